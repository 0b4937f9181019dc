// Which buffers are a KV manager's staged tables, and the layout they were
// staged in. A table is only int32 ids: an index op given a view of these
// buffers checks its constants against the layout they hold (an SWA page
// size in swa_rows, the row space's envelope as block_stride), so a constant
// left at its slot-layout default is refused instead of giving wrong rows.
// Tables elsewhere (a copy, a tensor-parallel rank's broadcast buffer) are
// not known here and are not checked. The table stager registers its buffers
// for its life; a lookup is one hash-map probe under a mutex.
#pragma once

#include <cstdint>
#include <optional>

namespace ukv::ops {

struct StagedLayout {
  int64_t swa_page;       // tokens per SWA page of the 'swa' table
  int64_t envelope_rows;  // row space: the envelope, every compress table's block stride; 0 in the slot layouts
};

void register_staged_tables(const void* storage, StagedLayout layout);
void unregister_staged_tables(const void* storage);
// The layout of the staged tables whose storage starts at `storage`, if it is one.
std::optional<StagedLayout> staged_layout(const void* storage);

}  // namespace ukv::ops

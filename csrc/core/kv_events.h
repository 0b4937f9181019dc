// KV cache events for external cache routers (prefix-aware load balancers):
// a logical block's content became reusable (Stored), stopped being reusable
// (Removed), or the whole prefix cache was dropped (AllCleared).
#pragma once

#include <cstdint>

namespace ukv {

enum class KvEventKind : int64_t { Stored = 0, Removed = 1, AllCleared = 2 };

struct KvEvent {
  KvEventKind kind;
  uint64_t block_hash = 0;   // Stored / Removed
  uint64_t parent_hash = 0;  // Stored: hash of the previous block in the chain
  bool has_parent = false;   // Stored: false for a sequence's first block
};

}  // namespace ukv

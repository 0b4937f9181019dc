// XXH64: the public xxHash 64-bit algorithm, the prefix cache's default
// (router-compatible) block hash.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ukv {

uint64_t xxh64(const void* data, size_t len, uint64_t seed = 0);

}  // namespace ukv

// SHA-256 (FIPS 180-4, section 6.2): a strong prefix-cache hash
// (ServeConfig.prefix_hash = "sha256").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace ukv {

std::array<unsigned char, 32> sha256(const void* data, size_t len);

}  // namespace ukv

// BLAKE2b (RFC 7693), unkeyed, with a digest of 1..64 bytes: a strong
// prefix-cache hash (ServeConfig.prefix_hash = "blake2b"). The digest length
// is part of the parameter block, so a 16-byte digest is not the first 16
// bytes of the 64-byte one; it equals Python's
// hashlib.blake2b(data, digest_size=out_len).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ukv {

// Writes the out_len-byte digest (1 <= out_len <= 64) to out.
void blake2b(const void* data, size_t len, unsigned char* out, size_t out_len);

}  // namespace ukv

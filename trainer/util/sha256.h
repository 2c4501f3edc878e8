// SHA-256 (FIPS 180-4), for content hashes: multiplier tables are identified by the hash of
// their bytes, since their files move and get renamed.
#ifndef TOPIARY_TRAINER_UTIL_SHA256_H_
#define TOPIARY_TRAINER_UTIL_SHA256_H_

#include <cstddef>
#include <string>

namespace topiary {

// The digest of data[0..n) as 64 lowercase hex digits.
std::string Sha256Hex(const void* data, size_t n);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_UTIL_SHA256_H_

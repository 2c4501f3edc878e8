// SHA-256 (FIPS 180-4), for content hashes: multiplier tables are identified by the hash of
// their bytes, since their files move and get renamed.
#ifndef TOPIARY_TRAINER_UTIL_SHA256_H_
#define TOPIARY_TRAINER_UTIL_SHA256_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace topiary {

// The digest of a stream of bytes given in pieces (files sent in chunks).
class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t n);
  // The digest of everything given so far, as 64 lowercase hex digits.
  std::string HexDigest() const;

 private:
  uint32_t state_[8];
  unsigned char buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

// The digest of data[0..n) as 64 lowercase hex digits.
std::string Sha256Hex(const void* data, size_t n);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_UTIL_SHA256_H_

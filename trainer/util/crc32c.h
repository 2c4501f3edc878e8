// CRC-32C (Castagnoli), as TensorBoard's record framing and the checkpoint metadata checksum
// use it.
#ifndef TOPIARY_TRAINER_UTIL_CRC32C_H_
#define TOPIARY_TRAINER_UTIL_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace topiary {

uint32_t Crc32c(const void* data, size_t size);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_UTIL_CRC32C_H_

// What a checkpoint document must be before anything reads it (docs/checkpoint-format.md):
// the root attributes with their types and ranges, the metadata checksum, `/rng`, and every
// dataset's place, type, shape and values (finite weights and momentum, running variances
// >= 0, masks of 0 and 1 whose shape fits their kernel). Both the loader and `inspect` call
// it, so neither meets a file it has to guess about.
#ifndef TOPIARY_TRAINER_STORE_CHECKPOINT_SCHEMA_H_
#define TOPIARY_TRAINER_STORE_CHECKPOINT_SCHEMA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "trainer/store/hdf5_file.h"

namespace topiary {

inline constexpr char kMetadataChecksumAttr[] = "metadata_crc32c";

// "[8, 1, 3, 3]": shapes in messages.
std::string ShapeText(const std::vector<int64_t>& shape);

// CRC-32C of MetadataText(doc, kMetadataChecksumAttr), stored as that root attribute.
int64_t MetadataChecksum(const H5Document& doc);

// Errors name the file and the object: DATA_LOSS for damage and contradictions.
absl::Status ValidateCheckpointDocument(const std::string& path, const H5Document& doc);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_STORE_CHECKPOINT_SCHEMA_H_

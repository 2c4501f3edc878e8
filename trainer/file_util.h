// Reading whole files, transparently gunzipping, with errors that name the file.
#ifndef TOPIARY_TRAINER_FILE_UTIL_H_
#define TOPIARY_TRAINER_FILE_UTIL_H_

#include <string>

#include "absl/status/statusor.h"

namespace topiary {

// Contents of `path`; gzip files are decompressed (detected by their magic bytes). A missing
// file is NOT_FOUND; a truncated or corrupt gzip stream is DATA_LOSS.
absl::StatusOr<std::string> ReadFileMaybeGzip(const std::string& path);
absl::StatusOr<std::string> ReadFile(const std::string& path);
// Writes atomically: a temporary file in the same folder, fsync, rename.
absl::Status WriteFileAtomic(const std::string& path, const std::string& contents);
bool PathExists(const std::string& path);
// Creates `path` and its missing parents (like mkdir -p); errors name the folder.
absl::Status MakeDirs(const std::string& path);
// The current time as ISO 8601 UTC, e.g. "2026-11-21T14:05:31Z" (records, checkpoints).
std::string NowIso8601();
bool IsDirectory(const std::string& path);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_FILE_UTIL_H_

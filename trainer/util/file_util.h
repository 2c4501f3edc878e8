// Reading files safely, transparently gunzipping, with errors that name the file; atomic
// writes; folders and the clock.
//
// Every file a run or the daemon reads comes through ReadFile / ReadFileMaybeGzip /
// ResolveReadableFile, which follow every link first and then check the real file against the
// process's ReadPolicy: a regular file (never a device, FIFO or folder), no larger than the
// limit, and inside the allowed folders when the policy names any (topiaryd names its data
// directory and the dataset folders). Decompression stops at the same limit, so a small gzip
// bomb cannot exhaust memory.
#ifndef TOPIARY_TRAINER_UTIL_FILE_UTIL_H_
#define TOPIARY_TRAINER_UTIL_FILE_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace topiary {

struct ReadPolicy {
  // Canonical folders a file must lie in once links are followed; empty: anywhere.
  std::vector<std::string> roots;
  // The most bytes a file may hold on disk, or inflate to (datasets, checkpoints).
  uint64_t max_file_bytes = uint64_t{2} << 30;
};

// The process-wide policy (default: anywhere, 2 GiB). topiaryd sets it once at start, after
// reading its own token and certificate files. Roots are made canonical here.
void SetReadPolicy(ReadPolicy policy);
ReadPolicy GetReadPolicy();

// Where `path` really is: its existing part with every link followed and "." and ".."
// resolved, the rest (files or folders yet to be made) as written; `path` itself when that
// cannot be worked out.
std::string Canonical(const std::string& path);

// True when the canonical `path` is `root` or lies under it (both canonical).
bool IsInsideFolder(const std::string& path, const std::string& root);

// Specs and other small text files stop here.
inline constexpr uint64_t kMaxSpecBytes = uint64_t{1} << 20;

// The real path of `path` after following every link, checked against the policy (regular
// file, size, roots). `max_bytes` (0: the policy's limit) lowers the size limit. Errors:
// NOT_FOUND, PERMISSION_DENIED (outside the roots), INVALID_ARGUMENT (not a regular file),
// RESOURCE_EXHAUSTED (too large).
absl::StatusOr<std::string> ResolveReadableFile(const std::string& path, uint64_t max_bytes = 0);

// Contents of `path` (checked as above). ReadFileMaybeGzip decompresses gzip files (detected
// by their magic bytes) and refuses contents that inflate beyond the limit; a truncated or
// corrupt gzip stream is DATA_LOSS.
absl::StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes = 0);
// At most the first `head_bytes` of `path` (checked and opened as ReadFile does: a FIFO
// swapped in never blocks the reader).
absl::StatusOr<std::string> ReadFileHead(const std::string& path, uint64_t head_bytes,
                                         uint64_t max_bytes = 0);
absl::StatusOr<std::string> ReadFileMaybeGzip(const std::string& path, uint64_t max_bytes = 0);

// `raw` itself, or its gzip decompression when it starts with gzip's magic bytes, refused
// beyond `limit` bytes; `name` names it in errors.
absl::StatusOr<std::string> InflateMaybeGzip(std::string raw, uint64_t limit,
                                             const std::string& name);

// The write side. Someone who can write into topiaryd's data directory could plant links
// or special files where the daemon writes; every writer here therefore (1) checks that the
// file's folder, once links are followed, lies inside the process's write roots (topiaryd:
// its data directory; none set: anywhere), (2) never follows a link in the last component
// (O_NOFOLLOW; temporary files are made with O_EXCL after removing a stale one) and (3)
// writes only regular files, opening without blocking (a FIFO never hangs a writer).
// `files`: single files outside the roots that may be written too (the operator's own, such as
// topiaryd's --port_file), without making their folders roots. Both made canonical here.
void SetWriteRoots(std::vector<std::string> roots, std::vector<std::string> files = {});
// OK when `path` may be written as above (absent, or a regular file).
absl::Status CheckWritable(const std::string& path);
// errno as a Status naming `what`: a full disk is RESOURCE_EXHAUSTED, no access
// PERMISSION_DENIED, a link or special file INVALID_ARGUMENT, the rest INTERNAL.
absl::Status ErrnoStatus(int err, const std::string& what);

// Writes atomically: a temporary file in the same folder, fsync, rename.
absl::Status WriteFileAtomic(const std::string& path, const std::string& contents);
// Appends `text` to `path` (created if absent) in one write; fdatasync when `sync`. With
// `max_bytes`, a file that would grow beyond it is left as it is (RESOURCE_EXHAUSTED).
absl::Status AppendToFile(const std::string& path, const std::string& text, bool sync,
                          uint64_t max_bytes = 0);
bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);
// Creates `path` and its missing parents (like mkdir -p); errors name the folder. Each
// folder made, and the result, must lie inside the write roots once links are followed (or
// be on the way to a root or an own file).
absl::Status MakeDirs(const std::string& path);
// The current time as ISO 8601 UTC, e.g. "2026-11-21T14:05:31Z" (records, checkpoints).
std::string NowIso8601();
// "1.5 GiB", "300 MiB", "12 KiB", "17 bytes": sizes in messages.
std::string HumanBytes(uint64_t bytes);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_UTIL_FILE_UTIL_H_

// Files in and out of the daemon's data directory (UploadFiles, DownloadFile, ListFiles):
// the path rules, the staging of uploads and the checks that make an upload land whole or
// not at all. The gRPC handlers in service.cc only move chunks to and from these.
//
// The rules (docs/remote.md, "Files"):
// - A path is data-directory relative: no leading '/', no empty, "." or ".." component, no
//   hidden component (".x": the daemon's own, such as .uploads/ and .reserve), no control
//   characters; at most 255 bytes a component and 1024 in all.
// - Uploads never go into experiments/ (runs own their folders) or plan_cache/, never
//   replace a file, and must stay inside the data directory once links are followed.
// - An upload is written to .uploads/ (emptied at each start of the daemon), its size and
//   SHA-256 checked, then hard-linked into place: a crash, a cut stream or a bad checksum
//   leaves nothing at the destination.
// - Its declared size is checked before a byte is written: at most the daemon's
//   --max_file_bytes (what it would read), and the disk keeps 1 GiB free.
#ifndef TOPIARY_SERVER_FILE_TRANSFER_H_
#define TOPIARY_SERVER_FILE_TRANSFER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "topiary/v1/service.pb.h"
#include "trainer/util/sha256.h"

namespace topiary::server {

// Most bytes of one chunk's data (the daemon refuses messages over 1 MiB).
inline constexpr size_t kMaxChunkBytes = 1000 * 1000;
// What the daemon sends per chunk.
inline constexpr size_t kChunkBytes = 256 * 1024;
// Files ListFiles answers with at most (name a subfolder for more).
inline constexpr size_t kMaxListedFiles = 20000;

// The checks of the rules above on the path as written; `field` names it in errors.
absl::Status CheckTransferPath(const std::string& field, const std::string& path);

// CheckTransferPath, and not in a folder of the daemon's own (experiments/, plan_cache/):
// where an upload or an export may write. PERMISSION_DENIED names the folder.
absl::Status CheckWritablePath(const std::string& field, const std::string& path);

// The data directory's staging folder for uploads, emptied (made if missing).
absl::Status ResetUploadStaging(const std::string& data_dir);

// One file being uploaded: made by Begin, fed by Append, landed by Commit. Destroyed
// before Commit (an error, a cut stream), it removes what it wrote.
class FileUpload {
 public:
  // Checks the header (path, size, checksum's form, destination free, disk room) and opens
  // a staging file. `data_dir` is canonical.
  static absl::StatusOr<std::unique_ptr<FileUpload>> Begin(const std::string& data_dir,
                                                           const topiary::v1::FileHeader& header);
  ~FileUpload();
  FileUpload(const FileUpload&) = delete;
  FileUpload& operator=(const FileUpload&) = delete;

  // More bytes; beyond the declared size is an error.
  absl::Status Append(absl::string_view data);
  // Checks the size and checksum, then links the file into place (ALREADY_EXISTS if a file
  // appeared there meanwhile).
  absl::StatusOr<topiary::v1::FileInfo> Commit();

 private:
  FileUpload(topiary::v1::FileHeader header, std::string dest, std::string staged, int fd)
      : header_(std::move(header)), dest_(std::move(dest)), staged_(std::move(staged)), fd_(fd) {}

  topiary::v1::FileHeader header_;
  std::string dest_;    // absolute
  std::string staged_;  // absolute, in .uploads/
  int fd_;
  uint64_t written_ = 0;
  Sha256 hash_;
};

// A file opened for download: its info (size, SHA-256 of what will be sent) and reads.
class FileDownload {
 public:
  // `absolute` was resolved inside the data directory; `path` is how the client named it.
  static absl::StatusOr<std::unique_ptr<FileDownload>> Open(const std::string& absolute,
                                                            const std::string& path);
  ~FileDownload();
  FileDownload(const FileDownload&) = delete;
  FileDownload& operator=(const FileDownload&) = delete;

  const topiary::v1::FileInfo& info() const { return info_; }
  // Up to `n` bytes at `offset` (fewer only at the end).
  absl::StatusOr<std::string> Read(uint64_t offset, size_t n) const;

 private:
  explicit FileDownload(int fd) : fd_(fd) {}
  int fd_;
  topiary::v1::FileInfo info_;
};

// The regular file `path` (data-directory relative) or the regular files under the folder,
// recursively, sorted, without hidden names or links; with checksums when asked.
absl::StatusOr<std::vector<topiary::v1::FileInfo>> ListDataFiles(const std::string& data_dir,
                                                                 const std::string& path,
                                                                 bool sha256);

}  // namespace topiary::server

#endif  // TOPIARY_SERVER_FILE_TRANSFER_H_

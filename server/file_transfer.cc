#include "server/file_transfer.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "trainer/util/file_util.h"

namespace topiary::server {
namespace {

constexpr size_t kMaxComponentBytes = 255;
constexpr size_t kMaxPathBytes = 1024;
constexpr uint64_t kKeepFreeBytes = uint64_t{1} << 30;
constexpr const char* kStaging = ".uploads";
// Top-level folders that belong to the daemon's runs and caches.
constexpr const char* kReservedFolders[] = {"experiments", "plan_cache"};

std::string Iso8601(const struct timespec& t) {
  struct tm tm;
  gmtime_r(&t.tv_sec, &tm);
  char buf[32];
  strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string RandomHex() {
  std::random_device rd;
  const uint64_t v = (uint64_t{rd()} << 32) ^ rd();
  return absl::StrCat(absl::Hex(v, absl::kZeroPad16));
}

absl::StatusOr<std::string> HashFd(int fd, uint64_t size, const std::string& what) {
  Sha256 hash;
  std::string buf(1 << 20, '\0');
  for (uint64_t off = 0; off < size;) {
    const ssize_t n = ::pread(fd, buf.data(), std::min<uint64_t>(buf.size(), size - off), off);
    if (n < 0) return ErrnoStatus(errno, what);
    if (n == 0) return absl::DataLossError(absl::StrCat(what, ": shrank while it was read"));
    hash.Update(buf.data(), n);
    off += n;
  }
  return hash.HexDigest();
}

bool IsHexDigest(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

}  // namespace

absl::Status CheckTransferPath(const std::string& field, const std::string& path) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' ", why));
  };
  if (path.empty()) return absl::InvalidArgumentError(field + ": empty; name a file");
  if (path.size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path.size(), " bytes long; at most ", kMaxPathBytes));
  }
  if (path[0] == '/') {
    return bad("is absolute; name it relative to the daemon's data directory");
  }
  for (char c : path) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return bad("holds a control character");
  }
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == "." || part == "..") {
      return bad(
          "has an empty, '.' or '..' component; name it plainly, relative to the data "
          "directory");
    }
    if (part[0] == '.')
      return bad("has a hidden component (names starting with '.' are the daemon's)");
    if (part.size() > kMaxComponentBytes) return bad("has a component over 255 bytes");
  }
  return absl::OkStatus();
}

absl::Status CheckWritablePath(const std::string& field, const std::string& path) {
  if (auto st = CheckTransferPath(field, path); !st.ok()) return st;
  const std::string top = path.substr(0, path.find('/'));
  for (const char* reserved : kReservedFolders) {
    if (top == reserved) {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": '", path, "' is in ", reserved,
                       "/, which belongs to the daemon's runs; write elsewhere in the data "
                       "directory"));
    }
  }
  return absl::OkStatus();
}

absl::Status ResetUploadStaging(const std::string& data_dir) {
  const std::string staging = data_dir + "/" + kStaging;
  if (DIR* d = ::opendir(staging.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      ::unlinkat(dirfd(d), name.c_str(), 0);  // only files are made there
    }
    ::closedir(d);
  }
  return MakeDirs(staging);
}

absl::StatusOr<std::unique_ptr<FileUpload>> FileUpload::Begin(
    const std::string& data_dir, const topiary::v1::FileHeader& header) {
  const std::string& path = header.path();
  if (auto st = CheckWritablePath("header.path", path); !st.ok()) return st;
  const uint64_t limit = GetReadPolicy().max_file_bytes;
  if (header.size() < 0 || static_cast<uint64_t>(header.size()) > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "header.size: ", path, " is ", header.size(), " bytes; the daemon takes at most ",
        HumanBytes(limit), " a file (topiaryd --max_file_bytes)"));
  }
  if (!IsHexDigest(header.sha256())) {
    return absl::InvalidArgumentError(absl::StrCat("header.sha256: '", header.sha256(), "' for ",
                                                   path,
                                                   " is not a SHA-256 (64 lowercase hex digits)"));
  }
  const std::string dest = data_dir + "/" + path;
  if (!IsInsideFolder(Canonical(dest), data_dir)) {
    return absl::PermissionDeniedError(absl::StrCat("header.path: '", path,
                                                    "' leads outside the data directory (",
                                                    data_dir, ") through a symbolic link"));
  }
  struct stat st;
  if (::lstat(dest.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        "header.path: '", path, "' exists in the data directory; uploads never replace a file"));
  }
  struct statvfs vfs;
  if (::statvfs(data_dir.c_str(), &vfs) == 0) {
    const uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
    if (free_bytes < static_cast<uint64_t>(header.size()) + kKeepFreeBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": ", HumanBytes(header.size()), " would leave less than ",
                       HumanBytes(kKeepFreeBytes), " free in the data directory (",
                       HumanBytes(free_bytes), " free)"));
    }
  }
  const std::string staged = absl::StrCat(data_dir, "/", kStaging, "/", RandomHex(), ".part");
  if (auto s = CheckWritable(staged); !s.ok()) return s;
  const int fd = ::open(staged.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "the upload's staging file " + staged);
  return std::unique_ptr<FileUpload>(new FileUpload(header, dest, staged, fd));
}

FileUpload::~FileUpload() {
  if (fd_ >= 0) ::close(fd_);
  if (!staged_.empty()) ::unlink(staged_.c_str());
}

absl::Status FileUpload::Append(absl::string_view data) {
  if (written_ + data.size() > static_cast<uint64_t>(header_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(header_.path(),
                                                   ": more bytes than its header's size (",
                                                   header_.size(), "); nothing was kept"));
  }
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
    if (n < 0) return ErrnoStatus(errno, header_.path() + ": writing the upload");
    done += n;
  }
  hash_.Update(data.data(), data.size());
  written_ += data.size();
  return absl::OkStatus();
}

absl::StatusOr<topiary::v1::FileInfo> FileUpload::Commit() {
  const std::string& path = header_.path();
  if (written_ != static_cast<uint64_t>(header_.size())) {
    return absl::DataLossError(absl::StrCat(path, ": ", written_, " bytes arrived of the ",
                                            header_.size(),
                                            " its header announced (truncated); "
                                            "nothing was kept, send it again"));
  }
  const std::string digest = hash_.HexDigest();
  if (digest != header_.sha256()) {
    return absl::DataLossError(absl::StrCat(path, ": the bytes that arrived have SHA-256 ", digest,
                                            ", not the header's ", header_.sha256(),
                                            "; nothing was kept, send it again"));
  }
  if (::fsync(fd_) != 0) return ErrnoStatus(errno, path + ": saving the upload");
  const std::string folder = dest_.substr(0, dest_.rfind('/'));
  if (auto st = MakeDirs(folder); !st.ok()) return st;
  if (auto st = CheckWritable(dest_); !st.ok()) return st;
  // A hard link never replaces what is there: a file that appeared meanwhile stays.
  if (::link(staged_.c_str(), dest_.c_str()) != 0) {
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat("header.path: '", path, "' appeared while it was uploaded; not replaced"));
    }
    return ErrnoStatus(errno, absl::StrCat(path, ": placing the upload"));
  }
  topiary::v1::FileInfo info;
  info.set_path(path);
  info.set_size(header_.size());
  info.set_sha256(digest);
  info.set_modified_at(NowIso8601());
  return info;
}

absl::StatusOr<std::unique_ptr<FileDownload>> FileDownload::Open(const std::string& absolute,
                                                                 const std::string& path) {
  auto real = ResolveReadableFile(absolute);  // regular, within --max_file_bytes
  if (!real.ok()) return real.status();
  const int fd = ::open(real->c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, path);
  std::unique_ptr<FileDownload> out(new FileDownload(fd));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return ErrnoStatus(ENXIO, path);
  // The bytes present now are what is sent and hashed: a log appended meanwhile sends its
  // lines up to here.
  auto digest = HashFd(fd, st.st_size, path);
  if (!digest.ok()) return digest.status();
  out->info_.set_path(path);
  out->info_.set_size(st.st_size);
  out->info_.set_sha256(*digest);
  out->info_.set_modified_at(Iso8601(st.st_mtim));
  return out;
}

FileDownload::~FileDownload() { ::close(fd_); }

absl::StatusOr<std::string> FileDownload::Read(uint64_t offset, size_t n) const {
  const uint64_t size = info_.size();
  if (offset >= size) return std::string();
  std::string buf(std::min<uint64_t>(n, size - offset), '\0');
  size_t done = 0;
  while (done < buf.size()) {
    const ssize_t r = ::pread(fd_, buf.data() + done, buf.size() - done, offset + done);
    if (r < 0) return ErrnoStatus(errno, info_.path());
    if (r == 0) return absl::DataLossError(info_.path() + ": shrank while it was sent");
    done += r;
  }
  return buf;
}

namespace {

// A regular file's info; its checksum read from the file when asked.
absl::StatusOr<topiary::v1::FileInfo> InfoOf(const std::string& abs, const std::string& rel,
                                             const struct stat& st, bool sha256) {
  if (sha256) {
    auto file = FileDownload::Open(abs, rel);
    if (!file.ok()) return file.status();
    return (*file)->info();
  }
  topiary::v1::FileInfo info;
  info.set_path(rel);
  info.set_size(st.st_size);
  info.set_modified_at(Iso8601(st.st_mtim));
  return info;
}

// Appends the regular files under `abs` (shown as `rel`) to `out`, depth first.
absl::Status Walk(const std::string& abs, const std::string& rel, bool sha256,
                  std::vector<topiary::v1::FileInfo>* out) {
  DIR* d = ::opendir(abs.c_str());
  if (d == nullptr) return ErrnoStatus(errno, rel.empty() ? "the data directory" : rel);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') names.push_back(e->d_name);  // hidden: the daemon's own
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const std::string child = abs + "/" + name, child_rel = rel.empty() ? name : rel + "/" + name;
    struct stat st;
    if (::lstat(child.c_str(), &st) != 0) continue;  // gone meanwhile
    if (S_ISDIR(st.st_mode)) {
      if (auto s = Walk(child, child_rel, sha256, out); !s.ok()) return s;
      continue;
    }
    if (!S_ISREG(st.st_mode)) continue;  // links and special files are not listed
    if (out->size() == kMaxListedFiles) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "path: more than ", kMaxListedFiles, " files under '", rel, "'; name a subfolder"));
    }
    auto info = InfoOf(child, child_rel, st, sha256);
    if (!info.ok()) return info.status();
    out->push_back(*std::move(info));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<topiary::v1::FileInfo>> ListDataFiles(const std::string& data_dir,
                                                                 const std::string& path,
                                                                 bool sha256) {
  if (!path.empty()) {
    if (auto st = CheckTransferPath("path", path); !st.ok()) return st;
  }
  const std::string abs = path.empty() ? data_dir : data_dir + "/" + path;
  if (!IsInsideFolder(Canonical(abs), data_dir)) {
    return absl::PermissionDeniedError(
        absl::StrCat("path: '", path, "' leads outside the data directory (", data_dir, ")"));
  }
  struct stat st;
  if (::lstat(abs.c_str(), &st) != 0) return ErrnoStatus(errno, "path: '" + path + "'");
  std::vector<topiary::v1::FileInfo> out;
  if (S_ISREG(st.st_mode)) {
    auto info = InfoOf(abs, path, st, sha256);
    if (!info.ok()) return info.status();
    out.push_back(*std::move(info));
    return out;
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError("path: '" + path + "' is neither a file nor a folder");
  }
  if (auto s = Walk(abs, path, sha256, &out); !s.ok()) return s;
  return out;
}

}  // namespace topiary::server

#include "trainer/util/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "util/status_macros.h"

namespace topiary {

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string NowIso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

namespace {

absl::Mutex& PolicyLock() {
  static absl::Mutex* m = new absl::Mutex;
  return *m;
}
ReadPolicy& Policy() {
  static ReadPolicy* p = new ReadPolicy;
  return *p;
}

// The size limit of one read: the policy's, lowered by `max_bytes` when that is non-zero.
uint64_t EffectiveLimit(uint64_t max_bytes) {
  const uint64_t policy = GetReadPolicy().max_file_bytes;
  return max_bytes == 0 ? policy : std::min(max_bytes, policy);
}

// Canonical folders the process may write in, and single files outside them it may write
// (the operator's own: --port_file, the plan cache).
struct WritePolicy {
  std::vector<std::string> roots, files;
  bool anywhere() const { return roots.empty() && files.empty(); }
};
WritePolicy& Writes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(PolicyLock()) {
  static auto* policy = new WritePolicy;
  return *policy;
}
WritePolicy GetWritePolicy() {
  absl::MutexLock lock(&PolicyLock());
  return Writes();
}

// Where `path` really is: its folder with every link followed, and its own name (itself not
// followed). `what` names it in errors.
absl::StatusOr<std::string> RealLocation(const std::string& path, const std::string& what) {
  const size_t slash = path.rfind('/');
  const std::string folder =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string name = path.substr(slash == std::string::npos ? 0 : slash + 1);
  char buf[PATH_MAX];
  if (::realpath(folder.c_str(), buf) == nullptr) return ErrnoStatus(errno, what);
  if (name.empty() || name == "." || name == "..") return std::string(buf);
  return absl::StrCat(std::string(buf) == "/" ? "" : buf, "/", name);
}

absl::Status OutsideWrites(const std::string& what, const std::string& real,
                           const WritePolicy& policy) {
  std::vector<std::string> allowed = policy.roots;
  allowed.insert(allowed.end(), policy.files.begin(), policy.files.end());
  return absl::PermissionDeniedError(
      absl::StrCat(what, ": it would be ", real, ", outside where this process writes (",
                   absl::StrJoin(allowed, ", "), "); a symbolic link was planted?"));
}

// A file may be written inside a root, or where it is one of the own files (or the
// temporary file an atomic write of one makes beside it).
absl::Status CheckFileAllowed(const std::string& path) {
  const WritePolicy policy = GetWritePolicy();
  if (policy.anywhere()) return absl::OkStatus();
  TOPIARY_ASSIGN_OR_RETURN(const std::string real, RealLocation(path, path));
  for (const std::string& root : policy.roots) {
    if (IsInsideFolder(real, root)) return absl::OkStatus();
  }
  for (const std::string& file : policy.files) {
    if (real == file || real == file + ".tmp") return absl::OkStatus();
  }
  return OutsideWrites(path, real, policy);
}

// A folder may be made (or be the folder made) inside a root, or on the way to a root or an
// own file (their missing parents), judged where it really goes: a planted link never has
// folders made outside.
absl::Status CheckFolderAllowed(const std::string& folder) {
  const WritePolicy policy = GetWritePolicy();
  if (policy.anywhere()) return absl::OkStatus();
  const std::string what = "folder " + folder;
  char buf[PATH_MAX];  // an existing folder, every link followed; else where it would be made
  auto real = ::realpath(folder.c_str(), buf) ? std::string(buf) : RealLocation(folder, what);
  if (!real.ok()) return real.status();
  auto on_the_way_to = [&](const std::string& p) { return p != *real && IsInsideFolder(p, *real); };
  for (const std::string& root : policy.roots) {
    if (IsInsideFolder(*real, root) || on_the_way_to(root)) return absl::OkStatus();
  }
  for (const std::string& file : policy.files) {
    if (on_the_way_to(file)) return absl::OkStatus();
  }
  return OutsideWrites(what, *real, policy);
}

}  // namespace

void SetWriteRoots(std::vector<std::string> roots, std::vector<std::string> files) {
  for (std::string& root : roots) root = Canonical(root);
  for (std::string& file : files) file = Canonical(file);
  absl::MutexLock lock(&PolicyLock());
  Writes() = WritePolicy{std::move(roots), std::move(files)};
}

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string text = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(absl::StrCat(text, " (the disk is full)"));
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(text);
    case ELOOP:
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a symbolic link (never followed when writing)"));
    case ENXIO:
    case EISDIR:
      return absl::InvalidArgumentError(absl::StrCat(what, ": not a regular file"));
    case ENOENT:
      return absl::NotFoundError(text);
    default:
      return absl::InternalError(text);
  }
}

absl::Status CheckWritable(const std::string& path) {
  TOPIARY_RETURN_IF_ERROR(CheckFileAllowed(path));
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? absl::OkStatus() : ErrnoStatus(errno, path);
  }
  if (S_ISLNK(st.st_mode)) return ErrnoStatus(ELOOP, path);
  if (!S_ISREG(st.st_mode)) return ErrnoStatus(ENXIO, path);
  return absl::OkStatus();
}

namespace {

// Opens `path` for writing as CheckWritable describes; `flags` adds O_APPEND or O_EXCL.
absl::StatusOr<int> OpenForWriting(const std::string& path, int flags) {
  TOPIARY_RETURN_IF_ERROR(CheckWritable(path));
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | flags, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat(path, ": cannot open for writing"));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {  // swapped since it was checked
    ::close(fd);
    return ErrnoStatus(ENXIO, path);
  }
  return fd;
}

absl::Status WriteAll(int fd, const std::string& path, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, absl::StrCat(path, ": write failed"));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MakeDirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!partial.empty() && !IsDirectory(partial)) {
        TOPIARY_RETURN_IF_ERROR(CheckFolderAllowed(partial));
        if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
          return ErrnoStatus(errno, "cannot create folder " + partial);
        }
      }
    }
    if (i < path.size()) partial += path[i];
  }
  return CheckFolderAllowed(path);
}

absl::Status AppendToFile(const std::string& path, const std::string& text, bool sync,
                          uint64_t max_bytes) {
  TOPIARY_ASSIGN_OR_RETURN(auto fd, OpenForWriting(path, O_APPEND));
  struct stat info;
  absl::Status st;
  if (max_bytes > 0 &&
      (::fstat(fd, &info) != 0 || static_cast<uint64_t>(info.st_size) + text.size() > max_bytes)) {
    st = absl::ResourceExhaustedError(
        absl::StrCat(path, ": full (", HumanBytes(max_bytes), "); delete it to start a new one"));
  }
  if (st.ok()) st = WriteAll(fd, path, text);
  if (st.ok() && sync && ::fdatasync(fd) != 0) st = ErrnoStatus(errno, path + ": fdatasync");
  ::close(fd);
  return st;
}

std::string Canonical(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path canonical = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : canonical.string();
}

bool IsInsideFolder(const std::string& path, const std::string& root) {
  return path == root || root == "/" || path.rfind(root + "/", 0) == 0;
}

void SetReadPolicy(ReadPolicy policy) {
  for (std::string& root : policy.roots) {
    std::error_code ec;
    const std::filesystem::path canonical = std::filesystem::weakly_canonical(root, ec);
    if (!ec) root = canonical.string();
  }
  absl::MutexLock lock(&PolicyLock());
  Policy() = std::move(policy);
}

ReadPolicy GetReadPolicy() {
  absl::MutexLock lock(&PolicyLock());
  return Policy();
}

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(bytes, " bytes") : absl::StrFormat("%.3g %s", v, units[u]);
}

absl::StatusOr<std::string> ResolveReadableFile(const std::string& path, uint64_t max_bytes) {
  const ReadPolicy policy = GetReadPolicy();
  const uint64_t limit = EffectiveLimit(max_bytes);
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::canonical(path, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    }
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot resolve: ", ec.message()));
  }
  const std::string resolved = real.string();
  if (!policy.roots.empty()) {
    bool inside = false;
    for (const std::string& root : policy.roots) inside = inside || IsInsideFolder(resolved, root);
    if (!inside) {
      return absl::PermissionDeniedError(
          absl::StrCat(path, ": resolves to a file outside the folders this process may read (",
                       absl::StrJoin(policy.roots, ", "), ")"));
    }
  }
  struct stat st;
  if (::stat(resolved.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a folder, not a file"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file (a device, pipe or socket is never read)"));
  }
  if (static_cast<uint64_t>(st.st_size) > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(path, ": ", HumanBytes(st.st_size),
                                                     ", over the limit of ", HumanBytes(limit)));
  }
  return resolved;
}

absl::StatusOr<std::string> ReadFileHead(const std::string& path, uint64_t head_bytes,
                                         uint64_t max_bytes) {
  TOPIARY_ASSIGN_OR_RETURN(auto resolved, ResolveReadableFile(path, max_bytes));
  // Swapped since it was resolved: a link is not followed, a FIFO does not block the open,
  // and what was opened is checked again.
  const int fd = ::open(resolved.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > EffectiveLimit(max_bytes)) {
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(path, ": over the size limit"));
  }
  std::string out(std::min<uint64_t>(static_cast<uint64_t>(st.st_size), head_bytes), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return absl::DataLossError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
    }
    if (n == 0) break;  // shrank meanwhile
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes) {
  return ReadFileHead(path, std::numeric_limits<uint64_t>::max(), max_bytes);
}

absl::StatusOr<std::string> ReadFileMaybeGzip(const std::string& path, uint64_t max_bytes) {
  TOPIARY_ASSIGN_OR_RETURN(auto raw, ReadFile(path, max_bytes));
  return InflateMaybeGzip(std::move(raw), EffectiveLimit(max_bytes), path);
}

absl::StatusOr<std::string> InflateMaybeGzip(std::string raw, uint64_t limit,
                                             const std::string& name) {
  if (raw.size() < 2 || static_cast<uint8_t>(raw[0]) != 0x1f ||
      static_cast<uint8_t>(raw[1]) != 0x8b) {
    return raw;
  }
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK) return absl::InternalError("zlib init failed");
  zs.next_in = reinterpret_cast<Bytef*>(raw.data());
  zs.avail_in = static_cast<uInt>(std::min<size_t>(raw.size(), UINT32_MAX));
  std::string out;
  char buf[1 << 16];
  int rc;
  do {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof(buf);
    rc = inflate(&zs, Z_NO_FLUSH);
    if ((rc == Z_BUF_ERROR || rc == Z_OK) && zs.avail_in == 0 && zs.avail_out != 0) {
      inflateEnd(&zs);
      return absl::DataLossError(absl::StrCat(name, ": truncated gzip file"));
    }
    if (rc != Z_OK && rc != Z_STREAM_END) {
      inflateEnd(&zs);
      return absl::DataLossError(
          absl::StrCat(name, ": corrupt gzip data (", zs.msg ? zs.msg : "inflate failed", ")"));
    }
    const size_t produced = sizeof(buf) - zs.avail_out;
    if (out.size() + produced > limit) {
      inflateEnd(&zs);
      return absl::ResourceExhaustedError(
          absl::StrCat(name, ": inflates to more than the limit of ", HumanBytes(limit), " (",
                       HumanBytes(raw.size()), " compressed)"));
    }
    out.append(buf, produced);
  } while (rc != Z_STREAM_END);
  inflateEnd(&zs);
  return out;
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& contents) {
  // The target itself is replaced by rename (which never follows a link there), but it
  // must not be a folder; the temporary file is made fresh (O_EXCL: no planted link).
  TOPIARY_RETURN_IF_ERROR(CheckWritable(path));
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());
  TOPIARY_ASSIGN_OR_RETURN(auto fd, OpenForWriting(tmp, O_EXCL));
  absl::Status st = WriteAll(fd, tmp, contents);
  if (st.ok() && ::fsync(fd) != 0) st = ErrnoStatus(errno, tmp + ": fsync failed");
  if (::close(fd) != 0 && st.ok()) st = ErrnoStatus(errno, tmp + ": close failed");
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = ErrnoStatus(errno, path + ": rename failed");
  }
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

}  // namespace topiary

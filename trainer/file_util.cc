#include "trainer/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace topiary {

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

absl::Status MakeDirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!partial.empty() && !IsDirectory(partial) && ::mkdir(partial.c_str(), 0755) != 0 &&
          errno != EEXIST) {
        return absl::PermissionDeniedError(absl::StrCat("cannot create folder ", partial));
      }
    }
    if (i < path.size()) partial += path[i];
  }
  return absl::OkStatus();
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

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!PathExists(path)) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::string> ReadFileMaybeGzip(const std::string& path) {
  auto raw = ReadFile(path);
  if (!raw.ok()) return raw.status();
  if (raw->size() < 2 || static_cast<uint8_t>((*raw)[0]) != 0x1f ||
      static_cast<uint8_t>((*raw)[1]) != 0x8b) {
    return raw;
  }
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK) return absl::InternalError("zlib init failed");
  zs.next_in = reinterpret_cast<Bytef*>(raw->data());
  zs.avail_in = static_cast<uInt>(raw->size());
  std::string out;
  char buf[1 << 16];
  int rc;
  do {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof(buf);
    rc = inflate(&zs, Z_NO_FLUSH);
    if ((rc == Z_BUF_ERROR || rc == Z_OK) && zs.avail_in == 0 && zs.avail_out != 0) {
      inflateEnd(&zs);
      return absl::DataLossError(absl::StrCat(path, ": truncated gzip file"));
    }
    if (rc != Z_OK && rc != Z_STREAM_END) {
      inflateEnd(&zs);
      return absl::DataLossError(
          absl::StrCat(path, ": corrupt gzip data (", zs.msg ? zs.msg : "inflate failed", ")"));
    }
    out.append(buf, sizeof(buf) - zs.avail_out);
  } while (rc != Z_STREAM_END);
  inflateEnd(&zs);
  return out;
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      ::close(fd);
      return absl::DataLossError(absl::StrCat(tmp, ": write failed: ", std::strerror(errno)));
    }
    done += n;
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    return absl::DataLossError(absl::StrCat(tmp, ": fsync/close failed: ", std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": rename failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace topiary

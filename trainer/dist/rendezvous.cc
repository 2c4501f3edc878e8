#include "trainer/dist/rendezvous.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_format.h"
#include "trainer/util/file_util.h"
#include "util/status_macros.h"

namespace topiary {

absl::Status Publish(const std::string& dir, const std::string& name, const std::string& bytes) {
  TOPIARY_RETURN_IF_ERROR(MakeDirs(dir));
  return WriteFileAtomic(dir + "/" + name, bytes);
}

absl::StatusOr<std::string> AwaitPublished(const std::string& dir, const std::string& name,
                                           size_t size, double timeout_s) {
  const std::string path = dir + "/" + name;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (true) {
    auto bytes = ReadFile(path, size);  // published whole (renamed into place), or absent
    if (bytes.ok() && bytes->size() == size) return bytes;
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "rendezvous: rank 0 did not publish %s within %.0f s (is it running, and is the "
          "directory shared by every rank?)",
          path, timeout_s));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace topiary

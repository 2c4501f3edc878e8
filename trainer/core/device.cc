#include "trainer/core/device.h"

#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "absl/strings/str_format.h"
#include "kernels/parallel.h"

namespace topiary {
namespace {

class CpuDevice : public Device {
 public:
  explicit CpuDevice(int threads) {
    kernels::SetCpuThreads(threads);
    threads_ = kernels::CpuThreads();
  }
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return absl::StrFormat("cpu (%d threads)", threads_); }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("out of host memory allocating %d bytes", bytes));
    }
    std::memset(p, 0, rounded);
    allocated_ += rounded;
    sizes_bytes_[p] = rounded;
    return p;
  }
  void Free(void* p) override {
    allocated_ -= sizes_bytes_[p];
    sizes_bytes_.erase(p);
    std::free(p);
  }
  void CopyFromHost(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  size_t allocated_bytes() const override { return allocated_; }

 private:
  int threads_ = 1;
  size_t allocated_ = 0;
  std::unordered_map<void*, size_t> sizes_bytes_;
};

}  // namespace

std::unique_ptr<Device> MakeCpuDevice(int threads) { return std::make_unique<CpuDevice>(threads); }

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const topiary::v1::DeviceSpec& spec) {
  using topiary::v1::DeviceSpec;
  if (spec.kind() == DeviceSpec::CPU) return MakeCpuDevice(spec.threads());
  std::string why;
  const auto gpus = ListGpus(&why);
  const int ordinal = spec.gpus_size() > 0 ? spec.gpus(0) : 0;
  if (gpus.empty()) {
    if (spec.kind() == DeviceSpec::AUTO) return MakeCpuDevice(spec.threads());
    return absl::FailedPreconditionError("device.kind: CUDA requested but no usable GPU: " + why);
  }
  if (ordinal >= static_cast<int>(gpus.size())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("device.gpus: GPU %d requested but only %d found", ordinal, gpus.size()));
  }
  return MakeCudaDevice(ordinal);
}

}  // namespace topiary

#include "trainer/device.h"

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
  if (spec.kind() == DeviceSpec::CUDA) {
    std::string why;
    const auto gpus = ListGpus(&why);
    if (gpus.empty()) {
      return absl::FailedPreconditionError("device.kind: CUDA requested but no usable GPU: " + why);
    }
    return absl::UnimplementedError(absl::StrFormat(
        "device.kind: CUDA: found %s, but this version trains on the CPU only (the CUDA "
        "training backend is the next milestone); use device.kind: CPU or AUTO",
        gpus[0].name));
  }
  return MakeCpuDevice(spec.threads());
}

}  // namespace topiary

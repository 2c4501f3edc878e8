#include "trainer/core/device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_format.h"
#include "kernels/runtime/parallel.h"
#include "util/status_macros.h"

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

int CpuThreadsPerRank(const topiary::v1::DeviceSpec& spec) {
  // threads 0 ("all cores") shares the cores among the ranks rather than giving each rank
  // all of them (ranks x cores threads, oversubscribed).
  const int ranks = std::max(1, spec.cpu_ranks());
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return spec.threads() > 0 ? spec.threads() : std::max(1, cores / ranks);
}

absl::Status CheckCpuThreads(const topiary::v1::DeviceSpec& spec) {
  const int ranks = std::max(1, spec.cpu_ranks()), per_rank = CpuThreadsPerRank(spec);
  const int64_t total = static_cast<int64_t>(per_rank) * ranks;
  if (total <= kernels::MachineThreadLimit()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "device.threads: %d threads on each of %d CPU ranks (%d in all) is over this machine's "
      "limit of %d (4 per core on its %d cores)",
      per_rank, ranks, total, kernels::MachineThreadLimit(), std::thread::hardware_concurrency()));
}

absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateDevices(
    const topiary::v1::DeviceSpec& spec) {
  using topiary::v1::DeviceSpec;
  std::vector<std::unique_ptr<Device>> out;
  std::string why;
  const std::vector<GpuInfo> gpus =
      spec.kind() == DeviceSpec::CPU ? std::vector<GpuInfo>{} : ListGpus(&why);
  if (spec.kind() == DeviceSpec::CPU || (gpus.empty() && spec.kind() == DeviceSpec::AUTO)) {
    const int ranks = std::max(1, spec.cpu_ranks());
    TOPIARY_RETURN_IF_ERROR(CheckCpuThreads(spec));
    const int threads = CpuThreadsPerRank(spec);
    // Every rank's kernels run an OpenMP team of `threads` (the rank's own thread among them).
    TOPIARY_RETURN_IF_ERROR(kernels::CheckThreadsStart(ranks * threads));
    for (int r = 0; r < ranks; ++r) out.push_back(MakeCpuDevice(threads));
    return out;
  }
  if (gpus.empty()) {
    return absl::FailedPreconditionError("device.kind: CUDA requested but no usable GPU: " + why);
  }
  std::vector<int> ordinals(spec.gpus().begin(), spec.gpus().end());
  if (ordinals.empty()) {
    for (int i = 0; i < std::max(1, spec.gpu_count()); ++i) ordinals.push_back(i);
  }
  for (int ordinal : ordinals) {
    if (ordinal >= static_cast<int>(gpus.size())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: GPU %d requested but only %d found",
          spec.gpus_size() > 0 ? "device.gpus" : "device.gpu_count", ordinal, gpus.size()));
    }
    TOPIARY_ASSIGN_OR_RETURN(auto dev, MakeCudaDevice(ordinal));
    out.push_back(std::move(dev));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const topiary::v1::DeviceSpec& spec) {
  topiary::v1::DeviceSpec one = spec;
  one.clear_gpu_count();
  one.clear_cpu_ranks();
  if (one.gpus_size() > 1) one.mutable_gpus()->Truncate(1);
  TOPIARY_ASSIGN_OR_RETURN(auto devices, CreateDevices(one));
  return std::move(devices.front());
}

}  // namespace topiary

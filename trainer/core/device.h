// Device: where tensors live and kernels run. One abstraction, two backends: the CPU
// (host memory, kernels/*_cpu.cc) and CUDA (device memory, a stream, cuDNN/cuBLAS handles;
// its training kernels arrive with the GPU engine). Layers and the optimizer receive the
// Device and never allocate themselves: memory is planned once per model and batch shape.
#ifndef TOPIARY_TRAINER_CORE_DEVICE_H_
#define TOPIARY_TRAINER_CORE_DEVICE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/experiment.pb.h"

namespace topiary {
namespace kernels {
struct CudaContext;
}  // namespace kernels

enum class DeviceKind { kCpu, kCuda };

// Work recorded once and replayed (a CUDA graph): same kernels, same pointers.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  virtual absl::Status Replay() = 0;
  // Kernel launches (and other nodes: copies, memsets, events) per replay; 0 if not known.
  virtual int64_t nodes() const { return 0; }
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  // Human-readable, e.g. "cpu (2 threads)" or "cuda:0 NVIDIA H100 80GB HBM3".
  virtual std::string name() const = 0;
  // A GPU's PCI bus id ("0000:1B:00.0"), as NVML names boards; empty on the CPU.
  virtual std::string pci_bus_id() const { return ""; }
  // The CUDA device ordinal; -1 on the CPU.
  virtual int ordinal() const { return -1; }
  // Makes this the calling thread's current device, which kernel launches and library calls
  // use (CUDA's per-thread state). A thread that launches work for several GPUs is an error;
  // data parallelism gives each rank its own thread (trainer/dist). The device's own methods
  // (Allocate, copies, Synchronize) work from any thread.
  virtual void MakeCurrent() {}
  // Returns zero-initialized memory of `bytes` bytes, aligned to 64 bytes.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  virtual void CopyFromHost(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  // Bytes currently allocated through this device.
  virtual size_t allocated_bytes() const = 0;
  // The stream and library handles of a GPU device; null for the CPU.
  virtual const kernels::CudaContext* cuda() const { return nullptr; }
  // Waits for all work enqueued on the device (no-op on the CPU).
  virtual absl::Status Synchronize() { return absl::OkStatus(); }
  // Records the work enqueued between BeginCapture and EndCapture instead of running it.
  // Only devices with a stream support it (CPU: UNIMPLEMENTED).
  virtual absl::Status BeginCapture() {
    return absl::UnimplementedError("no capture on " + name());
  }
  virtual absl::StatusOr<std::unique_ptr<CapturedWork>> EndCapture() {
    return absl::UnimplementedError("no capture on " + name());
  }
};

// The host CPU. `threads` bounds BLAS threads (0: all cores).
std::unique_ptr<Device> MakeCpuDevice(int threads);

// One GPU as seen by the CUDA runtime.
struct GpuInfo {
  int ordinal = 0;
  std::string name;
  size_t memory_bytes = 0;
  int compute_major = 0, compute_minor = 0;
};

// GPUs usable by this binary: empty when built without CUDA, without a driver, or with no
// device. `why_none` (optional) receives the reason when the list is empty.
std::vector<GpuInfo> ListGpus(std::string* why_none = nullptr);
// True when this binary was built with the CUDA backend.
bool BuiltWithCuda();
// The GPU with this ordinal: its own stream, cuDNN and cuBLAS handles. Leaves it the
// calling thread's current device.
absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(int ordinal);

// Resolves spec.device to a device. CPU: the host. CUDA: the first GPU of spec.gpus (default
// 0), or an error naming why none can be used. AUTO: the GPU when one is usable, else the CPU.
absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const topiary::v1::DeviceSpec& spec);

// The CPU threads each rank of `spec` runs (device.threads, or its share of the cores).
int CpuThreadsPerRank(const topiary::v1::DeviceSpec& spec);
// INVALID_ARGUMENT naming device.threads when a CPU run of `spec` would ask this machine for
// more threads than kernels::MachineThreadLimit(). CreateDevices checks it (and then that
// the system starts that many); topiaryd refuses such specs at submission.
absl::Status CheckCpuThreads(const topiary::v1::DeviceSpec& spec);

// The devices of a data-parallel run, one per rank: spec.gpus, else the first
// spec.gpu_count GPUs, else one; on the CPU (or AUTO without a GPU) spec.cpu_ranks host
// devices. Errors name the field that asks for more GPUs than there are.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateDevices(
    const topiary::v1::DeviceSpec& spec);

// Owning handle to `count` floats (or bytes, for masks) on a device. Movable, not copyable.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  static absl::StatusOr<Buffer> Create(Device* device, size_t count) {
    Buffer b;
    if (count == 0) return b;
    auto p = device->Allocate(count * sizeof(T));
    if (!p.ok()) return p.status();
    b.device_ = device;
    b.data_ = static_cast<T*>(*p);
    b.count_ = count;
    return b;
  }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Release();
    device_ = o.device_;
    data_ = o.data_;
    count_ = o.count_;
    o.data_ = nullptr;
    o.count_ = 0;
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Release(); }

  T* data() const { return data_; }
  Device* device() const { return device_; }
  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }

  void CopyFromHost(const T* src) { device_->CopyFromHost(data_, src, count_ * sizeof(T)); }
  std::vector<T> ToHost() const {
    std::vector<T> v(count_);
    if (count_ > 0) device_->CopyToHost(v.data(), data_, count_ * sizeof(T));
    return v;
  }

 private:
  void Release() {
    if (data_ != nullptr) device_->Free(data_);
    data_ = nullptr;
    count_ = 0;
  }
  Device* device_ = nullptr;
  T* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_CORE_DEVICE_H_

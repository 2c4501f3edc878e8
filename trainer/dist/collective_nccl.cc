// NCCL between the GPUs of one process. libnccl.so.2 is loaded at run time (as NVML is), so
// binaries need it only for multi-GPU runs: the CUDA toolkit ships it, the GPU machines have
// it in PyTorch's nvidia packages, and a run that cannot load it fails naming why.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/runtime/cuda_context.h"
#include "trainer/dist/collective.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

// The part of NCCL's C API used here, resolved from the library.
struct NcclApi {
  void* lib = nullptr;
  ncclResult_t (*comm_init_all)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t) = nullptr;
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                             cudaStream_t) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*comm_abort)(ncclComm_t) = nullptr;
  ncclResult_t (*get_version)(int*) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;

  absl::Status Check(ncclResult_t rc, const std::string& what) const {
    if (rc == ncclSuccess) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("NCCL ", what, ": ", error_string(rc)));
  }
};

absl::StatusOr<NcclApi> LoadNccl() {
  NcclApi api;
  api.lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (api.lib == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("device.gpus: data parallelism on GPUs needs NCCL (libnccl.so.2: ", dlerror(),
                     "); put the directory holding it on LD_LIBRARY_PATH"));
  }
  bool missing = false;
  auto sym = [&](auto* fn, const char* name) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(api.lib, name));
    missing = missing || *fn == nullptr;
  };
  sym(&api.comm_init_all, "ncclCommInitAll");
  sym(&api.all_reduce, "ncclAllReduce");
  sym(&api.all_gather, "ncclAllGather");
  sym(&api.comm_destroy, "ncclCommDestroy");
  sym(&api.comm_abort, "ncclCommAbort");
  sym(&api.get_version, "ncclGetVersion");
  sym(&api.error_string, "ncclGetErrorString");
  if (missing) {
    dlclose(api.lib);
    return absl::FailedPreconditionError("libnccl.so.2 lacks an entry point Topiary uses");
  }
  return api;
}

class NcclCollective : public Collective {
 public:
  struct Rank {
    Device* device = nullptr;
    ncclComm_t comm = nullptr;
    cudaStream_t side = nullptr;
    cudaEvent_t forked = nullptr, joined = nullptr;
    kernels::CudaContext side_ctx;
    float* gathered = nullptr;  // ordered mode: ranks x reserved floats
    size_t reserved = 0;
  };

  NcclCollective(NcclApi api, bool ordered) : api_(api), ordered_(ordered) {}
  ~NcclCollective() override {
    for (Rank& r : ranks_) {
      kernels::ScopedCudaDevice on(r.device->ordinal());
      if (r.side) cudaStreamSynchronize(r.side);
      if (r.comm) (aborted_ ? api_.comm_abort : api_.comm_destroy)(r.comm);
      if (r.gathered) cudaFree(r.gathered);
      if (r.forked) cudaEventDestroy(r.forked);
      if (r.joined) cudaEventDestroy(r.joined);
      if (r.side) cudaStreamDestroy(r.side);
    }
    // NCCL's library stays loaded: its threads may outlive the communicators briefly.
  }

  absl::Status Init(const std::vector<Device*>& devices) {
    ranks_.resize(devices.size());
    std::vector<int> ordinals;
    for (size_t i = 0; i < devices.size(); ++i) {
      Rank& r = ranks_[i];
      r.device = devices[i];
      ordinals.push_back(r.device->ordinal());
      kernels::ScopedCudaDevice on(r.device->ordinal());
      const std::string where = r.device->name();
      TOPIARY_RETURN_IF_ERROR(kernels::CudaStatus(
          cudaStreamCreateWithFlags(&r.side, cudaStreamNonBlocking), where + " gradient stream"));
      TOPIARY_RETURN_IF_ERROR(kernels::CudaStatus(
          cudaEventCreateWithFlags(&r.forked, cudaEventDisableTiming), where + " event"));
      TOPIARY_RETURN_IF_ERROR(kernels::CudaStatus(
          cudaEventCreateWithFlags(&r.joined, cudaEventDisableTiming), where + " event"));
      r.side_ctx.stream = r.side;
      r.side_ctx.sm_count = r.device->cuda()->sm_count;
    }
    std::vector<ncclComm_t> comms(devices.size());
    TOPIARY_RETURN_IF_ERROR(api_.Check(
        api_.comm_init_all(comms.data(), static_cast<int>(comms.size()), ordinals.data()),
        "communicator setup"));
    for (size_t i = 0; i < comms.size(); ++i) ranks_[i].comm = comms[i];
    int version = 0;
    api_.get_version(&version);
    name_ = absl::StrFormat("nccl %d.%d.%d%s", version / 10000, version / 100 % 100, version % 100,
                            ordered_ ? ", ordered" : "");
    return absl::OkStatus();
  }

  int ranks() const override { return static_cast<int>(ranks_.size()); }
  std::string name() const override { return name_; }

  absl::Status Reserve(int rank, size_t n) override {
    Rank& r = ranks_[rank];
    if (!ordered_ || n <= r.reserved) return absl::OkStatus();
    kernels::ScopedCudaDevice on(r.device->ordinal());
    if (r.gathered) cudaFree(r.gathered);
    r.gathered = nullptr;
    r.reserved = 0;
    TOPIARY_RETURN_IF_ERROR(kernels::CudaStatus(
        cudaMalloc(&r.gathered, n * ranks_.size() * sizeof(float)), "gradient gather buffer"));
    r.reserved = n;
    return absl::OkStatus();
  }

  const kernels::CudaContext* side(int rank) const override { return &ranks_[rank].side_ctx; }

  absl::Status Fork(int rank) override {
    Rank& r = ranks_[rank];
    const cudaStream_t main = r.device->cuda()->stream;
    TOPIARY_RETURN_IF_ERROR(kernels::CudaStatus(cudaEventRecord(r.forked, main), "fork"));
    return kernels::CudaStatus(cudaStreamWaitEvent(r.side, r.forked, 0), "fork");
  }
  absl::Status Join(int rank) override {
    Rank& r = ranks_[rank];
    const cudaStream_t main = r.device->cuda()->stream;
    TOPIARY_RETURN_IF_ERROR(kernels::CudaStatus(cudaEventRecord(r.joined, r.side), "join"));
    return kernels::CudaStatus(cudaStreamWaitEvent(main, r.joined, 0), "join");
  }

  absl::Status AllReduceMean(int rank, float* data, size_t n) override {
    if (aborted_) return absl::AbortedError("another rank failed");
    Rank& r = ranks_[rank];
    if (!ordered_) {
      return api_.Check(api_.all_reduce(data, data, n, ncclFloat32, ncclAvg, r.comm, r.side),
                        "all-reduce");
    }
    if (n > r.reserved) {
      return absl::InternalError(
          absl::StrFormat("all-reduce of %d floats exceeds the %d reserved", n, r.reserved));
    }
    // Every rank's values side by side, then summed in rank order by each rank alike.
    TOPIARY_RETURN_IF_ERROR(api_.Check(
        api_.all_gather(data, r.gathered, n, ncclFloat32, r.comm, r.side), "all-gather"));
    return kernels::MeanRowsCuda(ranks(), static_cast<int64_t>(n), r.gathered, data, r.side_ctx);
  }

  absl::Status AllGather(int rank, const float* data, size_t n, float* all) override {
    if (aborted_) return absl::AbortedError("another rank failed");
    Rank& r = ranks_[rank];
    return api_.Check(api_.all_gather(data, all, n, ncclFloat32, r.comm, r.device->cuda()->stream),
                      "all-gather");
  }

  void Abort() override { aborted_ = true; }

 private:
  NcclApi api_;
  bool ordered_;
  std::string name_;
  std::vector<Rank> ranks_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> MakeNcclCollective(const std::vector<Device*>& devices,
                                                               bool ordered) {
  for (Device* d : devices) {
    if (d->cuda() == nullptr) {
      return absl::InvalidArgumentError("NCCL needs GPU devices, not " + d->name());
    }
  }
  TOPIARY_ASSIGN_OR_RETURN(auto api, LoadNccl());
  auto c = std::make_unique<NcclCollective>(api, ordered);
  TOPIARY_RETURN_IF_ERROR(c->Init(devices));
  return std::unique_ptr<Collective>(std::move(c));
}

}  // namespace topiary

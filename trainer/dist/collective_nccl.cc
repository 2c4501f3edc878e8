// NCCL between the GPUs of one process. libnccl.so.2 is loaded at run time (as NVML is), so
// binaries need it only for multi-GPU runs: the CUDA toolkit ships it, the GPU machines have
// it in PyTorch's nvidia packages, and a run that cannot load it fails naming why.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/runtime/cuda_context.h"
#include "trainer/dist/collective.h"
#include "trainer/dist/rendezvous.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

// The part of NCCL's C API used here, resolved from the library.
struct NcclApi {
  void* lib = nullptr;
  ncclResult_t (*comm_init_all)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t) = nullptr;
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
  sym(&api.get_unique_id, "ncclGetUniqueId");
  sym(&api.comm_init_rank, "ncclCommInitRank");
  sym(&api.broadcast, "ncclBroadcast");
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
    char* staged = nullptr;  // ExchangeHost: the ranks' host bytes, on the device
    size_t staged_bytes = 0;
  };

  NcclCollective(NcclApi api, bool ordered) : api_(api), ordered_(ordered) {}
  ~NcclCollective() override {
    for (Rank& r : ranks_) {
      kernels::ScopedCudaDevice on(r.device->ordinal());
      if (r.side) cudaStreamSynchronize(r.side);
      if (r.comm) (aborted_ ? api_.comm_abort : api_.comm_destroy)(r.comm);
      if (r.gathered) cudaFree(r.gathered);
      if (r.staged) cudaFree(r.staged);
      if (r.forked) cudaEventDestroy(r.forked);
      if (r.joined) cudaEventDestroy(r.joined);
      if (r.side) cudaStreamDestroy(r.side);
    }
    // NCCL's library stays loaded: its threads may outlive the communicators briefly.
  }

  // The GPUs of this process, one communicator each (ncclCommInitAll).
  absl::Status Init(const std::vector<Device*>& devices) {
    TOPIARY_RETURN_IF_ERROR(CreateStreams(devices));
    std::vector<int> ordinals;
    for (Device* d : devices) ordinals.push_back(d->ordinal());
    std::vector<ncclComm_t> comms(devices.size());
    TOPIARY_RETURN_IF_ERROR(api_.Check(
        api_.comm_init_all(comms.data(), static_cast<int>(comms.size()), ordinals.data()),
        "communicator setup"));
    for (size_t i = 0; i < comms.size(); ++i) ranks_[i].comm = comms[i];
    world_size_ = static_cast<int>(devices.size());
    return Named();
  }

  // One GPU of a world of processes: NCCL's bootstrap, its unique id passed through the
  // rendezvous directory.
  absl::Status InitWorld(Device* device, const World& world, double timeout_s) {
    TOPIARY_RETURN_IF_ERROR(CreateStreams({device}));
    ncclUniqueId id;
    if (world.rank == 0) {
      TOPIARY_RETURN_IF_ERROR(api_.Check(api_.get_unique_id(&id), "unique id"));
      TOPIARY_RETURN_IF_ERROR(
          Publish(world.rendezvous, "nccl-id", std::string(id.internal, sizeof(id.internal))));
    } else {
      TOPIARY_ASSIGN_OR_RETURN(
          const std::string bytes,
          AwaitPublished(world.rendezvous, "nccl-id", sizeof(id.internal), timeout_s));
      std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
    }
    kernels::ScopedCudaDevice on(device->ordinal());
    TOPIARY_RETURN_IF_ERROR(
        api_.Check(api_.comm_init_rank(&ranks_[0].comm, world.size, id, world.rank),
                   absl::StrFormat("communicator setup (rank %d of %d)", world.rank, world.size)));
    world_size_ = world.size;
    global_rank_ = world.rank;
    return Named();
  }

  int ranks() const override { return world_size_; }
  std::string name() const override { return name_; }

  absl::Status Reserve(int rank, size_t n) override {
    Rank& r = ranks_[rank];
    if (!ordered_ || n <= r.reserved) return absl::OkStatus();
    kernels::ScopedCudaDevice on(r.device->ordinal());
    if (r.gathered) cudaFree(r.gathered);
    r.gathered = nullptr;
    r.reserved = 0;
    TOPIARY_RETURN_IF_ERROR(kernels::CudaStatus(
        cudaMalloc(&r.gathered, n * ranks() * sizeof(float)), "gradient gather buffer"));
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

  absl::Status Broadcast(int rank, float* data, size_t n) override {
    if (aborted_) return absl::AbortedError("another rank failed");
    Rank& r = ranks_[rank];
    const cudaStream_t stream = r.device->cuda()->stream;
    TOPIARY_RETURN_IF_ERROR(api_.Check(
        api_.broadcast(data, data, n, ncclFloat32, /*root=*/0, r.comm, stream), "broadcast"));
    return kernels::CudaStatus(cudaStreamSynchronize(stream), "broadcast");
  }

  // Through the device: the bytes staged there, gathered, and copied back.
  absl::Status ExchangeHost(int rank, const void* data, size_t n, void* all) override {
    if (aborted_) return absl::AbortedError("another rank failed");
    Rank& r = ranks_[rank];
    kernels::ScopedCudaDevice on(r.device->ordinal());
    const size_t bytes = n * ranks();
    if (bytes > r.staged_bytes) {
      if (r.staged) cudaFree(r.staged);
      r.staged = nullptr;
      r.staged_bytes = 0;
      TOPIARY_RETURN_IF_ERROR(
          kernels::CudaStatus(cudaMalloc(&r.staged, bytes), "host exchange buffer"));
      r.staged_bytes = bytes;
    }
    const cudaStream_t stream = r.device->cuda()->stream;
    char* mine = r.staged + n * RankIndex(rank);
    TOPIARY_RETURN_IF_ERROR(kernels::CudaStatus(
        cudaMemcpyAsync(mine, data, n, cudaMemcpyHostToDevice, stream), "host exchange"));
    TOPIARY_RETURN_IF_ERROR(
        api_.Check(api_.all_gather(mine, r.staged, n, ncclUint8, r.comm, stream), "host exchange"));
    TOPIARY_RETURN_IF_ERROR(kernels::CudaStatus(
        cudaMemcpyAsync(all, r.staged, bytes, cudaMemcpyDeviceToHost, stream), "host exchange"));
    return kernels::CudaStatus(cudaStreamSynchronize(stream), "host exchange");
  }

  void Abort() override { aborted_ = true; }

 private:
  // The global rank of local rank `rank`: itself in one process, the world's in a world.
  int RankIndex(int rank) const { return ranks_.size() == 1 ? global_rank_ : rank; }

  absl::Status CreateStreams(const std::vector<Device*>& devices) {
    ranks_.resize(devices.size());
    for (size_t i = 0; i < devices.size(); ++i) {
      Rank& r = ranks_[i];
      r.device = devices[i];
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
    return absl::OkStatus();
  }

  absl::Status Named() {
    int version = 0;
    api_.get_version(&version);
    name_ = absl::StrFormat(
        "nccl %d.%d.%d%s%s", version / 10000, version / 100 % 100, version % 100,
        ordered_ ? ", ordered" : "",
        ranks_.size() == 1 ? absl::StrFormat(", %d processes", world_size_) : std::string());
    return absl::OkStatus();
  }

  NcclApi api_;
  bool ordered_;
  std::string name_;
  std::vector<Rank> ranks_;  // this process's
  int world_size_ = 0;
  int global_rank_ = 0;  // of ranks_[0], in a world of processes
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

absl::StatusOr<std::unique_ptr<Collective>> MakeNcclWorldCollective(Device* device,
                                                                    const World& world,
                                                                    bool ordered,
                                                                    double timeout_s) {
  TOPIARY_ASSIGN_OR_RETURN(auto api, LoadNccl());
  auto c = std::make_unique<NcclCollective>(api, ordered);
  TOPIARY_RETURN_IF_ERROR(c->InitWorld(device, world, timeout_s));
  return std::unique_ptr<Collective>(std::move(c));
}

}  // namespace topiary

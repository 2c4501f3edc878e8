// The CUDA entry points of kernels/sparse in a CPU-only build (see kernels/runtime/no_cuda.h).
#include "kernels/runtime/no_cuda.h"
#include "kernels/sparse/block_sparse_conv.h"

namespace topiary::kernels {

struct BlockSparseConvCuda::Device {};
absl::StatusOr<std::unique_ptr<BlockSparseConvCuda>> BlockSparseConvCuda::Create(
    const ConvShape&, const BlockGrid&, DType, const CudaContext&) {
  return NoCuda();
}
BlockSparseConvCuda::~BlockSparseConvCuda() = default;
int BlockSparseConvCuda::configs(SparsePass) const { return 0; }
absl::Status BlockSparseConvCuda::set_config(SparsePass, int) { return NoCuda(); }
std::string BlockSparseConvCuda::config_name(SparsePass) const { return "unavailable"; }
absl::Status BlockSparseConvCuda::Run(SparsePass, int, const void*, const void*, void*,
                                      const float*, float*, const CudaContext&, float*) const {
  return NoCuda();
}
absl::Status BlockSparseConvCuda::Forward(const void*, const void*, const float*, void*,
                                          const CudaContext&, float*) const {
  return NoCuda();
}
int BlockSparseConvCuda::forward_moment_slices(const CudaContext&) const { return 0; }
absl::Status BlockSparseConvCuda::BackwardData(const void*, const void*, void*,
                                               const CudaContext&) const {
  return NoCuda();
}
absl::Status BlockSparseConvCuda::BackwardFilter(const void*, const void*, void*, float*,
                                                 const CudaContext&) const {
  return NoCuda();
}
absl::StatusOr<float> BlockSparseConvCuda::Tune(SparsePass, const void*, const void*, void*,
                                                const CudaContext&) {
  return NoCuda();
}

}  // namespace topiary::kernels

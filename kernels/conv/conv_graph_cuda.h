// One convolution pass through cuDNN's graph (backend) API: the engine configurations that
// cuDNN's heuristics propose for the operation, finalized into execution plans. The graph API
// reaches engines the legacy convolution API does not offer (in cuDNN 9 the legacy API picks
// among a fixed list of algorithms, several of them slow for bf16 NHWC), so ConvCudaPlan times
// both and keeps the fastest. Internal to kernels/conv/conv_cuda.cc.
#ifndef TOPIARY_KERNELS_CONV_CONV_GRAPH_CUDA_H_
#define TOPIARY_KERNELS_CONV_CONV_GRAPH_CUDA_H_

#include <cudnn.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/conv/conv.h"
#include "kernels/runtime/cuda_context.h"

namespace topiary::kernels {

enum class ConvPass { kForward, kBackwardData, kBackwardFilter };

class GraphConvPass {
 public:
  // Up to max_plans plans, in the heuristics' order, that finalize, need at most
  // workspace_limit bytes, and meet the numeric rules: no tensor cores in fp32 (which would
  // mean TF32), and no nondeterministic engines when deterministic is set. With only_engine
  // >= 0, only that engine (cuDNN's global index) is considered. May be empty.
  static absl::StatusOr<std::vector<std::unique_ptr<GraphConvPass>>> Candidates(
      const ConvShape& shape, Precision precision, ConvPass pass, size_t workspace_limit,
      bool deterministic, int max_plans, const CudaContext& ctx, int64_t only_engine = -1);
  ~GraphConvPass();
  GraphConvPass(const GraphConvPass&) = delete;
  GraphConvPass& operator=(const GraphConvPass&) = delete;

  size_t workspace_bytes() const { return workspace_bytes_; }
  // "engine 12" (cuDNN's global engine index), for logs.
  const std::string& name() const { return name_; }
  int64_t engine() const { return engine_; }

  // The pass's operands in the order of the legacy calls: forward (x, w -> y), backward data
  // (dy, w -> dx), backward filter (x, dy -> dw). Overwrites the output.
  absl::Status Run(const void* in0, const void* in1, void* out, void* workspace,
                   const CudaContext& ctx) const;

 private:
  GraphConvPass() = default;
  std::shared_ptr<void> graph_;  // keeps the operation graph alive for the plan
  cudnnBackendDescriptor_t plan_ = nullptr;
  int64_t uid_in0_ = 0, uid_in1_ = 0, uid_out_ = 0;
  size_t workspace_bytes_ = 0;
  int64_t engine_ = -1;
  std::string name_;
};

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_CONV_CONV_GRAPH_CUDA_H_

// 2-D convolution (groups = 1) on NHWC activations with KRSC filters.
//
// CPU: im2col reduction to GEMM (Caffe's method), processed in chunks of images so the
// column buffer stays small; 1x1 stride-1 unpadded convolutions skip im2col entirely.
// Filters are [K, R, S, C] in memory, so a filter row is one im2col row and both the
// forward and the backward passes are single GEMMs per chunk.
#ifndef TOPIARY_KERNELS_CONV_CONV_H_
#define TOPIARY_KERNELS_CONV_CONV_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/runtime/dtype.h"
#include "kernels/runtime/host_device.h"

namespace topiary::kernels {

struct CudaContext;

struct ConvShape {
  int n = 0, h = 0, w = 0, c = 0;  // input  [N, H, W, C]
  int k = 0, r = 0, s = 0;         // filter [K, R, S, C]
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;

  TOPIARY_HD int ho() const { return (h + 2 * pad_h - r) / stride_h + 1; }
  TOPIARY_HD int wo() const { return (w + 2 * pad_w - s) / stride_w + 1; }
  // Length of one im2col row (one output pixel's receptive field).
  TOPIARY_HD int patch() const { return r * s * c; }
  TOPIARY_HD bool is_pointwise() const {
    return r == 1 && s == 1 && stride_h == 1 && stride_w == 1 && pad_h == 0 && pad_w == 0;
  }
};

// OK when every size is positive and the output is at least 1x1; otherwise names the problem.
absl::Status CheckConvShape(const ConvShape& shape);

// Backward data at stride 1 (padding at most the filter's side less 1) as a forward
// convolution: dx = conv(dy, w') with w'[c, r, s, k] = w[k, R-1-r, S-1-s, c] and padding
// R-1-pad. This is that convolution's shape: input dy (Ho x Wo x K), output H x W x C.
ConvShape TransposedConvShape(const ConvShape& shape);

// Whether TOPIARY_CONV_LOG is set: convolution planning and dispatch then print what they
// measured and chose to stderr.
bool ConvLogEnabled();

// Floats of scratch memory the CPU kernels below need (0 for pointwise convolutions).
size_t ConvWorkspaceFloatsCpu(const ConvShape& shape);

// y[N, Ho, Wo, K] = conv(x, w) (+ bias[K] when bias != nullptr).
// REQUIRES: CheckConvShape(shape).ok(); workspace holds ConvWorkspaceFloatsCpu(shape) floats.
void Conv2dForwardCpu(const ConvShape& shape, const float* x, const float* w, const float* bias,
                      float* y, float* workspace);

// dx[N, H, W, C] = gradient of the loss w.r.t. x given dy[N, Ho, Wo, K] (overwrites dx).
void Conv2dBackwardDataCpu(const ConvShape& shape, const float* dy, const float* w, float* dx,
                           float* workspace);

// dw[K, R, S, C] (and dbias[K] when not null) = gradients w.r.t. the filter (overwrites).
void Conv2dBackwardFilterCpu(const ConvShape& shape, const float* x, const float* dy, float* dw,
                             float* dbias, float* workspace);

// What a ConvCudaPlan runs for one pass: enough to make the same plan again without searching
// (trainer/nn/plan_cache.h keeps these on disk).
struct ConvPassAlgo {
  bool graph = false;   // a graph-API engine (`engine`), else a legacy algorithm (`algo`, `math`)
  bool direct = false;  // instead of either: Topiary's direct fp32 kernel (direct_conv.h)
  int64_t engine = -1;  // cuDNN's global engine index
  int algo = 0;         // the pass's cudnnConvolution*Algo_t
  int math = 0;         // cudnnMathType_t
  float ms = -1;        // the time measured when it was chosen; -1: the heuristics' pick, untimed
};
struct ConvAlgos {
  ConvPassAlgo pass[3];  // forward, backward data, backward filter
};

// How ConvCudaPlan::Create chooses.
struct ConvSearch {
  // Make the plan from these choices (a cache's). A choice that does not work here (another
  // cuDNN, a damaged cache) is searched for instead, as without one.
  const ConvAlgos* known = nullptr;
  // Time the candidates (at most 8 graph engines and the legacy heuristics' pick per pass,
  // and in fp32 and TF32 the direct kernels of direct_conv.h where they take the shape; slow
  // ones after a single run) and keep the fastest; false takes the heuristics' first
  // usable choice untimed, as deterministic plans always do.
  bool measure = true;
};

// How a plan's choices were made.
enum class ConvPlanSource { kKnown, kMeasured, kHeuristic };

// The GPU, driver and cuDNN a plan's measurements hold for, as one line: "NVIDIA H100 80GB
// HBM3|sm_90|driver 13000|cudnn 91900". Empty without CUDA.
std::string ConvDeviceIdentity(const CudaContext& ctx);

// A convolution planned for cuDNN: descriptors for NHWC activations and KRSC filters, and the
// fastest algorithm for each pass, chosen by measurement when planned (see ConvSearch). Not
// thread-safe; used from the stream of the context it was planned with.
//
// Precision (kernels/runtime/dtype.h): kFp32 is IEEE single precision (the reference semantics);
// kTf32 lets tensor cores round fp32 operands to TF32; kBf16 takes bf16 activations,
// filters and gradients and accumulates in fp32.
class ConvCudaPlan {
 public:
  // Chooses each pass's algorithm as `search` says, timing candidates on zeroed scratch
  // operands it allocates and frees. Algorithms whose workspace exceeds workspace_limit bytes
  // are not considered, nor, when deterministic is set, those whose results may vary from
  // run to run (atomics).
  static absl::StatusOr<std::unique_ptr<ConvCudaPlan>> Create(
      const ConvShape& shape, Precision precision, size_t workspace_limit, bool deterministic,
      const CudaContext& ctx, const ConvSearch& search = {});
  ~ConvCudaPlan();
  ConvCudaPlan(const ConvCudaPlan&) = delete;
  ConvCudaPlan& operator=(const ConvCudaPlan&) = delete;

  // Bytes of workspace the chosen algorithms need (the maximum over the three passes).
  size_t workspace_bytes() const { return workspace_bytes_; }
  const ConvShape& shape() const { return shape_; }
  // The element type of x, y, w and their gradients.
  DType dtype() const { return dtype_; }
  // What runs for each pass, and how that was chosen.
  const ConvAlgos& algos() const { return algos_; }
  ConvPlanSource source() const { return source_; }

  // The passes, as the CPU functions above, on elements of dtype() (bias and dbias are fp32
  // and may be null).
  absl::Status Forward(const void* x, const void* w, const float* bias, void* y, void* workspace,
                       const CudaContext& ctx) const;
  absl::Status BackwardData(const void* dy, const void* w, void* dx, void* workspace,
                            const CudaContext& ctx) const;
  absl::Status BackwardFilter(const void* x, const void* dy, void* dw, float* dbias,
                              void* workspace, const CudaContext& ctx) const;

 public:
  struct Descriptors;  // cuDNN state; defined by the implementation

 private:
  ConvCudaPlan() = default;
  // Pass 0 forward (x, w -> y), 1 backward data (dy, w -> dx), 2 backward filter (x, dy -> dw).
  absl::Status RunPass(int pass, const void* in0, const void* in1, void* out, void* workspace,
                       const CudaContext& ctx) const;
  ConvShape shape_;
  DType dtype_ = DType::kF32;
  std::unique_ptr<Descriptors> d_;
  size_t workspace_bytes_ = 0;
  ConvAlgos algos_;
  ConvPlanSource source_ = ConvPlanSource::kMeasured;
};

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_CONV_CONV_H_

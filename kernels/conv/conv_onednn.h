// CPU convolutions through oneDNN (Debian's libdnnl, 2.x): its JIT kernels for the CPU's
// vector units, on the network's own NHWC activations and [K, R, S, C] filters. Filters are
// reordered into oneDNN's preferred blocked layout on every pass (they are small; activations
// never are). The im2col + OpenBLAS kernels of conv.h stay the reference: they check this
// path in tests and run wherever oneDNN is not built in (static builds) or is turned off
// (TOPIARY_CPU_CONV=reference).
#ifndef TOPIARY_KERNELS_CONV_CONV_ONEDNN_H_
#define TOPIARY_KERNELS_CONV_CONV_ONEDNN_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/conv/conv.h"

namespace topiary::kernels {

class ConvOneDnnPlan {
 public:
  // Whether this build has oneDNN and TOPIARY_CPU_CONV is not "reference".
  static bool Enabled();
  // Primitives for the three passes of `shape` (fp32). UNAVAILABLE without oneDNN.
  static absl::StatusOr<std::unique_ptr<ConvOneDnnPlan>> Create(const ConvShape& shape);
  ~ConvOneDnnPlan();
  ConvOneDnnPlan(const ConvOneDnnPlan&) = delete;
  ConvOneDnnPlan& operator=(const ConvOneDnnPlan&) = delete;

  // As Conv2dForwardCpu, Conv2dBackwardDataCpu and Conv2dBackwardFilterCpu (no workspace:
  // the plan owns its scratch). bias and dbias may be null.
  absl::Status Forward(const float* x, const float* w, const float* bias, float* y);
  absl::Status BackwardData(const float* dy, const float* w, float* dx);
  absl::Status BackwardFilter(const float* x, const float* dy, float* dw, float* dbias);

  // oneDNN's implementation of each pass, e.g. "brg:avx512_core" (for logs and benchmarks).
  std::string implementations() const;

  struct Impl;  // oneDNN objects; defined by the implementation

 private:
  ConvOneDnnPlan() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_CONV_CONV_ONEDNN_H_

#include "trainer/run/evaluate.h"

#include <algorithm>

#include "util/status_macros.h"

namespace topiary {

kernels::Precision PrecisionOf(topiary::v1::TrainSpec::Precision p) {
  switch (p) {
    case topiary::v1::TrainSpec::TF32:
      return kernels::Precision::kTf32;
    case topiary::v1::TrainSpec::BF16:
      return kernels::Precision::kBf16;
    default:
      return kernels::Precision::kFp32;
  }
}

PlanOptions PlanOptionsForSpec(const topiary::v1::ExperimentSpec& spec) {
  PlanOptions options;
  options.precision = PrecisionOf(spec.train().precision());
  options.deterministic = spec.device().deterministic();
  return options;
}

absl::StatusOr<EvalResult> Evaluate(Network& net, DeviceBatches& data, int64_t images) {
  const int batch = net.batch();
  TOPIARY_RETURN_IF_ERROR(net.TakeMetrics().status());  // start from zero
  for (int64_t first = 0; first < images; first += batch) {
    const int count = static_cast<int>(std::min<int64_t>(batch, images - first));
    // Rows past `count` keep the previous batch's images: inference treats each image on
    // its own, so they cannot affect the real ones, and they are not counted.
    TOPIARY_RETURN_IF_ERROR(
        data.Assemble(nullptr, 0, first, count, false, net.input(), net.labels()));
    TOPIARY_RETURN_IF_ERROR(net.Forward(false, /*count_input_zeros=*/count));
    TOPIARY_RETURN_IF_ERROR(net.Loss(0.0f, count));
  }
  TOPIARY_ASSIGN_OR_RETURN(auto m, net.TakeMetrics());
  TOPIARY_ASSIGN_OR_RETURN(auto zeros, net.TakeConvInputZeros());
  EvalResult r;
  r.conv_input_zeros = std::move(zeros);
  r.images = static_cast<int64_t>(m.images);
  r.loss = m.loss();
  r.top1 = m.top1_rate();
  r.top5 = m.top5_rate();
  return r;
}

}  // namespace topiary

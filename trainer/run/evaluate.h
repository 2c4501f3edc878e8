// Evaluation of a network on a test set, and the numeric mode a spec trains in.
#ifndef TOPIARY_TRAINER_RUN_EVALUATE_H_
#define TOPIARY_TRAINER_RUN_EVALUATE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/runtime/dtype.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/data/device_batches.h"
#include "trainer/nn/model.h"

namespace topiary {

struct EvalResult {
  double loss = 0, top1 = 0, top5 = 0;  // top1/top5 as fractions
  int64_t images = 0;
  bool validation = false;      // of data.validation_fraction's held-out images, not the test set
  double joules_per_image = 0;  // GPU board energy (NVML); 0 where not measured
  // Per convolution (model order): the zero fraction of its input over the images evaluated.
  std::vector<std::pair<std::string, double>> conv_input_zeros;
};

// An evaluation's top-1 and loss into a report (an epoch's, a round's, a run's summary or
// its checkpoints' metrics): its val_* fields for the validation set, else its test_* ones.
template <typename Report>
void SetEvalFigures(const EvalResult& r, Report* report) {
  if (r.validation) {
    report->set_val_top1(r.top1);
    report->set_val_loss(r.loss);
  } else {
    report->set_test_top1(r.top1);
    report->set_test_loss(r.loss);
  }
}

// Evaluates `net` (inference mode) on the first `images` images of data's order, in batches
// of net.batch(); the last partial batch counts only its real images.
absl::StatusOr<EvalResult> Evaluate(Network& net, DeviceBatches& data, int64_t images);

// The kernels' numeric mode of a spec's train.precision.
kernels::Precision PrecisionOf(topiary::v1::TrainSpec::Precision p);

// The planning options of a spec (precision, determinism): the one mapping from a spec to
// how its networks are planned; callers change only what they are about (an evaluation's
// precision, a benchmark's block-sparse mode).
PlanOptions PlanOptionsForSpec(const topiary::v1::ExperimentSpec& spec);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_RUN_EVALUATE_H_

#include "trainer/run/step_runner.h"

#include "util/status_macros.h"

namespace topiary {

absl::Status StepRunner::Run() {
  if (graph_) return graph_->Replay();
  if (!use_graph_ || eager_left_ > 0) {
    --eager_left_;
    return step_();
  }
  TOPIARY_RETURN_IF_ERROR(device_->BeginCapture());
  const absl::Status recorded = step_();
  auto graph = device_->EndCapture();  // always end the capture, even after an error
  TOPIARY_RETURN_IF_ERROR(recorded);
  if (!graph.ok()) return graph.status();
  graph_ = std::move(*graph);
  return graph_->Replay();  // capturing recorded the step without running it
}

}  // namespace topiary

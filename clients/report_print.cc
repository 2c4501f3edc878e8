#include "clients/report_print.h"

#include <google/protobuf/util/json_util.h>

#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "pruning/checkpoint_report.h"
#include "topiary/v1/events.pb.h"

namespace topiary {

void PrintCheckpointReport(const topiary::v1::CheckpointReport& r) {
  topiary::v1::CheckpointMetrics metrics;
  google::protobuf::util::JsonParseOptions lenient;
  lenient.ignore_unknown_fields = true;
  (void)google::protobuf::util::JsonStringToMessage(r.metrics_json(), &metrics, lenient);
  absl::PrintF("%s (topiary checkpoint, format %d)\n", r.path(), r.format_version());
  absl::PrintF("experiment %s: %s, round %d, epoch %d, step %d, written %s\n",
               r.experiment_id().empty() ? "-" : r.experiment_id(), r.model_arch(), r.round(),
               r.epoch(), r.global_step(), r.created_at());
  if (!r.parent().empty()) absl::PrintF("parent %s\n", r.parent());
  absl::PrintF(
      "test top-1 %.2f%%, loss %.4f (dense model: %.2f%%); %d parameters; conv and "
      "linear sparsity %.1f%%\n\n",
      100 * metrics.test_top1(), metrics.test_loss(), 100 * metrics.dense_top1(), r.parameters(),
      100 * r.sparsity());
  absl::PrintF("%-30s %-16s %-8s %-13s %8s %9s %9s %9s\n", "layer", "shape (OIHW)", "mask",
               "blocks kept", "sparsity", "mean", "std", "|w| max");
  for (const auto& l : r.layers()) {
    std::vector<std::string> dims;
    for (int64_t d : l.shape()) dims.push_back(std::to_string(d));
    const std::string mask = l.mask_kind() == "n_of_m"
                                 ? absl::StrFormat("%d:%d", l.n(), l.m())
                                 : (l.mask_kind().empty() ? "-" : l.mask_kind());
    const std::string blocks =
        l.mask_kind() == "block"
            ? absl::StrFormat("%d/%d", l.blocks_kept(), l.block_rows() * l.block_cols())
            : "-";
    absl::PrintF("%-30s %-16s %-8s %-13s %7.1f%% %9.4f %9.4f %9.4f%s\n", l.layer(),
                 absl::StrJoin(dims, "x"), mask, blocks, 100 * l.sparsity(), l.stats().mean(),
                 l.stats().std(), l.stats().abs_max(),
                 l.mask_consistent() ? "" : "  (masked weights not zero!)");
  }
  if (r.layers_size() == 1 && !r.layers(0).mask_kind().empty()) {
    absl::PrintF("\n%s", pruning::MaskHeatMap(r.layers(0)));
  }
}

}  // namespace topiary

#include "trainer/spec/describe.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace topiary {

using topiary::v1::ExperimentSpec;

std::string DescribeMethod(const ExperimentSpec& spec) {
  if (!spec.has_pruning()) return "dense";
  const auto& p = spec.pruning();
  const std::string name = topiary::v1::PruningSpec::Method_Name(p.method());
  if (p.method() == topiary::v1::PruningSpec::BLOCK) {
    return absl::StrFormat("%s %dx%d", name, p.block_in(), p.block_out());
  }
  if (p.method() == topiary::v1::PruningSpec::N_OF_M) {
    return absl::StrFormat("%s %d:%d", name, p.n(), p.m());
  }
  return name;
}

std::string DescribeTarget(const ExperimentSpec& spec) {
  if (!spec.has_pruning()) return "-";
  if (spec.pruning().target_flops() > 0) {
    return absl::StrFormat("flops %g", spec.pruning().target_flops());
  }
  return absl::StrFormat("%g", spec.pruning().target());
}

std::string DescribeMultiplier(const ExperimentSpec& spec) {
  std::vector<std::string> names;
  for (const auto& r : spec.approximation().rules()) {
    if (r.exclude()) continue;
    absl::string_view stem = r.multiplier();
    stem = stem.substr(stem.rfind('/') + 1);
    names.emplace_back(absl::StripSuffix(stem, ".bin"));
  }
  if (names.empty()) return "exact";
  return names.size() == 1 ? names[0] : names[0] + "+";
}

std::string DescribeWeightCode(const ExperimentSpec& spec) {
  if (!spec.has_approximation()) return "-";
  return topiary::v1::ApproximationSpec::WeightCode_Name(spec.approximation().weight_code());
}

std::string DescribeParent(const std::string& checkpoint) {
  if (checkpoint.empty()) return "-";
  const std::vector<std::string> parts = absl::StrSplit(checkpoint, '/', absl::SkipEmpty());
  const std::string file(absl::StripSuffix(parts.back(), ".h5"));
  for (size_t i = 0; i + 3 < parts.size(); ++i) {
    if (parts[i] == "experiments" && parts[i + 2] == "checkpoints") {
      return parts[i + 1] + "/" + file;
    }
  }
  return file;
}

}  // namespace topiary

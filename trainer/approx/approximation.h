// A spec's approximation block applied to a model: every rule's multiplier loaded (errors
// name the rule), and each conv layer given the multiplier of the last rule that matches it.
#ifndef TOPIARY_TRAINER_APPROX_APPROXIMATION_H_
#define TOPIARY_TRAINER_APPROX_APPROXIMATION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/approx/multiplier.h"
#include "trainer/nn/model.h"

namespace topiary {

// The multiplier of every rule (none for exclude rules), in rule order. Errors are
// INVALID_ARGUMENT or the read policy's, prefixed "approximation.rules[i].multiplier: ".
absl::StatusOr<std::vector<std::optional<Multiplier>>> LoadRuleMultipliers(
    const topiary::v1::ApproximationSpec& spec);

// Which conv layers become approximate with which rule: conv layer name -> rule index, in
// model order (layers that stay exact are left out). A rule that matches no conv layer is an
// error naming it (a typo would otherwise silently leave a layer exact).
absl::StatusOr<std::vector<std::pair<std::string, int>>> MatchApproximationRules(
    const topiary::v1::ApproximationSpec& spec, const Model& model);

// One rule per (layer pattern, multiplier) in order (an empty multiplier keeps the matching
// layers exact), with the range mode and weight tuning of `base`.
topiary::v1::ApproximationSpec AssignmentRules(
    const topiary::v1::ApproximationSpec& base,
    const std::vector<std::pair<std::string, std::string>>& layers);

// LoadRuleMultipliers and MatchApproximationRules, then Conv2d::Approximate for each matched
// layer (weight tuning applied to the table when the spec asks). Before any network is
// planned and before a checkpoint is loaded (the moving-average range is a parameter).
absl::Status ApplyApproximation(const topiary::v1::ApproximationSpec& spec, Model* model);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_APPROX_APPROXIMATION_H_

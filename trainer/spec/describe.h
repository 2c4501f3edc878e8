// Short descriptions of what an experiment is, for tables and dashboards: `topiary list` and
// `compare` columns, TensorBoard's hyperparameters.
#ifndef TOPIARY_TRAINER_SPEC_DESCRIBE_H_
#define TOPIARY_TRAINER_SPEC_DESCRIBE_H_

#include <string>

#include "topiary/v1/experiment.pb.h"

namespace topiary {

// "BLOCK 8x8", "CHANNEL", "N_OF_M 2:4", "MAGNITUDE", or "dense" without pruning.
std::string DescribeMethod(const topiary::v1::ExperimentSpec& spec);
// "0.5", "flops 0.5", or "-".
std::string DescribeTarget(const topiary::v1::ExperimentSpec& spec);
// The multiplier of the first approximate rule (its table file's stem), "+" after it when
// there are more; "exact" without approximation.
std::string DescribeMultiplier(const topiary::v1::ExperimentSpec& spec);
// The weight code of an approximate run ("ASYMMETRIC", "SIGN_MAGNITUDE"), "-" otherwise.
std::string DescribeWeightCode(const topiary::v1::ExperimentSpec& spec);
// A checkpoint path, short: "exp-0002/round-003" for one in an experiment's folder (however
// the path starts), the file's name without ".h5" otherwise, "-" for none.
std::string DescribeParent(const std::string& checkpoint);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_SPEC_DESCRIBE_H_

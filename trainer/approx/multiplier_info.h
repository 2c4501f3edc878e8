// Multipliers as reports describe them (protos/topiary/v1/multiplier.proto): the metrics,
// hash and known circuit of one table, and the tables of a folder (the daemon's library).
#ifndef TOPIARY_TRAINER_APPROX_MULTIPLIER_INFO_H_
#define TOPIARY_TRAINER_APPROX_MULTIPLIER_INFO_H_

#include <string>
#include <vector>

#include "topiary/v1/multiplier.pb.h"
#include "trainer/approx/multiplier.h"

namespace topiary {

topiary::v1::MultiplierInfo DescribeMultiplier(const Multiplier& m);

// The most .bin files a folder listing reads.
inline constexpr int kMaxListedMultipliers = 1000;

// Every regular *.bin file directly in `dir` (links are not followed; names sorted), at most
// kMaxListedMultipliers: described, or with `error` set when it is not a valid table. An
// absent folder lists nothing.
std::vector<topiary::v1::MultiplierInfo> ListMultiplierFolder(const std::string& dir);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_APPROX_MULTIPLIER_INFO_H_

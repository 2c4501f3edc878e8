// topiary compare ID...: experiments side by side, from what the daemon keeps of them (their
// records and event logs): what differs in their specs, their final and per-round accuracy,
// sparsity, multiply-adds, step time, energy and their multiplier's power; --json for scripts,
// --png for accuracy against sparsity or multiply-adds, one curve per experiment.
// Also the short columns `topiary list` shows (method, target, multiplier, parent).
#ifndef TOPIARY_CLIENTS_COMPARE_H_
#define TOPIARY_CLIENTS_COMPARE_H_

#include <string>

#include "clients/args.h"
#include "clients/connection.h"
#include "topiary/v1/service.pb.h"

namespace topiary {

int CompareCommand(const Args& a, Connection& c);

// "BLOCK 8x8", "CHANNEL", "N_OF_M 2:4", "MAGNITUDE", or "dense" without pruning.
std::string MethodText(const topiary::v1::ExperimentSpec& spec);
// "0.5", "flops 0.5", or "-".
std::string TargetText(const topiary::v1::ExperimentSpec& spec);
// The multiplier of the first approximate rule (its file's stem), "+" when there are more;
// "exact" without approximation.
std::string MultiplierText(const topiary::v1::ExperimentSpec& spec);
// "exp-0002/round-003" for a fork of that checkpoint, the file's name otherwise, "-" for none.
std::string ParentText(const std::string& parent);

}  // namespace topiary

#endif  // TOPIARY_CLIENTS_COMPARE_H_

// topiary compare ID...: experiments side by side, from what the daemon keeps of them (their
// records and event logs): what differs in their specs, their final and per-round accuracy,
// sparsity, multiply-adds, step time, energy and their multiplier's power; --json for scripts,
// --png for accuracy against sparsity or multiply-adds, one curve per experiment.
#ifndef TOPIARY_CLIENTS_COMPARE_H_
#define TOPIARY_CLIENTS_COMPARE_H_

#include <string>

#include "clients/args.h"
#include "clients/connection.h"
#include "topiary/v1/service.pb.h"

namespace topiary {

int CompareCommand(const Args& a, Connection& c);

}  // namespace topiary

#endif  // TOPIARY_CLIENTS_COMPARE_H_

// The approximate-computing commands of the topiary CLI, run in this process: multipliers
// (a table's metrics), evaluate (a checkpoint under multipliers) and sensitivity (per-layer
// accuracy and a greedy low-power assignment).
#ifndef TOPIARY_CLIENTS_APPROX_COMMANDS_H_
#define TOPIARY_CLIENTS_APPROX_COMMANDS_H_

#include "clients/args.h"

namespace topiary {

// topiary multipliers [NAME|FILE.bin ...] [--json]
int MultipliersCommand(const Args& a);
// topiary evaluate CKPT [--set PATTERN=MULTIPLIER]... [--json]
int EvaluateCommand(const Args& a);
// topiary sensitivity CKPT NAME|FILE.bin... [--budget PTS] [--json]
int SensitivityCommand(const Args& a);

}  // namespace topiary

#endif  // TOPIARY_CLIENTS_APPROX_COMMANDS_H_

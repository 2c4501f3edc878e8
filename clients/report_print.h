// Terminal rendering of a checkpoint report (`topiary inspect`, local or through topiaryd):
// provenance, metrics, the per-layer table and, for a single layer, its mask heat map.
#ifndef TOPIARY_CLIENTS_REPORT_PRINT_H_
#define TOPIARY_CLIENTS_REPORT_PRINT_H_

#include "topiary/v1/checkpoint.pb.h"

namespace topiary {

void PrintCheckpointReport(const topiary::v1::CheckpointReport& report);

}  // namespace topiary

#endif  // TOPIARY_CLIENTS_REPORT_PRINT_H_

// Terminal rendering of a checkpoint report (`topiary inspect`, local or through topiaryd):
// provenance, metrics, the per-layer table and, for a single layer, its mask heat map.
#ifndef TOPIARY_CLIENTS_REPORT_PRINT_H_
#define TOPIARY_CLIENTS_REPORT_PRINT_H_

#include <vector>

#include "topiary/v1/checkpoint.pb.h"
#include "topiary/v1/multiplier.pb.h"
#include "topiary/v1/network.pb.h"

namespace topiary {

// `topiary inspect`'s output, local or through the daemon: the text report, or with `json`
// one ScriptJson line.
// `topiary import`'s result, local or remote: one line, or with json the ImportSummary.
void PrintImportSummary(topiary::v1::ImportSummary s, bool json);

void PrintCheckpointReport(topiary::v1::CheckpointReport report, bool json = false);

// The table of `topiary multipliers` (local or the daemon's): one line per multiplier, or
// with `json` a JSON array of MultiplierInfo.
void PrintMultipliers(bool json, const std::vector<topiary::v1::MultiplierInfo>& rows);

}  // namespace topiary

#endif  // TOPIARY_CLIENTS_REPORT_PRINT_H_

// Run events as flat JSON lines: {"event": "progress", "seq": 3, "time_s": 1.5, ...fields}.
#ifndef TOPIARY_TRAINER_RUN_EVENTS_H_
#define TOPIARY_TRAINER_RUN_EVENTS_H_

#include <string>

#include "topiary/v1/events.pb.h"

namespace topiary {

// The fine-tuning phase after prune step `round`, and a phase as people read it: "dense",
// "round 3".
topiary::v1::Phase FineTunePhase(int round);
std::string PhaseName(const topiary::v1::Phase& phase);

// The event flattened into one line (no trailing newline).
std::string EventToJsonLine(const topiary::v1::Event& event);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_RUN_EVENTS_H_

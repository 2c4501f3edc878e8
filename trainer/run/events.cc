#include "trainer/run/events.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/util/json.h"

namespace topiary {

topiary::v1::Phase FineTunePhase(int round) {
  topiary::v1::Phase p;
  p.set_kind(topiary::v1::Phase::FINE_TUNE);
  p.set_round(round);
  return p;
}

std::string PhaseName(const topiary::v1::Phase& phase) {
  switch (phase.kind()) {
    case topiary::v1::Phase::FINE_TUNE:
      return absl::StrCat("round ", phase.round());
    case topiary::v1::Phase::START_FINE_TUNE:
      return "fine-tune";
    default:
      return "dense";
  }
}

std::string EventToJsonLine(const topiary::v1::Event& event) {
  const google::protobuf::Message* body = nullptr;
  const char* kind = "unknown";
  switch (event.kind_case()) {
    case topiary::v1::Event::kStarted:
      body = &event.started();
      kind = "started";
      break;
    case topiary::v1::Event::kProgress:
      body = &event.progress();
      kind = "progress";
      break;
    case topiary::v1::Event::kEpoch:
      body = &event.epoch();
      kind = "epoch";
      break;
    case topiary::v1::Event::kSummary:
      body = &event.summary();
      kind = "summary";
      break;
    case topiary::v1::Event::kRound:
      body = &event.round();
      kind = "round";
      break;
    case topiary::v1::Event::kCheckpoint:
      body = &event.checkpoint();
      kind = "checkpoint";
      break;
    case topiary::v1::Event::kState:
      body = &event.state();
      kind = "state";
      break;
    case topiary::v1::Event::kPlanning:
      body = &event.planning();
      kind = "planning";
      break;
    default:
      break;
  }
  std::string head =
      absl::StrFormat(R"({"event":"%s","seq":%d,"time_s":%.3f)", kind, event.seq(), event.time_s());
  if (body == nullptr) return head + "}";
  const std::string fields = ToJson(*body);  // "{...}"
  if (fields.size() <= 2) return head + "}";
  return absl::StrCat(head, ",", fields.substr(1));
}

}  // namespace topiary

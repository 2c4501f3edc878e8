#include "trainer/run/events.h"

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace topiary {

std::string MessageToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(message, &out, opts);
  return out;
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
  const std::string fields = MessageToJson(*body);  // "{...}"
  if (fields.size() <= 2) return head + "}";
  return absl::StrCat(head, ",", fields.substr(1));
}

}  // namespace topiary

// The one JSON codec for protobuf messages Topiary writes and reads: files (checkpoint
// attributes, experiment records, event logs, summaries, ONNX metadata) and JSON specs. One
// form everywhere: proto field names, every primitive field printed (zeros included), so a
// reader in any language finds every key.
#ifndef TOPIARY_TRAINER_UTIL_JSON_H_
#define TOPIARY_TRAINER_UTIL_JSON_H_

#include <google/protobuf/message.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace topiary {

// The largest JSON text read (a network graph of thousands of layers is well below it).
inline constexpr size_t kMaxJsonBytes = 16 << 20;

std::string ToJson(const google::protobuf::Message& message);

// What a reader does with a key its message does not have: a record written by a newer
// version is read (kIgnore: metrics, records, events); a spec or a network, whose every key
// changes what runs, is refused (kRefuse).
enum class JsonUnknown { kIgnore, kRefuse };

// Parses `json` into `out` (cleared first). Errors are INVALID_ARGUMENT and begin with `what`
// (a file and attribute, a field), e.g. "m.h5: /@metrics: not JSON of CheckpointMetrics: ...".
absl::Status FromJson(absl::string_view json, google::protobuf::Message* out,
                      const std::string& what, JsonUnknown unknown);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_UTIL_JSON_H_

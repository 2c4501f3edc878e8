#include "trainer/util/json.h"

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"

namespace topiary {

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string out;
  // Printing fails only for messages holding Any of unknown types, which Topiary has none of.
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

absl::Status FromJson(absl::string_view json, google::protobuf::Message* out,
                      const std::string& what, JsonUnknown unknown) {
  out->Clear();
  if (json.size() > kMaxJsonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", json.size(), " bytes of JSON (at most ", kMaxJsonBytes, ")"));
  }
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = unknown == JsonUnknown::kIgnore;
  const auto st = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), out, options);
  if (!st.ok()) {
    out->Clear();  // a half-parsed message is never used
    // Protobuf quotes the input in some messages: at most 200 characters of it.
    return absl::InvalidArgumentError(absl::StrCat(what, ": not JSON of ",
                                                   out->GetDescriptor()->name(), ": ",
                                                   std::string(st.message()).substr(0, 200)));
  }
  return absl::OkStatus();
}

}  // namespace topiary

// libFuzzer harness: the spec parser (text format and JSON), validation, defaults, printing.
#include <google/protobuf/util/json_util.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "trainer/spec/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto spec = topiary::ParseSpec(text, "fuzz");
  if (!spec.ok()) return 0;
  if (!topiary::ValidateSpec(*spec).ok()) return 0;
  const auto full = topiary::WithDefaults(*spec);
  // Defaults keep a valid spec valid, a valid spec converts to JSON (the daemon stores it so;
  // this found names that were not UTF-8), and printing it parses back to the same spec.
  if (!topiary::ValidateSpec(full).ok()) __builtin_trap();
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(full, &json).ok()) __builtin_trap();
  auto again = topiary::ParseSpec(topiary::SpecToText(full), "fuzz-roundtrip");
  if (!again.ok() || again->SerializeAsString() != full.SerializeAsString()) __builtin_trap();
  return 0;
}

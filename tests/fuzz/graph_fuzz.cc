// libFuzzer harness: the network-graph reader of checkpoints (the /@network JSON, parsed and
// built into a model on the CPU) under the parameter budget a file of the input's size would
// give, so that a graph claiming more than its weights never allocates it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "trainer/core/device.h"
#include "trainer/nn/graph.h"
#include "trainer/util/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<topiary::Device> device = [] {
    topiary::v1::DeviceSpec cpu;
    cpu.set_kind(topiary::v1::DeviceSpec::CPU);
    cpu.set_threads(1);
    return std::move(*topiary::CreateDevice(cpu));
  }();
  const std::string json(reinterpret_cast<const char*>(data), size);
  topiary::v1::NetworkGraph graph;
  if (!topiary::FromJson(json, &graph, "fuzz.h5: /@network", topiary::JsonUnknown::kRefuse).ok()) {
    return 0;
  }
  // What a checkpoint of about 64 MiB could hold.
  auto model = topiary::BuildModelFromGraph(graph, device.get(), "fuzz.h5", int64_t{1} << 24);
  // A model that builds is finished: its output is the declared classes.
  if (model.ok() && ((*model)->output() < 0 || (*model)->classes() != graph.classes())) {
    __builtin_trap();
  }
  return 0;
}

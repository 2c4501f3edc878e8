// libFuzzer harness: the ONNX importer (protobuf parsing, the graph and tensor checks, the
// network it builds and the parameters it loads), on the CPU.
#include <cstddef>
#include <cstdint>
#include <string>

#include "trainer/core/device.h"
#include "trainer/import/onnx_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<topiary::Device> device = [] {
    topiary::v1::DeviceSpec cpu;
    cpu.set_kind(topiary::v1::DeviceSpec::CPU);
    return std::move(*topiary::CreateDevice(cpu));
  }();
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  topiary::OnnxImportOptions options;
  auto imported = topiary::ImportOnnx(bytes, "fuzz.onnx", options, device.get());
  // An import that succeeds gives a finished model whose logits are the declared classes.
  if (imported.ok() && imported->model->output() < 0) __builtin_trap();
  return 0;
}

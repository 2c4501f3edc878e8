// Test tool: the logits a checkpoint's network gives for raw NCHW float32 inputs, on the CPU
// in fp32 (tests/import_test.py compares them with PyTorch's for imported models).
//   onnx_logits CKPT.h5 INPUT.f32 N OUT.f32
// INPUT holds N images [C, H, W] as the network reads them (normalized); OUT receives
// N x classes float32 logits.

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "topiary/v1/checkpoint.pb.h"
#include "trainer/core/device.h"
#include "trainer/store/inference.h"
#include "trainer/util/file_util.h"

namespace topiary {
namespace {

absl::Status Main(const std::string& ckpt, const std::string& input_path, int n,
                  const std::string& out_path) {
  auto opened = OpenForInference(ckpt);
  if (!opened.ok()) return opened.status();
  topiary::v1::DeviceSpec cpu;
  cpu.set_kind(topiary::v1::DeviceSpec::CPU);
  auto device = CreateDevice(cpu);
  if (!device.ok()) return device.status();
  // The network's own input size and classes: the tool trusts the checkpoint.
  if (!opened->file.state.input) return absl::InvalidArgumentError(ckpt + ": no /@input");
  const topiary::v1::InputFormat& in = *opened->file.state.input;
  auto model = InferenceModel(*opened, Shape4{1, in.height(), in.width(), in.channels()},
                              in.classes(), device->get(), /*load=*/true);
  if (!model.ok()) return model.status();
  auto net = Network::Plan(model->get(), n, false);
  if (!net.ok()) return net.status();
  auto bytes = ReadFile(input_path);
  if (!bytes.ok()) return bytes.status();
  const int c = in.channels(), h = in.height(), w = in.width();
  if (bytes->size() != static_cast<size_t>(n) * c * h * w * 4) {
    return absl::InvalidArgumentError("input size does not match N x C x H x W floats");
  }
  const float* nchw = reinterpret_cast<const float*>(bytes->data());
  float* nhwc = (*net)->input();
  for (int i = 0; i < n; ++i)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int k = 0; k < c; ++k)
          nhwc[((static_cast<size_t>(i) * h + y) * w + x) * c + k] =
              nchw[((static_cast<size_t>(i) * c + k) * h + y) * w + x];
  if (auto st = (*net)->Forward(false); !st.ok()) return st;
  const float* logits = static_cast<const float*>((*net)->logits());
  return WriteFileAtomic(out_path,
                         std::string(reinterpret_cast<const char*>(logits),
                                     static_cast<size_t>(n) * in.classes() * sizeof(float)));
}

}  // namespace
}  // namespace topiary

int main(int argc, char** argv) {
  int n = 0;
  if (argc != 5 || !absl::SimpleAtoi(argv[3], &n) || n < 1) {
    std::fprintf(stderr, "usage: onnx_logits CKPT.h5 INPUT.f32 N OUT.f32\n");
    return 2;
  }
  const absl::Status st = topiary::Main(argv[1], argv[2], n, argv[4]);
  if (!st.ok()) {
    std::fprintf(stderr, "onnx_logits: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}

// Training-step throughput: forward + loss + backward + SGD update of a zoo model on random
// data, timed over many steps after a warm-up. Prints one JSON line per model.
//
//   train_step_bench [--models lenet5,resnet20] [--batch 128] [--hw 28] [--channels 1]
//                    [--steps 20] [--threads 0]
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "trainer/model_zoo.h"
#include "trainer/optimizer.h"

namespace topiary {
namespace {

struct Flags {
  std::vector<std::string> models = {"lenet5", "resnet20"};
  int batch = 128, hw = 28, channels = 1, steps = 20, warmup = 3, threads = 0;
};

int Bench(const Flags& f, const std::string& arch) {
  auto dev = MakeCpuDevice(f.threads);
  auto model = BuildModel(arch, 1.0f, {1, f.hw, f.hw, f.channels}, 10, dev.get());
  if (!model.ok()) {
    absl::FPrintF(stderr, "%s\n", model.status().ToString());
    return 1;
  }
  (*model)->Initialize(1);
  auto net = Network::Plan(model->get(), f.batch, true);
  if (!net.ok()) {
    absl::FPrintF(stderr, "%s\n", net.status().ToString());
    return 1;
  }
  topiary::v1::OptimizerSpec spec;
  spec.set_lr(0.01f);
  spec.set_momentum(0.9f);
  spec.set_weight_decay(5e-4f);
  SgdOptimizer opt((*model)->parameters(), spec);
  std::mt19937 gen(1);
  std::normal_distribution<float> dist;
  const size_t n_in = static_cast<size_t>(f.batch) * f.hw * f.hw * f.channels;
  for (size_t i = 0; i < n_in; ++i) (*net)->input()[i] = dist(gen);
  std::vector<int32_t> labels(f.batch);
  for (int i = 0; i < f.batch; ++i) labels[i] = i % 10;
  auto step = [&] {
    (*net)->Forward(true);
    (*net)->Loss(labels.data(), 0.0f);
    (*net)->Backward();
    opt.Step(0.01f);
  };
  for (int i = 0; i < f.warmup; ++i) step();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < f.steps; ++i) step();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  absl::PrintF(
      "{\"engine\":\"topiary\",\"model\":\"%s\",\"batch\":%d,\"input\":\"%dx%dx%d\","
      "\"threads\":%d,\"images_per_s\":%.1f,\"ms_per_step\":%.2f,\"planned_mb\":%.1f}\n",
      arch, f.batch, f.hw, f.hw, f.channels, f.threads, f.batch * f.steps / s, 1000 * s / f.steps,
      (*net)->planned_bytes() / 1048576.0);
  return 0;
}

}  // namespace
}  // namespace topiary

int main(int argc, char** argv) {
  topiary::Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--models")
      f.models = absl::StrSplit(v, ',');
    else if (k == "--batch")
      f.batch = std::stoi(v);
    else if (k == "--hw")
      f.hw = std::stoi(v);
    else if (k == "--channels")
      f.channels = std::stoi(v);
    else if (k == "--steps")
      f.steps = std::stoi(v);
    else if (k == "--threads")
      f.threads = std::stoi(v);
    else {
      absl::FPrintF(stderr, "unknown flag %s\n", k);
      return 2;
    }
  }
  int rc = 0;
  for (const auto& m : f.models) rc |= topiary::Bench(f, m);
  return rc;
}

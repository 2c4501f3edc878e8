// Helpers of the round tests (CPU, GPU, channel pruning): runs with every step's loss, and
// checks on the masked checkpoints that pruning runs write: the rules of docs/algorithms.md §1 and
// mask enforcement (weights and momentum exactly zero wherever the mask is zero).
#ifndef TOPIARY_PRUNING_ROUNDS_TEST_UTIL_H_
#define TOPIARY_PRUNING_ROUNDS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <string>

#include "pruning/pruner.h"
#include "trainer/run/runner.h"
#include "trainer/store/checkpoint.h"
#include "util/test_dir.h"

namespace topiary::testing {

// A folder for a test's outputs.
inline std::string OutDir(const std::string& name) { return TestPath(name); }

inline RunOptions PruningOptions(const std::string& out_dir) {
  RunOptions o;
  o.out_dir = out_dir;
  o.progress_interval_s = 0;
  o.make_pruner = pruning::MakePruner;
  return o;
}

// The loss of every step, by global step, and the run's summary.
struct StepLosses {
  std::map<int, double> loss;
  topiary::v1::RunSummary summary;
};

inline StepLosses RunWithLosses(const topiary::v1::ExperimentSpec& spec, RunOptions options) {
  StepLosses out;
  options.on_event = [&](const topiary::v1::Event& e) {
    if (e.has_progress()) out.loss[e.progress().step()] = e.progress().loss();
  };
  out.summary = RunExperiment(spec, options);
  return out;
}

struct MaskCheck {
  int masked_layers = 0;
  int block_layers_at_target = 0;
};

// Checks every mask of the checkpoint at `path`; block masks must be at `target`.
inline MaskCheck CheckMaskedCheckpoint(const std::string& path, double target) {
  MaskCheck result;
  auto doc = ReadCheckpointFile(path);
  EXPECT_TRUE(doc.ok()) << doc.status();
  if (!doc.ok()) return result;
  for (const auto& [name, mask] : doc->datasets) {
    if (name.size() < 5 || name.substr(name.size() - 5) != "/mask") continue;
    const std::string layer_dir = name.substr(0, name.size() - 5);  // /layers/<layer>
    const std::string layer = layer_dir.substr(8);
    const H5Dataset& kernel = doc->datasets.at(layer_dir + "/kernel");
    const H5Dataset& momentum = doc->datasets.at("/optimizer/momentum/" + layer + "/kernel");
    ++result.masked_layers;
    // Kernel on disk: [K, C, R, S] or [out, in].
    const int64_t k_dim = kernel.shape[0], c_dim = kernel.shape[1];
    const int64_t taps = kernel.count() / (k_dim * c_dim);
    const bool block = AttrString(mask.attrs, "kind") == "block";
    int64_t bi = AttrInt(mask.attrs, "block_in"), bo = AttrInt(mask.attrs, "block_out");
    if (block) {
      const int64_t rows = mask.shape[0], cols = mask.shape[1];
      int64_t zeros = 0;
      for (int64_t r = 0; r < rows; ++r) {
        int64_t kept = 0;
        for (int64_t c = 0; c < cols; ++c) kept += mask.u8[r * cols + c];
        EXPECT_GT(kept, 0) << layer << ": input-block row " << r << " is empty";
        zeros += cols - kept;
      }
      for (int64_t c = 0; c < cols; ++c) {
        int64_t z = 0;
        for (int64_t r = 0; r < rows; ++r) z += mask.u8[r * cols + c] == 0;
        EXPECT_LE(z, static_cast<int64_t>(std::floor(target * rows)))
            << layer << ": output-block column " << c << " over its cap";
      }
      if (zeros == static_cast<int64_t>(std::floor(target * rows * cols))) {
        ++result.block_layers_at_target;
      }
    }
    for (int64_t k = 0; k < k_dim; ++k) {
      for (int64_t c = 0; c < c_dim; ++c) {
        for (int64_t t = 0; t < taps; ++t) {
          const size_t i = (static_cast<size_t>(k) * c_dim + c) * taps + t;
          const bool kept =
              block ? mask.u8[(c / bi) * mask.shape[1] + k / bo] != 0 : mask.u8[i] != 0;
          if (kept) continue;
          if (kernel.f32[i] != 0.0f || momentum.f32[i] != 0.0f) {
            ADD_FAILURE() << layer << ": masked weight [" << k << "," << c << "," << t << "] is "
                          << kernel.f32[i] << ", momentum " << momentum.f32[i];
            return result;
          }
        }
      }
    }
  }
  return result;
}

}  // namespace topiary::testing

#endif  // TOPIARY_PRUNING_ROUNDS_TEST_UTIL_H_

// ONNX export: a checkpoint's network as an ONNX model (onnx.proto from Debian's libonnx-dev,
// opset 13, IR version 7), for inference runtimes. What the graph computes, and why each choice
// was made, is in docs/onnx-export.md.
//
// The graph reads raw pixel values (0..max_value, float32, NCHW) and starts with the
// checkpoint's input normalization, so a runtime is fed images, not Topiary's internals. Masks
// are applied (masked weights are exact zeros in the initializers); batch norm is folded into
// the preceding convolution or kept as BatchNormalization nodes.
#ifndef TOPIARY_TRAINER_EXPORT_ONNX_EXPORT_H_
#define TOPIARY_TRAINER_EXPORT_ONNX_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/checkpoint.pb.h"
#include "trainer/nn/model.h"

namespace topiary {

inline constexpr int kOnnxOpset = 13;
inline constexpr int kOnnxIrVersion = 7;

struct OnnxExportOptions {
  int batch = 1;                // the input's batch dimension; 0: dynamic ("batch")
  bool fold_batch_norm = true;  // false: BatchNormalization nodes
};

struct OnnxExportSummary {
  int nodes = 0;
  int64_t parameters = 0;          // the model's trainable parameters (as run and inspect count)
  int64_t initializer_floats = 0;  // floats in the graph's initializers (folding changes it)
  int64_t zeros = 0;               // exact zeros among the conv and linear weights
  int64_t masked = 0;              // weights under a mask (each one of the zeros)
  int folded = 0;                  // batch norms folded into convolutions
  std::vector<std::string> approximate_layers;  // exported as exact convolutions
  int64_t bytes = 0;                            // of the serialized model
};

// Builds the ONNX model of `model` (its parameters and masks as loaded) reading images of
// `input`. `metadata` pairs go to the model's metadata_props. Writes it to `path`.
absl::StatusOr<OnnxExportSummary> ExportOnnx(
    const Model& model, const topiary::v1::InputFormat& input, const OnnxExportOptions& options,
    const std::vector<std::pair<std::string, std::string>>& metadata, const std::string& path);

// The whole command: reads and checks `checkpoint`, builds its model on the CPU, loads it and
// exports it. The input format is the checkpoint's `input` attribute; a checkpoint written
// before it existed has its normalization recomputed from the training set its spec names.
absl::StatusOr<OnnxExportSummary> ExportCheckpointToOnnx(const std::string& checkpoint,
                                                         const OnnxExportOptions& options,
                                                         const std::string& path);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_EXPORT_ONNX_EXPORT_H_

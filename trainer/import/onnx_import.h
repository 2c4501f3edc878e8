// `topiary import`: an ONNX model (the CNN operator set people export from PyTorch) as a
// Topiary checkpoint, whose network graph (trainer/nn/graph.h) any experiment can then start
// from (a spec without model.arch and init_from_checkpoint naming the file).
//
// Read: Conv (groups and depthwise included), BatchNormalization (kept as a layer; a model
// exported with it folded into its convolutions arrives as convolutions with bias), Relu,
// Clip as ReLU6 or ReLU, Add, MaxPool, AveragePool, GlobalAveragePool, ReduceMean over height
// and width, Flatten and Reshape to
// 2-D, Gemm and MatMul (+ Add of a bias), Concat along channels, Constant; Identity and
// Dropout are dropped. A ReLU whose input only it reads is fused into the batch norm or add
// before it. Anything else is refused naming the node, its operator and why. Everything read
// is checked before it is used: sizes, types, attribute values, that each node reads only
// what came before it (no cycles), no external data.
#ifndef TOPIARY_TRAINER_IMPORT_ONNX_IMPORT_H_
#define TOPIARY_TRAINER_IMPORT_ONNX_IMPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/checkpoint.pb.h"
#include "topiary/v1/network.pb.h"
#include "trainer/core/device.h"
#include "trainer/nn/model.h"

namespace topiary {

struct OnnxImportOptions {
  std::string arch;  // the network's name; default "onnx:" + the file's base name
  // The image, when the ONNX input's dimensions are symbolic (0: from the file).
  int height = 0, width = 0, channels = 0;
  // How pixels become the network's input, recorded in the checkpoint (and used by runs that
  // start from it): (pixel / max_value - mean[c]) / std[c]. Empty: mean 0, std 1.
  std::vector<float> mean, std;
  float max_value = 255;
  // The checkpoint is only created, never replaces a file (ALREADY_EXISTS): the daemon's
  // imports, whose path others may write meanwhile.
  bool create_only = false;
  // The data set the network is evaluated on (topiary::ParseDataFlag's forms), recorded in the
  // checkpoint's spec so that `topiary evaluate CKPT` needs no --data; "": none recorded.
  std::string data;
};

// The model an ONNX file describes, parameters loaded, on `device`; `input` receives the
// recorded input format. `name` names the file in errors.
struct ImportedModel {
  std::unique_ptr<Model> model;
  topiary::v1::InputFormat input;
  topiary::v1::ImportSummary summary;  // checkpoint not set
};
absl::StatusOr<ImportedModel> ImportOnnx(const std::string& bytes, const std::string& name,
                                         const OnnxImportOptions& options, Device* device);

// Reads `onnx_path` (at most 2 GiB) and writes the checkpoint `out_path` (atomically).
absl::StatusOr<topiary::v1::ImportSummary> ImportOnnxFile(const std::string& onnx_path,
                                                          const std::string& out_path,
                                                          const OnnxImportOptions& options);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_IMPORT_ONNX_IMPORT_H_

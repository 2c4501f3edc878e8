// Parameter: one named tensor of a layer with its gradient, optimizer state and optional
// mask. Masks are applied by projection (the optimizer zeroes masked weights and momentum
// after every update), so the forward pass reads the weights directly.
#ifndef TOPIARY_TRAINER_CORE_PARAMETER_H_
#define TOPIARY_TRAINER_CORE_PARAMETER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/runtime/dtype.h"
#include "kernels/sparse/block_grid.h"
#include "trainer/core/device.h"
#include "trainer/core/tensor.h"

namespace topiary {

// How a parameter's mask was made; the element mask (Parameter::mask) is what training
// enforces, this is what checkpoints and reports show.
struct MaskInfo {
  enum class Kind { kNone, kBlock, kElement, kNofM };
  Kind kind = Kind::kNone;
  kernels::BlockGrid blocks;  // kBlock: which blocks are kept, and their shape
  int n = 0, m = 0;           // kNofM
};

// "block" | "element" | "n_of_m" | "" (the names used in checkpoints).
const char* MaskKindName(MaskInfo::Kind kind);
// The kind a name stands for (kNone is never named); nullopt for any other name.
std::optional<MaskInfo::Kind> MaskKindFromName(absl::string_view name);

// What a parameter is to its layer. An enum, not a string, so that code which must treat
// every kernel (pruning, masks, checkpoints, approximation) cannot miss one by a typo.
// kActivationRange: an approximate convolution's moving-average activation range
// [min, max, observed] (trainer/nn/conv_engine.h).
enum class ParamRole { kKernel, kBias, kGamma, kBeta, kRunningMean, kRunningVar, kActivationRange };

// The names used in checkpoints and reports: kernel, bias, gamma, beta, running_mean,
// running_var, activation_range; nullopt for any other name.
const char* ParamRoleName(ParamRole role);
std::optional<ParamRole> ParamRoleFromName(absl::string_view name);

struct Parameter {
  std::string layer;  // e.g. "stage1.block0.conv1"
  ParamRole role = ParamRole::kKernel;
  bool trainable = true;  // false for batch-norm running statistics
  bool decay = false;     // weight decay applies (conv and linear kernels)
  Tensor value;           // as stored in memory (conv kernels: [K, R, S, C])
  Tensor grad;            // trainable only
  Tensor momentum;        // trainable only
  Buffer<uint8_t> mask;   // empty: dense; else 1 = kept, same layout as value
  MaskInfo mask_info;
  // Counts InstallMask calls: whoever derives state from the mask (a block-sparse plan)
  // compares it to know when to derive it again.
  uint64_t mask_version = 0;
  // bf16 networks only (conv and linear kernels): the copy the kernels read, cast from value
  // before every forward pass (so it always follows the master, masks included), and the
  // gradient they write, widened into grad after every backward pass.
  Buffer<kernels::Bf16> value_bf16;
  Buffer<kernels::Bf16> grad_bf16;

  std::string full_name() const { return layer + "." + ParamRoleName(role); }
  size_t size() const { return value.size(); }
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_CORE_PARAMETER_H_

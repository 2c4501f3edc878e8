// The residual tail of a GPU network: a block's last batch norm (and its projection
// shortcut's), the add and the ReLU, run as one pass each way
// (kernels/norm_pool/residual_tail.h) instead of two batch-norm passes, the add, and the add's
// backward writing one gradient twice for the batch norms to read twice each.
//
// Network::Plan finds the tails (PlanOptions::fuse_residual_tails) and runs them in place of
// the layers: a folded batch norm's forward pass computes its statistics only; the add's
// forward pass reads the batch norms' inputs; the add's backward pass is the batch norms'
// backward too, and their own backward passes do nothing. The layers stay the reference and
// the path of the CPU and of shapes the kernels do not take.
#ifndef TOPIARY_TRAINER_NN_RESIDUAL_TAIL_H_
#define TOPIARY_TRAINER_NN_RESIDUAL_TAIL_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/norm_pool/residual_tail.h"
#include "trainer/core/tensor.h"
#include "trainer/nn/layer.h"

namespace topiary {

class Model;
class BatchNorm2d;

class ResidualTail {
 public:
  // The tails of `model` the kernels take in a GPU network of type t: an Add (with or
  // without ReLU) reading the output of a BatchNorm2d without ReLU that no other layer reads
  // and whose input is not the network's input; the add's other input is a second such batch
  // norm (a projection shortcut) or any other value (the identity). Channel counts and types
  // the kernels cannot take keep their layers.
  static std::vector<std::unique_ptr<ResidualTail>> Find(const Model& model, kernels::DType t);

  int add() const { return add_; }
  // The folded batch-norm node of the add's input k, or -1.
  int batch_norm(int k) const { return bn_[k]; }
  // The add's input the kernels call a (a folded batch norm), and b (the other one).
  int a() const { return a_; }
  int b() const { return 1 - a_; }

  // Planned with its network: the folded batch norms' scale and shift, and the workspace
  // bytes the passes need.
  absl::Status Prepare(int batch, Device* device, int sync_ranks, size_t* workspace_bytes);
  // The forward pass of folded batch-norm node `node` (one of batch_norm(0), batch_norm(1)).
  absl::Status ForwardBatchNorm(int node, const LayerIo& io, bool training);
  // The add's forward and backward passes with every node's io (indexed by node).
  absl::Status Forward(const std::vector<LayerIo>& io) const;
  absl::Status Backward(const std::vector<LayerIo>& io) const;

 private:
  ResidualTail(const Model& model, int add, int bn0, int bn1);
  kernels::FoldedBatchNorm Input(int k, const std::vector<LayerIo>& io) const;
  // The buffer the masked gradient g goes to: b's input gradient, else (b needs none) a's.
  void* GradientBuffer(const LayerIo& add_io) const;

  const Model& model_;
  int add_;
  int bn_[2];
  int a_;
  kernels::ResidualTailShape shape_;
  Buffer<float> scale_shift_;  // [2 inputs][2][C]
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_NN_RESIDUAL_TAIL_H_

// Block-mask pruning, docs/algorithms.md §1 ("Weight Block Sparsity", D'Alberto et al.).
//
// A layer's block mask G has rows = input-channel blocks (ceil(C / block_in)) and columns =
// output-channel blocks (ceil(K / block_out)); a block covers block_in input channels x
// block_out output channels x every filter tap. G is stored row-major, 1 = kept.
#ifndef TOPIARY_PRUNING_BLOCK_MASK_H_
#define TOPIARY_PRUNING_BLOCK_MASK_H_

#include <cstdint>
#include <vector>

#include "kernels/sparse/block_grid.h"
#include "pruning/kernel_view.h"
#include "topiary/v1/experiment.pb.h"

namespace topiary::pruning {

// The grid type is the kernels' (kernels/sparse/block_grid.h): one type from pruner to kernel.
using kernels::BlockGrid;

// Score of every block (row-major like the grid): the mean over the block's weights of
// VARIANCE (population variance), L1 (|w|), L2 (w^2) or GRAD_L2 (|dW| * w^2, which needs
// view.grad_abs). Blocks already zero in `grid` score 0.
std::vector<double> BlockScores(const KernelView& view, const BlockGrid& grid,
                                topiary::v1::PruningSpec::Score score);

// The zeros a layer can reach: Z = floor(target * rows * cols), bounded by the column cap
// (each of `cols` columns holds at most Zc = floor(target * rows)) and the row rule (each row
// keeps a block): min(Z, cols * Zc, rows * (cols - 1)). Below Z when rows is odd or small
// (rows 3, cols 2, target 0.5: Z = 3, reachable 2); that bound is the layer's effective target.
int ReachableBlockZeros(int rows, int cols, double target);

struct BlockStepReport {
  int zeros_before = 0, zeros_after = 0;
  int requested_zeros = 0;  // Z = floor(target * rows * cols)
  int target_zeros = 0;     // the effective target: ReachableBlockZeros
  int step_goal = 0;        // Z1 = min(zeros_before + K, Z)
  int column_cap = 0;       // Zc = floor(target * rows)
  bool fallback = false;
};

// One prune step (§1 steps 1-3) on `grid`, monotone: kept blocks may become zero, zero blocks
// stay zero. `seed` orders the fallback's columns. REQUIRES: scores.size() == rows * cols.
// balanced: the step's new zeros are the cheapest that leave every column and every row
// with an even count (pruning/balanced.h), in place of steps 1-3.
BlockStepReport BlockPruneStep(const std::vector<double>& scores, double target,
                               double step_fraction, uint64_t seed, BlockGrid* grid,
                               bool balanced = false);

}  // namespace topiary::pruning

#endif  // TOPIARY_PRUNING_BLOCK_MASK_H_

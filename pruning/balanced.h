// Balanced block steps (pruning { balanced: true }): each step zeros the lowest-scoring
// blocks subject to every column (output-channel block) and every row (input-channel block)
// ending with as even a count of zeros as the grid allows, so that a sparse kernel's output
// tiles (columns) in the forward pass and its input tiles (rows) in the backward-data pass all
// get the same work. Solved exactly as a min-cost flow: source -> column -> row -> sink, one
// unit per block zeroed, cost its score.
#ifndef TOPIARY_PRUNING_BALANCED_H_
#define TOPIARY_PRUNING_BALANCED_H_

#include <vector>

#include "kernels/sparse/block_grid.h"

namespace topiary::pruning {

// Zeros up to `need` more kept blocks of `grid` (monotone: zero blocks stay zero). Afterwards
// each column holds floor or ceil of Z / cols zeros and each row floor or ceil of Z / rows
// (at most cols - 1: every row keeps a block), Z = zeros before + need, with the least total
// score among such choices. Returns the zeros added (less than `need` only when the grid's
// earlier zeros make the even counts unreachable). REQUIRES: scores.size() == rows * cols.
int BalancedZeroStep(const std::vector<double>& scores, int need, kernels::BlockGrid* grid);

// Whether every column's and every row's zero count are within one of each other's.
bool IsBalanced(const kernels::BlockGrid& grid);

}  // namespace topiary::pruning

#endif  // TOPIARY_PRUNING_BALANCED_H_

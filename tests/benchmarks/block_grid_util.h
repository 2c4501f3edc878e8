// Block grids for the benchmarks: the shape the balanced block pruner (pruning { balanced:
// true }) leaves a layer in at its target: the same number of kept blocks in every
// output-block column, and every input-block row within one of the others.
#ifndef TOPIARY_TESTS_BENCHMARKS_BLOCK_GRID_UTIL_H_
#define TOPIARY_TESTS_BENCHMARKS_BLOCK_GRID_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/sparse/block_grid.h"

namespace topiary::bench {

// A rows x cols grid (row-major, 1 = kept) keeping max(1, round(kept * rows)) blocks in every
// column, each column taking the rows that have kept the fewest so far (ties drawn from gen).
inline std::vector<uint8_t> BalancedBlockGrid(int rows, int cols, double kept, std::mt19937& gen) {
  std::vector<uint8_t> grid(static_cast<size_t>(rows) * cols, 0);
  const int keep = std::max(1, static_cast<int>(kept * rows + 0.5));
  std::vector<int> order(rows), row_kept(rows, 0);
  for (int col = 0; col < cols; ++col) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), gen);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return row_kept[a] < row_kept[b]; });
    for (int i = 0; i < keep && i < rows; ++i) {
      grid[static_cast<size_t>(order[i]) * cols + col] = 1;
      ++row_kept[order[i]];
    }
  }
  return grid;
}

// The balanced grid of block_in x block_out blocks over a layer's channels, keeping `kept`.
inline kernels::BlockGrid BalancedGrid(int in_channels, int out_channels, int block_in,
                                       int block_out, double kept, std::mt19937& gen) {
  kernels::BlockGrid g = kernels::BlockGrid::Dense(in_channels, out_channels, block_in, block_out);
  g.kept = BalancedBlockGrid(g.rows, g.cols, kept, gen);
  return g;
}

// Parses a --block value "INxOUT" (e.g. 64x128); false when it is not two positive sides.
inline bool ParseBlockShape(const char* v, int* block_in, int* block_out) {
  int in = 0, out = 0;
  if (std::sscanf(v, "%dx%d", &in, &out) != 2 || in <= 0 || out <= 0) return false;
  *block_in = in;
  *block_out = out;
  return true;
}

}  // namespace topiary::bench

#endif  // TOPIARY_TESTS_BENCHMARKS_BLOCK_GRID_UTIL_H_

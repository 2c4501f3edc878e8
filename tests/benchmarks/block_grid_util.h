// Block grids for the benchmarks: the shape the block pruner leaves a layer in at its target
// (the same number of kept blocks in every output-block column), with random rows.
#ifndef TOPIARY_TESTS_BENCHMARKS_BLOCK_GRID_UTIL_H_
#define TOPIARY_TESTS_BENCHMARKS_BLOCK_GRID_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace topiary::bench {

// A rows x cols grid (row-major, 1 = kept) keeping max(1, round(kept * rows)) blocks in every
// column, the rows drawn from gen.
inline std::vector<uint8_t> BalancedBlockGrid(int rows, int cols, double kept, std::mt19937& gen) {
  std::vector<uint8_t> grid(static_cast<size_t>(rows) * cols, 0);
  const int keep = std::max(1, static_cast<int>(kept * rows + 0.5));
  std::vector<int> order(rows);
  for (int col = 0; col < cols; ++col) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), gen);
    for (int i = 0; i < keep && i < rows; ++i) grid[static_cast<size_t>(order[i]) * cols + col] = 1;
  }
  return grid;
}

}  // namespace topiary::bench

#endif  // TOPIARY_TESTS_BENCHMARKS_BLOCK_GRID_UTIL_H_

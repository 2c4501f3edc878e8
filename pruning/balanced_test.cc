// Balanced block steps: even zeros per column and row after every step, monotone, the least
// total score among balanced choices (checked by brute force on small grids), and the step
// goals of the block schedule reached on tile-shaped grids of resnet50's sizes.
#include "pruning/balanced.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "pruning/block_mask.h"

namespace topiary::pruning {
namespace {

using kernels::BlockGrid;

std::vector<double> RandomScores(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> s(n);
  for (double& v : s) v = u(rng);
  return s;
}

// The least total score of `need` new zeros leaving the grid balanced, over every subset.
double BruteForceBest(const BlockGrid& grid, const std::vector<double>& scores, int need) {
  const int n = grid.rows * grid.cols;
  double best = std::numeric_limits<double>::infinity();
  for (uint32_t set = 0; set < (1u << n); ++set) {
    if (__builtin_popcount(set) != need) continue;
    BlockGrid g = grid;
    double cost = 0;
    bool ok = true;
    for (int b = 0; b < n && ok; ++b) {
      if (!(set >> b & 1)) continue;
      ok = g.kept[b] != 0;
      g.kept[b] = 0;
      cost += scores[b];
    }
    bool rows_alive = true;
    for (int r = 0; r < g.rows; ++r) {
      int kept = 0;
      for (int c = 0; c < g.cols; ++c) kept += g.at(r, c);
      rows_alive &= kept > 0;
    }
    if (ok && rows_alive && IsBalanced(g)) best = std::min(best, cost);
  }
  return best;
}

TEST(BalancedZeroStep, IsTheCheapestBalancedChoiceOnSmallGrids) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    for (int need : {2, 4, 6}) {
      SCOPED_TRACE(testing::Message() << "seed " << seed << " need " << need);
      BlockGrid g = BlockGrid::Dense(32, 12, 8, 3);  // 4 rows x 4 columns
      const std::vector<double> scores = RandomScores(16, seed);
      const double best = BruteForceBest(g, scores, need);
      BlockGrid chosen = g;
      ASSERT_EQ(BalancedZeroStep(scores, need, &chosen), need);
      EXPECT_TRUE(IsBalanced(chosen));
      double cost = 0;
      for (int b = 0; b < 16; ++b) cost += chosen.kept[b] ? 0 : scores[b];
      EXPECT_NEAR(cost, best, 1e-9);
    }
  }
}

TEST(BalancedBlockSteps, TileShapedResnet50LayersStayBalancedEveryRound) {
  struct Layer {
    int in, out, block_in, block_out;
  };
  // resnet50-sized layers in 8x128, 32x64, 64x128 and 8x64 tiles.
  const Layer layers[] = {{256, 256, 8, 128},
                          {256, 256, 32, 64},
                          {512, 512, 64, 128},
                          {1024, 256, 8, 64},
                          {2048, 512, 8, 64}};
  for (const Layer& l : layers) {
    for (double target : {0.5, 0.75}) {
      SCOPED_TRACE(testing::Message() << l.in << "x" << l.out << " in " << l.block_in << "x"
                                      << l.block_out << " to " << target);
      BlockGrid g = BlockGrid::Dense(l.in, l.out, l.block_in, l.block_out);
      const auto start = std::chrono::steady_clock::now();
      for (int round = 0; round < 20; ++round) {
        const std::vector<double> scores = RandomScores(g.rows * g.cols, round + 1);
        const BlockGrid before = g;
        const BlockStepReport r = BlockPruneStep(scores, target, 0.3, 1, &g, true);
        EXPECT_TRUE(IsBalanced(g)) << "round " << round;
        for (size_t b = 0; b < g.kept.size(); ++b) {
          ASSERT_TRUE(before.kept[b] || !g.kept[b]) << "a zero block came back";
        }
        EXPECT_EQ(r.zeros_after, r.step_goal) << "round " << round;
        if (r.zeros_after >= r.target_zeros) break;
      }
      EXPECT_EQ(g.zeros(), ReachableBlockZeros(g.rows, g.cols, target));
      EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                5.0);
    }
  }
}

}  // namespace
}  // namespace topiary::pruning

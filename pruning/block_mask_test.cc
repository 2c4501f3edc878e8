#include "pruning/block_mask.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "trainer/core/random.h"
#include "trainer/util/glob.h"

namespace topiary::pruning {
namespace {

using topiary::v1::PruningSpec;

std::vector<double> RandomScores(int n, uint64_t seed) {
  Philox rng(seed, RngStream::kData);
  std::vector<double> s(n);
  for (double& x : s) x = rng.Uniform() + 0.01;
  return s;
}

// The invariants of §1 after every step: monotone, column cap, no empty row.
void ExpectInvariants(const BlockGrid& before, const BlockGrid& after, const BlockStepReport& r) {
  for (size_t i = 0; i < before.kept.size(); ++i) {
    if (!before.kept[i]) {
      EXPECT_EQ(after.kept[i], 0) << "block " << i << " came back";
    }
  }
  for (int c = 0; c < after.cols; ++c) {
    int zeros = 0;
    for (int row = 0; row < after.rows; ++row) zeros += after.at(row, c) == 0;
    EXPECT_LE(zeros, r.column_cap) << "column " << c;
  }
  for (int row = 0; row < after.rows; ++row) {
    int kept = 0;
    for (int c = 0; c < after.cols; ++c) kept += after.at(row, c);
    EXPECT_GT(kept, 0) << "row " << row << " is empty";
  }
  EXPECT_EQ(after.zeros(), r.zeros_after);
  EXPECT_LE(r.zeros_after, r.step_goal);
}

TEST(BlockPruneStep, FirstStepZeroesTheLowestScoredBlocks) {
  // 4 x 4 grid, target 0.5: Z = 8, K = floor(0.2 * 8) = 1... use step 0.5: K = 4.
  BlockGrid g = BlockGrid::Dense(32, 32, 8, 8);
  std::vector<double> scores(16);
  for (int i = 0; i < 16; ++i) scores[i] = 1.0 + ((i * 7) % 16);  // a permutation
  const BlockStepReport r = BlockPruneStep(scores, 0.5, 0.5, 1, &g);
  EXPECT_EQ(r.target_zeros, 8);
  EXPECT_EQ(r.step_goal, 4);
  EXPECT_EQ(r.column_cap, 2);
  EXPECT_FALSE(r.fallback);
  // The four lowest scores are 1, 2, 3, 4 at i with (7 i) % 16 = 0, 1, 2, 3: i = 0, 7, 14, 5.
  // Columns: 0, 3, 2, 1; rows: 0, 1, 3, 1: all constraints hold, so exactly these.
  for (int i : {0, 7, 14, 5}) EXPECT_EQ(g.kept[i], 0) << i;
  EXPECT_EQ(g.zeros(), 4);
}

TEST(BlockPruneStep, ColumnCapRestoresTheHighestRankedProposals) {
  // Column 0 holds the three lowest scores of a 4 x 2 grid; cap = floor(0.5 * 4) = 2.
  BlockGrid g = BlockGrid::Dense(32, 16, 8, 8);
  const std::vector<double> scores = {0.1, 5, 0.2, 6, 0.3, 7, 4, 8};  // [r][c], c fastest
  const BlockGrid before = g;
  const BlockStepReport r = BlockPruneStep(scores, 0.5, 0.75, 1, &g);  // Z = 4, K = 3
  ExpectInvariants(before, g, r);
  EXPECT_EQ(g.at(0, 0), 0);
  EXPECT_EQ(g.at(1, 0), 0);
  EXPECT_EQ(g.at(2, 0), 1) << "the highest-ranked proposal of the full column is restored";
}

TEST(BlockPruneStep, EmptyRowRestoresItsHighestRankedProposal) {
  // 2 x 4 grid: row 0 has every low score, so the proposal empties it; the repair restores
  // its highest-ranked block, and 3 of the 4 new zeros are at least half: accepted.
  BlockGrid g = BlockGrid::Dense(16, 32, 8, 8);
  const std::vector<double> scores = {0.1, 0.2, 0.3, 0.4, 5, 6, 7, 8};
  const BlockGrid before = g;
  const BlockStepReport r = BlockPruneStep(scores, 0.5, 1.0, 3, &g);  // Z = 4, Zc = 1
  ExpectInvariants(before, g, r);
  EXPECT_FALSE(r.fallback);
  EXPECT_EQ(g.at(0, 3), 1);
  EXPECT_EQ(r.zeros_after, 3);
}

TEST(BlockPruneStep, FallbackZeroesPerColumnAndSwapsToKeepRowsAlive) {
  // 2 x 2 grid with (0,0) zero. The lowest kept block (1,0) is in the full column 0, so the
  // repair leaves no new zero and the fallback runs: column 1's lowest (0,1) would empty row
  // 0, so it swaps with the next-ranked block of column 1, (1,1).
  BlockGrid g = BlockGrid::Dense(16, 16, 8, 8);
  g.at(0, 0) = 0;
  const BlockGrid before = g;
  const BlockStepReport r = BlockPruneStep({0, 0.2, 0.1, 0.3}, 0.5, 0.2, 5, &g);
  ExpectInvariants(before, g, r);
  EXPECT_TRUE(r.fallback);
  EXPECT_EQ(r.zeros_after, 2);
  EXPECT_EQ(g.at(1, 1), 0);
  EXPECT_EQ(g.at(0, 1), 1);
  EXPECT_EQ(g.at(1, 0), 1);
}

TEST(BlockPruneStep, ReachesTheTargetOnResnetShapedLayersKeepingEveryRule) {
  // Grids of resnet20..resnet50-like layers with 8 x 8 blocks; random scores each step (the
  // weights change during fine-tuning). Counts the steps to reach 50%.
  const std::vector<std::pair<int, int>> layers = {{16, 16},  {16, 32},  {32, 64},  {64, 64},
                                                   {64, 256}, {256, 64}, {512, 512}};
  for (auto [in, out] : layers) {
    BlockGrid g = BlockGrid::Dense(in, out, 8, 8);
    int steps = 0;
    BlockStepReport r;
    do {
      const BlockGrid before = g;
      r = BlockPruneStep(RandomScores(g.rows * g.cols, steps + in * out), 0.5, 0.2, steps, &g);
      ExpectInvariants(before, g, r);
      ++steps;
    } while (r.zeros_after < r.target_zeros && r.zeros_after > r.zeros_before && steps < 40);
    EXPECT_EQ(g.zeros(), r.target_zeros) << in << "x" << out << " after " << steps << " steps";
    EXPECT_LE(steps, 13) << in << "x" << out;
  }
}

TEST(BlockPruneStep, AlreadyAtTargetChangesNothing) {
  BlockGrid g = BlockGrid::Dense(16, 16, 8, 8);
  g.at(0, 0) = 0;
  g.at(1, 1) = 0;
  const BlockStepReport r = BlockPruneStep({0, 1, 1, 0}, 0.5, 0.2, 0, &g);
  EXPECT_EQ(r.zeros_before, 2);
  EXPECT_EQ(r.zeros_after, 2);
}

TEST(BlockScores, MatchADirectComputationOnAnOddShapedKernel) {
  // 11 outputs, 3 taps, 13 inputs with 4 x 5 blocks: partial blocks at both edges.
  const int out = 11, taps = 3, in = 13;
  Philox rng(7, RngStream::kData);
  std::vector<float> w(out * taps * in), g(w.size());
  for (float& x : w) x = rng.Normal();
  for (float& x : g) x = rng.Uniform();
  KernelView v{out, taps, in, w.data(), g.data(), nullptr};
  BlockGrid grid = BlockGrid::Dense(in, out, 4, 5);
  ASSERT_EQ(grid.rows, 4);
  ASSERT_EQ(grid.cols, 3);
  grid.at(1, 2) = 0;
  for (auto score :
       {PruningSpec::VARIANCE, PruningSpec::L1, PruningSpec::L2, PruningSpec::GRAD_L2}) {
    const std::vector<double> s = BlockScores(v, grid, score);
    for (int r = 0; r < grid.rows; ++r) {
      for (int c = 0; c < grid.cols; ++c) {
        std::vector<long double> xs;
        for (int k = c * 5; k < std::min(out, c * 5 + 5); ++k) {
          for (int t = 0; t < taps; ++t) {
            for (int i = r * 4; i < std::min(in, r * 4 + 4); ++i) {
              const long double x = w[v.index(k, t, i)];
              const long double gx = g[v.index(k, t, i)];
              xs.push_back(score == PruningSpec::VARIANCE ? x
                           : score == PruningSpec::L1     ? std::fabs(x)
                           : score == PruningSpec::L2     ? x * x
                                                          : gx * x * x);
            }
          }
        }
        long double mean = 0, var = 0;
        for (auto x : xs) mean += x / xs.size();
        for (auto x : xs) var += (x - mean) * (x - mean) / xs.size();
        const double want = !grid.at(r, c)                   ? 0.0
                            : score == PruningSpec::VARIANCE ? static_cast<double>(var)
                                                             : static_cast<double>(mean);
        EXPECT_NEAR(s[r * grid.cols + c], want, 1e-9 + 1e-9 * std::fabs(want))
            << PruningSpec::Score_Name(score) << " block " << r << "," << c;
      }
    }
  }
}

TEST(BlockGrid, ExpandCoversEveryTapOfABlock) {
  BlockGrid grid = BlockGrid::Dense(10, 6, 4, 4);  // rows 3, cols 2
  grid.at(2, 1) = 0;                               // inputs 8..9, outputs 4..5
  const std::vector<uint8_t> m = grid.Expand(6, 9, 10);
  KernelView v{6, 9, 10};
  for (int k = 0; k < 6; ++k) {
    for (int t = 0; t < 9; ++t) {
      for (int c = 0; c < 10; ++c) {
        EXPECT_EQ(m[v.index(k, t, c)], (k >= 4 && c >= 8) ? 0 : 1) << k << "," << t << "," << c;
      }
    }
  }
}

// ALGORITHMS §1 reachability: rows 3, cols 2, target 0.5 asks Z = 3 zeros, but Zc = 1 per
// column allows 2. Steps stop there and report 2 as the target, and repeated steps reach it.
TEST(BlockStep, AnUnreachableTargetBecomesTheReachableBound) {
  EXPECT_EQ(ReachableBlockZeros(3, 2, 0.5), 2);
  EXPECT_EQ(ReachableBlockZeros(4, 4, 0.5), 8);   // reachable: Z itself
  EXPECT_EQ(ReachableBlockZeros(2, 2, 0.75), 2);  // rows * (cols - 1): no row may empty
  BlockGrid g = BlockGrid::Dense(12, 8, 4, 4);    // rows 3, cols 2
  BlockStepReport r;
  for (int step = 0; step < 5; ++step) {
    r = BlockPruneStep({0.1, 0.2, 0.3, 0.4, 0.5, 0.6}, 0.5, 0.5, step, &g);
  }
  EXPECT_EQ(r.requested_zeros, 3);
  EXPECT_EQ(r.target_zeros, 2);
  EXPECT_EQ(g.zeros(), 2);
}

TEST(Glob, MatchesLayerNames) {
  EXPECT_TRUE(GlobMatch("stage1.*", "stage1.block0.conv1"));
  EXPECT_TRUE(GlobMatch("*.shortcut.conv", "stage2.block0.shortcut.conv"));
  EXPECT_TRUE(GlobMatch("stage?.block0.conv?", "stage3.block0.conv2"));
  EXPECT_TRUE(GlobMatch("fc", "fc"));
  EXPECT_FALSE(GlobMatch("fc", "fc1"));
  EXPECT_FALSE(GlobMatch("stage1.*", "stage2.block0.conv1"));
  EXPECT_TRUE(GlobMatch("*", ""));
  EXPECT_FALSE(GlobMatch("?", ""));
}

}  // namespace
}  // namespace topiary::pruning

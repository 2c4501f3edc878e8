#include "pruning/block_mask.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "pruning/balanced.h"
#include "trainer/core/random.h"
#include "trainer/nn/masks.h"

namespace topiary::pruning {
namespace {

using topiary::v1::PruningSpec;

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

// Kept blocks in ascending score order (ties by index, so the order is deterministic).
std::vector<int> AscendingKept(const std::vector<double>& scores, const BlockGrid& grid) {
  std::vector<int> order;
  for (int i = 0; i < grid.rows * grid.cols; ++i) {
    if (grid.kept[i]) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return scores[a] < scores[b]; });
  return order;
}

int ColumnZeros(const BlockGrid& g, int c) {
  int z = 0;
  for (int r = 0; r < g.rows; ++r) z += g.at(r, c) == 0;
  return z;
}

bool RowEmpty(const BlockGrid& g, int r) {
  for (int c = 0; c < g.cols; ++c) {
    if (g.at(r, c)) return false;
  }
  return true;
}

// Among blocks zeroed by this step (zero in `g`, kept in `before`) selected by `in_line`,
// the one with the highest score, or -1.
template <typename InLine>
int HighestNewZero(const BlockGrid& g, const BlockGrid& before, const std::vector<double>& scores,
                   InLine in_line) {
  int best = -1;
  for (int i = 0; i < g.rows * g.cols; ++i) {
    if (g.kept[i] || !before.kept[i] || !in_line(i)) continue;
    if (best < 0 || scores[i] >= scores[best]) best = i;
  }
  return best;
}

// Step 2: restores the highest-ranked proposals in columns over the cap, then in rows that
// became empty.
void Repair(const BlockGrid& before, const std::vector<double>& scores, int column_cap,
            BlockGrid* g) {
  for (int c = 0; c < g->cols; ++c) {
    while (ColumnZeros(*g, c) > column_cap) {
      const int i = HighestNewZero(*g, before, scores, [&](int j) { return j % g->cols == c; });
      if (i < 0) break;  // over the cap before this step (a lowered target): keep, monotone
      g->kept[i] = 1;
    }
  }
  for (int r = 0; r < g->rows; ++r) {
    if (!RowEmpty(*g, r)) continue;
    const int i = HighestNewZero(*g, before, scores, [&](int j) { return j / g->cols == r; });
    if (i >= 0) g->kept[i] = 1;
  }
}

// Step 3's fallback: per-column zeroing in seeded random column order, then empty rows
// repaired by swapping with the next-ranked block of the same column.
BlockGrid Fallback(const BlockGrid& before, const std::vector<double>& scores, int need,
                   int column_cap, uint64_t seed) {
  BlockGrid g = before;
  std::vector<int> columns(g.cols);
  std::iota(columns.begin(), columns.end(), 0);
  Philox rng(seed, RngStream::kPrune);
  for (int i = g.cols - 1; i > 0; --i) std::swap(columns[i], columns[rng.Below(i + 1)]);
  // Per column: kept blocks, ascending score.
  std::vector<std::vector<int>> ranked(g.cols);
  for (int i : AscendingKept(scores, before)) ranked[i % g.cols].push_back(i);
  std::vector<size_t> next(g.cols, 0);  // next candidate per column

  const int per_column = std::max(1, CeilDiv(need, g.cols));
  int added = 0;
  for (bool progress = true; progress && added < need;) {
    progress = false;
    for (int c : columns) {
      int quota = std::min({per_column, column_cap - ColumnZeros(g, c), need - added});
      while (quota > 0 && next[c] < ranked[c].size()) {
        g.kept[ranked[c][next[c]++]] = 0;
        ++added;
        --quota;
        progress = true;
      }
    }
  }
  for (int r = 0; r < g.rows; ++r) {
    if (!RowEmpty(g, r)) continue;
    const int i = HighestNewZero(g, before, scores, [&](int j) { return j / g.cols == r; });
    if (i < 0) continue;
    g.kept[i] = 1;
    // Swap: zero instead the next-ranked kept block of the same column whose row keeps
    // another block (bounded by the column's length).
    const int c = i % g.cols;
    for (int tries = 0; tries < g.rows && next[c] < ranked[c].size(); ++tries) {
      const int j = ranked[c][next[c]++];
      const int row = j / g.cols;
      int kept_in_row = 0;
      for (int cc = 0; cc < g.cols; ++cc) kept_in_row += g.at(row, cc);
      if (g.kept[j] && kept_in_row > 1) {
        g.kept[j] = 0;
        break;
      }
    }
  }
  return g;
}

}  // namespace

std::vector<double> BlockScores(const KernelView& v, const BlockGrid& grid,
                                PruningSpec::Score score) {
  const size_t n = static_cast<size_t>(grid.rows) * grid.cols;
  std::vector<double> sum(n, 0.0), sum_sq(n, 0.0), count(n, 0.0);
  for (int k = 0; k < v.out; ++k) {
    const int col = k / grid.block_out;
    for (int t = 0; t < v.taps; ++t) {
      for (int c = 0; c < v.in; ++c) {
        const size_t i = v.index(k, t, c);
        const size_t b = static_cast<size_t>(c / grid.block_in) * grid.cols + col;
        const double w = v.kept(i) ? v.w[i] : 0.0;
        double x = w;  // the quantity averaged
        if (score == PruningSpec::L1) x = std::fabs(w);
        if (score == PruningSpec::L2) x = w * w;
        if (score == PruningSpec::GRAD_L2) x = (v.grad_abs ? v.grad_abs[i] : 0.0) * w * w;
        sum[b] += x;
        sum_sq[b] += x * x;
        count[b] += 1;
      }
    }
  }
  std::vector<double> out(n, 0.0);
  for (size_t b = 0; b < n; ++b) {
    if (!grid.kept[b] || count[b] == 0) continue;
    const double mean = sum[b] / count[b];
    out[b] =
        score == PruningSpec::VARIANCE ? std::max(0.0, sum_sq[b] / count[b] - mean * mean) : mean;
  }
  return out;
}

int ReachableBlockZeros(int rows, int cols, double target) {
  const int z = static_cast<int>(std::floor(target * rows * cols));
  const int column_cap = static_cast<int>(std::floor(target * rows));
  return std::max(0, std::min({z, cols * column_cap, rows * (cols - 1)}));
}

BlockStepReport BlockPruneStep(const std::vector<double>& scores, double target,
                               double step_fraction, uint64_t seed, BlockGrid* grid,
                               bool balanced) {
  BlockStepReport report;
  const int blocks = grid->rows * grid->cols;
  report.zeros_before = grid->zeros();
  report.requested_zeros = static_cast<int>(std::floor(target * blocks));
  report.target_zeros = ReachableBlockZeros(grid->rows, grid->cols, target);
  report.column_cap = static_cast<int>(std::floor(target * grid->rows));
  const int k = std::max(1, static_cast<int>(std::floor(step_fraction * report.requested_zeros)));
  report.step_goal = std::min(report.zeros_before + k, report.target_zeros);
  const int need = report.step_goal - report.zeros_before;
  if (need <= 0) {
    report.zeros_after = report.zeros_before;
    return report;
  }
  if (balanced) {
    BalancedZeroStep(scores, need, grid);
    report.zeros_after = grid->zeros();
    return report;
  }
  // 1. Propose the lowest-ranked blocks; 2. repair columns over the cap and empty rows.
  const BlockGrid before = *grid;
  BlockGrid proposal = before;
  const std::vector<int> order = AscendingKept(scores, before);
  for (int i = 0; i < need && i < static_cast<int>(order.size()); ++i) proposal.kept[order[i]] = 0;
  Repair(before, scores, report.column_cap, &proposal);
  const int added = proposal.zeros() - report.zeros_before;
  // 3. Accept when the repaired step keeps at least half of its new zeros. (The reference
  // says "more than ceil(K/2)", which would force the fallback whenever one zero is left.)
  if (2 * added >= need) {
    *grid = std::move(proposal);
  } else {
    report.fallback = true;
    BlockGrid fb = Fallback(before, scores, need, report.column_cap, seed);
    *grid = fb.zeros() >= proposal.zeros() ? std::move(fb) : std::move(proposal);
  }
  report.zeros_after = grid->zeros();
  return report;
}

}  // namespace topiary::pruning

#include "pruning/balanced.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <queue>

namespace topiary::pruning {
namespace {

// A small min-cost flow (successive shortest paths with Dijkstra and potentials). Costs are
// block scores >= 0; every augmenting path carries one unit.
class MinCostFlow {
 public:
  explicit MinCostFlow(int nodes) : adj_(nodes), potential_(nodes, 0.0) {}
  int AddEdge(int from, int to, int capacity, double cost) {
    adj_[from].push_back(static_cast<int>(edges_.size()));
    edges_.push_back({to, capacity, cost});
    adj_[to].push_back(static_cast<int>(edges_.size()));
    edges_.push_back({from, 0, -cost});
    return static_cast<int>(edges_.size()) - 2;
  }
  // Pushes up to `limit` units from s to t along cheapest paths; returns the units pushed.
  int Run(int s, int t, int limit) {
    const int n = static_cast<int>(adj_.size());
    int pushed = 0;
    while (pushed < limit) {
      std::vector<double> dist(n, std::numeric_limits<double>::infinity());
      std::vector<int> via(n, -1);
      using Item = std::pair<double, int>;
      std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue;
      dist[s] = 0;
      queue.push({0.0, s});
      while (!queue.empty()) {
        const auto [d, u] = queue.top();
        queue.pop();
        if (d > dist[u]) continue;
        for (int e : adj_[u]) {
          const Edge& edge = edges_[e];
          if (edge.capacity <= 0) continue;
          // Reduced costs are >= 0 up to rounding: clamp so Dijkstra stays valid.
          const double reduced = std::max(0.0, edge.cost + potential_[u] - potential_[edge.to]);
          if (dist[u] + reduced < dist[edge.to]) {
            dist[edge.to] = dist[u] + reduced;
            via[edge.to] = e;
            queue.push({dist[edge.to], edge.to});
          }
        }
      }
      if (via[t] < 0) break;
      for (int v = 0; v < n; ++v) {
        if (dist[v] < std::numeric_limits<double>::infinity()) potential_[v] += dist[v];
      }
      for (int v = t; v != s; v = edges_[via[v] ^ 1].to) {
        --edges_[via[v]].capacity;
        ++edges_[via[v] ^ 1].capacity;
      }
      ++pushed;
    }
    return pushed;
  }
  bool Used(int edge) const { return edges_[edge].capacity == 0; }

 private:
  struct Edge {
    int to, capacity;
    double cost;
  };
  std::vector<std::vector<int>> adj_;
  std::vector<Edge> edges_;
  std::vector<double> potential_;
};

// How many zeros a line (column or row) may end with: at least `low` (floor of the even share,
// or what it has), at most `high` (the ceil, or what it has).
struct Share {
  int low, high;
};
std::vector<Share> Shares(const std::vector<int>& now, int total, int cap) {
  const int count = static_cast<int>(now.size());
  std::vector<Share> share(count);
  for (int i = 0; i < count; ++i) {
    const int floor = std::min(cap, total / count);
    const int ceil = std::min(cap, (total + count - 1) / count);
    share[i] = {std::max(now[i], floor), std::max(now[i], ceil)};
  }
  return share;
}

}  // namespace

int BalancedZeroStep(const std::vector<double>& scores, int need, kernels::BlockGrid* grid) {
  const int rows = grid->rows, cols = grid->cols;
  std::vector<int> col_zeros(cols, 0), row_zeros(rows, 0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      if (!grid->at(r, c)) {
        ++row_zeros[r];
        ++col_zeros[c];
      }
    }
  }
  const int total = grid->zeros() + need;
  const std::vector<Share> col_share = Shares(col_zeros, total, rows);
  const std::vector<Share> row_share = Shares(row_zeros, total, cols - 1);
  // Nodes: 0 source, 1..cols columns, then rows, then the sink. A line's zeros up to its
  // floor cost nothing; the one more up to its ceil costs more than all scores together, so
  // the flow fills every floor before any ceil, and picks which lines take the ceils by score.
  double extra = 1;
  for (double v : scores) extra += 2 * v;
  const int source = 0, sink = 1 + cols + rows;
  MinCostFlow flow(sink + 1);
  for (int c = 0; c < cols; ++c) {
    flow.AddEdge(source, 1 + c, col_share[c].low - col_zeros[c], 0.0);
    flow.AddEdge(source, 1 + c, col_share[c].high - col_share[c].low, extra);
  }
  for (int r = 0; r < rows; ++r) {
    flow.AddEdge(1 + cols + r, sink, row_share[r].low - row_zeros[r], 0.0);
    flow.AddEdge(1 + cols + r, sink, row_share[r].high - row_share[r].low, extra);
  }
  std::vector<std::pair<int, int>> block_edges;  // (edge, block index)
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      if (!grid->at(r, c)) continue;
      const int b = r * cols + c;
      block_edges.push_back({flow.AddEdge(1 + c, 1 + cols + r, 1, scores[b]), b});
    }
  }
  const int added = flow.Run(source, sink, need);
  for (const auto& [edge, b] : block_edges) {
    if (flow.Used(edge)) grid->kept[b] = 0;
  }
  return added;
}

bool IsBalanced(const kernels::BlockGrid& grid) {
  std::vector<int> col(grid.cols, 0), row(grid.rows, 0);
  for (int r = 0; r < grid.rows; ++r) {
    for (int c = 0; c < grid.cols; ++c) {
      if (!grid.at(r, c)) {
        ++row[r];
        ++col[c];
      }
    }
  }
  auto spread = [](const std::vector<int>& v) {
    return *std::max_element(v.begin(), v.end()) - *std::min_element(v.begin(), v.end());
  };
  return spread(col) <= 1 && spread(row) <= 1;
}

}  // namespace topiary::pruning

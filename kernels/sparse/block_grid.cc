#include "kernels/sparse/block_grid.h"

#include <algorithm>

namespace topiary::kernels {

BlockGrid BlockGrid::Dense(int in_channels, int out_channels, int block_in, int block_out) {
  BlockGrid g;
  g.block_in = block_in;
  g.block_out = block_out;
  g.rows = (in_channels + block_in - 1) / block_in;
  g.cols = (out_channels + block_out - 1) / block_out;
  g.kept.assign(static_cast<size_t>(g.rows) * g.cols, 1);
  return g;
}

int BlockGrid::zeros() const { return static_cast<int>(std::count(kept.begin(), kept.end(), 0)); }

double BlockGrid::density() const {
  if (kept.empty()) return 1.0;
  return 1.0 - static_cast<double>(zeros()) / static_cast<double>(kept.size());
}

std::vector<uint8_t> BlockGrid::Expand(int out, int taps, int in) const {
  std::vector<uint8_t> mask(static_cast<size_t>(out) * taps * in);
  for (int k = 0; k < out; ++k) {
    for (int t = 0; t < taps; ++t) {
      uint8_t* row = &mask[(static_cast<size_t>(k) * taps + t) * in];
      for (int c = 0; c < in; ++c) row[c] = at(c / block_in, k / block_out);
    }
  }
  return mask;
}

}  // namespace topiary::kernels

// The block grid of a block-sparse kernel: the one type that the pruner fills, the mask
// records (trainer/core MaskInfo), checkpoints store and the block-sparse kernels consume.
//
// A [K, R, S, C] filter is cut into blocks of block_in input channels x block_out output
// channels x every filter tap. Rows are input-channel blocks (ceil(C / block_in)), columns
// output-channel blocks (ceil(K / block_out)); `kept` is row-major, 1 = kept. The last block
// of a row or column may be ragged. (Checkpoints store the grid as [rows, cols], i.e.
// [input blocks, output blocks]: the transpose of the kernel's [K, C] order, and say so in
// the mask's `axes` attribute.)
#ifndef TOPIARY_KERNELS_SPARSE_BLOCK_GRID_H_
#define TOPIARY_KERNELS_SPARSE_BLOCK_GRID_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace topiary::kernels {

struct BlockGrid {
  int block_in = 8, block_out = 8;
  int rows = 0, cols = 0;  // input blocks, output blocks
  std::vector<uint8_t> kept;

  // Every block kept, for `in_channels` x `out_channels`.
  static BlockGrid Dense(int in_channels, int out_channels, int block_in, int block_out);

  bool Kept(int row, int col) const { return kept[index(row, col)] != 0; }
  uint8_t& at(int row, int col) { return kept[index(row, col)]; }
  uint8_t at(int row, int col) const { return kept[index(row, col)]; }
  int zeros() const;
  // Kept blocks / all blocks (1 for an empty grid).
  double density() const;
  // The element mask this grid stands for, in the memory layout [out, taps, in].
  std::vector<uint8_t> Expand(int out, int taps, int in) const;

  bool operator==(const BlockGrid& o) const {
    return block_in == o.block_in && block_out == o.block_out && rows == o.rows && cols == o.cols &&
           kept == o.kept;
  }

 private:
  size_t index(int row, int col) const { return static_cast<size_t>(row) * cols + col; }
};

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_SPARSE_BLOCK_GRID_H_

// The CPU reference of the block-sparse convolution: direct loops over kept blocks, in the
// order a reader can check against the formulas of block_sparse_conv.h.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "kernels/sparse/block_sparse_conv.h"

namespace topiary::kernels {

absl::Status CheckBlockGrid(const ConvShape& s, const BlockGrid& g) {
  if (g.block_in < 1 || g.block_out < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("block shape %dx%d: both sides must be >= 1", g.block_in, g.block_out));
  }
  const int rows = (s.c + g.block_in - 1) / g.block_in;
  const int cols = (s.k + g.block_out - 1) / g.block_out;
  if (g.rows != rows || g.cols != cols) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "block grid %dx%d does not fit %d input and %d output channels in %dx%d blocks (want "
        "%dx%d)",
        g.rows, g.cols, s.c, s.k, g.block_in, g.block_out, rows, cols));
  }
  if (g.kept.size() != static_cast<size_t>(rows) * cols) {
    return absl::InvalidArgumentError(
        absl::StrFormat("block grid has %zu entries, not %d", g.kept.size(), rows * cols));
  }
  for (uint8_t k : g.kept) {
    if (k > 1) return absl::InvalidArgumentError("block grid entries must be 0 or 1");
  }
  return absl::OkStatus();
}

const char* SparsePassName(SparsePass pass) {
  switch (pass) {
    case SparsePass::kForward:
      return "forward";
    case SparsePass::kBackwardData:
      return "backward data";
    case SparsePass::kBackwardFilter:
      return "backward filter";
  }
  return "?";
}

namespace {

// The channels [begin, end) of block b of `size` channels in blocks of `block`.
struct Span {
  int begin, end;
  Span(int b, int block, int size) : begin(b * block), end(std::min(size, (b + 1) * block)) {}
};

}  // namespace

void BlockSparseConv2dForwardCpu(const ConvShape& s, const BlockGrid& g, const float* x,
                                 const float* w, const float* bias, float* y) {
  const int ho = s.ho(), wo = s.wo();
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < static_cast<int64_t>(s.n) * ho * wo; ++p) {
    const int n = static_cast<int>(p / (ho * wo));
    const int oy = static_cast<int>(p / wo % ho), ox = static_cast<int>(p % wo);
    float* out = y + p * s.k;
    for (int k = 0; k < s.k; ++k) out[k] = bias != nullptr ? bias[k] : 0.0f;
    for (int col = 0; col < g.cols; ++col) {
      const Span ks(col, g.block_out, s.k);
      for (int row = 0; row < g.rows; ++row) {
        if (!g.Kept(row, col)) continue;
        const Span cs(row, g.block_in, s.c);
        for (int r = 0; r < s.r; ++r) {
          const int iy = oy * s.stride_h - s.pad_h + r;
          if (iy < 0 || iy >= s.h) continue;
          for (int t = 0; t < s.s; ++t) {
            const int ix = ox * s.stride_w - s.pad_w + t;
            if (ix < 0 || ix >= s.w) continue;
            const float* in = x + ((static_cast<int64_t>(n) * s.h + iy) * s.w + ix) * s.c;
            for (int k = ks.begin; k < ks.end; ++k) {
              const float* wk = w + ((static_cast<int64_t>(k) * s.r + r) * s.s + t) * s.c;
              float acc = 0;
              for (int c = cs.begin; c < cs.end; ++c) acc += in[c] * wk[c];
              out[k] += acc;
            }
          }
        }
      }
    }
  }
}

void BlockSparseConv2dBackwardDataCpu(const ConvShape& s, const BlockGrid& g, const float* dy,
                                      const float* w, float* dx) {
  const int ho = s.ho(), wo = s.wo();
#pragma omp parallel for schedule(static)
  for (int64_t q = 0; q < static_cast<int64_t>(s.n) * s.h * s.w; ++q) {
    const int n = static_cast<int>(q / (s.h * s.w));
    const int iy = static_cast<int>(q / s.w % s.h), ix = static_cast<int>(q % s.w);
    float* out = dx + q * s.c;
    std::fill(out, out + s.c, 0.0f);
    for (int r = 0; r < s.r; ++r) {
      const int ty = iy + s.pad_h - r;  // = oy * stride_h for the output pixel that reads q
      if (ty < 0 || ty % s.stride_h != 0 || ty / s.stride_h >= ho) continue;
      for (int t = 0; t < s.s; ++t) {
        const int tx = ix + s.pad_w - t;
        if (tx < 0 || tx % s.stride_w != 0 || tx / s.stride_w >= wo) continue;
        const float* g_out =
            dy + ((static_cast<int64_t>(n) * ho + ty / s.stride_h) * wo + tx / s.stride_w) * s.k;
        for (int row = 0; row < g.rows; ++row) {
          const Span cs(row, g.block_in, s.c);
          for (int col = 0; col < g.cols; ++col) {
            if (!g.Kept(row, col)) continue;
            const Span ks(col, g.block_out, s.k);
            for (int k = ks.begin; k < ks.end; ++k) {
              const float* wk = w + ((static_cast<int64_t>(k) * s.r + r) * s.s + t) * s.c;
              for (int c = cs.begin; c < cs.end; ++c) out[c] += g_out[k] * wk[c];
            }
          }
        }
      }
    }
  }
}

void BlockSparseConv2dBackwardFilterCpu(const ConvShape& s, const BlockGrid& g, const float* x,
                                        const float* dy, float* dw, float* dbias) {
  const int ho = s.ho(), wo = s.wo();
  const int64_t pixels = static_cast<int64_t>(s.n) * ho * wo;
  std::memset(dw, 0, sizeof(float) * static_cast<size_t>(s.k) * s.patch());
  if (dbias != nullptr) {
    for (int k = 0; k < s.k; ++k) {
      double acc = 0;
      for (int64_t p = 0; p < pixels; ++p) acc += dy[p * s.k + k];
      dbias[k] = static_cast<float>(acc);
    }
  }
#pragma omp parallel for schedule(dynamic)
  for (int k = 0; k < s.k; ++k) {
    const int col = k / g.block_out;
    for (int row = 0; row < g.rows; ++row) {
      if (!g.Kept(row, col)) continue;
      const Span cs(row, g.block_in, s.c);
      for (int r = 0; r < s.r; ++r) {
        for (int t = 0; t < s.s; ++t) {
          float* out = dw + ((static_cast<int64_t>(k) * s.r + r) * s.s + t) * s.c;
          for (int64_t p = 0; p < pixels; ++p) {
            const int n = static_cast<int>(p / (ho * wo));
            const int oy = static_cast<int>(p / wo % ho), ox = static_cast<int>(p % wo);
            const int iy = oy * s.stride_h - s.pad_h + r, ix = ox * s.stride_w - s.pad_w + t;
            if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
            const float gk = dy[p * s.k + k];
            const float* in = x + ((static_cast<int64_t>(n) * s.h + iy) * s.w + ix) * s.c;
            for (int c = cs.begin; c < cs.end; ++c) out[c] += gk * in[c];
          }
        }
      }
    }
  }
}

}  // namespace topiary::kernels

// Backward data at stride > 1 recomposed from its unit-stride phases (dgrad_phases.h) equals
// the direct strided backward data: the phases' dx views partition dx, each phase's problem has
// the layer's dy extent, and summing its sub-filter over dy (in double) gives the reference's
// dx, with 0 in the phases that have no taps.
#include "kernels/sparse/dgrad_phases.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/test_util.h"

namespace topiary::kernels {
namespace {

using testing::MakeConv;

// dx of one phase from its unit-stride problem, written into the layer's dx at its rows and
// columns; `seen` counts how often each dx element is written.
void RunPhase(const ConvShape& layer, const DgradPhase& p, const std::vector<float>& dy,
              const std::vector<float>& w, std::vector<double>* dx, std::vector<int>* seen) {
  const ConvShape& q = p.shape;
  const int ho = q.h + q.pad_h + p.pad_h_hi - q.r + 1, wo = q.w + q.pad_w + p.pad_w_hi - q.s + 1;
  for (int n = 0; n < q.n; ++n) {
    for (int i = 0; i < q.h; ++i) {
      for (int j = 0; j < q.w; ++j) {
        for (int c = 0; c < q.c; ++c) {
          double sum = 0;
          for (int t = 0; t < q.r; ++t) {
            for (int u = 0; u < q.s; ++u) {
              const int y = i + q.pad_h - t, x = j + q.pad_w - u;
              if (y < 0 || y >= ho || x < 0 || x >= wo) continue;
              const int r = p.r0 + layer.stride_h * t, s = p.s0 + layer.stride_w * u;
              for (int k = 0; k < q.k; ++k) {
                sum +=
                    static_cast<double>(
                        dy[((static_cast<size_t>(n) * layer.ho() + y) * layer.wo() + x) * layer.k +
                           k]) *
                    w[((static_cast<size_t>(k) * layer.r + r) * layer.s + s) * layer.c + c];
              }
            }
          }
          const int h = p.ph + layer.stride_h * i, x = p.pw + layer.stride_w * j;
          const size_t at = ((static_cast<size_t>(n) * layer.h + h) * layer.w + x) * layer.c + c;
          (*dx)[at] = sum;
          ++(*seen)[at];
        }
      }
    }
  }
}

TEST(DgradPhases, RecomposeStridedBackwardData) {
  ConvShape tall = MakeConv(1, 9, 6, 3, 4, 3, 2, 2, 1);  // unequal strides and paddings
  tall.stride_w = 3;
  tall.pad_w = 0;
  const ConvShape cases[] = {
      MakeConv(2, 8, 8, 5, 6, 3, 3, 2, 1),    // resnet's stride-2 3x3, even maps
      MakeConv(1, 7, 9, 3, 4, 3, 3, 2, 1),    // odd maps
      MakeConv(2, 8, 7, 4, 3, 1, 1, 2, 0),    // 1x1 shortcut: three phases without taps
      MakeConv(1, 8, 8, 3, 2, 3, 3, 2, 0),    // no padding: a dy row reaches no dx row
      MakeConv(1, 11, 10, 2, 3, 5, 5, 2, 2),  // 5x5
      MakeConv(1, 9, 9, 2, 2, 3, 3, 3, 1),    // stride 3
      MakeConv(1, 6, 6, 3, 3, 2, 2, 2, 0),    // stride = filter: one tap per phase
      MakeConv(1, 5, 5, 2, 3, 3, 3, 1, 1),    // stride 1: one phase, the layer itself
      tall,
  };
  uint32_t seed = 3;
  for (const ConvShape& s : cases) {
    SCOPED_TRACE(absl::StrFormat("%dx%d maps, %dx%d filter, stride %dx%d, pad %dx%d", s.h, s.w, s.r,
                                 s.s, s.stride_h, s.stride_w, s.pad_h, s.pad_w));
    const auto dy = testing::RandomFloats(static_cast<size_t>(s.n) * s.ho() * s.wo() * s.k, ++seed);
    const auto w = testing::RandomFloats(static_cast<size_t>(s.k) * s.r * s.s * s.c, ++seed);
    std::vector<float> ref(static_cast<size_t>(s.n) * s.h * s.w * s.c);
    std::vector<float> workspace(ConvWorkspaceFloatsCpu(s));
    Conv2dBackwardDataCpu(s, dy.data(), w.data(), ref.data(), workspace.data());

    const std::vector<DgradPhase> phases = DgradPhases(s);
    ASSERT_EQ(phases.size(), static_cast<size_t>(s.stride_h) * s.stride_w);
    std::vector<double> dx(ref.size(), 0.0);
    std::vector<int> seen(ref.size(), 0);
    for (const DgradPhase& p : phases) {
      EXPECT_EQ(p.shape.stride_h, 1);
      EXPECT_EQ(p.shape.stride_w, 1);
      if (!p.empty()) {
        EXPECT_EQ(p.shape.h + p.shape.pad_h + p.pad_h_hi - p.shape.r + 1, s.ho());
        EXPECT_EQ(p.shape.w + p.shape.pad_w + p.pad_w_hi - p.shape.s + 1, s.wo());
        RunPhase(s, p, dy, w, &dx, &seen);
        continue;
      }
      // No taps: dx is 0 on the phase's rows and columns.
      for (int n = 0; n < s.n; ++n) {
        for (int h = p.ph; h < s.h; h += s.stride_h) {
          for (int x = p.pw; x < s.w; x += s.stride_w) {
            for (int c = 0; c < s.c; ++c) {
              ++seen[((static_cast<size_t>(n) * s.h + h) * s.w + x) * s.c + c];
            }
          }
        }
      }
    }
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(seen[i], 1) << "dx element " << i;
      ASSERT_NEAR(dx[i], ref[i], 1e-5) << "dx element " << i;
    }
  }
}

// The padding a phase needs is what TMA im2col takes: resnet's stride-2 layers split into
// phases with non-negative upper padding and at least one tap each (3x3) or one phase with taps
// (1x1).
TEST(DgradPhases, ResnetStride2Layers) {
  const std::vector<DgradPhase> conv = DgradPhases(MakeConv(256, 56, 56, 128, 128, 3, 3, 2, 1));
  int taps = 0;
  for (const DgradPhase& p : conv) {
    EXPECT_FALSE(p.empty());
    EXPECT_EQ(p.shape.h, 28);
    EXPECT_GE(p.pad_h_hi, 0);
    EXPECT_GE(p.pad_w_hi, 0);
    taps += p.shape.r * p.shape.s;
  }
  EXPECT_EQ(taps, 9);  // every tap in exactly one phase
  const std::vector<DgradPhase> shortcut = DgradPhases(MakeConv(256, 56, 56, 256, 512, 1, 1, 2, 0));
  int with_taps = 0;
  for (const DgradPhase& p : shortcut) with_taps += !p.empty();
  EXPECT_EQ(with_taps, 1);
}

}  // namespace
}  // namespace topiary::kernels

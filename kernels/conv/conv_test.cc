#include "kernels/conv/conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/conv/conv_onednn.h"
#include "kernels/runtime/parallel.h"
#include "kernels/test_util.h"

namespace topiary::kernels {
namespace {

using testing::Dot;
using testing::MakeConv;
using testing::NumericalGradient;
using testing::RandomFloats;
using testing::RelError;
using testing::ToDouble;

// Direct convolution in double: y[n,oh,ow,k] = sum_{r,s,c} x[n,ih,iw,c] w[k,r,s,c].
std::vector<double> RefForward(const ConvShape& sh, const std::vector<double>& x,
                               const std::vector<double>& w) {
  std::vector<double> y(static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.k, 0.0);
  for (int n = 0; n < sh.n; ++n)
    for (int oh = 0; oh < sh.ho(); ++oh)
      for (int ow = 0; ow < sh.wo(); ++ow)
        for (int k = 0; k < sh.k; ++k) {
          double acc = 0.0;
          for (int r = 0; r < sh.r; ++r)
            for (int s = 0; s < sh.s; ++s) {
              const int ih = oh * sh.stride_h - sh.pad_h + r;
              const int iw = ow * sh.stride_w - sh.pad_w + s;
              if (ih < 0 || ih >= sh.h || iw < 0 || iw >= sh.w) continue;
              for (int c = 0; c < sh.c; ++c)
                acc += x[((static_cast<size_t>(n) * sh.h + ih) * sh.w + iw) * sh.c + c] *
                       w[((static_cast<size_t>(k) * sh.r + r) * sh.s + s) * sh.c + c];
            }
          y[((static_cast<size_t>(n) * sh.ho() + oh) * sh.wo() + ow) * sh.k + k] = acc;
        }
  return y;
}

// Gradients of L = <y, g> in double, written out directly (not through im2col).
void RefBackward(const ConvShape& sh, const std::vector<double>& x, const std::vector<double>& w,
                 const std::vector<double>& g, std::vector<double>* dx, std::vector<double>* dw) {
  dx->assign(x.size(), 0.0);
  dw->assign(w.size(), 0.0);
  for (int n = 0; n < sh.n; ++n)
    for (int oh = 0; oh < sh.ho(); ++oh)
      for (int ow = 0; ow < sh.wo(); ++ow)
        for (int k = 0; k < sh.k; ++k) {
          const double gy = g[((static_cast<size_t>(n) * sh.ho() + oh) * sh.wo() + ow) * sh.k + k];
          for (int r = 0; r < sh.r; ++r)
            for (int s = 0; s < sh.s; ++s) {
              const int ih = oh * sh.stride_h - sh.pad_h + r;
              const int iw = ow * sh.stride_w - sh.pad_w + s;
              if (ih < 0 || ih >= sh.h || iw < 0 || iw >= sh.w) continue;
              for (int c = 0; c < sh.c; ++c) {
                const size_t xi = ((static_cast<size_t>(n) * sh.h + ih) * sh.w + iw) * sh.c + c;
                const size_t wi = ((static_cast<size_t>(k) * sh.r + r) * sh.s + s) * sh.c + c;
                (*dx)[xi] += gy * w[wi];
                (*dw)[wi] += gy * x[xi];
              }
            }
        }
}

class ConvTest : public ::testing::TestWithParam<ConvShape> {};

TEST_P(ConvTest, MatchesFloat64Reference) {
  for (int threads : {1, 3}) {  // serial, and an odd split of chunks over threads
    SetCpuThreads(threads);
    SCOPED_TRACE(threads);
    const ConvShape sh = GetParam();
    ASSERT_TRUE(CheckConvShape(sh).ok());
    const size_t nx = static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c;
    const size_t nw = static_cast<size_t>(sh.k) * sh.patch();
    const size_t ny = static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.k;
    auto x = RandomFloats(nx, 1), w = RandomFloats(nw, 2), b = RandomFloats(sh.k, 3);
    auto g = RandomFloats(ny, 4);
    std::vector<float> ws(ConvWorkspaceFloatsCpu(sh) + 1);

    std::vector<float> y(ny);
    Conv2dForwardCpu(sh, x.data(), w.data(), b.data(), y.data(), ws.data());
    auto ref_y = RefForward(sh, ToDouble(x), ToDouble(w));
    for (size_t i = 0; i < ny; ++i) ref_y[i] += b[i % sh.k];
    EXPECT_LT(RelError(y, ref_y), 1e-5);

    std::vector<double> ref_dx, ref_dw;
    RefBackward(sh, ToDouble(x), ToDouble(w), ToDouble(g), &ref_dx, &ref_dw);
    std::vector<float> dx(nx, 123.0f), dw(nw, 123.0f), db(sh.k, 123.0f);
    Conv2dBackwardDataCpu(sh, g.data(), w.data(), dx.data(), ws.data());
    Conv2dBackwardFilterCpu(sh, x.data(), g.data(), dw.data(), db.data(), ws.data());
    EXPECT_LT(RelError(dx, ref_dx), 1e-5);
    EXPECT_LT(RelError(dw, ref_dw), 1e-5);
    std::vector<double> ref_db(sh.k, 0.0);
    for (size_t i = 0; i < ny; ++i) ref_db[i % sh.k] += g[i];
    EXPECT_LT(RelError(db, ref_db), 1e-5);

    // oneDNN's primitives (the CPU engine's default) against the same references.
    if (!ConvOneDnnPlan::Enabled()) {
      std::printf("oneDNN: not in this build (or TOPIARY_CPU_CONV=reference), not checked\n");
      continue;
    }
    auto plan = ConvOneDnnPlan::Create(sh);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::fill(y.begin(), y.end(), 123.0f);
    std::fill(dx.begin(), dx.end(), 123.0f);
    std::fill(dw.begin(), dw.end(), 123.0f);
    std::fill(db.begin(), db.end(), 123.0f);
    ASSERT_TRUE((*plan)->Forward(x.data(), w.data(), b.data(), y.data()).ok());
    ASSERT_TRUE((*plan)->BackwardData(g.data(), w.data(), dx.data()).ok());
    ASSERT_TRUE((*plan)->BackwardFilter(x.data(), g.data(), dw.data(), db.data()).ok());
    EXPECT_LT(RelError(y, ref_y), 1e-5) << (*plan)->implementations();
    EXPECT_LT(RelError(dx, ref_dx), 1e-5) << (*plan)->implementations();
    EXPECT_LT(RelError(dw, ref_dw), 1e-5) << (*plan)->implementations();
    EXPECT_LT(RelError(db, ref_db), 1e-5);
    // Without bias: the forward adds nothing, and the filter gradient is the same.
    ASSERT_TRUE((*plan)->Forward(x.data(), w.data(), nullptr, y.data()).ok());
    for (size_t i = 0; i < ny; ++i) ref_y[i] -= b[i % sh.k];
    EXPECT_LT(RelError(y, ref_y), 1e-5);
    ASSERT_TRUE((*plan)->BackwardFilter(x.data(), g.data(), dw.data(), nullptr).ok());
    EXPECT_LT(RelError(dw, ref_dw), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ConvTest,
    ::testing::Values(MakeConv(2, 5, 5, 3, 4, 3, 3, 1, 1),    // same padding
                      MakeConv(1, 7, 6, 3, 5, 3, 3, 2, 1),    // batch 1, odd, stride 2
                      MakeConv(3, 6, 6, 8, 16, 1, 1, 1, 0),   // pointwise (no im2col)
                      MakeConv(2, 7, 7, 5, 3, 1, 1, 2, 0),    // 1x1 stride 2 (shortcut)
                      MakeConv(2, 9, 8, 2, 3, 5, 3, 1, 2),    // non-square filter
                      MakeConv(1, 28, 28, 1, 6, 5, 5, 1, 2),  // lenet stem
                      MakeConv(2, 4, 4, 3, 2, 4, 4, 1, 0),    // filter covers the whole input
                      MakeConv(2, 3, 3, 2, 3, 1, 1, 1, 1),    // padded 1x1: pad > R-1
                      MakeConv(2, 6, 6, 4, 3, 1, 1, 2, 0),    // stride 2 skips the last row
                      MakeConv(1, 8, 8, 16, 32, 3, 3, 2, 1),  // resnet downsampling
                      MakeConv(300, 3, 3, 2, 3, 3, 3, 1, 1),  // many chunks
                      // resnet20 at width 0.75 (12, 24, 48 channels), odd batch 33: the
                      // oneDNN path crashed the process on these
                      MakeConv(33, 28, 28, 1, 12, 3, 3, 1, 1),   // stem
                      MakeConv(33, 28, 28, 12, 12, 3, 3, 1, 1),  // stage 1
                      MakeConv(33, 28, 28, 12, 24, 3, 3, 2, 1),  // stage 2 entry
                      MakeConv(33, 28, 28, 12, 24, 1, 1, 2, 0),  // its shortcut
                      MakeConv(33, 14, 14, 24, 24, 3, 3, 1, 1),  // stage 2
                      MakeConv(33, 14, 14, 24, 48, 3, 3, 2, 1),  // stage 3 entry
                      MakeConv(33, 7, 7, 48, 48, 3, 3, 1, 1)),   // stage 3
    [](const ::testing::TestParamInfo<ConvShape>& info) {
      const ConvShape& s = info.param;
      return absl::StrFormat("n%dh%dw%dc%dk%dr%ds%dst%dp%d", s.n, s.h, s.w, s.c, s.k, s.r, s.s,
                             s.stride_h, s.pad_h);
    });

// The reference's backward is itself checked against finite differences of its forward.
TEST(ConvReference, BackwardMatchesFiniteDifferences) {
  const ConvShape sh = MakeConv(2, 5, 4, 2, 3, 3, 2, 2, 1);
  const size_t nx = static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c;
  const size_t nw = static_cast<size_t>(sh.k) * sh.patch();
  auto x = ToDouble(RandomFloats(nx, 5)), w = ToDouble(RandomFloats(nw, 6));
  auto g = ToDouble(RandomFloats(static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.k, 7));
  std::vector<double> dx, dw;
  RefBackward(sh, x, w, g, &dx, &dw);
  auto num_dx =
      NumericalGradient([&](std::vector<double>& v) { return Dot(RefForward(sh, v, w), g); }, x);
  auto num_dw =
      NumericalGradient([&](std::vector<double>& v) { return Dot(RefForward(sh, x, v), g); }, w);
  EXPECT_LT(RelError(dx, num_dx), 1e-7);
  EXPECT_LT(RelError(dw, num_dw), 1e-7);
}

TEST(ConvShapeCheck, RejectsBadShapes) {
  EXPECT_FALSE(CheckConvShape(MakeConv(0, 5, 5, 3, 4, 3, 3, 1, 1)).ok());
  EXPECT_FALSE(CheckConvShape(MakeConv(1, 2, 2, 3, 4, 5, 5, 1, 0)).ok());
  EXPECT_FALSE(CheckConvShape(MakeConv(1, 5, 5, 3, 4, 3, 3, 0, 0)).ok());
  EXPECT_TRUE(CheckConvShape(MakeConv(1, 2, 2, 3, 4, 5, 5, 1, 2)).ok());
}

}  // namespace
}  // namespace topiary::kernels

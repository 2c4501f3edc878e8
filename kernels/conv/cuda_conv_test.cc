// CUDA kernels of convolutions (cuDNN, grouped, sampled weight gradients) and the linear layer
// against their CPU twins, over the shared fixture of kernels/cuda_test_util.h.
#include "kernels/conv/conv.h"
#include "kernels/conv/direct_conv.h"
#include "kernels/conv/grouped_conv.h"
#include "kernels/conv/linear.h"
#include "kernels/conv/sampled_grad.h"
#include "kernels/conv/stem_conv.h"
#include "kernels/cuda_test_util.h"

namespace topiary::kernels {
namespace {

using namespace testing;  // NOLINT: the shared fixture and helpers (cuda_test_util.h)

// "2x9x9x32 k24 r3x3 stride 2 pad 1", for failure messages.
std::string ShapeName(const ConvShape& s) {
  return std::to_string(s.n) + "x" + std::to_string(s.h) + "x" + std::to_string(s.w) + "x" +
         std::to_string(s.c) + " k" + std::to_string(s.k) + " r" + std::to_string(s.r) + "x" +
         std::to_string(s.s) + " stride " + std::to_string(s.stride_h) + " pad " +
         std::to_string(s.pad_h);
}

TEST_F(CudaKernels, ConvMatchesCpu) {
  for (const ConvShape& sh :
       {MakeConv(2, 5, 5, 3, 4, 3, 3, 1, 1), MakeConv(1, 7, 6, 3, 5, 3, 3, 2, 1),
        MakeConv(3, 6, 6, 8, 16, 1, 1, 1, 0), MakeConv(2, 7, 7, 5, 3, 1, 1, 2, 0),
        MakeConv(2, 9, 8, 2, 3, 5, 3, 1, 2), MakeConv(4, 28, 28, 1, 6, 5, 5, 1, 2),
        MakeConv(2, 4, 4, 3, 2, 4, 4, 1, 0), MakeConv(128, 32, 32, 16, 16, 3, 3, 1, 1),
        MakeConv(2, 33, 33, 3, 64, 7, 7, 2, 3)}) {
    for (Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16}) {
      SCOPED_TRACE(ShapeName(sh) + " " + PrecisionName(p));
      const DType t = ActivationType(p);
      const double tol = p == Precision::kFp32 ? 1e-4 : 1e-2;
      auto plan = ConvCudaPlan::Create(sh, p, size_t{1} << 30, true, ctx_);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ((*plan)->dtype(), t);
      const size_t nx = static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c;
      const size_t nw = static_cast<size_t>(sh.k) * sh.patch();
      const size_t ny = static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.k;
      auto x = Round(RandomFloats(nx, 20), t), w = Round(RandomFloats(nw, 21), t);
      auto b = RandomFloats(sh.k, 22), g = Round(RandomFloats(ny, 23), t);
      Act dx(t, x), dw(t, w), dg(t, g), y(t, ny), gx(t, nx), gw(t, nw);
      Dev<float> db(b), gb(sh.k);
      Dev<uint8_t> ws((*plan)->workspace_bytes());
      ASSERT_TRUE((*plan)->Forward(dx.get(), dw.get(), db.get(), y.get(), ws.get(), ctx_).ok());
      ASSERT_TRUE((*plan)->BackwardData(dg.get(), dw.get(), gx.get(), ws.get(), ctx_).ok());
      ASSERT_TRUE(
          (*plan)->BackwardFilter(dx.get(), dg.get(), gw.get(), gb.get(), ws.get(), ctx_).ok());
      std::vector<float> cws(ConvWorkspaceFloatsCpu(sh) + 1), ry(ny), rgx(nx), rgw(nw), rgb(sh.k);
      Conv2dForwardCpu(sh, x.data(), w.data(), b.data(), ry.data(), cws.data());
      Conv2dBackwardDataCpu(sh, g.data(), w.data(), rgx.data(), cws.data());
      Conv2dBackwardFilterCpu(sh, x.data(), g.data(), rgw.data(), rgb.data(), cws.data());
      Sync();
      EXPECT_LT(Rel(y.Host(), ry), tol);
      EXPECT_LT(Rel(gx.Host(), rgx), tol);
      EXPECT_LT(Rel(gw.Host(), rgw), tol);
      EXPECT_LT(Rel(gb.Host(), rgb), 1e-4);
    }
  }
}

// The three passes of a convolution in float64 (the direct kernels' reference).
struct Float64Conv {
  std::vector<float> y, dx, dw;
  Float64Conv(const ConvShape& s, const std::vector<float>& x, const std::vector<float>& w,
              const std::vector<float>& dy) {
    const int ho = s.ho(), wo = s.wo();
    std::vector<double> ry(dy.size(), 0), rdx(x.size(), 0), rdw(w.size(), 0);
    for (int n = 0; n < s.n; ++n)
      for (int p = 0; p < ho; ++p)
        for (int q = 0; q < wo; ++q)
          for (int r = 0; r < s.r; ++r)
            for (int t = 0; t < s.s; ++t) {
              const int h = p * s.stride_h - s.pad_h + r, col = q * s.stride_w - s.pad_w + t;
              if (h < 0 || h >= s.h || col < 0 || col >= s.w) continue;
              const size_t xi = ((static_cast<size_t>(n) * s.h + h) * s.w + col) * s.c;
              const size_t yi = ((static_cast<size_t>(n) * ho + p) * wo + q) * s.k;
              for (int k = 0; k < s.k; ++k) {
                const size_t wi = ((static_cast<size_t>(k) * s.r + r) * s.s + t) * s.c;
                for (int c = 0; c < s.c; ++c) {
                  ry[yi + k] += static_cast<double>(x[xi + c]) * w[wi + c];
                  rdx[xi + c] += static_cast<double>(dy[yi + k]) * w[wi + c];
                  rdw[wi + c] += static_cast<double>(dy[yi + k]) * x[xi + c];
                }
              }
            }
    y.assign(ry.begin(), ry.end());
    dx.assign(rdx.begin(), rdx.end());
    dw.assign(rdw.begin(), rdw.end());
  }
};

// Random bf16 operands of a convolution (x, w and dy, rounded to bf16) and its passes in
// float64 on them.
struct Bf16Case {
  size_t nx, nw, ny;
  std::vector<float> x, w, g;
  Float64Conv ref;
  Bf16Case(const ConvShape& sh, uint32_t seed)
      : nx(static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c),
        nw(static_cast<size_t>(sh.k) * sh.patch()),
        ny(static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.k),
        x(Round(RandomFloats(nx, seed), DType::kBf16)),
        w(Round(RandomFloats(nw, seed + 1), DType::kBf16)),
        g(Round(RandomFloats(ny, seed + 2), DType::kBf16)),
        ref(sh, x, w, g) {}
};

// The direct kernels' test shapes: batch 1, odd and non-square maps, stride 2, 1x1, no
// padding, every output-channel tile (8-64) and input-channel split, the largest channel
// counts taken.
std::vector<ConvShape> DirectShapes() {
  return {MakeConv(1, 7, 5, 16, 8, 3, 3, 1, 1),      MakeConv(2, 9, 9, 32, 24, 3, 3, 2, 1),
          MakeConv(3, 6, 7, 16, 16, 1, 1, 1, 0),     MakeConv(2, 11, 13, 48, 40, 1, 1, 2, 0),
          MakeConv(4, 32, 32, 16, 16, 3, 3, 1, 1),   MakeConv(3, 8, 8, 64, 64, 3, 3, 1, 1),
          MakeConv(2, 16, 16, 128, 128, 3, 3, 1, 1), MakeConv(1, 5, 6, 16, 32, 3, 3, 1, 0),
          MakeConv(2, 17, 15, 32, 64, 3, 3, 2, 1)};
}

// The direct fp32 kernels against float64 on random operands (DirectShapes), and the passes
// they refuse.
TEST_F(CudaKernels, DirectConvMatchesFloat64) {
  EXPECT_FALSE(DirectConvSupported(MakeConv(2, 8, 8, 8, 16, 3, 3, 1, 1), 0));    // C % 16
  EXPECT_FALSE(DirectConvSupported(MakeConv(2, 8, 8, 16, 12, 3, 3, 1, 1), 0));   // K % 8
  EXPECT_FALSE(DirectConvSupported(MakeConv(2, 8, 8, 256, 64, 3, 3, 1, 1), 0));  // C > 128
  EXPECT_FALSE(DirectConvSupported(MakeConv(2, 8, 8, 16, 16, 5, 5, 1, 2), 0));   // 5x5
  EXPECT_FALSE(DirectConvSupported(MakeConv(2, 9, 9, 16, 16, 3, 3, 2, 1), 1));   // stride 2
  EXPECT_FALSE(DirectConvSupported(MakeConv(2, 9, 9, 16, 8, 3, 3, 1, 1), 1));    // K % 16
  for (const ConvShape& sh : DirectShapes()) {
    SCOPED_TRACE(ShapeName(sh));
    const size_t nx = static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c;
    const size_t nw = static_cast<size_t>(sh.k) * sh.patch();
    const size_t ny = static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.k;
    const auto x = RandomFloats(nx, 30), w = RandomFloats(nw, 31), g = RandomFloats(ny, 32);
    const Float64Conv ref(sh, x, w, g);
    Dev<float> dx(x), dw(w), dg(g), y(ny), gx(nx), gw(nw);
    size_t ws_bytes = 0;
    for (int p = 0; p < 3; ++p) {
      ws_bytes = std::max(ws_bytes, DirectConvWorkspaceBytes(sh, p, ctx_.sm_count));
    }
    Dev<uint8_t> ws(ws_bytes);
    ASSERT_TRUE(DirectConvSupported(sh, 0));
    ASSERT_TRUE(DirectConvSupported(sh, 2));
    ASSERT_TRUE(DirectConvForwardCuda(sh, dx.get(), dw.get(), y.get(), false, ctx_).ok());
    ASSERT_TRUE(
        DirectConvBackwardFilterCuda(sh, dx.get(), dg.get(), gw.get(), ws.get(), false, ctx_).ok());
    const bool data = sh.stride_h == 1 && sh.k % 16 == 0;
    ASSERT_EQ(DirectConvSupported(sh, 1), data);
    if (data) {
      ASSERT_TRUE(
          DirectConvBackwardDataCuda(sh, dg.get(), dw.get(), gx.get(), ws.get(), false, ctx_).ok());
    }
    Sync();
    EXPECT_LT(Rel(y.Host(), ref.y), 1e-5);
    EXPECT_LT(Rel(gw.Host(), ref.dw), 1e-5);
    if (data) {
      EXPECT_LT(Rel(gx.Host(), ref.dx), 1e-5);
    }
    // The same bits on a second run: fixed summation order, no atomics.
    Dev<float> gw2(nw);
    ASSERT_TRUE(
        DirectConvBackwardFilterCuda(sh, dx.get(), dg.get(), gw2.get(), ws.get(), false, ctx_)
            .ok());
    Sync();
    EXPECT_EQ(gw.Host(), gw2.Host());
    // TF32 on tensor cores: operands rounded to 10-bit mantissas (relative error 2^-11 each),
    // the backward filter (3x3 and 1x1 here) again the same bits on a second run.
    ASSERT_TRUE(DirectConvForwardCuda(sh, dx.get(), dw.get(), y.get(), true, ctx_).ok());
    if (data) {
      ASSERT_TRUE(
          DirectConvBackwardDataCuda(sh, dg.get(), dw.get(), gx.get(), ws.get(), true, ctx_).ok());
    }
    ASSERT_TRUE(
        DirectConvBackwardFilterCuda(sh, dx.get(), dg.get(), gw.get(), ws.get(), true, ctx_).ok());
    ASSERT_TRUE(
        DirectConvBackwardFilterCuda(sh, dx.get(), dg.get(), gw2.get(), ws.get(), true, ctx_).ok());
    Sync();
    const double tf32_y = Rel(y.Host(), ref.y), tf32_dw = Rel(gw.Host(), ref.dw);
    EXPECT_LT(tf32_y, 3e-3);
    EXPECT_GT(tf32_y, 1e-6);  // the tensor-core path really ran: not fp32's error
    EXPECT_LT(tf32_dw, 3e-3);
    EXPECT_GT(tf32_dw, 1e-6);
    EXPECT_EQ(gw.Host(), gw2.Host());
    if (data) {
      EXPECT_LT(Rel(gx.Host(), ref.dx), 3e-3);
    }
  }
}

// The direct kernels' bf16 forms (forward and backward data on mma.sync m16n8k16) against
// float64 on the same bf16 operands: each output is its fp32 sum rounded to bf16 once (half a
// bf16 step, 2^-9 of its magnitude), on DirectShapes.
TEST_F(CudaKernels, DirectConvBf16MatchesFloat64) {
  for (const ConvShape& sh : DirectShapes()) {
    SCOPED_TRACE(ShapeName(sh));
    const Bf16Case c(sh, 60);
    const Float64Conv& ref = c.ref;
    Act dx(DType::kBf16, c.x), dw(DType::kBf16, c.w), dg(DType::kBf16, c.g), y(DType::kBf16, c.ny),
        gx(DType::kBf16, c.nx), gw(DType::kBf16, c.nw), gw2(DType::kBf16, c.nw);
    Dev<uint8_t> ws(std::max(DirectConvWorkspaceBytes(sh, 1, ctx_.sm_count),
                             DirectConvWorkspaceBytes(sh, 2, ctx_.sm_count)));
    ASSERT_TRUE(DirectConvBf16Supported(sh, 0));
    ASSERT_TRUE(DirectConvBf16Supported(sh, 2));  // 3x3 and 1x1 filters
    const auto* xb = static_cast<const Bf16*>(dx.get());
    const auto* wb = static_cast<const Bf16*>(dw.get());
    const auto* gb = static_cast<const Bf16*>(dg.get());
    ASSERT_TRUE(DirectConvForwardBf16Cuda(sh, xb, wb, static_cast<Bf16*>(y.get()), ctx_).ok());
    const bool data = DirectConvBf16Supported(sh, 1);
    if (data) {
      ASSERT_TRUE(
          DirectConvBackwardDataBf16Cuda(sh, gb, wb, static_cast<Bf16*>(gx.get()), ws.get(), ctx_)
              .ok());
    }
    for (const Act* out : {&gw, &gw2}) {
      ASSERT_TRUE(DirectConvBackwardFilterBf16Cuda(sh, xb, gb, static_cast<Bf16*>(out->get()),
                                                   ws.get(), ctx_)
                      .ok());
    }
    Sync();
    EXPECT_LT(Rel(y.Host(), ref.y), 5e-3);
    if (data) {
      EXPECT_LT(Rel(gx.Host(), ref.dx), 5e-3);
    }
    EXPECT_LT(Rel(gw.Host(), ref.dw), 5e-3);
    EXPECT_EQ(gw.Host(), gw2.Host());  // fixed summation order: the same bits
  }
  // Backward filter takes 3x3 and 1x1 filters only (its taps are its accumulators).
  EXPECT_TRUE(DirectConvSupported(MakeConv(2, 8, 8, 16, 16, 3, 1, 1, 0), 2));
  EXPECT_FALSE(DirectConvBf16Supported(MakeConv(2, 8, 8, 16, 16, 3, 1, 1, 0), 2));
}

// The bf16 stem kernels against float64 on the same bf16 operands: each output is its fp32 sum
// rounded to bf16 once (half a bf16 step, 2^-9 of its magnitude), on awkward shapes (batch 1,
// odd sizes, 1 to 4 channels, 1x1, stride 2 and 3, receptive fields of 2 to 256 values,
// several channel tiles of 64 or 16 channels, blocks of the backward filter walking several stages
// and a partial last one).
TEST_F(CudaKernels, StemConvMatchesFloat64) {
  EXPECT_FALSE(StemConvSupported(MakeConv(2, 9, 9, 5, 64, 3, 3, 1, 1), 0));    // C > 4
  EXPECT_FALSE(StemConvSupported(MakeConv(2, 9, 9, 3, 24, 3, 3, 1, 1), 0));    // K % 16
  EXPECT_FALSE(StemConvSupported(MakeConv(2, 20, 20, 4, 64, 9, 9, 1, 0), 2));  // S*C = 36
  for (int pass : {0, 2}) {
    EXPECT_FALSE(StemConvSupported(MakeConv(2, 20, 20, 4, 64, 9, 8, 1, 0), pass));  // 36 runs
    EXPECT_TRUE(StemConvSupported(MakeConv(2, 20, 20, 4, 64, 8, 8, 1, 0), pass));   // 32 runs
  }
  EXPECT_FALSE(StemConvSupported(MakeConv(2, 9, 9, 3, 64, 3, 3, 1, 1), 1));  // backward data
  for (const ConvShape& sh :
       {MakeConv(2, 33, 33, 3, 64, 7, 7, 2, 3), MakeConv(1, 9, 7, 1, 64, 3, 3, 1, 1),
        MakeConv(3, 11, 13, 4, 128, 5, 5, 2, 2), MakeConv(2, 8, 8, 2, 64, 1, 1, 1, 0),
        MakeConv(1, 17, 19, 3, 64, 8, 8, 1, 0), MakeConv(2, 40, 36, 4, 64, 8, 8, 3, 4),
        MakeConv(5, 64, 64, 4, 128, 3, 3, 1, 1), MakeConv(2, 64, 64, 3, 64, 7, 7, 2, 3),
        MakeConv(1, 10, 12, 1, 64, 3, 3, 1, 1),
        // 16 channels per block (K not a multiple of 64): resnet20's stem, stride 2, 1x1.
        MakeConv(3, 32, 32, 3, 16, 3, 3, 1, 1), MakeConv(2, 15, 17, 3, 48, 3, 3, 2, 1),
        MakeConv(1, 7, 9, 2, 32, 1, 1, 1, 0), MakeConv(2, 33, 33, 3, 16, 7, 7, 2, 3)}) {
    SCOPED_TRACE(ShapeName(sh));
    ASSERT_TRUE(StemConvSupported(sh, 0));
    ASSERT_TRUE(StemConvSupported(sh, 2));
    const Bf16Case c(sh, 50);
    const Float64Conv& ref = c.ref;
    Act dx(DType::kBf16, c.x), dw(DType::kBf16, c.w), dg(DType::kBf16, c.g), y(DType::kBf16, c.ny),
        gw(DType::kBf16, c.nw), gw2(DType::kBf16, c.nw);
    Dev<uint8_t> ws(StemConvWorkspaceBytes(sh, 2, ctx_.sm_count));
    const auto* xb = static_cast<const Bf16*>(dx.get());
    const auto* gb = static_cast<const Bf16*>(dg.get());
    ASSERT_TRUE(StemConvForwardCuda(sh, xb, static_cast<const Bf16*>(dw.get()),
                                    static_cast<Bf16*>(y.get()), ctx_)
                    .ok());
    ASSERT_TRUE(
        StemConvBackwardFilterCuda(sh, xb, gb, static_cast<Bf16*>(gw.get()), ws.get(), ctx_).ok());
    ASSERT_TRUE(
        StemConvBackwardFilterCuda(sh, xb, gb, static_cast<Bf16*>(gw2.get()), ws.get(), ctx_).ok());
    Sync();
    EXPECT_LT(Rel(y.Host(), ref.y), 5e-3);
    EXPECT_LT(Rel(gw.Host(), ref.dw), 5e-3);
    EXPECT_EQ(gw.Host(), gw2.Host());  // fixed summation order: the same bits
  }
}

// A plan restored with the direct kernel on every pass (as a cached measurement would make
// it) runs it, in fp32, TF32 and bf16, and is refused where a pass has no direct kernel for
// the shape (backward data at stride 2).
TEST_F(CudaKernels, PlansRunTheDirectKernelsTheyChose) {
  ConvAlgos direct;
  for (ConvPassAlgo& a : direct.pass) a.direct = true;
  const ConvShape sh = MakeConv(3, 12, 10, 32, 16, 3, 3, 1, 1);
  const size_t nx = static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c;
  const size_t nw = static_cast<size_t>(sh.k) * sh.patch();
  const size_t ny = static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.k;
  const auto x = RandomFloats(nx, 40), w = RandomFloats(nw, 41), g = RandomFloats(ny, 42);
  const Float64Conv ref(sh, x, w, g);
  for (Precision p : {Precision::kFp32, Precision::kTf32}) {
    SCOPED_TRACE(PrecisionName(p));
    ConvSearch search;
    search.known = &direct;
    auto plan = ConvCudaPlan::Create(sh, p, size_t{1} << 30, false, ctx_, search);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ((*plan)->source(), ConvPlanSource::kKnown);
    for (int pass = 0; pass < 3; ++pass) EXPECT_TRUE((*plan)->algos().pass[pass].direct);
    Dev<float> dx(x), dw(w), dg(g), y(ny), gx(nx), gw(nw);
    Dev<uint8_t> ws((*plan)->workspace_bytes());
    ASSERT_TRUE((*plan)->Forward(dx.get(), dw.get(), nullptr, y.get(), ws.get(), ctx_).ok());
    ASSERT_TRUE((*plan)->BackwardData(dg.get(), dw.get(), gx.get(), ws.get(), ctx_).ok());
    ASSERT_TRUE(
        (*plan)->BackwardFilter(dx.get(), dg.get(), gw.get(), nullptr, ws.get(), ctx_).ok());
    Sync();
    // fp32 plans: fp32 products; TF32 plans: TF32 products on every pass.
    const double tol = p == Precision::kFp32 ? 1e-5 : 3e-3;
    EXPECT_LT(Rel(y.Host(), ref.y), tol);
    EXPECT_LT(Rel(gx.Host(), ref.dx), tol);
    EXPECT_LT(Rel(gw.Host(), ref.dw), tol);
  }
  // bf16 at 32 channels: the direct kernels' bf16 forms take all three passes, so the known
  // plan is kept and runs within bf16 rounding. At stride 2 backward data has no direct kernel:
  // the known plan is refused and searched anew.
  ConvSearch search;
  search.known = &direct;
  auto bf16 = ConvCudaPlan::Create(sh, Precision::kBf16, size_t{1} << 30, false, ctx_, search);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ((*bf16)->source(), ConvPlanSource::kKnown);
  for (int pass = 0; pass < 3; ++pass) EXPECT_TRUE((*bf16)->algos().pass[pass].direct);
  {
    const auto xb = Round(x, DType::kBf16), wb = Round(w, DType::kBf16),
               gb = Round(g, DType::kBf16);
    const Float64Conv rb(sh, xb, wb, gb);
    Act dx(DType::kBf16, xb), dw(DType::kBf16, wb), dg(DType::kBf16, gb), y(DType::kBf16, ny),
        gx(DType::kBf16, nx), gw(DType::kBf16, nw);
    Dev<uint8_t> ws((*bf16)->workspace_bytes());
    ASSERT_TRUE((*bf16)->Forward(dx.get(), dw.get(), nullptr, y.get(), ws.get(), ctx_).ok());
    ASSERT_TRUE((*bf16)->BackwardData(dg.get(), dw.get(), gx.get(), ws.get(), ctx_).ok());
    ASSERT_TRUE(
        (*bf16)->BackwardFilter(dx.get(), dg.get(), gw.get(), nullptr, ws.get(), ctx_).ok());
    Sync();
    EXPECT_LT(Rel(y.Host(), rb.y), 5e-3);
    EXPECT_LT(Rel(gx.Host(), rb.dx), 5e-3);
    EXPECT_LT(Rel(gw.Host(), rb.dw), 5e-3);
  }
  auto strided = ConvCudaPlan::Create(MakeConv(2, 9, 9, 32, 16, 3, 3, 2, 1), Precision::kFp32,
                                      size_t{1} << 30, false, ctx_, search);
  ASSERT_TRUE(strided.ok()) << strided.status();
  EXPECT_NE((*strided)->source(), ConvPlanSource::kKnown);
  EXPECT_FALSE((*strided)->algos().pass[1].direct);
}

// Grouped and depthwise convolutions (imported networks) within rounding, both element types.
TEST_F(CudaKernels, GroupedConvMatchesCpu) {
  for (DType t : kTypes) {
    SCOPED_TRACE(Name(t));
    for (auto [sh, groups] : {std::pair{MakeConv(4, 15, 13, 32, 32, 3, 3, 2, 1), 32},
                              std::pair{MakeConv(3, 9, 9, 16, 32, 3, 3, 1, 1), 4},
                              std::pair{MakeConv(1, 7, 7, 6, 6, 5, 5, 1, 2), 6}}) {
      GroupedConvShape gc{sh, groups};
      const size_t nx = static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c;
      const size_t ny = static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.k;
      const size_t nw = static_cast<size_t>(sh.k) * sh.r * sh.s * gc.cg();
      auto cx = Round(RandomFloats(nx, 5), t), cdy = Round(RandomFloats(ny, 6), t);
      auto w = RandomFloats(nw, 7), bias = RandomFloats(sh.k, 8);
      Act ax(t, cx), ady(t, cdy), ay(t, ny), adx(t, nx);
      Dev<float> dw(w), dbias(bias), dgw(nw);
      ASSERT_TRUE(
          GroupedConvForwardCuda(t, gc, ax.get(), dw.get(), dbias.get(), ay.get(), ctx_).ok());
      ASSERT_TRUE(GroupedConvBackwardDataCuda(t, gc, ady.get(), dw.get(), adx.get(), ctx_).ok());
      ASSERT_TRUE(GroupedConvBackwardFilterCuda(t, gc, ax.get(), ady.get(), dgw.get(), ctx_).ok());
      std::vector<float> cy(ny), cdx(nx), cgw(nw);
      GroupedConvForwardCpu(gc, cx.data(), w.data(), bias.data(), cy.data());
      GroupedConvBackwardDataCpu(gc, cdy.data(), w.data(), cdx.data());
      GroupedConvBackwardFilterCpu(gc, cx.data(), cdy.data(), cgw.data(), nullptr);
      Sync();
      EXPECT_LT(Rel(ay.Host(), cy), Tol(t, 1e-5));
      EXPECT_LT(Rel(adx.Host(), cdx), Tol(t, 1e-5));
      EXPECT_LT(Rel(dgw.Host(), cgw), 1e-4);  // fp32 sums in another order
    }
  }
}

// Sampled weight gradients: the same selection as the CPU reference (every list length, the
// bisection path, every position kept), a mask and a bias gradient, for both element types.
// Keeping every position must equal the exact filter gradient.
TEST_F(CudaKernels, SampledWeightGradMatchesCpu) {
  uint32_t seed = 900;
  for (const ConvShape& sh :
       {MakeConv(2, 7, 7, 3, 5, 3, 3, 1, 1), MakeConv(1, 9, 8, 5, 4, 3, 3, 2, 1),
        MakeConv(3, 6, 6, 4, 40, 1, 1, 1, 0), MakeConv(2, 5, 5, 17, 33, 3, 3, 2, 0),
        MakeConv(2, 8, 8, 7, 3, 5, 5, 1, 2), MakeConv(16, 28, 28, 16, 16, 3, 3, 1, 1),
        MakeConv(4, 14, 14, 64, 70, 3, 3, 2, 1), MakeConv(2, 7, 7, 300, 20, 3, 3, 1, 1)}) {
    const int count = sh.ho() * sh.wo();
    for (int top_k : {1, 3, 8, 16, 40, count}) {
      for (DType t : kTypes) {
        SCOPED_TRACE(ShapeName(sh) + " top_k " + std::to_string(top_k) + " " + Name(t));
        const size_t nx = static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c;
        const size_t nw = static_cast<size_t>(sh.k) * sh.patch();
        const size_t ny = static_cast<size_t>(sh.n) * count * sh.k;
        const auto x = Round(RandomFloats(nx, seed++), t), g = Round(RandomFloats(ny, seed++), t);
        std::vector<uint8_t> mask(nw);
        std::mt19937 gen(seed++);
        for (auto& m : mask) m = gen() % 4 != 0;
        const WeightGradSampling sampling{top_k, top_k == 3 ? 1.0f / sh.n : 1.0f};
        Act dx(t, x), dg(t, g), gw(t, nw);
        Dev<uint8_t> dmask(mask), ws(SampledWeightGradWorkspaceBytes(sh, top_k));
        Dev<float> gb(sh.k);
        ASSERT_TRUE(SampledWeightGradCuda(t, sh, sampling, dx.get(), dg.get(), dmask.get(),
                                          gw.get(), gb.get(), ws.get(), ctx_)
                        .ok());
        std::vector<unsigned char> cws(SampledWeightGradWorkspaceBytesCpu(sh, top_k));
        std::vector<float> rgw(nw), rgb(sh.k);
        SampledWeightGradCpu(sh, sampling, x.data(), g.data(), mask.data(), rgw.data(), rgb.data(),
                             cws.data());
        Sync();
        const auto got = gw.Host();
        EXPECT_LT(Rel(got, rgw), Tol(t, 1e-4));
        EXPECT_LT(Rel(gb.Host(), rgb), 1e-4);
        for (size_t e = 0; e < nw; ++e) {
          if (!mask[e]) {
            ASSERT_EQ(got[e], 0.0f) << e;
          }
        }
        if (top_k == count) {
          std::vector<float> exact(nw), eb(sh.k), ews(ConvWorkspaceFloatsCpu(sh) + 1);
          Conv2dBackwardFilterCpu(sh, x.data(), g.data(), exact.data(), eb.data(), ews.data());
          for (size_t e = 0; e < nw; ++e) exact[e] *= mask[e];
          EXPECT_LT(Rel(got, exact), Tol(t, 1e-4));
        }
      }
    }
  }
}

TEST_F(CudaKernels, LinearMatchesCpu) {
  for (DType t : kTypes) {
    for (LinearShape sh :
         {LinearShape{1, 7, 3}, LinearShape{128, 400, 120}, LinearShape{33, 9, 1}}) {
      SCOPED_TRACE(std::to_string(sh.n) + "x" + std::to_string(sh.in) + " " + Name(t));
      auto x = Round(RandomFloats(sh.n * sh.in, 16), t);
      auto w = Round(RandomFloats(sh.out * sh.in, 17), t);
      auto b = RandomFloats(sh.out, 18), g = Round(RandomFloats(sh.n * sh.out, 19), t);
      Act dx(t, x), dw(t, w), dg(t, g), y(t, sh.n * sh.out), gx(t, sh.n * sh.in),
          gw(t, sh.out * sh.in);
      Dev<float> db(b), gb(sh.out);
      std::vector<float> ry(sh.n * sh.out), rgx(sh.n * sh.in), rgw(sh.out * sh.in), rgb(sh.out);
      ASSERT_TRUE(LinearForwardCuda(t, sh, dx.get(), dw.get(), db.get(), y.get(), ctx_).ok());
      ASSERT_TRUE(LinearBackwardDataCuda(t, sh, dg.get(), dw.get(), gx.get(), ctx_).ok());
      ASSERT_TRUE(
          LinearBackwardFilterCuda(t, sh, dx.get(), dg.get(), gw.get(), gb.get(), ctx_).ok());
      LinearForwardCpu(sh, x.data(), w.data(), b.data(), ry.data());
      LinearBackwardDataCpu(sh, g.data(), w.data(), rgx.data());
      LinearBackwardFilterCpu(sh, x.data(), g.data(), rgw.data(), rgb.data());
      Sync();
      // bf16: the GEMM's output is rounded to bf16 before the bias is added (and rounded).
      EXPECT_LT(Rel(y.Host(), ry), Tol(t, 1e-5));
      EXPECT_LT(Rel(gx.Host(), rgx), Tol(t, 1e-5));
      EXPECT_LT(Rel(gw.Host(), rgw), Tol(t, 1e-5));
      EXPECT_LT(Rel(gb.Host(), rgb), 1e-5);
    }
  }
}

}  // namespace
}  // namespace topiary::kernels

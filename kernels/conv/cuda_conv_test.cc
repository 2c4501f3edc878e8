// CUDA kernels of convolutions (cuDNN, grouped, sampled weight gradients) and the linear layer
// against their CPU twins, over the shared fixture of kernels/cuda_test_util.h.
#include "kernels/conv/conv.h"
#include "kernels/conv/grouped_conv.h"
#include "kernels/conv/linear.h"
#include "kernels/conv/sampled_grad.h"
#include "kernels/cuda_test_util.h"

namespace topiary::kernels {
namespace {

using namespace testing;  // NOLINT: the shared fixture and helpers (cuda_test_util.h)

TEST_F(CudaKernels, ConvMatchesCpu) {
  for (const ConvShape& sh :
       {MakeConv(2, 5, 5, 3, 4, 3, 3, 1, 1), MakeConv(1, 7, 6, 3, 5, 3, 3, 2, 1),
        MakeConv(3, 6, 6, 8, 16, 1, 1, 1, 0), MakeConv(2, 7, 7, 5, 3, 1, 1, 2, 0),
        MakeConv(2, 9, 8, 2, 3, 5, 3, 1, 2), MakeConv(4, 28, 28, 1, 6, 5, 5, 1, 2),
        MakeConv(2, 4, 4, 3, 2, 4, 4, 1, 0), MakeConv(128, 32, 32, 16, 16, 3, 3, 1, 1),
        MakeConv(2, 33, 33, 3, 64, 7, 7, 2, 3)}) {
    for (Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16}) {
      SCOPED_TRACE(std::to_string(sh.n) + "x" + std::to_string(sh.h) + "x" + std::to_string(sh.c) +
                   " k" + std::to_string(sh.k) + " r" + std::to_string(sh.r) + " " +
                   PrecisionName(p));
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
        SCOPED_TRACE(std::to_string(sh.n) + "x" + std::to_string(sh.h) + "x" +
                     std::to_string(sh.c) + " k" + std::to_string(sh.k) + " r" +
                     std::to_string(sh.r) + " top_k " + std::to_string(top_k) + " " + Name(t));
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

// CUDA kernels of batch norm and pooling against their CPU twins, over the shared fixture of
// kernels/cuda_test_util.h.
#include "kernels/cuda_test_util.h"
#include "kernels/norm_pool/batch_norm.h"
#include "kernels/norm_pool/pooling.h"

namespace topiary::kernels {
namespace {

using namespace testing;  // NOLINT: the shared fixture and helpers (cuda_test_util.h)

TEST_F(CudaKernels, BatchNormMatchesCpu) {
  for (DType t : kTypes) {
    for (auto [m, c] : {std::pair<int64_t, int>{7, 3},
                        {100352, 16},
                        {12, 2048},
                        {50, 40},
                        {4099, 64},
                        {1000, 1024}}) {
      for (bool relu : {false, true}) {
        SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(c) + (relu ? " relu " : " ") +
                     Name(t));
        BatchNormShape sh{m, c};
        std::vector<float> cws(BatchNormWorkspaceFloatsCpu(sh));
        sh.relu = relu;
        auto x = Round(RandomFloats(m * c, 6, -1.0f, 3.0f), t);
        auto gamma = RandomFloats(c, 7, 0.5f, 1.5f), beta = RandomFloats(c, 8);
        auto g = Round(RandomFloats(m * c, 9), t);
        std::vector<float> rm(c, 0.1f), rv(c, 2.0f), mean(c), inv(c), y(m * c);
        Dev<float> dgamma(gamma), dbeta(beta), drm(rm), drv(rv), dmean(c), dinv(c);
        Act dx(t, x), dy(t, m * c), dgr(t, g);
        Dev<float> ws(BatchNormWorkspaceFloatsCuda(sh));
        ASSERT_TRUE(BatchNormForwardTrainCuda(t, sh, dx.get(), dgamma.get(), dbeta.get(), drm.get(),
                                              drv.get(), dmean.get(), dinv.get(), dy.get(),
                                              ws.get(), ctx_)
                        .ok());
        ASSERT_TRUE(BatchNormForwardTrainCpu(sh, x.data(), gamma.data(), beta.data(), rm.data(),
                                             rv.data(), mean.data(), inv.data(), y.data(),
                                             cws.data())
                        .ok());
        Sync();
        EXPECT_LT(Rel(dy.Host(), y), Tol(t, 1e-4));
        // Statistics are fp32 whatever the activation type.
        EXPECT_LT(Rel(dmean.Host(), mean), 1e-4);
        EXPECT_LT(Rel(dinv.Host(), inv), 1e-4);
        EXPECT_LT(Rel(drm.Host(), rm), 1e-4);
        EXPECT_LT(Rel(drv.Host(), rv), 1e-4);

        std::vector<float> rdx(m * c), rdg(c), rdb(c);
        Dev<float> ddg(c), ddb(c);
        Act ddx(t, m * c);
        // Backward from the CPU's saved statistics and output, so only the backward differs.
        y = Round(y, t);
        Dev<float> cmean(mean), cinv(inv);
        Act cy(t, y);
        ASSERT_TRUE(BatchNormBackwardCuda(t, sh, dx.get(), cy.get(), dgr.get(), dgamma.get(),
                                          cmean.get(), cinv.get(), ddx.get(), ddg.get(), ddb.get(),
                                          ws.get(), ctx_)
                        .ok());
        ASSERT_TRUE(BatchNormBackwardCpu(sh, x.data(), y.data(), g.data(), gamma.data(),
                                         mean.data(), inv.data(), rdx.data(), rdg.data(),
                                         rdb.data(), cws.data())
                        .ok());
        Sync();
        EXPECT_LT(Rel(ddx.Host(), rdx), Tol(t, 1e-3));
        EXPECT_LT(Rel(ddg.Host(), rdg), 1e-3);
        EXPECT_LT(Rel(ddb.Host(), rdb), 1e-3);

        Act ey(t, m * c);
        ASSERT_TRUE(BatchNormForwardEvalCuda(t, sh, dx.get(), dgamma.get(), dbeta.get(), drm.get(),
                                             drv.get(), ey.get(), ctx_)
                        .ok());
        BatchNormForwardEvalCpu(sh, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(),
                                y.data(), cws.data());
        Sync();
        EXPECT_LT(Rel(ey.Host(), y), Tol(t, 1e-4));
      }
    }
  }
}

TEST_F(CudaKernels, PoolingMatchesCpu) {
  for (DType t : kTypes) {
    SCOPED_TRACE(Name(t));
    // C = 64, 16, 8 and 12 take the 16-byte vector kernels (12: fp32 only), the others the
    // scalar ones; odd sizes, stride 1 and 2, padding, batch 1.
    for (const PoolShape& sh : {MakePool(2, 4, 4, 3, 2, 2, 0), MakePool(3, 7, 5, 2, 3, 2, 1),
                                MakePool(2, 28, 28, 6, 2, 2, 0), MakePool(1, 9, 9, 64, 3, 2, 1),
                                MakePool(2, 13, 11, 16, 3, 2, 1), MakePool(1, 6, 6, 8, 3, 1, 1),
                                MakePool(3, 10, 10, 12, 2, 2, 0)}) {
      const size_t nx = static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c;
      const size_t ny = static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.c;
      auto x = Round(RandomFloats(nx, 10), t), g = Round(RandomFloats(ny, 11), t);
      x[0] = x[1];  // a tie: both sides must route it to the first position
      Act dx(t, x), dg(t, g), y(t, ny), gx(t, nx);
      Dev<uint8_t> argmax(ny);
      for (bool max : {true, false}) {
        std::vector<float> ry(ny), rgx(nx);
        if (max) {
          ASSERT_TRUE(MaxPoolForwardCuda(t, sh, dx.get(), y.get(), argmax.get(), ctx_).ok());
          ASSERT_TRUE(MaxPoolBackwardCuda(t, sh, argmax.get(), dg.get(), gx.get(), ctx_).ok());
          MaxPoolForwardCpu(sh, x.data(), ry.data());
          MaxPoolBackwardCpu(sh, x.data(), ry.data(), g.data(), rgx.data());
        } else {
          ASSERT_TRUE(AvgPoolForwardCuda(t, sh, dx.get(), y.get(), ctx_).ok());
          ASSERT_TRUE(AvgPoolBackwardCuda(t, sh, dg.get(), gx.get(), ctx_).ok());
          AvgPoolForwardCpu(sh, x.data(), ry.data());
          AvgPoolBackwardCpu(sh, g.data(), rgx.data());
        }
        Sync();
        EXPECT_LT(Rel(y.Host(), ry), Tol(t, 1e-6)) << (max ? "max" : "avg");
        EXPECT_LT(Rel(gx.Host(), rgx), Tol(t, 1e-6)) << (max ? "max" : "avg");
      }
    }
    const int n = 5, hw = 49, c = 37;
    auto x = Round(RandomFloats(n * hw * c, 12), t), g = Round(RandomFloats(n * c, 13), t);
    Act dx(t, x), dg(t, g), y(t, n * c), gx(t, n * hw * c);
    std::vector<float> ry(n * c), rgx(n * hw * c);
    ASSERT_TRUE(GlobalAvgPoolForwardCuda(t, n, hw, c, dx.get(), y.get(), ctx_).ok());
    ASSERT_TRUE(GlobalAvgPoolBackwardCuda(t, n, hw, c, dg.get(), gx.get(), ctx_).ok());
    GlobalAvgPoolForwardCpu(n, hw, c, x.data(), ry.data());
    GlobalAvgPoolBackwardCpu(n, hw, c, g.data(), rgx.data());
    Sync();
    EXPECT_LT(Rel(y.Host(), ry), Tol(t, 1e-5));
    EXPECT_LT(Rel(gx.Host(), rgx), Tol(t, 1e-6));
  }
}

}  // namespace
}  // namespace topiary::kernels

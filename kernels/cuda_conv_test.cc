// CUDA kernels of convolutions: cuDNN, sampled weight gradients, block-sparse against their CPU
// twins (kernels/cuda_test_util.h).
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

// The approximate convolution: the same codes, parameters and integer sums as the CPU
// reference, so every output is bit-identical, for random tables, the awkward shapes, every
// channel tiling (K up to 16, 32, 64 and beyond) and constant tensors.

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

// The block-sparse convolution against its CPU reference: every kernel configuration of every
// pass, fp32 (plain kernels) and bf16 (tensor cores where channels and blocks are multiples of
// 8), random grids, every block kept and one block kept per row, on the awkward shapes. The
// filter holds nonzero values outside the kept blocks, which every pass must ignore, and the
// filter gradient must be exactly 0 there.

TEST_F(CudaKernels, BlockSparseConvMatchesCpu) {
  const testing::BlockConvCase cases[] = {
      {MakeConv(2, 14, 14, 64, 64, 3, 3, 1, 1), 8, 8},
      {MakeConv(1, 7, 7, 32, 48, 3, 3, 2, 1), 8, 8},
      {MakeConv(3, 8, 8, 16, 32, 1, 1, 1, 0), 8, 8},
      {MakeConv(2, 9, 7, 24, 16, 5, 3, 1, 2), 8, 8},
      {MakeConv(2, 6, 6, 13, 11, 3, 3, 1, 1), 8, 8},
      {MakeConv(2, 8, 8, 32, 32, 3, 3, 1, 1), 16, 16},
      {MakeConv(2, 6, 6, 16, 24, 3, 3, 2, 0), 4, 4},
      {MakeConv(5, 28, 28, 64, 72, 3, 3, 1, 1), 8, 8},
      {MakeConv(2, 15, 15, 40, 24, 1, 1, 2, 0), 8, 8},
  };
  uint32_t seed = 1300;
  for (const testing::BlockConvCase& c : cases) {
    const ConvShape& sh = c.shape;
    for (testing::GridPattern pattern : testing::kGridPatterns) {
      const BlockGrid grid = testing::MakeBlockGrid(sh, c.bi, c.bo, pattern, seed++);
      for (DType t : kTypes) {
        SCOPED_TRACE(std::to_string(sh.n) + "x" + std::to_string(sh.h) + "x" +
                     std::to_string(sh.c) + " k" + std::to_string(sh.k) + " r" +
                     std::to_string(sh.r) + "x" + std::to_string(sh.s) + " stride " +
                     std::to_string(sh.stride_h) + " blocks " + std::to_string(c.bi) + "x" +
                     std::to_string(c.bo) + " pattern " +
                     std::to_string(static_cast<int>(pattern)) + " " + Name(t));
        const size_t nx = static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c;
        const size_t nw = static_cast<size_t>(sh.k) * sh.patch();
        const size_t ny = static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.k;
        const auto x = Round(RandomFloats(nx, seed++), t), w = Round(RandomFloats(nw, seed++), t);
        const auto g = Round(RandomFloats(ny, seed++), t);
        const auto b = RandomFloats(sh.k, seed++);
        std::vector<float> ry(ny), rgx(nx), rgw(nw), rgb(sh.k);
        BlockSparseConv2dForwardCpu(sh, grid, x.data(), w.data(), b.data(), ry.data());
        BlockSparseConv2dBackwardDataCpu(sh, grid, g.data(), w.data(), rgx.data());
        BlockSparseConv2dBackwardFilterCpu(sh, grid, x.data(), g.data(), rgw.data(), rgb.data());

        auto plan = BlockSparseConvCuda::Create(sh, grid, t, ctx_);
        ASSERT_TRUE(plan.ok()) << plan.status();
        const bool tc =
            t == DType::kBf16 && sh.c % 8 == 0 && sh.k % 8 == 0 && c.bi % 8 == 0 && c.bo % 8 == 0;
        EXPECT_EQ((*plan)->tensor_cores(), tc);
        Act dx(t, x), dw(t, w), dg(t, g), y(t, ny), gx(t, nx), gw(t, nw);
        Dev<float> db(b), gb(sh.k);
        for (int config = 0; config < (*plan)->configs(SparsePass::kForward); ++config) {
          SCOPED_TRACE("configuration " + std::to_string(config));
          ASSERT_TRUE((*plan)->set_config(SparsePass::kForward, config).ok());
          ASSERT_TRUE((*plan)->set_config(SparsePass::kBackwardData, config).ok());
          ASSERT_TRUE((*plan)->Forward(dx.get(), dw.get(), db.get(), y.get(), ctx_).ok());
          ASSERT_TRUE((*plan)->BackwardData(dg.get(), dw.get(), gx.get(), ctx_).ok());
          Sync();
          EXPECT_LT(Rel(y.Host(), ry), Tol(t, 1e-5));
          EXPECT_LT(Rel(gx.Host(), rgx), Tol(t, 1e-5));
        }
        ASSERT_TRUE((*plan)->BackwardFilter(dx.get(), dg.get(), gw.get(), gb.get(), ctx_).ok());
        Sync();
        const auto got = gw.Host();
        EXPECT_LT(Rel(got, rgw), Tol(t, 1e-5));
        EXPECT_LT(Rel(gb.Host(), rgb), 1e-4);
        for (size_t e = 0; e < nw; ++e) {
          if (rgw[e] == 0.0f) {
            ASSERT_EQ(got[e], 0.0f) << e;  // outside the kept blocks
          }
        }
        // Tuning keeps a configuration that computes the same result.
        for (SparsePass pass : {SparsePass::kForward, SparsePass::kBackwardData}) {
          auto ms = pass == SparsePass::kForward
                        ? (*plan)->Tune(pass, dx.get(), dw.get(), y.get(), ctx_)
                        : (*plan)->Tune(pass, dg.get(), dw.get(), gx.get(), ctx_);
          ASSERT_TRUE(ms.ok()) << ms.status();
          EXPECT_GT(*ms, 0.0f);
        }
        ASSERT_TRUE((*plan)->Forward(dx.get(), dw.get(), db.get(), y.get(), ctx_).ok());
        Sync();
        EXPECT_LT(Rel(y.Host(), ry), Tol(t, 1e-5));
      }
    }
  }
}

}  // namespace
}  // namespace topiary::kernels

// CUDA kernels of block-sparse convolutions against their CPU twins, over the shared fixture of
// kernels/cuda_test_util.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "kernels/cuda_test_util.h"
#include "kernels/runtime/moments.h"
#include "kernels/sparse/block_sparse_conv.h"
#include "kernels/sparse/dgrad_phases.h"

namespace topiary::kernels {
namespace {

using namespace testing;  // NOLINT: the shared fixture and helpers (cuda_test_util.h)

bool Sm90() { return CurrentComputeCapability() == 90; }

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
      // Blocks that Hopper's forward tiles align with (64 input channels x 64 or 128 outputs).
      {MakeConv(2, 14, 14, 128, 128, 3, 3, 1, 1), 64, 64},
      {MakeConv(1, 9, 11, 128, 256, 3, 3, 2, 1), 64, 128},
      {MakeConv(3, 7, 7, 192, 128, 1, 1, 1, 0), 64, 128},
      {MakeConv(2, 5, 5, 64, 64, 3, 3, 1, 1), 64, 64},
      {MakeConv(1, 9, 11, 128, 192, 3, 3, 1, 1), 64, 64},
      // The shifted-window (halo) kernels' frames: no padding (the frame is the input's
      // width), and a 5x3 filter with padding 2 (an output wider than the input; backward
      // data's transposed problem then has row padding 2 and column padding 0).
      {MakeConv(2, 9, 7, 64, 128, 3, 3, 1, 0), 64, 64},
      {MakeConv(1, 10, 6, 64, 64, 5, 3, 1, 2), 64, 64},
      // 128-channel input blocks: backward data's 128-wide tiles.
      {MakeConv(2, 9, 9, 256, 256, 3, 3, 1, 1), 128, 128},
      // Backward data at stride 2, phase by phase and the halo kernel's phases in one launch:
      // even maps (resnet's), a 1x1 shortcut (three phases without taps), 128-wide tiles, and
      // no padding (a phase whose last dy row reaches no dx row of it: Hopper's backward data
      // refuses the layer). (1x9x11 at stride 2 above: phases of unequal sizes.)
      {MakeConv(2, 14, 14, 128, 128, 3, 3, 2, 1), 64, 64},
      {MakeConv(2, 8, 7, 128, 256, 1, 1, 2, 0), 64, 128},
      // One row: the odd-row phases have no pixels at all, the tapless ones zeros to write.
      {MakeConv(2, 1, 7, 128, 256, 1, 1, 2, 0), 64, 128},
      {MakeConv(2, 10, 10, 256, 256, 3, 3, 2, 1), 128, 128},
      {MakeConv(1, 8, 8, 64, 64, 3, 3, 2, 0), 64, 64},
      // The halo forward at stride 2 on one row: the taps of the first and last filter rows
      // land on the odd-row phase, which has no pixels (they read padding only).
      {MakeConv(2, 1, 9, 64, 64, 3, 3, 2, 1), 64, 64},
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
        // Hopper's kernels come after the tensor-core configurations, for bf16 grids whose
        // blocks their tiles align with, on an sm_90 GPU (backward data at stride > 1 where
        // each phase's problem has the layer's dy, dgrad_phases.h).
        const int forward_configs = (*plan)->configs(SparsePass::kForward);
        const int data_configs = (*plan)->configs(SparsePass::kBackwardData);
        int hopper[2] = {0, 0}, halo[2] = {0, 0}, halo_phases = 0;
        for (SparsePass pass : {SparsePass::kForward, SparsePass::kBackwardData}) {
          for (int config = 0; config < (*plan)->configs(pass); ++config) {
            ASSERT_TRUE((*plan)->set_config(pass, config).ok());
            const std::string name = (*plan)->config_name(pass);
            hopper[static_cast<int>(pass)] += name.rfind("wgmma", 0) == 0 ? 1 : 0;
            halo[static_cast<int>(pass)] += name.rfind("halo", 0) == 0 ? 1 : 0;
            halo_phases += name.rfind("halo phases", 0) == 0 ? 1 : 0;
          }
        }
        const bool aligned = tc && c.bi % 64 == 0 && c.bo % 64 == 0 && Sm90();
        EXPECT_EQ(hopper[0] > 0, aligned);
        const std::vector<DgradPhase> phases = DgradPhases(sh);
        const bool phases_ok = std::all_of(phases.begin(), phases.end(), [](const auto& p) {
          return p.empty() || (p.pad_h_hi >= 0 && p.pad_w_hi >= 0);
        });
        EXPECT_EQ(hopper[1] > 0, aligned && phases_ok);
        // The shifted-window kernels: 64-channel multiples, stride 1 or 2 (every shape here
        // fits their frame and shared memory); backward data where every phase of dx with
        // pixels has taps (it writes no zeros).
        const bool halo_fits = aligned && sh.stride_h == sh.stride_w && sh.stride_h <= 2 &&
                               sh.c % 64 == 0 && sh.k % 64 == 0;
        const bool every_phase_tapped =
            std::all_of(phases.begin(), phases.end(), [](const DgradPhase& p) {
              return p.shape.h == 0 || p.shape.w == 0 || (p.shape.r > 0 && p.shape.s > 0);
            });
        EXPECT_EQ(halo[0] > 0, halo_fits);
        EXPECT_EQ(halo[1] > 0, halo_fits && every_phase_tapped);
        // Its phases in one launch: where there are several phases of dx with pixels.
        const auto with_pixels = std::count_if(phases.begin(), phases.end(), [](const auto& p) {
          return p.shape.h > 0 && p.shape.w > 0;
        });
        EXPECT_EQ(halo_phases > 0, halo_fits && every_phase_tapped && with_pixels > 1);
        for (int config = 0; config < std::max(forward_configs, data_configs); ++config) {
          SCOPED_TRACE("configuration " + std::to_string(config));
          ASSERT_TRUE((*plan)
                          ->set_config(SparsePass::kForward, std::min(config, forward_configs - 1))
                          .ok());
          ASSERT_TRUE(
              (*plan)
                  ->set_config(SparsePass::kBackwardData, std::min(config, data_configs - 1))
                  .ok());
          SCOPED_TRACE((*plan)->config_name(SparsePass::kForward) + ", " +
                       (*plan)->config_name(SparsePass::kBackwardData));
          // Every entry of y and dx must be written (the frames' extra columns not; the phases
          // without taps too): start from garbage, not the previous configuration's results.
          ASSERT_EQ(cudaMemset(y.get(), 0x3f, ny * SizeOf(t)), cudaSuccess);
          ASSERT_TRUE((*plan)->Forward(dx.get(), dw.get(), db.get(), y.get(), ctx_).ok());
          ASSERT_EQ(cudaMemset(gx.get(), 0x3f, nx * SizeOf(t)), cudaSuccess);
          ASSERT_TRUE((*plan)->BackwardData(dg.get(), dw.get(), gx.get(), ctx_).ok());
          Sync();
          EXPECT_LT(Rel(y.Host(), ry), Tol(t, 1e-5));
          EXPECT_LT(Rel(gx.Host(), rgx), Tol(t, 1e-5));
        }
        // Backward filter: the plain kernel (configuration 0), then Hopper's, offered for
        // blocks of 128 output channels x 64 or 128 input channels on sm_90.
        const int filter_configs = (*plan)->configs(SparsePass::kBackwardFilter);
        EXPECT_EQ(filter_configs > 1,
                  tc && c.bo % 128 == 0 && c.bi % 64 == 0 && sh.c % 64 == 0 && Sm90());
        // Untuned, the filter gradient runs Hopper's kernel where there is one.
        EXPECT_EQ((*plan)->config_name(SparsePass::kBackwardFilter).rfind("wgmma", 0) == 0,
                  filter_configs > 1);
        for (int config = 0; config < filter_configs; ++config) {
          ASSERT_TRUE((*plan)->set_config(SparsePass::kBackwardFilter, config).ok());
          SCOPED_TRACE("backward filter " + (*plan)->config_name(SparsePass::kBackwardFilter));
          // Every entry must be written, kept or not: start from nonzero garbage (0.75).
          ASSERT_EQ(cudaMemset(gw.get(), 0x3f, nw * SizeOf(t)), cudaSuccess);
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

// Hopper's kernels on layers with more output tiles than CTAs, so that each CTA of the
// persistent grid runs several tiles (the pipeline and the epilogue carried from tile to
// tile), against the tensor-core configuration (itself checked against the CPU above).
TEST_F(CudaKernels, HopperBlockSparseKernelsRunManyTilesPerCta) {
  if (!Sm90()) GTEST_SKIP() << "Hopper's kernels need an sm_90 GPU";
  // A case and the kept blocks its grid must have at least (0: any).
  struct ManyTiles {
    testing::BlockConvCase c;
    int least_kept;
  };
  const ManyTiles cases[] = {
      // 392 tiles of 128 x 64 (196 of 256 x 64) for at most 132 CTAs.
      {{MakeConv(32, 28, 28, 128, 128, 3, 3, 1, 1), 64, 64}, 0},
      // 196 tiles of 128 x 128, 392 of 128 x 64 forward; 392 of 128 x 64 backward data.
      {{MakeConv(64, 14, 14, 256, 256, 3, 3, 1, 1), 64, 128}, 0},
      // Backward data's 128-wide tiles: 98 of 256 x 128 per pass, 196 of 128 x 128.
      {{MakeConv(64, 14, 14, 256, 256, 3, 3, 1, 1), 128, 128}, 0},
      // Stride 2: backward data's four phases, 98 tiles of 128 x 64 each (the halo kernel's
      // phases in one launch: 32 groups of four tiles, their halos shared).
      {{MakeConv(32, 28, 28, 128, 128, 3, 3, 2, 1), 64, 64}, 0},
      // Stride 2 where the halo kernel's phases in one launch do not fit: more kept blocks
      // (of 8) than a group's 30 KB bands of dy leave room for (three), so it runs phase by
      // phase.
      {{MakeConv(8, 28, 28, 64, 512, 3, 3, 2, 1), 64, 64}, 4},
  };
  uint32_t seed = 4400;
  for (const auto& [c, least_kept] : cases) {
    const ConvShape& sh = c.shape;
    SCOPED_TRACE(
        absl::StrFormat("%dx%dx%dx%d k%d blocks %dx%d", sh.n, sh.h, sh.w, sh.c, sh.k, c.bi, c.bo));
    const BlockGrid grid =
        testing::MakeBlockGrid(sh, c.bi, c.bo, testing::GridPattern::kRandom, seed++);
    ASSERT_GE(grid.rows * grid.cols - grid.zeros(), least_kept);
    const size_t nx = static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c;
    const size_t nw = static_cast<size_t>(sh.k) * sh.patch();
    const size_t ny = static_cast<size_t>(sh.n) * sh.ho() * sh.wo() * sh.k;
    const DType t = DType::kBf16;
    Act x(t, Round(RandomFloats(nx, seed++), t)), w(t, Round(RandomFloats(nw, seed++), t));
    Act g(t, Round(RandomFloats(ny, seed++), t)), y(t, ny), gx(t, nx);
    Dev<float> b(RandomFloats(sh.k, seed++));
    auto plan = BlockSparseConvCuda::Create(sh, grid, t, ctx_);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (SparsePass pass : {SparsePass::kForward, SparsePass::kBackwardData}) {
      const bool fwd = pass == SparsePass::kForward;
      auto run = [&]() {
        return fwd ? (*plan)->Forward(x.get(), w.get(), b.get(), y.get(), ctx_)
                   : (*plan)->BackwardData(g.get(), w.get(), gx.get(), ctx_);
      };
      ASSERT_TRUE((*plan)->set_config(pass, 0).ok());  // a tensor-core configuration
      ASSERT_TRUE(run().ok());
      Sync();
      const std::vector<float> want = fwd ? y.Host() : gx.Host();
      int hopper = 0;
      for (int config = 0; config < (*plan)->configs(pass); ++config) {
        ASSERT_TRUE((*plan)->set_config(pass, config).ok());
        const std::string name = (*plan)->config_name(pass);
        if (name.rfind("wgmma", 0) != 0 && name.rfind("halo", 0) != 0) continue;
        SCOPED_TRACE(std::string(SparsePassName(pass)) + " " + name);
        ++hopper;
        ASSERT_EQ(cudaMemset(fwd ? y.get() : gx.get(), 0x3f, (fwd ? ny : nx) * SizeOf(t)),
                  cudaSuccess);  // garbage, not the previous configuration's results
        ASSERT_TRUE(run().ok());
        Sync();
        EXPECT_LT(Rel(fwd ? y.Host() : gx.Host(), want), 1e-2);
      }
      EXPECT_GT(hopper, 0);
    }
    // Backward filter: Hopper's against the plain kernel, with many segments per CTA share
    // and tiles split across shares.
    ASSERT_EQ((*plan)->configs(SparsePass::kBackwardFilter) > 1, c.bo % 128 == 0);
    if (c.bo % 128 != 0) continue;  // 64-channel output blocks: no Hopper filter kernel
    Act gw(t, nw);
    ASSERT_TRUE((*plan)->set_config(SparsePass::kBackwardFilter, 0).ok());
    ASSERT_TRUE((*plan)->BackwardFilter(x.get(), g.get(), gw.get(), nullptr, ctx_).ok());
    Sync();
    const std::vector<float> want = gw.Host();
    for (int config = 1; config < (*plan)->configs(SparsePass::kBackwardFilter); ++config) {
      ASSERT_TRUE((*plan)->set_config(SparsePass::kBackwardFilter, config).ok());
      SCOPED_TRACE("backward filter " + (*plan)->config_name(SparsePass::kBackwardFilter));
      ASSERT_EQ(cudaMemset(gw.get(), 0x3f, nw * SizeOf(t)), cudaSuccess);
      ASSERT_TRUE((*plan)->BackwardFilter(x.get(), g.get(), gw.get(), nullptr, ctx_).ok());
      Sync();
      const std::vector<float> got = gw.Host();
      EXPECT_LT(Rel(got, want), 1e-2);
      for (size_t e = 0; e < nw; ++e) {
        if (want[e] == 0.0f) {
          ASSERT_EQ(got[e], 0.0f) << e;
        }
      }
      // The same bits on a second run: the partial sums are added in a fixed order.
      ASSERT_TRUE((*plan)->BackwardFilter(x.get(), g.get(), gw.get(), nullptr, ctx_).ok());
      Sync();
      EXPECT_EQ(gw.Host(), got);
    }
  }
}

// Hopper's forward configurations (the im2col tiles and the halo kernels) with the batch norm's
// moments of their output (hopper_conv.h, halo_conv.h): the slices merged in double give each
// channel's count, mean and M2 of y, on shapes whose last pixel tile is partial, whose channels
// leave a tile partly empty (192 with 128-wide tiles), with one tile in all, and with many tiles
// per CTA; a pruned grid too. Slots the kernel leaves empty start as NaN, and the same operands
// give the same bits.
TEST_F(CudaKernels, HopperForwardWritesTheBatchNormMomentsOfItsOutput) {
  if (!Sm90()) GTEST_SKIP() << "Hopper's kernels need an sm_90 GPU";
  const testing::BlockConvCase cases[] = {
      {MakeConv(3, 13, 13, 64, 192, 3, 3, 1, 1), 64, 64},   // 507 pixels: a partial tile
      {MakeConv(2, 9, 7, 128, 128, 1, 1, 2, 0), 64, 128},   // 40 pixels: one tile
      {MakeConv(32, 28, 28, 64, 128, 3, 3, 1, 1), 64, 64},  // 392 tiles of 128 x 64
      {MakeConv(16, 14, 14, 256, 256, 3, 3, 1, 1), 64, 128},
      // A network's (a narrow resnet50's at 64 px), as the engine plans them: one block.
      {MakeConv(3, 16, 16, 64, 256, 1, 1, 1, 0), 64, 256},
      {MakeConv(3, 16, 16, 128, 128, 3, 3, 2, 1), 128, 128},
      {MakeConv(3, 16, 16, 256, 512, 1, 1, 2, 0), 256, 512},
      {MakeConv(3, 4, 4, 512, 128, 1, 1, 1, 0), 512, 128},
  };
  uint32_t seed = 4500;
  for (const testing::BlockConvCase& c : cases) {
    for (const GridPattern pattern : {GridPattern::kAll, GridPattern::kRandom}) {
      const ConvShape& sh = c.shape;
      if (pattern == GridPattern::kRandom && c.bi == sh.c && c.bo == sh.k) continue;
      SCOPED_TRACE(absl::StrFormat("%dx%dx%dx%d k%d %dx%d s%d blocks %dx%d%s", sh.n, sh.h, sh.w,
                                   sh.c, sh.k, sh.r, sh.s, sh.stride_h, c.bi, c.bo,
                                   pattern == GridPattern::kAll ? "" : " random"));
      const BlockGrid grid = testing::MakeBlockGrid(sh, c.bi, c.bo, pattern, seed++);
      const size_t nx = static_cast<size_t>(sh.n) * sh.h * sh.w * sh.c;
      const size_t nw = static_cast<size_t>(sh.k) * sh.patch();
      const int64_t pixels = static_cast<int64_t>(sh.n) * sh.ho() * sh.wo();
      const DType t = DType::kBf16;
      const std::vector<float> hx = Round(RandomFloats(nx, seed++, -1.0f, 2.0f), t);
      const std::vector<float> hw = Round(RandomFloats(nw, seed++), t);
      Act x(t, hx), w(t, hw), y(t, pixels * sh.k);
      std::vector<float> want(pixels * sh.k);
      BlockSparseConv2dForwardCpu(sh, grid, hx.data(), hw.data(), nullptr, want.data());
      auto plan = BlockSparseConvCuda::Create(sh, grid, t, ctx_);
      ASSERT_TRUE(plan.ok()) << plan.status();
      int hopper = 0;
      for (int config = 0; config < (*plan)->configs(SparsePass::kForward); ++config) {
        ASSERT_TRUE((*plan)->set_config(SparsePass::kForward, config).ok());
        const std::string name = (*plan)->config_name(SparsePass::kForward);
        const int slices = (*plan)->forward_moment_slices(ctx_);
        if (name.rfind("wgmma", 0) != 0 && name.rfind("halo", 0) != 0) {
          EXPECT_EQ(slices, 0) << name;
          continue;
        }
        SCOPED_TRACE(name);
        ++hopper;
        ASSERT_GT(slices, 0);
        ASSERT_LE(slices, 2 * ctx_.sm_count);
        const size_t plane = static_cast<size_t>(slices) * sh.k;
        Dev<float> moments(std::vector<float>(3 * plane, std::nanf("")));
        // A bias and moments: refused (the batch norm's input has no bias).
        Dev<float> bias(sh.k);
        EXPECT_FALSE(
            (*plan)->Forward(x.get(), w.get(), bias.get(), y.get(), ctx_, moments.get()).ok());
        ASSERT_TRUE((*plan)->Forward(x.get(), w.get(), nullptr, y.get(), ctx_, moments.get()).ok());
        Sync();
        const std::vector<float> out = y.Host(), part = moments.Host();
        EXPECT_LT(Rel(out, want), 1e-2);
        ASSERT_TRUE((*plan)->Forward(x.get(), w.get(), nullptr, y.get(), ctx_, moments.get()).ok());
        Sync();
        const std::vector<float> again = moments.Host();
        EXPECT_EQ(std::memcmp(part.data(), again.data(), part.size() * sizeof(float)), 0)
            << "not deterministic";
        double worst_mean = 0, worst_m2 = 0;
        int64_t wrong_counts = 0;
        // Against y's, in double.
        for (int k = 0; k < sh.k; ++k) {
          double sum = 0, sq = 0;
          for (int64_t p = 0; p < pixels; ++p) sum += out[p * sh.k + k];
          const double mean = sum / pixels;
          for (int64_t p = 0; p < pixels; ++p)
            sq += (out[p * sh.k + k] - mean) * (out[p * sh.k + k] - mean);
          // The slices merged in double, skipping empty ones.
          double n = 0, m = 0, m2 = 0;
          for (int i = 0; i < slices; ++i) {
            const size_t at = static_cast<size_t>(i) * sh.k + k;
            MergeMoments<double>(n, m, m2, part[at], part[plane + at], part[2 * plane + at]);
          }
          wrong_counts += n != static_cast<double>(pixels);
          const double scale = std::sqrt(sq / pixels) + 1e-3;
          worst_mean = std::max(worst_mean, std::abs(m - mean) / scale);
          worst_m2 = std::max(worst_m2, std::abs(m2 - sq) / (sq + 1e-3));
        }
        // fp32 sums against double: far below what a lost or extra row (1/40 of a standard
        // deviation in the smallest case) or a wrong column would make.
        EXPECT_EQ(wrong_counts, 0);
        EXPECT_LT(worst_mean, 1e-5);
        EXPECT_LT(worst_m2, 1e-5);
      }
      EXPECT_GT(hopper, 0);
    }
  }
}

// A shape the Hopper kernels' TMA im2col cannot load (padding beyond its corner offsets) gets
// no Hopper configuration: the plan offers the others instead of failing when tuned or run.
TEST_F(CudaKernels, HopperBlockSparseKernelsRefuseShapesTmaCannotLoad) {
  const ConvShape sh = MakeConv(1, 2, 2, 128, 256, 1, 1, 1, 130);
  const BlockGrid grid = testing::MakeBlockGrid(sh, 64, 128, testing::GridPattern::kAll, 1);
  auto plan = BlockSparseConvCuda::Create(sh, grid, DType::kBf16, ctx_);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (SparsePass pass : {SparsePass::kForward, SparsePass::kBackwardData}) {
    for (int config = 0; config < (*plan)->configs(pass); ++config) {
      ASSERT_TRUE((*plan)->set_config(pass, config).ok());
      EXPECT_NE((*plan)->config_name(pass).rfind("wgmma", 0), 0u) << (*plan)->config_name(pass);
    }
  }
}

// A layer so wide that the filter gradient's partial sums would pass the plan's bound (about
// 150 MB here) gets no Hopper filter kernel, and keeps its forward ones.
TEST_F(CudaKernels, HopperFilterKernelRefusesLayersWhosePartialSumsWouldBeTooLarge) {
  if (!Sm90()) GTEST_SKIP() << "Hopper's kernels need an sm_90 GPU";
  const ConvShape sh = MakeConv(1, 4, 4, 2048, 2048, 3, 3, 1, 1);
  const BlockGrid grid = testing::MakeBlockGrid(sh, 64, 128, testing::GridPattern::kAll, 1);
  auto plan = BlockSparseConvCuda::Create(sh, grid, DType::kBf16, ctx_);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ((*plan)->configs(SparsePass::kBackwardFilter), 1);
  EXPECT_EQ((*plan)->config_name(SparsePass::kBackwardFilter), "plain");
  bool hopper_forward = false;
  for (int config = 0; config < (*plan)->configs(SparsePass::kForward); ++config) {
    ASSERT_TRUE((*plan)->set_config(SparsePass::kForward, config).ok());
    hopper_forward |= (*plan)->config_name(SparsePass::kForward).rfind("wgmma", 0) == 0;
  }
  EXPECT_TRUE(hopper_forward);
}

}  // namespace
}  // namespace topiary::kernels

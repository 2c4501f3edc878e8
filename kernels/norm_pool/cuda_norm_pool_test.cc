// CUDA kernels of batch norm and pooling against their CPU twins, over the shared fixture of
// kernels/cuda_test_util.h.
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <tuple>

#include "absl/strings/str_format.h"
#include "kernels/cuda_test_util.h"
#include "kernels/norm_pool/batch_norm.h"
#include "kernels/norm_pool/pooling.h"
#include "kernels/norm_pool/residual_tail.h"

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
        Dev<float> dgamma(gamma), dbeta(beta), drm(rm), drv(rv), dmean(c), dinv(c), dss(2 * c);
        Act dx(t, x), dy(t, m * c), dgr(t, g);
        Dev<float> ws(BatchNormWorkspaceFloatsCuda(sh));
        ASSERT_TRUE(BatchNormForwardTrainCuda(t, sh, dx.get(), dgamma.get(), dbeta.get(), drm.get(),
                                              drv.get(), dmean.get(), dinv.get(), dss.get(),
                                              dy.get(), ws.get(), ctx_)
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
        // Backward from the GPU forward pass's statistics (its ReLU mask comes from x and the
        // saved scale and shift), the CPU's from the same statistics and the GPU's output: so
        // only the backward passes differ, and a mask recomputed wrongly would show.
        const auto gy = dy.Host(), gmean = dmean.Host(), ginv = dinv.Host();
        ASSERT_TRUE(BatchNormBackwardCuda(t, sh, dx.get(), dgr.get(), dgamma.get(), dmean.get(),
                                          dinv.get(), dss.get(), ddx.get(), ddg.get(), ddb.get(),
                                          ws.get(), ctx_)
                        .ok());
        ASSERT_TRUE(BatchNormBackwardCpu(sh, x.data(), gy.data(), g.data(), gamma.data(),
                                         gmean.data(), ginv.data(), rdx.data(), rdg.data(),
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

// Ranks of one process sharing the test's GPU, one thread each, gathering through host memory:
// what is checked here is the kernels' merge of the ranks' moments and sums (NCCL's gather
// between GPUs runs in trainer/run:data_parallel_gpu_test).
class ThreadRanks {
 public:
  explicit ThreadRanks(int ranks) : ranks_(ranks) {}
  int ranks() const { return ranks_; }

  // Every rank's data[0, n) (device) into all (device), once every rank has called it.
  absl::Status Gather(int rank, const float* data, size_t n, float* all) {
    if (cudaDeviceSynchronize() != cudaSuccess) return absl::InternalError("device");
    {
      std::lock_guard<std::mutex> lock(mu_);
      host_.resize(ranks_ * n);
    }
    Wait();
    cudaMemcpy(host_.data() + rank * n, data, n * sizeof(float), cudaMemcpyDeviceToHost);
    Wait();
    cudaMemcpy(all, host_.data(), ranks_ * n * sizeof(float), cudaMemcpyHostToDevice);
    Wait();  // everyone has copied before the next gather resizes
    return absl::OkStatus();
  }

 private:
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int generation = generation_;
    if (++arrived_ == ranks_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

  int ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0, generation_ = 0;
  std::vector<float> host_;
};

class RankSync : public BatchNormSync {
 public:
  RankSync(ThreadRanks* all, int rank) : all_(all), rank_(rank) {}
  int ranks() const override { return all_->ranks(); }
  absl::Status SumOverRanks(double*, int) override {
    return absl::InternalError("CUDA batch norm summed on the host");
  }
  absl::Status Gather(const float* data, size_t n, float* all) override {
    return all_->Gather(rank_, data, n, all);
  }

 private:
  ThreadRanks* all_;
  int rank_;
};

// Synchronized: ranks holding slices of a batch normalize as one GPU holding all of it does
// (statistics, outputs, running statistics, input gradients; dgamma and dbeta summed over the
// ranks), at odd sizes, both kernel forms, 2 and 3 ranks.
// Moments another pass reduced (BatchNormMoments: slices of rows, a convolution's epilogue
// in practice) give the statistics and output the batch norm computes from x itself. The slices
// here are uneven and some hold count 0 for a channel with NaN in its mean and M2, which must
// be ignored; 513 slices is one too many.
TEST_F(CudaKernels, BatchNormTakesMomentsReducedByAnotherPass) {
  const DType t = DType::kBf16;
  for (auto [m, c, slices] :
       {std::tuple<int64_t, int, int>{7, 3, 1}, {4099, 64, 5}, {600, 192, 512}}) {
    SCOPED_TRACE(absl::StrFormat("%dx%d, %d slices", m, c, slices));
    BatchNormShape sh{m, c};
    sh.relu = true;
    const auto x = Round(RandomFloats(m * c, 16, -1.0f, 3.0f), t);
    const auto gamma = RandomFloats(c, 17, 0.5f, 1.5f), beta = RandomFloats(c, 18);
    // Slice i takes rows [m * i^2 / slices^2, ...): uneven; its moments in double, and for
    // every third (slice, channel) pair with the channel's rows moved to the next slice, count
    // 0 and NaN.
    std::vector<float> part(3 * static_cast<size_t>(slices) * c);
    const size_t plane = static_cast<size_t>(slices) * c;
    auto first_row = [&](int i) { return m * i / slices * i / slices; };
    for (int ch = 0; ch < c; ++ch) {
      double carry_n = 0, carry_s = 0, carry_q = 0;
      for (int i = 0; i < slices; ++i) {
        double n = carry_n, sum = carry_s, sq = carry_q;
        for (int64_t r = first_row(i); r < first_row(i + 1); ++r) {
          n += 1, sum += x[r * c + ch], sq += static_cast<double>(x[r * c + ch]) * x[r * c + ch];
        }
        const size_t at = static_cast<size_t>(i) * c + ch;
        if ((i + ch) % 3 == 1 && i + 1 < slices) {  // empty: its rows go to the next slice
          carry_n = n, carry_s = sum, carry_q = sq;
          part[at] = 0.0f;
          part[plane + at] = part[2 * plane + at] = std::nanf("");
          continue;
        }
        carry_n = carry_s = carry_q = 0;
        const double mean = n > 0 ? sum / n : 0.0;
        part[at] = static_cast<float>(n);
        part[plane + at] = static_cast<float>(mean);
        part[2 * plane + at] = static_cast<float>(n > 0 ? sq - sum * mean : 0.0);
      }
    }
    Dev<float> dgamma(gamma), dbeta(beta), dpart(part);
    Dev<float> ws(BatchNormWorkspaceFloatsCuda(sh));
    Act dx(t, x);
    std::vector<float> stats[2][3];  // [own, given][mean, inv std, output]
    for (int given = 0; given < 2; ++given) {
      Dev<float> drm(std::vector<float>(c, 0.1f)), drv(std::vector<float>(c, 2.0f));
      Dev<float> dmean(c), dinv(c), dss(2 * c);
      Act dy(t, m * c);
      const BatchNormMoments moments{dpart.get(), slices};
      ASSERT_TRUE(BatchNormForwardTrainCuda(t, sh, dx.get(), dgamma.get(), dbeta.get(), drm.get(),
                                            drv.get(), dmean.get(), dinv.get(), dss.get(), dy.get(),
                                            ws.get(), ctx_, nullptr, given ? &moments : nullptr)
                      .ok());
      Sync();
      stats[given][0] = dmean.Host();
      stats[given][1] = dinv.Host();
      stats[given][2] = dy.Host();
    }
    EXPECT_LT(Rel(stats[1][0], stats[0][0]), 1e-5);
    EXPECT_LT(Rel(stats[1][1], stats[0][1]), 1e-5);
    EXPECT_LT(Rel(stats[1][2], stats[0][2]), 1e-2);  // one bf16 rounding apart at most
    const BatchNormMoments too_many{dpart.get(), kBatchNormMaxMomentSlices + 1};
    Dev<float> drm(c), drv(c), dmean(c), dinv(c), dss(2 * c);
    const absl::Status bad = BatchNormForwardTrainCuda(
        t, sh, dx.get(), dgamma.get(), dbeta.get(), drm.get(), drv.get(), dmean.get(), dinv.get(),
        dss.get(), nullptr, ws.get(), ctx_, nullptr, &too_many);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.message().find("moment slices"), std::string::npos) << bad;
  }
}

TEST_F(CudaKernels, SynchronizedBatchNormMatchesOneGpuWithTheGlobalBatch) {
  for (DType t : kTypes) {
    for (auto [ranks_, m_, c_] : {std::tuple<int, int64_t, int>{2, 7, 3},
                                  {3, 37, 40},
                                  {2, 4099, 64},
                                  {3, 12, 2048},
                                  {2, 1000, 24}}) {
      const int ranks = ranks_, c = c_;  // (C++17 lambdas cannot capture bindings)
      const int64_t m = m_;
      for (bool relu : {false, true}) {
        SCOPED_TRACE(std::to_string(ranks) + " ranks of " + std::to_string(m) + "x" +
                     std::to_string(c) + (relu ? " relu " : " ") + Name(t));
        BatchNormShape global{m * ranks, c}, local{m, c};
        global.relu = local.relu = relu;
        const auto x = Round(RandomFloats(global.m * c, 21, -1.0f, 3.0f), t);
        const auto g = Round(RandomFloats(global.m * c, 22), t);
        const auto gamma = RandomFloats(c, 23, 0.5f, 1.5f), beta = RandomFloats(c, 24);
        const std::vector<float> rm0(c, 0.1f), rv0(c, 2.0f);

        // One GPU, the whole batch.
        Dev<float> dgamma(gamma), dbeta(beta), rm(rm0), rv(rv0), mean(c), inv(c), ss(2 * c),
            ws(BatchNormWorkspaceFloatsCuda(global));
        Act dx(t, x), y(t, global.m * c), dg(t, g), gx(t, global.m * c);
        Dev<float> ggamma(c), gbeta(c);
        ASSERT_TRUE(BatchNormForwardTrainCuda(t, global, dx.get(), dgamma.get(), dbeta.get(),
                                              rm.get(), rv.get(), mean.get(), inv.get(), ss.get(),
                                              y.get(), ws.get(), ctx_)
                        .ok());
        ASSERT_TRUE(BatchNormBackwardCuda(t, global, dx.get(), dg.get(), dgamma.get(), mean.get(),
                                          inv.get(), ss.get(), gx.get(), ggamma.get(), gbeta.get(),
                                          ws.get(), ctx_)
                        .ok());
        Sync();

        // The ranks, each with its rows and its own parameters, statistics and workspace.
        ThreadRanks group(ranks);
        std::vector<std::vector<float>> ry(ranks), rgx(ranks), rmean(ranks), rinv(ranks),
            rrm(ranks), rrv(ranks), rgg(ranks), rgb(ranks);
        std::vector<absl::Status> status(ranks);
        std::vector<std::thread> threads;
        for (int r = 0; r < ranks; ++r) {
          threads.emplace_back([&, r] {
            const size_t at = static_cast<size_t>(r) * m * c, n = static_cast<size_t>(m) * c;
            const std::vector<float> xr(x.begin() + at, x.begin() + at + n),
                gr(g.begin() + at, g.begin() + at + n);
            Dev<float> lgamma(gamma), lbeta(beta), lrm(rm0), lrv(rv0), lmean(c), linv(c),
                lss(2 * c), lws(BatchNormWorkspaceFloatsCuda(local, ranks)), lgg(c), lgb(c);
            Act lx(t, xr), ly(t, n), lg(t, gr), lgx(t, n);
            RankSync sync(&group, r);
            status[r] = BatchNormForwardTrainCuda(t, local, lx.get(), lgamma.get(), lbeta.get(),
                                                  lrm.get(), lrv.get(), lmean.get(), linv.get(),
                                                  lss.get(), ly.get(), lws.get(), ctx_, &sync);
            if (status[r].ok()) {
              status[r] = BatchNormBackwardCuda(t, local, lx.get(), lg.get(), lgamma.get(),
                                                lmean.get(), linv.get(), lss.get(), lgx.get(),
                                                lgg.get(), lgb.get(), lws.get(), ctx_, &sync);
            }
            cudaDeviceSynchronize();
            ry[r] = ly.Host(), rgx[r] = lgx.Host(), rmean[r] = lmean.Host(), rinv[r] = linv.Host();
            rrm[r] = lrm.Host(), rrv[r] = lrv.Host(), rgg[r] = lgg.Host(), rgb[r] = lgb.Host();
          });
        }
        for (std::thread& th : threads) th.join();
        std::vector<float> all_y, all_gx, sum_gg(c, 0.0f), sum_gb(c, 0.0f);
        for (int r = 0; r < ranks; ++r) {
          ASSERT_TRUE(status[r].ok()) << status[r];
          all_y.insert(all_y.end(), ry[r].begin(), ry[r].end());
          all_gx.insert(all_gx.end(), rgx[r].begin(), rgx[r].end());
          for (int k = 0; k < c; ++k) sum_gg[k] += rgg[r][k], sum_gb[k] += rgb[r][k];
          // Every rank holds the same statistics, bit for bit.
          EXPECT_EQ(rmean[r], rmean[0]);
          EXPECT_EQ(rinv[r], rinv[0]);
          EXPECT_EQ(rrv[r], rrv[0]);
          EXPECT_LT(Rel(rmean[r], mean.Host()), 1e-5);
          EXPECT_LT(Rel(rinv[r], inv.Host()), 1e-5);
          EXPECT_LT(Rel(rrm[r], rm.Host()), 1e-5);
          EXPECT_LT(Rel(rrv[r], rv.Host()), 1e-5);
        }
        EXPECT_LT(Rel(all_y, y.Host()), Tol(t, 1e-5));
        EXPECT_LT(Rel(all_gx, gx.Host()), Tol(t, 1e-4));
        EXPECT_LT(Rel(sum_gg, ggamma.Host()), 1e-4);
        EXPECT_LT(Rel(sum_gb, gbeta.Host()), 1e-4);
      }
    }
  }
}

// A batch norm in float64 from x (rounded as stored): the saved statistics, its output, and
// the backward pass from g (dbeta = sum g, dgamma = sum g * xhat, dx).
struct Bn64 {
  std::vector<double> xhat, y, dx, dgamma, dbeta;
  Bn64(const std::vector<float>& x, int64_t m, int c, const std::vector<float>& gamma,
       const std::vector<float>& beta) {
    std::vector<double> mean(c, 0), var(c, 0);
    for (int64_t r = 0; r < m; ++r)
      for (int k = 0; k < c; ++k) mean[k] += x[r * c + k] / static_cast<double>(m);
    for (int64_t r = 0; r < m; ++r)
      for (int k = 0; k < c; ++k) var[k] += std::pow(x[r * c + k] - mean[k], 2) / m;
    xhat.resize(m * c);
    y.resize(m * c);
    for (int64_t i = 0; i < m * c; ++i) {
      const int k = static_cast<int>(i % c);
      xhat[i] = (x[i] - mean[k]) / std::sqrt(var[k] + 1e-5);
      y[i] = gamma[k] * xhat[i] + beta[k];
    }
    inv_std.resize(c);
    for (int k = 0; k < c; ++k) inv_std[k] = 1 / std::sqrt(var[k] + 1e-5);
    gamma_ = gamma;
  }
  void Backward(const std::vector<double>& g, int64_t m, int c) {
    dgamma.assign(c, 0);
    dbeta.assign(c, 0);
    for (int64_t i = 0; i < m * c; ++i) {
      dbeta[i % c] += g[i];
      dgamma[i % c] += g[i] * xhat[i];
    }
    dx.resize(m * c);
    for (int64_t i = 0; i < m * c; ++i) {
      const int k = static_cast<int>(i % c);
      dx[i] = gamma_[k] * inv_std[k] * (g[i] - dbeta[k] / m - xhat[i] * dgamma[k] / m);
    }
  }
  std::vector<double> inv_std;
  std::vector<float> gamma_;
};

std::vector<float> Floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// The fused end of a residual block against the unfused layers (the batch-norm kernels, the
// add and its ReLU as the add kernels compute them: in float, rounded once) and float64.
TEST_F(CudaKernels, ResidualTailMatchesTheUnfusedLayersAndFloat64) {
  EXPECT_TRUE(ResidualTailFusableCuda(DType::kBf16, 2048));
  EXPECT_FALSE(ResidualTailFusableCuda(DType::kBf16, 4096));
  EXPECT_FALSE(ResidualTailFusableCuda(DType::kBf16, 12));
  EXPECT_TRUE(ResidualTailFusableCuda(DType::kF32, 12));
  EXPECT_FALSE(ResidualTailFusableCuda(DType::kF32, 2048));
  EXPECT_FALSE(ResidualTailFusableCuda(DType::kF32, 6));
  for (DType t : kTypes) {
    // Batch 1 of 3x5, odd row counts, one row per slice (12 rows), resnet50's widest bf16 tail.
    for (auto [m, c] : {std::pair<int64_t, int>{15, 16},
                        {4099, 64},
                        {50, 40},
                        {12, t == DType::kBf16 ? 2048 : 1024},
                        {6272, 256}}) {
      ASSERT_TRUE(ResidualTailFusableCuda(t, c));
      for (int variant = 0; variant < 8; ++variant) {
        const bool relu = variant & 4, two = variant & 2, proj = variant & 1;
        SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(c) + (relu ? " relu" : "") +
                     (two ? " dy2" : "") + (proj ? " projection " : " identity ") + Name(t));
        const size_t n = static_cast<size_t>(m) * c;
        BatchNormShape bsh{m, c};
        const ResidualTailShape sh{m, c, relu};
        const auto xa = Round(RandomFloats(n, 31, -1.0f, 3.0f), t);
        const auto xb = Round(RandomFloats(n, 32, -2.0f, 2.0f), t);
        const auto dy = Round(RandomFloats(n, 33), t), dy2 = Round(RandomFloats(n, 34), t);
        const auto ga = RandomFloats(c, 35, 0.5f, 1.5f), ba = RandomFloats(c, 36);
        const auto gb = RandomFloats(c, 37, 0.5f, 1.5f), bb = RandomFloats(c, 38);
        const std::vector<float> rm0(c, 0.1f), rv0(c, 2.0f);
        Act dxa(t, xa), dxb(t, xb), ddy(t, dy), ddy2(t, dy2);
        Dev<float> dga(ga), dba(ba), dgb(gb), dbb(bb), ws(BatchNormWorkspaceFloatsCuda(bsh));

        // Unfused: the batch norms' outputs, the add on the host.
        struct Side {
          Dev<float> rm, rv, mean, inv, ss, dgamma, dbeta;
          Side(const std::vector<float>& rm0, const std::vector<float>& rv0, int c)
              : rm(rm0), rv(rv0), mean(c), inv(c), ss(2 * c), dgamma(c), dbeta(c) {}
        };
        Side ua(rm0, rv0, c), ub(rm0, rv0, c), fa(rm0, rv0, c), fb(rm0, rv0, c);
        Act ya(t, n), yb(t, n);
        ASSERT_TRUE(BatchNormForwardTrainCuda(t, bsh, dxa.get(), dga.get(), dba.get(), ua.rm.get(),
                                              ua.rv.get(), ua.mean.get(), ua.inv.get(), nullptr,
                                              ya.get(), ws.get(), ctx_)
                        .ok());
        if (proj) {
          ASSERT_TRUE(BatchNormForwardTrainCuda(t, bsh, dxb.get(), dgb.get(), dbb.get(),
                                                ub.rm.get(), ub.rv.get(), ub.mean.get(),
                                                ub.inv.get(), nullptr, yb.get(), ws.get(), ctx_)
                          .ok());
        }
        Sync();
        const auto hya = ya.Host(), hyb = proj ? yb.Host() : xb;
        std::vector<float> y_ref(n), g_ref(n);
        for (size_t i = 0; i < n; ++i) {
          const float v = hya[i] + hyb[i];
          y_ref[i] = relu ? std::max(v, 0.0f) : v;
        }
        y_ref = Round(y_ref, t);
        for (size_t i = 0; i < n; ++i) {
          g_ref[i] = (!relu || y_ref[i] > 0.0f) ? dy[i] + (two ? dy2[i] : 0.0f) : 0.0f;
        }
        g_ref = Round(g_ref, t);
        Act dg_ref(t, g_ref), dxa_ref(t, n), dxb_ref(t, n);
        ASSERT_TRUE(BatchNormBackwardCuda(t, bsh, dxa.get(), dg_ref.get(), dga.get(), ua.mean.get(),
                                          ua.inv.get(), nullptr, dxa_ref.get(), ua.dgamma.get(),
                                          ua.dbeta.get(), ws.get(), ctx_)
                        .ok());
        if (proj) {
          ASSERT_TRUE(BatchNormBackwardCuda(t, bsh, dxb.get(), dg_ref.get(), dgb.get(),
                                            ub.mean.get(), ub.inv.get(), nullptr, dxb_ref.get(),
                                            ub.dgamma.get(), ub.dbeta.get(), ws.get(), ctx_)
                          .ok());
        }

        // Fused.
        Dev<float> tws(ResidualTailWorkspaceFloatsCuda(sh));
        Act y(t, n), g(t, n), gxa(t, n), gxb(t, n);
        ASSERT_TRUE(BatchNormForwardTrainCuda(t, bsh, dxa.get(), dga.get(), dba.get(), fa.rm.get(),
                                              fa.rv.get(), fa.mean.get(), fa.inv.get(), fa.ss.get(),
                                              nullptr, ws.get(), ctx_)
                        .ok());
        if (proj) {
          ASSERT_TRUE(BatchNormForwardTrainCuda(t, bsh, dxb.get(), dgb.get(), dbb.get(),
                                                fb.rm.get(), fb.rv.get(), fb.mean.get(),
                                                fb.inv.get(), fb.ss.get(), nullptr, ws.get(), ctx_)
                          .ok());
        }
        FoldedBatchNorm a{dxa.get(),    fa.ss.get(), dga.get(),       fa.mean.get(),
                          fa.inv.get(), gxa.get(),   fa.dgamma.get(), fa.dbeta.get()};
        FoldedBatchNorm b{dxb.get(),    nullptr,   dgb.get(),       fb.mean.get(),
                          fb.inv.get(), gxb.get(), fb.dgamma.get(), fb.dbeta.get()};
        if (proj) b.scale_shift = fb.ss.get();
        ASSERT_TRUE(ResidualTailForwardCuda(t, sh, a, b, y.get(), ctx_).ok());
        ASSERT_TRUE(ResidualTailBackwardCuda(t, sh, y.get(), ddy.get(), two ? ddy2.get() : nullptr,
                                             a, b, g.get(), tws.get(), ctx_)
                        .ok());
        Sync();
        // The same statistics (the same kernels), the same output and gradient as stored by
        // the unfused layers, and the batch norms' gradients from the same sums.
        EXPECT_EQ(fa.mean.Host(), ua.mean.Host());
        EXPECT_EQ(fa.inv.Host(), ua.inv.Host());
        EXPECT_EQ(fa.rv.Host(), ua.rv.Host());
        const auto hy = y.Host(), hg = g.Host();
        EXPECT_LT(Rel(hy, y_ref), Tol(t, 1e-6));
        EXPECT_EQ(hg, g_ref);
        EXPECT_LT(Rel(gxa.Host(), dxa_ref.Host()), Tol(t, 1e-5));
        EXPECT_LT(Rel(fa.dgamma.Host(), ua.dgamma.Host()), 1e-5);
        EXPECT_LT(Rel(fa.dbeta.Host(), ua.dbeta.Host()), 1e-5);
        if (proj) {
          EXPECT_LT(Rel(gxb.Host(), dxb_ref.Host()), Tol(t, 1e-5));
          EXPECT_LT(Rel(fb.dgamma.Host(), ub.dgamma.Host()), 1e-5);
          EXPECT_LT(Rel(fb.dbeta.Host(), ub.dbeta.Host()), 1e-5);
        }

        // Float64 from the same rounded inputs (the ReLU mask taken from the device's output,
        // so that values within rounding of zero do not decide the comparison).
        Bn64 ra(xa, m, c, ga, ba), rb(xb, m, c, gb, bb);
        std::vector<double> y64(n), g64(n);
        for (size_t i = 0; i < n; ++i) {
          const double v = ra.y[i] + (proj ? rb.y[i] : xb[i]);
          y64[i] = relu ? std::max(v, 0.0) : v;
          g64[i] = (!relu || hy[i] > 0.0f) ? dy[i] + (two ? dy2[i] : 0.0) : 0.0;
        }
        ra.Backward(g64, m, c);
        rb.Backward(g64, m, c);
        EXPECT_LT(Rel(hy, Floats(y64)), Tol(t, 1e-5));
        EXPECT_LT(Rel(hg, Floats(g64)), Tol(t, 1e-6));
        EXPECT_LT(Rel(gxa.Host(), Floats(ra.dx)), Tol(t, 1e-4));
        EXPECT_LT(Rel(fa.dgamma.Host(), Floats(ra.dgamma)), Tol(t, 1e-4));
        EXPECT_LT(Rel(fa.dbeta.Host(), Floats(ra.dbeta)), Tol(t, 1e-4));
        if (proj) {
          EXPECT_LT(Rel(gxb.Host(), Floats(rb.dx)), Tol(t, 1e-4));
          EXPECT_LT(Rel(fb.dgamma.Host(), Floats(rb.dgamma)), Tol(t, 1e-4));
        }
      }
    }
  }
}

// Synchronized: two ranks' tails equal one GPU's tail over both ranks' rows.
TEST_F(CudaKernels, SynchronizedResidualTailMatchesOneGpuWithTheGlobalBatch) {
  for (DType t : kTypes) {
    const int ranks = 2, c = 64;
    const int64_t m = 1000;
    SCOPED_TRACE(Name(t));
    const int64_t gm = m * ranks;
    const size_t gn = static_cast<size_t>(gm) * c, n = static_cast<size_t>(m) * c;
    const auto xa = Round(RandomFloats(gn, 41, -1.0f, 3.0f), t);
    const auto xb = Round(RandomFloats(gn, 42), t), dy = Round(RandomFloats(gn, 43), t);
    const auto gamma = RandomFloats(c, 44, 0.5f, 1.5f), beta = RandomFloats(c, 45);
    const std::vector<float> rm0(c, 0.1f), rv0(c, 2.0f);
    // One GPU: statistics, forward and backward of a projection tail with a ReLU.
    auto run = [&](int64_t rows, const std::vector<float>& a_in, const std::vector<float>& b_in,
                   const std::vector<float>& dy_in, BatchNormSync* sync, int sync_ranks,
                   std::vector<std::vector<float>>* out) -> absl::Status {
      const size_t count = static_cast<size_t>(rows) * c;
      BatchNormShape bsh{rows, c};
      const ResidualTailShape sh{rows, c, true};
      Act xa_d(t, a_in), xb_d(t, b_in), dy_d(t, dy_in), y(t, count), g(t, count), gxa(t, count),
          gxb(t, count);
      Dev<float> gm_d(gamma), bt(beta), rma(rm0), rva(rv0), rmb(rm0), rvb(rv0), ma(c), ia(c), mb(c),
          ib(c), ssa(2 * c), ssb(2 * c), dga(c), dba(c), dgb(c), dbb(c),
          ws(BatchNormWorkspaceFloatsCuda(bsh, sync_ranks)),
          tws(ResidualTailWorkspaceFloatsCuda(sh, sync_ranks));
      absl::Status st =
          BatchNormForwardTrainCuda(t, bsh, xa_d.get(), gm_d.get(), bt.get(), rma.get(), rva.get(),
                                    ma.get(), ia.get(), ssa.get(), nullptr, ws.get(), ctx_, sync);
      if (st.ok()) {
        st = BatchNormForwardTrainCuda(t, bsh, xb_d.get(), gm_d.get(), bt.get(), rmb.get(),
                                       rvb.get(), mb.get(), ib.get(), ssb.get(), nullptr, ws.get(),
                                       ctx_, sync);
      }
      const FoldedBatchNorm a{xa_d.get(), ssa.get(), gm_d.get(), ma.get(),
                              ia.get(),   gxa.get(), dga.get(),  dba.get()};
      const FoldedBatchNorm b{xb_d.get(), ssb.get(), gm_d.get(), mb.get(),
                              ib.get(),   gxb.get(), dgb.get(),  dbb.get()};
      if (st.ok()) st = ResidualTailForwardCuda(t, sh, a, b, y.get(), ctx_);
      if (st.ok()) {
        st = ResidualTailBackwardCuda(t, sh, y.get(), dy_d.get(), nullptr, a, b, g.get(), tws.get(),
                                      ctx_, sync);
      }
      cudaStreamSynchronize(ctx_.stream);
      if (!st.ok()) return st;
      *out = {y.Host(), gxa.Host(), gxb.Host(), dga.Host(), dgb.Host(), ia.Host()};
      return absl::OkStatus();
    };
    std::vector<std::vector<float>> one;
    ASSERT_TRUE(run(gm, xa, xb, dy, nullptr, 1, &one).ok());
    ThreadRanks group(ranks);
    std::vector<std::vector<std::vector<float>>> per(ranks);
    std::vector<absl::Status> status(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        auto part = [&](const std::vector<float>& v) {
          return std::vector<float>(v.begin() + r * n, v.begin() + (r + 1) * n);
        };
        RankSync sync(&group, r);
        status[r] = run(m, part(xa), part(xb), part(dy), &sync, ranks, &per[r]);
      });
    }
    for (std::thread& th : threads) th.join();
    for (int r = 0; r < ranks; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(per[0][5], per[1][5]);  // the same inverse std on both ranks, bit for bit
    EXPECT_LT(Rel(per[0][5], one[5]), 1e-5);
    for (int k : {0, 1, 2}) {  // y, dxa, dxb: the ranks' rows of the one-GPU result
      std::vector<float> joined = per[0][k];
      joined.insert(joined.end(), per[1][k].begin(), per[1][k].end());
      EXPECT_LT(Rel(joined, one[k]), Tol(t, 1e-4)) << k;
    }
    for (int k : {3, 4}) {  // dgamma: this rank's sums, which add up to one GPU's
      std::vector<float> sum(c);
      for (int j = 0; j < c; ++j) sum[j] = per[0][k][j] + per[1][k][j];
      EXPECT_LT(Rel(sum, one[k]), 1e-4) << k;
    }
  }
}

TEST_F(CudaKernels, PoolingMatchesCpu) {
  for (DType t : kTypes) {
    SCOPED_TRACE(Name(t));
    // C = 64, 16, 8 and 12 take the 16-byte vector kernels (12: fp32 only), the others the
    // scalar ones; odd sizes, stride 1 and 2, padding, batch 1. The vector kernels' threads
    // walk rows a grid apart: 300 images of 24 output rows take several steps of the walk. The
    // backward's threads own 2x2 input pixels at stride 2: odd sizes cut the last blocks, and
    // 8 x 9 unpadded leaves a row and a column no window covers.
    for (const PoolShape& sh : {MakePool(2, 4, 4, 3, 2, 2, 0), MakePool(3, 7, 5, 2, 3, 2, 1),
                                MakePool(2, 28, 28, 6, 2, 2, 0), MakePool(1, 9, 9, 64, 3, 2, 1),
                                MakePool(2, 13, 11, 16, 3, 2, 1), MakePool(1, 6, 6, 8, 3, 1, 1),
                                MakePool(3, 10, 10, 12, 2, 2, 0), MakePool(300, 48, 47, 8, 3, 2, 1),
                                MakePool(2, 8, 9, 16, 3, 2, 0)}) {
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

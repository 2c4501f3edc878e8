// CUDA kernels of batch norm and pooling against their CPU twins, over the shared fixture of
// kernels/cuda_test_util.h.
#include <condition_variable>
#include <mutex>
#include <thread>

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
        Dev<float> dgamma(gamma), dbeta(beta), rm(rm0), rv(rv0), mean(c), inv(c),
            ws(BatchNormWorkspaceFloatsCuda(global));
        Act dx(t, x), y(t, global.m * c), dg(t, g), gx(t, global.m * c);
        Dev<float> ggamma(c), gbeta(c);
        ASSERT_TRUE(BatchNormForwardTrainCuda(t, global, dx.get(), dgamma.get(), dbeta.get(),
                                              rm.get(), rv.get(), mean.get(), inv.get(), y.get(),
                                              ws.get(), ctx_)
                        .ok());
        ASSERT_TRUE(BatchNormBackwardCuda(t, global, dx.get(), y.get(), dg.get(), dgamma.get(),
                                          mean.get(), inv.get(), gx.get(), ggamma.get(),
                                          gbeta.get(), ws.get(), ctx_)
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
                lws(BatchNormWorkspaceFloatsCuda(local, ranks)), lgg(c), lgb(c);
            Act lx(t, xr), ly(t, n), lg(t, gr), lgx(t, n);
            RankSync sync(&group, r);
            status[r] = BatchNormForwardTrainCuda(t, local, lx.get(), lgamma.get(), lbeta.get(),
                                                  lrm.get(), lrv.get(), lmean.get(), linv.get(),
                                                  ly.get(), lws.get(), ctx_, &sync);
            if (status[r].ok()) {
              status[r] = BatchNormBackwardCuda(t, local, lx.get(), ly.get(), lg.get(),
                                                lgamma.get(), lmean.get(), linv.get(), lgx.get(),
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

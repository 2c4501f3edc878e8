// Data parallelism on CPU ranks: the host collective, bucketed gradient averaging against
// one rank's gradients, rank threads' errors, and keeping replicas identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "kernels/elementwise/elementwise.h"
#include "kernels/norm_pool/batch_norm.h"
#include "kernels/test_util.h"
#include "trainer/dist/batch_norm_sync.h"
#include "trainer/dist/collective.h"
#include "trainer/dist/gradient_sync.h"
#include "trainer/dist/rank_threads.h"
#include "trainer/dist/replicate.h"
#include "trainer/nn/masks.h"
#include "trainer/nn/model_zoo.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

std::vector<Device*> Raw(const std::vector<std::unique_ptr<Device>>& devices) {
  std::vector<Device*> out;
  for (const auto& d : devices) out.push_back(d.get());
  return out;
}

std::vector<std::unique_ptr<Device>> CpuRanks(int n) {
  std::vector<std::unique_ptr<Device>> out;
  for (int i = 0; i < n; ++i) out.push_back(MakeCpuDevice(1));
  return out;
}

TEST(HostCollective, MeanInRankOrderIdenticalOnEveryRank) {
  for (int ranks : {2, 3}) {
    auto devices = CpuRanks(ranks);
    auto collective = MakeHostCollective(ranks);
    RankThreads threads(Raw(devices), [&] { collective->Abort(); });
    for (size_t n : {size_t{1}, size_t{7}, size_t{100003}}) {
      std::vector<std::vector<float>> data, original;
      for (int r = 0; r < ranks; ++r) {
        data.push_back(kernels::testing::RandomFloats(n, 100 + r, -3, 3));
      }
      original = data;
      ASSERT_TRUE(threads.Run([&](int r) { return collective->Reserve(r, n); }).ok());
      ASSERT_TRUE(
          threads.Run([&](int r) { return collective->AllReduceMean(r, data[r].data(), n); }).ok());
      std::vector<const float*> rows;
      for (const auto& o : original) rows.push_back(o.data());
      std::vector<float> want(n);
      kernels::MeanRowsCpu(ranks, static_cast<int64_t>(n), rows.data(), want.data());
      for (int r = 0; r < ranks; ++r) {
        ASSERT_EQ(std::memcmp(data[r].data(), want.data(), n * sizeof(float)), 0)
            << "rank " << r << " of " << ranks << ", n " << n;
      }
      // The mean of the float64 sum, to within rounding.
      for (size_t i = 0; i < n; i += 997) {
        double s = 0;
        for (int r = 0; r < ranks; ++r) s += original[r][i];
        EXPECT_NEAR(want[i], s / ranks, 1e-6) << i;
      }
    }
  }
}

// Every rank gets every rank's values, whole and in rank order (three ranks: no power of two).
TEST(HostCollective, AllGatherDeliversEveryRanksValuesWhole) {
  auto devices = CpuRanks(3);
  auto collective = MakeHostCollective(3);
  RankThreads threads(Raw(devices), [&] { collective->Abort(); });
  const size_t n = 7;
  std::vector<std::vector<float>> mine, all(3, std::vector<float>(3 * n));
  for (int r = 0; r < 3; ++r) mine.push_back(kernels::testing::RandomFloats(n, 200 + r, -3, 3));
  ASSERT_TRUE(
      threads.Run([&](int r) { return collective->AllGather(r, mine[r].data(), n, all[r].data()); })
          .ok());
  for (int r = 0; r < 3; ++r) {
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(std::memcmp(all[r].data() + k * n, mine[k].data(), n * sizeof(float)), 0)
          << "rank " << r << " holding rank " << k << "'s";
    }
  }
}

TEST(HostCollective, AFailedRankReleasesTheOthers) {
  auto devices = CpuRanks(3);
  auto collective = MakeHostCollective(3);
  RankThreads threads(Raw(devices), [&] { collective->Abort(); });
  ASSERT_TRUE(threads.Run([&](int r) { return collective->Reserve(r, 4); }).ok());
  std::vector<float> a(4, 1.0f), b(4, 2.0f);
  const absl::Status st = threads.Run([&](int r) -> absl::Status {
    if (r == 2) return absl::InvalidArgumentError("rank two broke");
    return collective->AllReduceMean(r, r == 0 ? a.data() : b.data(), 4);
  });
  // The cause is reported, with its rank, not the ranks that stopped waiting for it.
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("rank 2"), std::string::npos) << st;
  EXPECT_NE(st.message().find("rank two broke"), std::string::npos) << st;
  // Later operations fail at once instead of waiting.
  EXPECT_TRUE(absl::IsAborted(collective->AllReduceMean(0, a.data(), 4)));
}

// One rank per entry of `inputs`: each plans `arch` for its share, runs a training pass
// on it with a GradientSync, and returns its parameters' gradients.
struct RankRun {
  std::unique_ptr<Device> device;
  std::unique_ptr<Model> model;
  std::unique_ptr<Network> net;
  std::unique_ptr<GradientSync> sync;
};

std::vector<std::vector<float>> Grads(const Model& m) {
  std::vector<std::vector<float>> out;
  for (Parameter* p : m.parameters()) {
    if (p->trainable) out.push_back(p->grad.ToHost());
  }
  return out;
}

// Runs forward, loss and backward of `arch` on each rank's images, averaging gradients
// across the ranks (a single rank: no averaging). Returns rank 0's (and checks every rank
// agrees bit for bit).
std::vector<std::vector<float>> DataParallelGrads(const std::string& arch, Shape4 image,
                                                  const std::vector<std::vector<float>>& x,
                                                  const std::vector<std::vector<int32_t>>& y,
                                                  int* buckets = nullptr) {
  const int ranks = static_cast<int>(x.size());
  const int batch = static_cast<int>(y[0].size());
  std::vector<RankRun> runs(ranks);
  auto collective = MakeHostCollective(ranks);
  std::vector<Device*> devices;
  for (RankRun& r : runs) {
    r.device = MakeCpuDevice(1);
    devices.push_back(r.device.get());
  }
  RankThreads threads(devices, [&] { collective->Abort(); });
  const absl::Status st = threads.Run([&](int rank) -> absl::Status {
    RankRun& r = runs[rank];
    TOPIARY_ASSIGN_OR_RETURN(auto model, BuildModel(arch, 1.0f, image, 10, r.device.get()));
    r.model = std::move(model);
    r.model->Initialize(7);
    TOPIARY_ASSIGN_OR_RETURN(auto net, Network::Plan(r.model.get(), batch, true));
    r.net = std::move(net);
    if (ranks > 1) {
      TOPIARY_ASSIGN_OR_RETURN(auto sync,
                               GradientSync::Create(r.model.get(), collective.get(), rank, false));
      r.sync = std::move(sync);
      r.net->set_gradient_reducer(r.sync.get());
    }
    std::memcpy(r.net->input(), x[rank].data(), x[rank].size() * sizeof(float));
    std::memcpy(r.net->labels(), y[rank].data(), y[rank].size() * sizeof(int32_t));
    TOPIARY_RETURN_IF_ERROR(r.net->Forward(true));
    TOPIARY_RETURN_IF_ERROR(r.net->Loss(0.0f));
    return r.net->Backward();
  });
  EXPECT_TRUE(st.ok()) << st;
  if (buckets != nullptr && runs[0].sync) *buckets = runs[0].sync->buckets();
  const auto grads = Grads(*runs[0].model);
  for (int r = 1; r < ranks; ++r) EXPECT_EQ(Grads(*runs[r].model), grads) << "rank " << r;
  return grads;
}

std::vector<int32_t> Labels(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> y(n);
  for (int32_t& v : y) v = static_cast<int32_t>(rng() % 10);
  return y;
}

TEST(GradientSync, EveryParameterOfEveryBucketIsAveraged) {
  // Both ranks see the same images, so the mean of their gradients is exactly one rank's:
  // any parameter a bucket missed, or placed wrongly, shows as a difference in bits.
  const Shape4 image{1, 28, 28, 1};
  const int batch = 3;
  const auto x = kernels::testing::RandomFloats(batch * image.per_image(), 5);
  const auto y = Labels(batch, 6);
  const auto one = DataParallelGrads("resnet20", image, {x}, {y});
  int buckets = 0;
  const auto two = DataParallelGrads("resnet20", image, {x, x}, {y, y}, &buckets);
  EXPECT_GE(buckets, 2);  // 1.1 MB of gradients: a 1 MiB bucket and the rest
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i], two[i]) << "parameter " << i;
}

TEST(GradientSync, TwoHalvesAverageToTheWholeBatch) {
  // lenet5 has no batch norm: two ranks of 4 images give the gradient of all 8.
  const Shape4 image{1, 28, 28, 1};
  const size_t per = image.per_image();
  const auto x = kernels::testing::RandomFloats(8 * per, 11);
  const auto y = Labels(8, 12);
  const std::vector<float> x0(x.begin(), x.begin() + 4 * per), x1(x.begin() + 4 * per, x.end());
  const std::vector<int32_t> y0(y.begin(), y.begin() + 4), y1(y.begin() + 4, y.end());
  const auto whole = DataParallelGrads("lenet5", image, {x}, {y});
  const auto halves = DataParallelGrads("lenet5", image, {x0, x1}, {y0, y1});
  ASSERT_EQ(whole.size(), halves.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    const std::vector<double> want(whole[i].begin(), whole[i].end());
    EXPECT_LE(kernels::testing::RelError(halves[i], want), 1e-5) << "parameter " << i;
  }
}

TEST(Replicate, CopiesStateAndFindsTheFirstDifference) {
  auto dev = MakeCpuDevice(1);
  auto a = BuildModel("resnet20", 0.5f, {1, 28, 28, 1}, 10, dev.get());
  auto b = BuildModel("resnet20", 0.5f, {1, 28, 28, 1}, 10, dev.get());
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->Initialize(1);
  (*b)->Initialize(2);
  Parameter* k = (*a)->FindLayer("stage1.block0.conv1")->parameters()[0];
  std::vector<uint8_t> mask(k->size(), 1);
  for (size_t i = 0; i < mask.size(); i += 3) mask[i] = 0;
  MaskInfo info;
  info.kind = MaskInfo::Kind::kElement;
  ASSERT_TRUE(InstallMask(k, mask, info).ok());
  auto diff = FirstDifference(**a, **b);
  ASSERT_TRUE(diff.ok());
  EXPECT_EQ(*diff, "stem.conv.kernel: value");
  ASSERT_TRUE(CopyModelState(**a, b->get()).ok());
  diff = FirstDifference(**a, **b);
  ASSERT_TRUE(diff.ok());
  EXPECT_EQ(*diff, "");
  Parameter* kb = (*b)->FindLayer("stage1.block0.conv1")->parameters()[0];
  EXPECT_EQ(HostMask(*kb), mask);
  // A mask that differs is named.
  mask[1] = 0;
  ASSERT_TRUE(InstallMask(kb, mask, info, /*zero_masked=*/false).ok());
  diff = FirstDifference(**a, **b);
  ASSERT_TRUE(diff.ok());
  EXPECT_EQ(*diff, "stage1.block0.conv1.kernel: mask");
  // Copying again installs rank 0's mask over it.
  ASSERT_TRUE(CopyModelState(**a, b->get()).ok());
  EXPECT_EQ(*FirstDifference(**a, **b), "");
}

// Synchronized batch norm: R ranks, each with its share of the rows, normalize, update the
// running statistics and propagate gradients as one rank holding every row does (within
// rounding: the ranks' sums travel as floats). Odd shapes, a large mean (the two-pass
// variance), with and without the fused ReLU.
TEST(BatchNormSync, RanksMatchOneRankWithTheGlobalBatch) {
  for (const bool relu : {false, true}) {
    const int ranks = 3, c = 5;
    const int64_t m = 37;  // rows per rank
    kernels::BatchNormShape global;
    global.m = m * ranks;
    global.c = c;
    global.relu = relu;
    kernels::BatchNormShape local = global;
    local.m = m;
    auto x = kernels::testing::RandomFloats(global.m * c, 11, -2.0f, 3.0f);
    for (float& v : x) v += 40.0f;
    const auto dy = kernels::testing::RandomFloats(global.m * c, 12, -1.0f, 1.0f);
    const auto gamma = kernels::testing::RandomFloats(c, 13, 0.5f, 1.5f);
    const auto beta = kernels::testing::RandomFloats(c, 14, -0.5f, 0.5f);
    // One rank, every row.
    std::vector<float> rm(c, 0.1f), rv(c, 0.9f), mean(c), inv(c), y(x.size()), dx(x.size());
    std::vector<float> dgamma(c), dbeta(c);
    std::vector<float> ws(kernels::BatchNormWorkspaceFloatsCpu(global));
    ASSERT_TRUE(kernels::BatchNormForwardTrainCpu(global, x.data(), gamma.data(), beta.data(),
                                                  rm.data(), rv.data(), mean.data(), inv.data(),
                                                  y.data(), ws.data())
                    .ok());
    ASSERT_TRUE(kernels::BatchNormBackwardCpu(global, x.data(), y.data(), dy.data(), gamma.data(),
                                              mean.data(), inv.data(), dx.data(), dgamma.data(),
                                              dbeta.data(), ws.data())
                    .ok());
    // R ranks through the host collective.
    auto devices = CpuRanks(ranks);
    auto collective = MakeHostCollective(ranks);
    RankThreads threads(Raw(devices), [&] { collective->Abort(); });
    struct Rank {
      std::vector<float> rm, rv, mean, inv, y, dx, dgamma, dbeta, ws;
    };
    std::vector<Rank> r(ranks);
    ASSERT_TRUE(threads
                    .Run([&](int k) -> absl::Status {
                      auto sync = MakeBatchNormSync(collective.get(), k, c);
                      Rank& q = r[k];
                      q = {std::vector<float>(c, 0.1f),
                           std::vector<float>(c, 0.9f),
                           std::vector<float>(c),
                           std::vector<float>(c),
                           std::vector<float>(m * c),
                           std::vector<float>(m * c),
                           std::vector<float>(c),
                           std::vector<float>(c),
                           std::vector<float>(kernels::BatchNormWorkspaceFloatsCpu(local))};
                      const int64_t at = k * m * c;
                      TOPIARY_RETURN_IF_ERROR(kernels::BatchNormForwardTrainCpu(
                          local, x.data() + at, gamma.data(), beta.data(), q.rm.data(), q.rv.data(),
                          q.mean.data(), q.inv.data(), q.y.data(), q.ws.data(), sync.get()));
                      return kernels::BatchNormBackwardCpu(
                          local, x.data() + at, q.y.data(), dy.data() + at, gamma.data(),
                          q.mean.data(), q.inv.data(), q.dx.data(), q.dgamma.data(), q.dbeta.data(),
                          q.ws.data(), sync.get());
                    })
                    .ok());
    for (int k = 0; k < ranks; ++k) {
      SCOPED_TRACE("rank " + std::to_string(k) + (relu ? ", relu" : ""));
      for (int j = 0; j < c; ++j) {
        EXPECT_NEAR(r[k].mean[j], mean[j], 2e-6 * std::fabs(mean[j]));
        EXPECT_NEAR(r[k].inv[j], inv[j], 1e-5 * inv[j]);
        EXPECT_NEAR(r[k].rm[j], rm[j], 2e-6 * std::fabs(rm[j]));
        EXPECT_NEAR(r[k].rv[j], rv[j], 1e-5 * rv[j]);
      }
      for (int64_t i = 0; i < m * c; ++i) {
        ASSERT_NEAR(r[k].y[i], y[k * m * c + i], 1e-4) << i;
        ASSERT_NEAR(r[k].dx[i], dx[k * m * c + i], 1e-4) << i;
      }
    }
    // The ranks' dgamma and dbeta are their own rows' sums: together, the global ones.
    for (int j = 0; j < c; ++j) {
      double g = 0, b = 0;
      for (int k = 0; k < ranks; ++k) {
        g += r[k].dgamma[j];
        b += r[k].dbeta[j];
      }
      EXPECT_NEAR(g, dgamma[j], 1e-4 * (1 + std::fabs(dgamma[j])));
      EXPECT_NEAR(b, dbeta[j], 1e-4 * (1 + std::fabs(dbeta[j])));
    }
    // Without the exchange, each rank's statistics are its own share's: they differ.
    std::vector<float> own_mean(c), own_inv(c), own_y(m * c), rm1(c, 0.1f), rv1(c, 0.9f);
    std::vector<float> ws1(kernels::BatchNormWorkspaceFloatsCpu(local));
    ASSERT_TRUE(kernels::BatchNormForwardTrainCpu(local, x.data(), gamma.data(), beta.data(),
                                                  rm1.data(), rv1.data(), own_mean.data(),
                                                  own_inv.data(), own_y.data(), ws1.data())
                    .ok());
    double diff = 0;
    for (int j = 0; j < c; ++j) diff = std::max(diff, std::fabs(own_inv[j] / inv[j] - 1.0));
    EXPECT_GT(diff, 1e-3);
  }
}

}  // namespace
}  // namespace topiary

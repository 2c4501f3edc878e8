// CUDA kernels of elementwise ops, casts, losses and SGD against their CPU twins, over the shared
// fixture of kernels/cuda_test_util.h.
#include <tuple>

#include "kernels/cuda_test_util.h"
#include "kernels/elementwise/activation.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/elementwise/loss.h"
#include "kernels/elementwise/sgd.h"

namespace topiary::kernels {
namespace {

using namespace testing;  // NOLINT: the shared fixture and helpers (cuda_test_util.h)

TEST_F(CudaKernels, ElementwiseAndBias) {
  const int64_t n = 1000003;  // odd, several grid strides
  for (DType t : kTypes) {
    SCOPED_TRACE(Name(t));
    auto a = Round(RandomFloats(n, 1), t), b = Round(RandomFloats(n, 2), t);
    auto g = Round(RandomFloats(n, 3), t);
    Act da(t, a), db(t, b), dg(t, g), y(t, n), dx(t, n), dx2(t, n);
    std::vector<float> ry(n), rdx(n), rdx2(n);
    // Each result is one fp32 operation on exact inputs, then one rounding: equal bits.
    ASSERT_TRUE(ReluForwardCuda(t, n, da.get(), y.get(), ctx_).ok());
    ReluForwardCpu(n, a.data(), ry.data());
    Sync();
    EXPECT_EQ(y.Host(), ry);
    ASSERT_TRUE(ReluBackwardCuda(t, n, y.get(), dg.get(), dx.get(), ctx_).ok());
    ReluBackwardCpu(n, ry.data(), g.data(), rdx.data());
    Sync();
    EXPECT_EQ(dx.Host(), rdx);
    ASSERT_TRUE(AddReluCuda(t, n, da.get(), db.get(), y.get(), ctx_).ok());
    AddReluCpu(n, a.data(), b.data(), ry.data());
    ry = Round(ry, t);
    ASSERT_TRUE(AddReluBackwardCuda(t, n, y.get(), dg.get(), dx.get(), dx2.get(), ctx_).ok());
    AddReluBackwardCpu(n, ry.data(), g.data(), rdx.data(), rdx2.data());
    Sync();
    EXPECT_EQ(y.Host(), ry);
    EXPECT_EQ(dx.Host(), rdx);
    EXPECT_EQ(dx2.Host(), rdx2);
    // With a second gradient (a value read by two layers): the sum and mask in fp32, then
    // one rounding, as the CPU's fp32 result rounded.
    ASSERT_TRUE(
        AddReluBackwardSumCuda(t, n, y.get(), dg.get(), db.get(), dx.get(), dx2.get(), ctx_).ok());
    AddReluBackwardSumCpu(n, ry.data(), g.data(), b.data(), rdx.data(), rdx2.data());
    Sync();
    EXPECT_EQ(dx.Host(), Round(rdx, t));
    EXPECT_EQ(dx2.Host(), Round(rdx2, t));
    ASSERT_TRUE(AddCuda(t, n, da.get(), db.get(), y.get(), ctx_).ok());
    AddCpu(n, a.data(), b.data(), ry.data());
    Sync();
    EXPECT_EQ(y.Host(), Round(ry, t));

    const int64_t rows = 777;
    const int c = 13;
    auto bias = RandomFloats(c, 4), m = Round(RandomFloats(rows * c, 5), t);
    Dev<float> dbias(bias), dgrad(c);
    Act dm(t, m);
    ASSERT_TRUE(AddBiasCuda(t, rows, c, dbias.get(), dm.get(), ctx_).ok());
    ASSERT_TRUE(BiasGradCuda(t, rows, c, dm.get(), dgrad.get(), ctx_).ok());
    std::vector<float> rgrad(c);
    AddBiasCpu(rows, c, bias.data(), m.data());
    m = Round(m, t);
    BiasGradCpu(rows, c, m.data(), rgrad.data());
    Sync();
    EXPECT_EQ(dm.Host(), m);
    EXPECT_LT(Rel(dgrad.Host(), rgrad), 1e-5);
  }
}

// Imported mobile networks' activations and gates against the CPU twins (the device's expf
// may differ from the host's in the last bit; bf16 outputs then within one bf16 rounding).
TEST_F(CudaKernels, ActivationsAndChannelScaleMatchCpu) {
  const ActivationFn kinds[] = {{ActivationKind::kSigmoid},
                                {ActivationKind::kSilu},
                                {ActivationKind::kLeakyRelu, 0.1f},
                                {ActivationKind::kHardSigmoid, 1.0f / 6, 0.5f},
                                {ActivationKind::kHardSwish}};
  const int64_t n = 100003;
  for (DType t : kTypes) {
    SCOPED_TRACE(Name(t));
    const double tol = t == DType::kF32 ? 2e-6 : 8e-3;
    std::vector<float> x = RandomFloats(n, 6), g = Round(RandomFloats(n, 7), t);
    for (float& v : x) v *= 6;
    x = Round(x, t);
    Act dx_in(t, x), dg(t, g), y(t, n), dx(t, n);
    std::vector<float> ry(n), rdx(n);
    for (const ActivationFn& p : kinds) {
      SCOPED_TRACE(static_cast<int>(p.kind));
      ASSERT_TRUE(ActivationForwardCuda(t, p, n, dx_in.get(), y.get(), ctx_).ok());
      ASSERT_TRUE(ActivationBackwardCuda(t, p, n, dx_in.get(), dg.get(), dx.get(), ctx_).ok());
      ActivationForwardCpu(p, n, x.data(), ry.data());
      ActivationBackwardCpu(p, n, x.data(), g.data(), rdx.data());
      Sync();
      EXPECT_LT(Rel(y.Host(), ry), tol);
      EXPECT_LT(Rel(dx.Host(), rdx), tol);
    }
    // The product: same shape and per-(image, channel) scale; odd sizes and batch 1.
    for (const auto& [images, pixels, c] :
         {std::tuple{1, 1, 1}, std::tuple{3, 49, 13}, std::tuple{2, 196, 96}}) {
      const int64_t rows = int64_t{images} * pixels;
      for (int ppi : {0, pixels}) {
        const int64_t nb = ppi == 0 ? rows * c : int64_t{images} * c;
        auto a = Round(RandomFloats(rows * c, 8), t), b = Round(RandomFloats(nb, 9), t);
        auto d = Round(RandomFloats(rows * c, 10), t);
        Act ma(t, a), mb(t, b), md(t, d), my(t, rows * c), mda(t, rows * c), mdb(t, nb);
        std::vector<float> ry2(rows * c), rda(rows * c), rdb(nb);
        ASSERT_TRUE(MulForwardCuda(t, rows, c, ppi, ma.get(), mb.get(), my.get(), ctx_).ok());
        ASSERT_TRUE(MulBackwardCuda(t, rows, c, ppi, ma.get(), mb.get(), md.get(), mda.get(),
                                    mdb.get(), ctx_)
                        .ok());
        MulForwardCpu(rows, c, ppi, a.data(), b.data(), ry2.data());
        MulBackwardCpu(rows, c, ppi, a.data(), b.data(), d.data(), rda.data(), rdb.data());
        Sync();
        EXPECT_EQ(my.Host(), Round(ry2, t));  // one fp32 product, one rounding
        EXPECT_EQ(mda.Host(), Round(rda, t));
        EXPECT_LT(Rel(mdb.Host(), rdb), t == DType::kF32 ? 1e-5 : 8e-3);
      }
    }
  }
}

// The layers imported networks need: ReLU6 and channel concat bit for bit.
TEST_F(CudaKernels, Relu6AndConcatMatchCpu) {
  for (DType t : kTypes) {
    SCOPED_TRACE(Name(t));
    const int64_t n = 100003;
    auto x = Round(RandomFloats(n, 1, -8.0f, 8.0f), t), g = Round(RandomFloats(n, 2), t);
    Act dx(t, x), dg(t, g), y(t, n), gx(t, n);
    std::vector<float> ry(n), rgx(n);
    ASSERT_TRUE(Relu6ForwardCuda(t, n, dx.get(), y.get(), ctx_).ok());
    ASSERT_TRUE(Relu6BackwardCuda(t, n, y.get(), dg.get(), gx.get(), ctx_).ok());
    Relu6ForwardCpu(n, x.data(), ry.data());
    Relu6BackwardCpu(n, ry.data(), g.data(), rgx.data());
    Sync();
    EXPECT_EQ(y.Host(), ry);
    EXPECT_EQ(gx.Host(), rgx);

    const int64_t rows = 1001;
    const int a = 5, b = 11;
    auto xa = Round(RandomFloats(rows * a, 3), t), xb = Round(RandomFloats(rows * b, 4), t);
    Act da(t, xa), db(t, xb), wide(t, rows * (a + b)), sa(t, rows * a), sb(t, rows * b);
    ASSERT_TRUE(ConcatChannelsCuda(t, rows, a, a + b, 0, da.get(), wide.get(), ctx_).ok());
    ASSERT_TRUE(ConcatChannelsCuda(t, rows, b, a + b, a, db.get(), wide.get(), ctx_).ok());
    ASSERT_TRUE(SplitChannelsCuda(t, rows, b, a + b, a, wide.get(), sb.get(), ctx_).ok());
    ASSERT_TRUE(SplitChannelsCuda(t, rows, a, a + b, 0, wide.get(), sa.get(), ctx_).ok());
    std::vector<float> rw(rows * (a + b));
    ConcatChannelsCpu(rows, a, a + b, 0, xa.data(), rw.data());
    ConcatChannelsCpu(rows, b, a + b, a, xb.data(), rw.data());
    Sync();
    EXPECT_EQ(wide.Host(), rw);
    EXPECT_EQ(sa.Host(), xa);
    EXPECT_EQ(sb.Host(), xb);
  }
}

// Zero counts (activation sparsity) equal the CPU's, for both element types, across calls.
TEST_F(CudaKernels, CountZerosMatchesCpu) {
  for (DType t : kTypes) {
    for (int64_t n : {1, 31, 1000, 300001}) {
      std::vector<float> x = RandomFloats(n, 77);
      for (int64_t i = 0; i < n; i += 3) x[i] = 0.0f;
      Act dx(t, x);
      Dev<unsigned long long> count(std::vector<unsigned long long>{5});
      ASSERT_TRUE(CountZerosCuda(t, n, dx.get(), count.get(), ctx_).ok());
      ASSERT_TRUE(CountZerosCuda(t, n, dx.get(), count.get(), ctx_).ok());
      Sync();
      const auto r = Round(x, t);
      EXPECT_EQ(count.Host()[0],
                5 + 2 * static_cast<unsigned long long>(CountZerosCpu(n, r.data())))
          << Name(t) << " n " << n;
    }
  }
}

// Data parallelism's ordered mean: the same bits as the CPU twin (both sum rows in order),
// and within rounding of the float64 mean.
TEST_F(CudaKernels, MeanRowsMatchesCpuBitForBit) {
  for (int rows : {1, 2, 3, 8}) {
    for (int64_t n : {1, 7, 100003}) {
      const std::vector<float> all = RandomFloats(rows * n, 90 + rows, -4.0f, 4.0f);
      Dev<float> src(all), dst(n);
      ASSERT_TRUE(MeanRowsCuda(rows, n, src.get(), dst.get(), ctx_).ok());
      Sync();
      std::vector<const float*> ptrs;
      for (int r = 0; r < rows; ++r) ptrs.push_back(all.data() + r * n);
      std::vector<float> want(n);
      MeanRowsCpu(rows, n, ptrs.data(), want.data());
      EXPECT_EQ(dst.Host(), want) << rows << " rows of " << n;
      for (int64_t i = 0; i < n; i += 1009) {
        double sum = 0;
        for (int r = 0; r < rows; ++r) sum += all[r * n + i];
        EXPECT_NEAR(want[i], sum / rows, 1e-5) << i;
      }
    }
  }
}

TEST_F(CudaKernels, CastsRoundToNearestEven) {
  auto v = RandomFloats(100003, 30, -1e3f, 1e3f);
  v[0] = 1.0f + 1.0f / 256;  // a tie: rounds to even (1.0)
  v[1] = 1.0f + 3.0f / 256;  // a tie: rounds to even (1 + 4/256)
  v[2] = 3.0e38f;            // near the top of the range: bf16 keeps fp32's exponent
  v[3] = 1e-30f;             // and its small numbers
  Dev<float> src(v), back(v.size());
  Act half(DType::kBf16, v.size());
  ASSERT_TRUE(CastCuda(DType::kF32, DType::kBf16, v.size(), src.get(), half.get(), ctx_).ok());
  ASSERT_TRUE(CastCuda(DType::kBf16, DType::kF32, v.size(), half.get(), back.get(), ctx_).ok());
  Sync();
  const auto rounded = Round(v, DType::kBf16);
  EXPECT_EQ(half.Host(), rounded);
  EXPECT_EQ(back.Host(), rounded);
  EXPECT_EQ(rounded[0], 1.0f);
  EXPECT_EQ(rounded[1], 1.0f + 4.0f / 256);
  EXPECT_FALSE(CastCuda(DType::kBf16, DType::kBf16, 1, half.get(), half.get(), ctx_).ok());
  // fp32 to fp32 is a copy (gradient gathers and scatters of data parallelism).
  Dev<float> copy(v.size());
  ASSERT_TRUE(CastCuda(DType::kF32, DType::kF32, v.size(), src.get(), copy.get(), ctx_).ok());
  Sync();
  EXPECT_EQ(copy.Host(), v);

  // The table form: entries of different sizes in one launch.
  auto a = RandomFloats(7, 31), b = RandomFloats(300001, 32);
  Dev<float> da(a), db(b);
  Act ha(DType::kBf16, a.size()), hb(DType::kBf16, b.size());
  Dev<CastItem> items(std::vector<CastItem>{{da.get(), ha.get(), 7}, {db.get(), hb.get(), 300001}});
  ASSERT_TRUE(CastManyCuda(DType::kF32, DType::kBf16, items.get(), 2, ctx_).ok());
  Sync();
  EXPECT_EQ(ha.Host(), Round(a, DType::kBf16));
  EXPECT_EQ(hb.Host(), Round(b, DType::kBf16));
}

TEST_F(CudaKernels, LossAndMetricsMatchCpu) {
  for (DType t : kTypes) {
    for (int classes : {10, 100, 1000}) {
      SCOPED_TRACE(std::to_string(classes) + " classes " + Name(t));
      const int n = 129;
      auto z = Round(RandomFloats(n * classes, 14, -5.0f, 5.0f), t);
      std::vector<int32_t> labels(n);
      for (int i = 0; i < n; ++i) labels[i] = (i * 7) % classes;
      for (float smoothing : {0.0f, 0.1f}) {
        Act dz(t, z), dd(t, n * classes);
        Dev<float> loss(n);
        Dev<int32_t> dl(labels), rank(n);
        Dev<double> acc(std::vector<double>(4, 0.0));
        ASSERT_TRUE(SoftmaxCrossEntropyCuda(t, n, classes, dz.get(), dl.get(), smoothing, dd.get(),
                                            loss.get(), rank.get(), ctx_)
                        .ok());
        ASSERT_TRUE(AccumulateMetricsCuda(n, loss.get(), rank.get(), 5, acc.get(), ctx_).ok());
        std::vector<float> rd(n * classes);
        const double rloss =
            SoftmaxCrossEntropyCpu(n, classes, z.data(), labels.data(), smoothing, rd.data());
        Sync();
        const auto a = acc.Host();
        // The loss itself is fp32 in both types (the logits are the same numbers).
        EXPECT_NEAR(a[0] / n, rloss, 1e-4 * std::abs(rloss));
        EXPECT_EQ(a[1], TopKCorrectCpu(n, classes, z.data(), labels.data(), 1));
        EXPECT_EQ(a[2], TopKCorrectCpu(n, classes, z.data(), labels.data(), 5));
        EXPECT_EQ(a[3], n);
        EXPECT_LT(Rel(dd.Host(), rd), Tol(t, 1e-4));
      }
    }
  }
}

TEST_F(CudaKernels, SgdMatchesCpu) {
  // Many tensors in one step (more than one launch's worth), of awkward sizes, some masked,
  // some without weight decay.
  const int count = 70;
  for (bool nesterov : {false, true}) {
    for (bool decoupled : {false, true}) {
      SgdParams p{0.05f, 0.9f, nesterov, 5e-4f, decoupled};
      std::vector<std::vector<float>> w(count), buf(count);
      std::vector<std::vector<uint8_t>> mask(count);
      std::vector<std::unique_ptr<Dev<float>>> dw, dbuf;
      std::vector<std::unique_ptr<Dev<uint8_t>>> dmask;
      for (int k = 0; k < count; ++k) {
        const int64_t n = k == 0 ? 100003 : 1 + 37 * k;
        w[k] = RandomFloats(n, 15 + k);
        buf[k].assign(n, 0.0f);
        mask[k].resize(n);
        for (int64_t i = 0; i < n; ++i) mask[k][i] = i % 4 != 0;
        dw.push_back(std::make_unique<Dev<float>>(w[k]));
        dbuf.push_back(std::make_unique<Dev<float>>(buf[k]));
        dmask.push_back(std::make_unique<Dev<uint8_t>>(mask[k]));
      }
      Dev<float> lr(std::vector<float>{p.lr});
      for (int step = 0; step < 3; ++step) {
        std::vector<std::unique_ptr<Dev<float>>> dg;
        std::vector<SgdTensor> tensors;
        for (int k = 0; k < count; ++k) {
          const auto g = RandomFloats(w[k].size(), 100 * step + k);
          dg.push_back(std::make_unique<Dev<float>>(g));
          const bool masked = k % 3 == 0, decay = k % 2 == 0;
          tensors.push_back({dw[k]->get(), dbuf[k]->get(), dg[k]->get(),
                             masked ? dmask[k]->get() : nullptr, static_cast<int64_t>(w[k].size()),
                             decay});
          SgdParams q = p;
          q.weight_decay = decay ? p.weight_decay : 0.0f;
          SgdStepCpu(w[k].size(), q, g.data(), masked ? mask[k].data() : nullptr, w[k].data(),
                     buf[k].data());
        }
        ASSERT_TRUE(SgdStepCuda(p, lr.get(), tensors, ctx_).ok());
        Sync();
      }
      for (int k = 0; k < count; ++k) {
        const auto gw = dw[k]->Host();
        EXPECT_LT(Rel(gw, w[k]), 1e-5) << k;
        if (k % 3 == 0) {
          for (size_t i = 0; i < gw.size(); i += 4) EXPECT_EQ(gw[i], 0.0f) << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace topiary::kernels

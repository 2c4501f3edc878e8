// CUDA kernels of approximate convolutions against their CPU twins, over the shared fixture of
// kernels/cuda_test_util.h.
#include "kernels/approx/approx_conv.h"
#include "kernels/cuda_test_util.h"

namespace topiary::kernels {
namespace {

using namespace testing;  // NOLINT: the shared fixture and helpers (cuda_test_util.h)

// The approximate convolution: the same codes, parameters and integer sums as the CPU
// reference, so every output is bit-identical, for random tables, the awkward shapes, every
// channel tiling (K up to 16, 32, 64 and beyond) and constant tensors.
TEST_F(CudaKernels, ApproxConvBitIdenticalToCpu) {
  ASSERT_TRUE(ApproxConvPrepareCuda().ok());
  struct Case {
    ConvShape s;
    float x_const;  // NaN: random input; else a constant input
  };
  const float kRandom = std::nanf("");
  const Case cases[] = {
      {MakeConv(2, 7, 7, 5, 6, 3, 3, 1, 1), kRandom},
      {MakeConv(3, 9, 11, 3, 7, 3, 3, 2, 1), kRandom},
      {MakeConv(2, 5, 5, 8, 4, 1, 1, 1, 0), kRandom},
      {MakeConv(1, 6, 6, 3, 5, 1, 1, 2, 0), kRandom},
      {MakeConv(1, 8, 8, 3, 20, 5, 5, 1, 2), kRandom},
      {MakeConv(2, 4, 4, 3, 33, 4, 4, 1, 0), kRandom},
      {MakeConv(2, 3, 3, 2, 3, 5, 5, 1, 1), kRandom},
      {MakeConv(5, 16, 16, 16, 16, 3, 3, 1, 1), kRandom},
      {MakeConv(3, 16, 16, 32, 64, 3, 3, 2, 1), kRandom},
      {MakeConv(2, 8, 8, 17, 100, 3, 3, 1, 1), kRandom},
      {MakeConv(2, 6, 6, 4, 8, 3, 3, 1, 1), 0.0f},
      {MakeConv(2, 6, 6, 4, 8, 3, 3, 1, 1), -0.8f},
  };
  uint32_t seed = 500;
  for (const Case& c : cases) {
    const ConvShape& s = c.s;
    SCOPED_TRACE(::testing::Message()
                 << "N" << s.n << " " << s.h << "x" << s.w << "x" << s.c << " K" << s.k << " "
                 << s.r << "x" << s.s << " stride " << s.stride_h << " pad " << s.pad_h);
    const size_t xn = static_cast<size_t>(s.n) * s.h * s.w * s.c;
    const size_t wn = static_cast<size_t>(s.k) * s.patch();
    const size_t yn = static_cast<size_t>(s.n) * s.ho() * s.wo() * s.k;
    std::vector<float> x = RandomFloats(xn, seed++, -1.0f, 2.5f);
    if (!std::isnan(c.x_const)) x.assign(xn, c.x_const);
    const auto w = RandomFloats(wn, seed++, -0.6f, 0.5f);
    const auto bias = RandomFloats(s.k, seed++);
    std::mt19937 gen(seed++);
    std::vector<uint16_t> table(kMultiplierEntries);
    for (auto& v : table) v = static_cast<uint16_t>(gen());

    std::vector<float> xq(xn), wq(wn), y(yn);
    std::vector<QuantParams> cpu_params(ApproxParamCount(s));
    std::vector<unsigned char> cpu_ws(ApproxConvWorkspaceBytesCpu(s));
    Dev<float> dx(x), dw(w), db(bias), dy(yn), dxq(xn), dwq(wn);
    Dev<uint16_t> dt(table), dsm(SignMagnitudeTable(table));
    Dev<QuantParams> dp(cpu_params.size());
    Dev<unsigned char> ws(ApproxConvWorkspaceBytes(s));
    // Every weight mode: asymmetric (TFApprox's) or sign-magnitude (through the derived
    // table), per tensor or per output channel.
    for (const bool symmetric : {false, true}) {
      for (const bool per_channel : {false, true}) {
        SCOPED_TRACE(std::string(symmetric ? "sign-magnitude" : "asymmetric") +
                     (per_channel ? ", per channel" : ", per tensor"));
        ApproxConvOptions o;
        o.weights.code = symmetric ? WeightCode::kSignMagnitude : WeightCode::kAsymmetric;
        o.weights.scales = per_channel ? WeightScales::kPerChannel : WeightScales::kPerTensor;
        const std::vector<uint16_t> t = symmetric ? SignMagnitudeTable(table) : table;
        ApproxConv2dForwardCpu(s, x.data(), w.data(), bias.data(), t.data(), y.data(), xq.data(),
                               wq.data(), cpu_params.data(), cpu_ws.data(), o);
        ASSERT_TRUE(ApproxConv2dForwardCuda(s, dx.get(), dw.get(), db.get(),
                                            symmetric ? dsm.get() : dt.get(), dy.get(), dxq.get(),
                                            dwq.get(), dp.get(), ws.get(), ctx_, o)
                        .ok());
        Sync();
        const auto params = dp.Host();
        for (size_t i = 0; i < params.size(); ++i) {
          EXPECT_EQ(params[i].scale, cpu_params[i].scale) << "params[" << i << "]";
          EXPECT_EQ(params[i].zero_point, cpu_params[i].zero_point) << "params[" << i << "]";
        }
        if (symmetric) {
          EXPECT_EQ(params[1].zero_point, 128);
        }
        EXPECT_EQ(dxq.Host(), xq);
        EXPECT_EQ(dwq.Host(), wq);
        EXPECT_EQ(dy.Host(), y);
      }
    }

    // The moving-average range: two updates (the first batch, then the same batch scaled),
    // then an evaluation, with the running range and the outputs identical to the CPU's.
    std::vector<float> running(3, 0.0f);
    Dev<float> drunning(running);
    std::vector<float> x2 = x;
    for (float& v : x2) v *= 1.7f;
    Dev<float> dx2(x2);
    for (auto [xs, dxs, update] :
         {std::tuple{&x, &dx, true}, {&x2, &dx2, true}, {&x2, &dx2, false}}) {
      ApproxConvOptions o;
      o.running_range = running.data();
      o.update_range = update;
      ApproxConv2dForwardCpu(s, xs->data(), w.data(), bias.data(), table.data(), y.data(),
                             xq.data(), wq.data(), cpu_params.data(), cpu_ws.data(), o);
      o.running_range = drunning.get();
      ASSERT_TRUE(ApproxConv2dForwardCuda(s, dxs->get(), dw.get(), db.get(), dt.get(), dy.get(),
                                          dxq.get(), dwq.get(), dp.get(), ws.get(), ctx_, o)
                      .ok());
      Sync();
      EXPECT_EQ(drunning.Host(), running);
      EXPECT_EQ(dxq.Host(), xq);
      EXPECT_EQ(dy.Host(), y);
    }
  }
}

}  // namespace
}  // namespace topiary::kernels

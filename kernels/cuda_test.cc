// Every CUDA kernel against its CPU twin on the same random inputs, for both activation types:
// fp32, and bf16 (inputs rounded to bf16 on both sides, so the difference left is the GPU's
// rounding of its outputs, at most 2^-9 relative). Tagged gpu: skips, saying why, where no
// GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/approx_conv.h"
#include "kernels/augment.h"
#include "kernels/batch_norm.h"
#include "kernels/block_sparse_conv.h"
#include "kernels/conv.h"
#include "kernels/cuda_context.h"
#include "kernels/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/grouped_conv.h"
#include "kernels/linear.h"
#include "kernels/loss.h"
#include "kernels/parallel.h"
#include "kernels/pooling.h"
#include "kernels/resize.h"
#include "kernels/sampled_grad.h"
#include "kernels/sgd.h"
#include "kernels/test_util.h"

namespace topiary::kernels {
namespace {

using testing::MakeConv;
using testing::MakePool;
using testing::RandomFloats;

// max |a - b| / max(max |b|, 1e-6)
double Rel(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 1e-6;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return err / scale;
}

template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) {
    EXPECT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p_); }
  T* get() const { return p_; }
  std::vector<T> Host() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// v as the device would hold it in type t (bf16: rounded to nearest even).
std::vector<float> Round(const std::vector<float>& v, DType t) {
  if (t == DType::kF32) return v;
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = FromBf16(ToBf16(v[i]));
  return r;
}

// Activations of type t in device memory, written and read as host floats.
class Act {
 public:
  Act(DType t, size_t n) : t_(t), n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(n, 1) * SizeOf(t)), cudaSuccess);
  }
  Act(DType t, const std::vector<float>& v) : Act(t, v.size()) {
    if (t == DType::kF32) {
      EXPECT_EQ(cudaMemcpy(p_, v.data(), n_ * 4, cudaMemcpyHostToDevice), cudaSuccess);
      return;
    }
    std::vector<Bf16> b(n_);
    for (size_t i = 0; i < n_; ++i) b[i] = ToBf16(v[i]);
    EXPECT_EQ(cudaMemcpy(p_, b.data(), n_ * 2, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Act() { cudaFree(p_); }
  void* get() const { return p_; }
  std::vector<float> Host() const {
    std::vector<float> v(n_);
    if (t_ == DType::kF32) {
      EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      return v;
    }
    std::vector<Bf16> b(n_);
    EXPECT_EQ(cudaMemcpy(b.data(), p_, n_ * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < n_; ++i) v[i] = FromBf16(b[i]);
    return v;
  }

 private:
  DType t_;
  size_t n_;
  void* p_ = nullptr;
};

constexpr DType kTypes[] = {DType::kF32, DType::kBf16};
const char* Name(DType t) { return t == DType::kBf16 ? "bf16" : "fp32"; }
// Tolerance of a result computed in fp32 and stored in type t.
double Tol(DType t, double fp32_tol) { return t == DType::kBf16 ? 1e-2 : fp32_tol; }

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
      GTEST_SKIP() << "no usable GPU: "
                   << (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    }
    ASSERT_EQ(cudaStreamCreate(&ctx_.stream), cudaSuccess);
    ASSERT_EQ(cudnnCreate(&ctx_.cudnn), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(cublasCreate(&ctx_.cublas), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasSetStream(ctx_.cublas, ctx_.stream), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudnnSetStream(ctx_.cudnn, ctx_.stream), CUDNN_STATUS_SUCCESS);
    cudaDeviceGetAttribute(&ctx_.sm_count, cudaDevAttrMultiProcessorCount, 0);
    SetCpuThreads(0);
  }
  void TearDown() override {
    if (ctx_.cublas) cublasDestroy(ctx_.cublas);
    if (ctx_.cudnn) cudnnDestroy(ctx_.cudnn);
    if (ctx_.stream) cudaStreamDestroy(ctx_.stream);
  }
  void Sync() { ASSERT_EQ(cudaStreamSynchronize(ctx_.stream), cudaSuccess); }
  CudaContext ctx_;
};

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

// The layers imported networks need: ReLU6 and channel concat bit for bit; grouped and
// depthwise convolutions within rounding, both element types.
TEST_F(CudaKernels, Relu6ConcatAndGroupedConvMatchCpu) {
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

// Batch assembly: the GPU builds the CPU's batches bit for bit, with zero-padded crops and
// flips, with random-resized crops into smaller images, and with the evaluation centre crop.
TEST_F(CudaKernels, AssembleBatchMatchesCpuBitForBit) {
  const int n = 37, h = 19, w = 23, c = 3;
  std::vector<uint8_t> pixels(static_cast<size_t>(n) * h * w * c);
  for (size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  std::vector<int32_t> labels(n), order(n);
  for (int i = 0; i < n; ++i) {
    labels[i] = i % 10;
    order[i] = (i * 7) % n;
  }
  std::vector<float> lut(c * 256);
  for (size_t i = 0; i < lut.size(); ++i) lut[i] = static_cast<float>(i % 256) * 0.01f - 1.0f;
  Dev<uint8_t> dpix(pixels);
  Dev<int32_t> dlab(labels), dord(order);
  Dev<float> dlut(lut);
  for (int mode = 0; mode < 3; ++mode) {
    SCOPED_TRACE(mode);
    AssembleParams p;
    p.h = h;
    p.w = w;
    p.c = c;
    p.count = 20;
    p.first = 5;
    p.epoch = 3;
    p.augment = mode < 2;
    p.horizontal_flip = true;
    p.crop_padding = mode == 0 ? 3 : 0;
    p.random_resized_crop = mode == 1;
    if (mode > 0) p.out_h = p.out_w = 11;
    p.key0 = 12345;
    p.key1 = 678;
    const size_t out = static_cast<size_t>(p.count) * p.oh() * p.ow() * c;
    Dev<float> dx(out);
    Dev<int32_t> dl(p.count);
    ASSERT_TRUE(AssembleBatchCuda(p, nullptr, dpix.get(), dlab.get(), dord.get(), dlut.get(),
                                  dx.get(), dl.get(), ctx_)
                    .ok());
    std::vector<float> x(out);
    std::vector<int32_t> bl(p.count);
    AssembleBatchCpu(p, pixels.data(), labels.data(), order.data(), lut.data(), x.data(),
                     bl.data());
    Sync();
    EXPECT_EQ(dx.Host(), x);
    EXPECT_EQ(dl.Host(), bl);
  }
}

// The streamed pipeline's crop-and-resize: the CUDA kernel writes the CPU's bytes (integer
// filter), for images of several sizes, boxes, flips and scales in one launch.
TEST_F(CudaKernels, CropResizeMatchesCpuBitForBit) {
  const int c = 3, oh = 29, ow = 23;
  const int sizes[][2] = {{500, 375}, {31, 29}, {7, 640}, {224, 224}};
  std::vector<std::vector<uint8_t>> images;
  std::vector<std::unique_ptr<Dev<uint8_t>>> dimages;
  std::vector<ResizeJob> jobs, djobs;
  for (int i = 0; i < 4; ++i) {
    const int w = sizes[i][0], h = sizes[i][1];
    images.emplace_back(static_cast<size_t>(w) * h * c);
    for (size_t j = 0; j < images[i].size(); ++j)
      images[i][j] = static_cast<uint8_t>((j + i) * 2654435761u >> 24);
    dimages.push_back(std::make_unique<Dev<uint8_t>>(images[i]));
    ResizeJob job;
    job.width = w;
    job.height = h;
    job.stride = w * c;
    job.box = {w / 5, h / 7, std::max(1, w / 2 + i), std::max(1, h / 3), i % 2 == 1};
    job.out_index = 3 - i;
    job.pixels = images[i].data();
    jobs.push_back(job);
    job.pixels = dimages[i]->get();
    djobs.push_back(job);
  }
  std::vector<uint8_t> out(4 * oh * ow * c);
  for (const ResizeJob& job : jobs) CropResizeCpu(job, c, oh, ow, out.data());
  std::vector<uint8_t> jobs_bytes(djobs.size() * sizeof(ResizeJob));
  std::memcpy(jobs_bytes.data(), djobs.data(), jobs_bytes.size());
  Dev<uint8_t> djob_mem(jobs_bytes), dout(out.size());
  ASSERT_TRUE(CropResizeCuda(reinterpret_cast<const ResizeJob*>(djob_mem.get()), 4, c, oh, ow,
                             dout.get(), ctx_)
                  .ok());
  Sync();
  EXPECT_EQ(dout.Host(), out);
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

// The fixture and helpers every CUDA kernel test shares (the tests beside their ops:
// <family>/cuda_*_test.cc, one binary //kernels:cuda_test): a stream, cuDNN and cuBLAS handles,
// device buffers, activation buffers of either type and the tolerances. Each kernel is checked
// against its CPU twin on the same random inputs, for both activation types: fp32, and bf16
// (inputs rounded to bf16 on both sides, so the difference left is the GPU's rounding of its
// outputs, at most 2^-9 relative). Tagged gpu: skips, saying why, where no GPU is usable.
#ifndef TOPIARY_KERNELS_CUDA_TEST_UTIL_H_
#define TOPIARY_KERNELS_CUDA_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/dtype.h"
#include "kernels/runtime/parallel.h"
#include "kernels/test_util.h"

namespace topiary::kernels::testing {

// max |a - b| / max(max |b|, 1e-6)
inline double Rel(const std::vector<float>& a, const std::vector<float>& b) {
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
inline std::vector<float> Round(const std::vector<float>& v, DType t) {
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

inline constexpr DType kTypes[] = {DType::kF32, DType::kBf16};
inline const char* Name(DType t) { return t == DType::kBf16 ? "bf16" : "fp32"; }
// Tolerance of a result computed in fp32 and stored in type t.
inline double Tol(DType t, double fp32_tol) { return t == DType::kBf16 ? 1e-2 : fp32_tol; }

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

}  // namespace topiary::kernels::testing

#endif  // TOPIARY_KERNELS_CUDA_TEST_UTIL_H_

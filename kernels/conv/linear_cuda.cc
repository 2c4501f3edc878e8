// cuBLAS is column-major: a row-major [r, c] matrix is its column-major [c, r] transpose, so
//   Y[N,out] = X W^T      ->  Y^T = W^T' X^T   : gemm(T, N, out, N, in; W, X)
//   dX[N,in] = dY W       ->  dX^T = W' dY^T    : gemm(N, N, in, N, out; W, dY)
//   dW[out,in] = dY^T X   ->  dW^T = X^T dY     : gemm(N, T, in, out, N; X, dY)
// (primes: the column-major views of the row-major buffers).
#include "kernels/conv/linear.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/runtime/cuda_context.h"

namespace topiary::kernels {
namespace {

// C = op(A) op(B), all of type t. fp32 keeps cublasSgemm (IEEE FMA, the reference semantics);
// bf16 uses GemmEx with fp32 accumulation.
absl::Status Gemm(DType t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                  const void* a, int lda, const void* b, int ldb, void* c, int ldc,
                  const CudaContext& ctx, const char* what) {
  const float one = 1.0f, zero = 0.0f;
  if (t == DType::kF32) {
    return CublasStatus(
        cublasSgemm(ctx.cublas, ta, tb, m, n, k, &one, static_cast<const float*>(a), lda,
                    static_cast<const float*>(b), ldb, &zero, static_cast<float*>(c), ldc),
        what);
  }
  return CublasStatus(
      cublasGemmEx(ctx.cublas, ta, tb, m, n, k, &one, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb,
                   &zero, c, CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      what);
}

}  // namespace

absl::Status LinearForwardCuda(DType t, const LinearShape& sh, const void* x, const void* w,
                               const float* bias, void* y, const CudaContext& ctx) {
  TOPIARY_RETURN_IF_ERROR(Gemm(t, CUBLAS_OP_T, CUBLAS_OP_N, sh.out, sh.n, sh.in, w, sh.in, x, sh.in,
                               y, sh.out, ctx, "linear forward"));
  if (bias == nullptr) return absl::OkStatus();
  return AddBiasCuda(t, sh.n, sh.out, bias, y, ctx);
}

absl::Status LinearBackwardDataCuda(DType t, const LinearShape& sh, const void* dy, const void* w,
                                    void* dx, const CudaContext& ctx) {
  return Gemm(t, CUBLAS_OP_N, CUBLAS_OP_N, sh.in, sh.n, sh.out, w, sh.in, dy, sh.out, dx, sh.in,
              ctx, "linear backward data");
}

absl::Status LinearBackwardFilterCuda(DType t, const LinearShape& sh, const void* x, const void* dy,
                                      void* dw, float* dbias, const CudaContext& ctx) {
  TOPIARY_RETURN_IF_ERROR(Gemm(t, CUBLAS_OP_N, CUBLAS_OP_T, sh.in, sh.out, sh.n, x, sh.in, dy,
                               sh.out, dw, sh.in, ctx, "linear backward filter"));
  if (dbias == nullptr) return absl::OkStatus();
  return BiasGradCuda(t, sh.n, sh.out, dy, dbias, ctx);
}

}  // namespace topiary::kernels

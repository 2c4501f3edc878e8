// cuBLAS is column-major: a row-major [r, c] matrix is its column-major [c, r] transpose, so
//   Y[N,out] = X W^T      ->  Y^T = W^T' X^T   : gemm(T, N, out, N, in; W, X)
//   dX[N,in] = dY W       ->  dX^T = W' dY^T    : gemm(N, N, in, N, out; W, dY)
//   dW[out,in] = dY^T X   ->  dW^T = X^T dY     : gemm(N, T, in, out, N; X, dY)
// (primes: the column-major views of the row-major buffers).
#include "kernels/cuda_context.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"

namespace topiary::kernels {

absl::Status LinearForwardCuda(const LinearShape& sh, const float* x, const float* w,
                               const float* bias, float* y, const CudaContext& ctx) {
  const float one = 1.0f, zero = 0.0f;
  TOPIARY_RETURN_IF_ERROR(
      CublasStatus(cublasSgemm(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, sh.out, sh.n, sh.in, &one, w,
                               sh.in, x, sh.in, &zero, y, sh.out),
                   "linear forward"));
  if (bias == nullptr) return absl::OkStatus();
  return AddBiasCuda(sh.n, sh.out, bias, y, ctx);
}

absl::Status LinearBackwardDataCuda(const LinearShape& sh, const float* dy, const float* w,
                                    float* dx, const CudaContext& ctx) {
  const float one = 1.0f, zero = 0.0f;
  return CublasStatus(cublasSgemm(ctx.cublas, CUBLAS_OP_N, CUBLAS_OP_N, sh.in, sh.n, sh.out, &one,
                                  w, sh.in, dy, sh.out, &zero, dx, sh.in),
                      "linear backward data");
}

absl::Status LinearBackwardFilterCuda(const LinearShape& sh, const float* x, const float* dy,
                                      float* dw, float* dbias, const CudaContext& ctx) {
  const float one = 1.0f, zero = 0.0f;
  TOPIARY_RETURN_IF_ERROR(
      CublasStatus(cublasSgemm(ctx.cublas, CUBLAS_OP_N, CUBLAS_OP_T, sh.in, sh.out, sh.n, &one, x,
                               sh.in, dy, sh.out, &zero, dw, sh.in),
                   "linear backward filter"));
  if (dbias == nullptr) return absl::OkStatus();
  return BiasGradCuda(sh.n, sh.out, dy, dbias, ctx);
}

}  // namespace topiary::kernels

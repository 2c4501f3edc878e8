// Single-precision GEMM on the CPU through BLAS (OpenBLAS, single-threaded: callers
// parallelize at a coarser grain, see parallel.h). Row-major everywhere.
#ifndef TOPIARY_KERNELS_RUNTIME_GEMM_H_
#define TOPIARY_KERNELS_RUNTIME_GEMM_H_

namespace topiary::kernels {

// C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C, all row-major.
// op(A) = A ([m, k], lda >= k) or A^T (A is [k, m], lda >= m); likewise for B.
void SgemmCpu(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
              const float* b, int ldb, float beta, float* c, int ldc);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_RUNTIME_GEMM_H_

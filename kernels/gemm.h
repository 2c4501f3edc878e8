// Single-precision GEMM on the CPU through BLAS (OpenBLAS). Row-major everywhere.
#ifndef TOPIARY_KERNELS_GEMM_H_
#define TOPIARY_KERNELS_GEMM_H_

namespace topiary::kernels {

// C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C, all row-major.
// op(A) = A ([m, k], lda >= k) or A^T (A is [k, m], lda >= m); likewise for B.
void SgemmCpu(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
              int lda, const float* b, int ldb, float beta, float* c, int ldc);

// Number of threads BLAS may use (0: all cores). Affects speed, not results: OpenBLAS splits
// work over M and N, never over K, so sums are formed in the same order.
void SetCpuThreads(int threads);
int CpuThreads();

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_GEMM_H_

#include "kernels/gemm.h"

#include <cblas.h>

#include <thread>

namespace topiary::kernels {

void SgemmCpu(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
              int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void SetCpuThreads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  if (threads <= 0) threads = 1;
  openblas_set_num_threads(threads);
}

int CpuThreads() { return openblas_get_num_threads(); }

}  // namespace topiary::kernels

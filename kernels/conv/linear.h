// Fully connected layer: y[N, out] = x[N, in] * W^T + b, with W stored [out, in] (PyTorch's
// layout). All three passes are single GEMMs.
#ifndef TOPIARY_KERNELS_CONV_LINEAR_H_
#define TOPIARY_KERNELS_CONV_LINEAR_H_

#include "absl/status/status.h"
#include "kernels/runtime/dtype.h"

namespace topiary::kernels {

struct CudaContext;

struct LinearShape {
  int n = 0;    // batch
  int in = 0;   // input features
  int out = 0;  // output features
};

// bias may be null.
void LinearForwardCpu(const LinearShape& sh, const float* x, const float* w, const float* bias,
                      float* y);
// dx[N, in] = dy * W (overwrites).
void LinearBackwardDataCpu(const LinearShape& sh, const float* dy, const float* w, float* dx);
// dw[out, in] = dy^T * x, dbias[out] = column sums of dy (when not null); overwrites.
void LinearBackwardFilterCpu(const LinearShape& sh, const float* x, const float* dy, float* dw,
                             float* dbias);

// CUDA twins through cuBLAS (row-major data seen as column-major transposes). x, w, y, dx,
// dy and dw are of type t: fp32 (IEEE, no TF32) or bf16 on tensor cores with fp32
// accumulation. The bias and its gradient are fp32.
absl::Status LinearForwardCuda(DType t, const LinearShape& sh, const void* x, const void* w,
                               const float* bias, void* y, const CudaContext& ctx);
absl::Status LinearBackwardDataCuda(DType t, const LinearShape& sh, const void* dy, const void* w,
                                    void* dx, const CudaContext& ctx);
absl::Status LinearBackwardFilterCuda(DType t, const LinearShape& sh, const void* x, const void* dy,
                                      void* dw, float* dbias, const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_CONV_LINEAR_H_

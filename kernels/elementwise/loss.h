// Softmax cross-entropy over logits [N, classes], fused with its gradient, and top-k counts.
#ifndef TOPIARY_KERNELS_ELEMENTWISE_LOSS_H_
#define TOPIARY_KERNELS_ELEMENTWISE_LOSS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/runtime/dtype.h"

namespace topiary::kernels {

struct CudaContext;

// Returns the mean over the batch of -sum_j t_j log softmax(z)_j, where the target t is
// (1 - smoothing) * one_hot(label) + smoothing / classes (PyTorch's label smoothing).
// When dlogits is not null it receives d(mean loss)/d(logits) = (softmax - t) / N.
// REQUIRES: 0 <= labels[i] < classes.
double SoftmaxCrossEntropyCpu(int n, int classes, const float* logits, const int32_t* labels,
                              float smoothing, float* dlogits);

// Counts the samples whose label is among the k largest logits (ties broken toward the
// lower class index, so a constant row predicts class 0).
int TopKCorrectCpu(int n, int classes, const float* logits, const int32_t* labels, int k);

// CUDA twin of the loss, fused with the metrics so that training never waits for the host:
// per sample, its loss (sample_loss[i], not divided by n) and the rank of its label among
// the logits (rank[i]; 0 = top-1). dlogits as on the CPU when not null. Logits and dlogits
// are of type t (fp32 or bf16); the loss is computed in fp32.
absl::Status SoftmaxCrossEntropyCuda(DType t, int n, int classes, const void* logits,
                                     const int32_t* labels, float smoothing, void* dlogits,
                                     float* sample_loss, int32_t* rank, const CudaContext& ctx);

// Adds the first `count` samples' metrics to device accumulators, in sample order:
// acc[0] += sum of losses, acc[1] += top-1 hits, acc[2] += top-k hits, acc[3] += count.
absl::Status AccumulateMetricsCuda(int count, const float* sample_loss, const int32_t* rank, int k,
                                   double* acc, const CudaContext& ctx);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_ELEMENTWISE_LOSS_H_

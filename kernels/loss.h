// Softmax cross-entropy over logits [N, classes], fused with its gradient, and top-k counts.
#ifndef TOPIARY_KERNELS_LOSS_H_
#define TOPIARY_KERNELS_LOSS_H_

#include <cstdint>

namespace topiary::kernels {

// Returns the mean over the batch of -sum_j t_j log softmax(z)_j, where the target t is
// (1 - smoothing) * one_hot(label) + smoothing / classes (PyTorch's label smoothing).
// When dlogits is not null it receives d(mean loss)/d(logits) = (softmax - t) / N.
// REQUIRES: 0 <= labels[i] < classes.
double SoftmaxCrossEntropyCpu(int n, int classes, const float* logits, const int32_t* labels,
                              float smoothing, float* dlogits);

// Counts the samples whose label is among the k largest logits (ties broken toward the
// lower class index, so a constant row predicts class 0).
int TopKCorrectCpu(int n, int classes, const float* logits, const int32_t* labels, int k);

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_LOSS_H_

// Batcher: how an ImageSet becomes batches. Seeded shuffling per epoch; random crop with zero
// padding and horizontal flips (training only); per-channel normalization. Crop and pad act
// on raw pixels before normalization, as torchvision's transforms do. The arithmetic is in
// kernels/image/augment.h (CPU and CUDA twins); the draws are stateless, so both devices build the
// same batches and any epoch or batch can be rebuilt on its own.
#ifndef TOPIARY_TRAINER_DATA_BATCHER_H_
#define TOPIARY_TRAINER_DATA_BATCHER_H_

#include <cstdint>
#include <vector>

#include "kernels/image/augment.h"
#include "topiary/v1/checkpoint.pb.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/data/dataset.h"

namespace topiary {

struct Normalization {
  std::vector<float> mean, inv_std;  // per channel, on pixels scaled to [0, 1]
};

// Per-channel mean and std of a set (identity when normalize is false).
Normalization ComputeNormalization(const ImageSet& set, float max_value, bool normalize);

// The normalization a run (or an evaluation) uses: ComputeNormalization's, unless the network
// comes from a checkpoint that recorded its input format (`recorded`; null: none), whose
// per-channel mean and inverse std it keeps, so an imported model reads what it was trained
// on. Errors when the channel counts differ.
absl::StatusOr<Normalization> RunNormalization(const ImageSet& set, float max_value, bool normalize,
                                               const topiary::v1::InputFormat* recorded);

// What a network trained on `set` reads, for checkpoints (and through them PyTorch and ONNX).
topiary::v1::InputFormat DescribeInput(const ImageSet& set, int classes, float max_value,
                                       const Normalization& norm);

class Batcher {
 public:
  Batcher(const ImageSet* set, float max_value, const Normalization& norm,
          topiary::v1::Augment augment, uint64_t seed);

  const ImageSet& set() const { return *set_; }
  // lut[ch * 256 + v]: the normalized value of raw byte v in channel ch.
  const std::vector<float>& lut() const { return lut_; }
  bool augments() const {
    return augment_.crop_padding() > 0 || augment_.horizontal_flip() ||
           augment_.random_resized_crop();
  }

  // A seeded permutation of the set for `epoch` (each epoch its own counter range of the
  // shuffle stream, so any epoch can be reproduced without replaying the ones before it).
  std::vector<int32_t> EpochOrder(int epoch) const;

  // What to assemble: `count` images from position `first` of an order, in `epoch`.
  kernels::AssembleParams Params(int epoch, int64_t first, int count, bool augment) const;

  // On the CPU: writes those images into x [count, H, W, C] and their labels.
  void Assemble(const std::vector<int32_t>& order, int epoch, int64_t first, int count,
                bool augment, float* x, int32_t* labels) const;

 private:
  const ImageSet* set_;
  std::vector<float> lut_;
  topiary::v1::Augment augment_;
  uint64_t seed_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DATA_BATCHER_H_

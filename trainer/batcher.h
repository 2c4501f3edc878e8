// Batcher: turns an ImageSet into float NHWC batches: seeded shuffling per epoch, random
// crop with zero padding and horizontal flips (training only), per-channel normalization.
// Crop and pad act on raw pixels before normalization, as torchvision's transforms do.
#ifndef TOPIARY_TRAINER_BATCHER_H_
#define TOPIARY_TRAINER_BATCHER_H_

#include <cstdint>
#include <vector>

#include "topiary/v1/experiment.pb.h"
#include "trainer/dataset.h"
#include "trainer/random.h"

namespace topiary {

struct Normalization {
  std::vector<float> mean, inv_std;  // per channel, on pixels scaled to [0, 1]
};

// Per-channel mean and std of a set (identity when normalize is false).
Normalization ComputeNormalization(const ImageSet& set, float max_value, bool normalize);

class Batcher {
 public:
  Batcher(const ImageSet* set, float max_value, Normalization norm, topiary::v1::Augment augment,
          uint64_t seed);

  // A seeded permutation of the set for `epoch`: each epoch has its own counter range of the
  // shuffle stream, so any epoch can be reproduced without replaying the ones before it.
  std::vector<int32_t> EpochOrder(int epoch) const;

  // Writes images order[first .. first+count) into x [count, H, W, C] and their labels.
  // augment: apply crop/flip, drawing from the augment stream (the caller positions it).
  void Assemble(const std::vector<int32_t>& order, int64_t first, int count, bool augment,
                Philox* rng, float* x, int32_t* labels) const;

  // The augment stream positioned at the start of `epoch` (same scheme as EpochOrder).
  Philox AugmentStream(int epoch) const;

 private:
  const ImageSet* set_;
  float scale_;
  Normalization norm_;
  topiary::v1::Augment augment_;
  uint64_t seed_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_BATCHER_H_

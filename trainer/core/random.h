// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator. A stream is (seed, purpose); its state is a 64-bit counter, so a
// run is reproducible, a resumed run continues exactly, and the same numbers can be made on
// the GPU from the same (key, counter).
#ifndef TOPIARY_TRAINER_CORE_RANDOM_H_
#define TOPIARY_TRAINER_CORE_RANDOM_H_

#include <array>
#include <cstdint>

namespace topiary {

// One independent stream per purpose.
enum class RngStream : uint32_t {
  kInit = 1,
  kShuffle = 2,
  kAugment = 3,
  kData = 4,
  kPrune = 5,
  kGradientSampling = 6
};

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

class Philox {
 public:
  Philox(uint64_t seed, RngStream stream);

  uint32_t NextU32();
  // Uniform in [0, 1) with 24 random bits.
  float Uniform();
  // Uniform integer in [0, n), n > 0 (rejection sampling: no modulo bias).
  uint32_t Below(uint32_t n);
  // Standard normal (Box-Muller, double internally).
  float Normal();

  // The Philox key of this stream (for stateless draws, see kernels/image/augment.h).
  std::array<uint32_t, 2> key() const { return key_; }

  // The state to save and restore for exact resumption.
  uint64_t counter() const { return counter_; }
  int index() const { return index_; }
  void Restore(uint64_t counter, int index);

 private:
  void Refill();
  std::array<uint32_t, 2> key_;
  uint64_t counter_ = 0;
  std::array<uint32_t, 4> block_{};
  int index_ = 4;  // next word of block_ to hand out; 4 = empty
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_CORE_RANDOM_H_

// Packing buffers with known lifetimes into one arena: two buffers share memory only when no
// step uses both. Networks plan their activations and gradients this way (model.cc), so a
// value no backward pass reads gives its memory back after its last forward reader, and a
// gradient after its last backward reader.
#ifndef TOPIARY_TRAINER_NN_MEMORY_PLAN_H_
#define TOPIARY_TRAINER_NN_MEMORY_PLAN_H_

#include <cstddef>
#include <vector>

namespace topiary {

struct Lifetime {
  size_t bytes = 0;
  int first = 0, last = 0;  // the steps that write and read it, inclusive
};

struct ArenaPlan {
  std::vector<size_t> offsets;  // per lifetime, multiples of the alignment
  size_t bytes = 0;             // the arena's size
};

// Largest buffers first, each at the lowest offset clear of every placed buffer whose
// lifetime overlaps its own (the greedy-by-size heuristic of TFLite's and XLA's planners).
ArenaPlan PackLifetimes(const std::vector<Lifetime>& items, size_t alignment = 256);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_NN_MEMORY_PLAN_H_

// Parameter initialization helpers: values are generated on the host from the init stream
// (so they do not depend on the device) and copied to the parameter's memory.
#ifndef TOPIARY_TRAINER_NN_INIT_H_
#define TOPIARY_TRAINER_NN_INIT_H_

#include <vector>

#include "trainer/core/parameter.h"
#include "trainer/core/random.h"

namespace topiary {

inline void FillNormal(Parameter* p, Philox& rng, float stddev) {
  std::vector<float> v(p->size());
  for (auto& x : v) x = rng.Normal() * stddev;
  p->value.CopyFromHost(v.data());
}

inline void FillUniform(Parameter* p, Philox& rng, float bound) {
  std::vector<float> v(p->size());
  for (auto& x : v) x = (2.0f * rng.Uniform() - 1.0f) * bound;
  p->value.CopyFromHost(v.data());
}

inline void FillConstant(Parameter* p, float value) {
  std::vector<float> v(p->size(), value);
  p->value.CopyFromHost(v.data());
}

}  // namespace topiary

#endif  // TOPIARY_TRAINER_NN_INIT_H_

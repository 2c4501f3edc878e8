#include "trainer/optim/lr_schedule.h"

#include <cmath>

namespace topiary {

double LearningRate(const topiary::v1::LrSchedule& s, double lr, double epoch, int total_epochs) {
  using topiary::v1::LrSchedule;
  double rate = lr;
  switch (s.kind()) {
    case LrSchedule::MULTISTEP:
      for (int m : s.milestones()) {
        if (epoch >= m) rate *= s.gamma();
      }
      break;
    case LrSchedule::COSINE:
      if (total_epochs > 0) {
        const double t = std::min(epoch / total_epochs, 1.0);
        rate = s.min_lr() + (lr - s.min_lr()) * 0.5 * (1.0 + std::cos(M_PI * t));
      }
      break;
    default:
      break;
  }
  if (s.warmup_epochs() > 0 && epoch < s.warmup_epochs()) rate *= epoch / s.warmup_epochs();
  return rate;
}

}  // namespace topiary

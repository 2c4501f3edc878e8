// Learning-rate schedules, evaluated at a fractional epoch so the rate changes every step.
#ifndef TOPIARY_TRAINER_OPTIM_LR_SCHEDULE_H_
#define TOPIARY_TRAINER_OPTIM_LR_SCHEDULE_H_

#include "topiary/v1/experiment.pb.h"

namespace topiary {

// The rate at `epoch` (0 <= epoch <= total_epochs, fractional) for base rate `lr`:
// CONSTANT, MULTISTEP (times gamma per milestone passed) or COSINE (lr -> min_lr over
// total_epochs), multiplied during the first warmup_epochs by epoch / warmup_epochs.
double LearningRate(const topiary::v1::LrSchedule& schedule, double lr, double epoch,
                    int total_epochs);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_OPTIM_LR_SCHEDULE_H_

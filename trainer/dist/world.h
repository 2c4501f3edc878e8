// World: where this process stands among the processes of one data-parallel run
// (`topiary worker`: one rank per process, started by Slurm's srun or by hand). A run in one
// process (threads for ranks, the default) has a world of one.
#ifndef TOPIARY_TRAINER_DIST_WORLD_H_
#define TOPIARY_TRAINER_DIST_WORLD_H_

#include <string>

namespace topiary {

struct World {
  int rank = 0;        // this process's global rank
  int size = 1;        // processes in the run, one rank each
  int local_rank = 0;  // among the run's processes on this host: which GPU it takes
  // A directory every process can read and write (shared storage across hosts): the NCCL
  // unique id and Gloo's rendezvous files go there. Fresh for each launch.
  std::string rendezvous;
  bool multi() const { return size > 1; }
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DIST_WORLD_H_

// The rendezvous of a run's processes (World::rendezvous, a directory on storage they all
// reach): global rank 0 publishes a small file there, the others wait for it. The NCCL
// unique id travels this way; Gloo keeps its own file store in a subdirectory.
#ifndef TOPIARY_TRAINER_DIST_RENDEZVOUS_H_
#define TOPIARY_TRAINER_DIST_RENDEZVOUS_H_

#include <string>

#include "absl/status/statusor.h"

namespace topiary {

// Writes `bytes` to dir/name whole (a temporary file renamed), creating dir.
absl::Status Publish(const std::string& dir, const std::string& name, const std::string& bytes);

// Waits up to timeout_s for dir/name to hold `size` bytes, and returns them. DEADLINE_EXCEEDED
// names the file and says that rank 0 did not publish it.
absl::StatusOr<std::string> AwaitPublished(const std::string& dir, const std::string& name,
                                           size_t size, double timeout_s);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DIST_RENDEZVOUS_H_

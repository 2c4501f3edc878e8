// Hostile and damaged input files, made for the tests that show each is refused cleanly:
// pruning:hostile_checkpoint_test (in process) and tests:hostile_daemon_test (through the
// CLI and the daemon, with the files written by make_hostile_files).
#ifndef TOPIARY_TESTS_TOOLS_HOSTILE_FILES_H_
#define TOPIARY_TESTS_TOOLS_HOSTILE_FILES_H_

#include <hdf5.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/store/hdf5_file.h"

namespace topiary::testing {

// A valid resnet20 (28x28x1, 10 classes) checkpoint with an element mask on `fc`.
void WriteGoodCheckpoint(const std::string& path);

// A copy of `good` whose document `edit` changed, written with a correct metadata checksum,
// so that only the edit itself can be what is refused.
void WriteEdited(const std::string& good, const std::string& path,
                 const std::function<void(H5Document*)>& edit);

// A copy of `good` changed through HDF5's own API (links, storage, declarations our writer
// never produces); `edit` gets the open file.
void WriteRawEdited(const std::string& good, const std::string& path,
                    const std::function<void(hid_t file)>& edit);

struct HostileCheckpoint {
  std::string name;    // file name, e.g. "float_mask.h5"
  std::string needle;  // a part of the error every reader must give
};

// Writes every hostile checkpoint into `dir` (next to `good`); `outside` is a file an
// external link points to. Returns what each must be refused with.
std::vector<HostileCheckpoint> WriteHostileCheckpoints(const std::string& good,
                                                       const std::string& dir,
                                                       const std::string& outside);

}  // namespace topiary::testing

#endif  // TOPIARY_TESTS_TOOLS_HOSTILE_FILES_H_

// ExperimentSpec I/O and validation. Specs are protobuf text format or JSON; unknown fields
// are errors. Validation names the field and the rule ("data.batch_size: must be > 0").
#ifndef TOPIARY_TRAINER_SPEC_SPEC_H_
#define TOPIARY_TRAINER_SPEC_SPEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "topiary/v1/experiment.pb.h"

namespace topiary {

// The most epochs any count of epochs may ask for (train.epochs, pruning.finetune_epochs, a
// manual round's epochs): far beyond any sensible experiment, small enough that the tables
// sized by them cannot exhaust memory.
inline constexpr int kMaxEpochs = 10000;

// Parses `text` as JSON when it starts with '{', otherwise as text format. `source` names
// the origin in errors (a file name).
absl::StatusOr<topiary::v1::ExperimentSpec> ParseSpec(const std::string& text,
                                                      const std::string& source);
// Reads and parses a spec file; the name defaults to the file's base name.
absl::StatusOr<topiary::v1::ExperimentSpec> LoadSpecFile(const std::string& path);

// Applies one "field.path=value" change (fork --set) to `spec`:
//   pruning.target=0.75                   a value (strings quoted or bare, enums by name)
//   approximation.rules[0].multiplier=x   an entry of a list, by index
//   pruning=none                          removes a block (or a whole list: ...rules=none)
//   approximation={rules {layer: "*" multiplier: "drum:6"}}   replaces a block whole (a
//                                         list: it becomes that one entry)
// INVALID_ARGUMENT naming the change, the path and what is wrong (a field the message lacks,
// with the ones it has; a value of the wrong type) leaves `spec` unchanged.
absl::Status ApplySpecChange(const std::string& change, topiary::v1::ExperimentSpec* spec);

// Checks every field's rule; returns the first violation as INVALID_ARGUMENT.
absl::Status ValidateSpec(const topiary::v1::ExperimentSpec& spec);

// Data parallelism: the GPUs a spec asks for (device.gpus, else device.gpu_count, else 1)
// and its CPU ranks (device.cpu_ranks, at least 1).
int RequestedGpus(const topiary::v1::DeviceSpec& device);
int CpuRanks(const topiary::v1::DeviceSpec& device);

// LoadSpecFile, then ValidateSpec: a spec that is ready to run, or the first problem.
absl::StatusOr<topiary::v1::ExperimentSpec> LoadValidSpec(const std::string& path);

// The spec with every unset field given its documented default (experiment.proto).
topiary::v1::ExperimentSpec WithDefaults(topiary::v1::ExperimentSpec spec);

// The data set a command-line `--data` names, for networks whose checkpoint records none
// (evaluate of an imported model): "fashion_mnist" (Debian's copy), "mnist:PATH",
// "cifar10:PATH", "cifar100:PATH", "digits:FILE", "folder:PATH" (an image folder, read at
// `image` height and channels: the network's input). Errors name --data and the forms.
absl::StatusOr<topiary::v1::DataSpec> ParseDataFlag(const std::string& text, int image_size,
                                                    int channels);

// Text format of a spec, for reports and provenance.
std::string SpecToText(const topiary::v1::ExperimentSpec& spec);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_SPEC_SPEC_H_

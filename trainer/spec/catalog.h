// What a spec may name, without the engine behind it: the model zoo's architectures and the
// default dataset's folder. Spec validation and the CLI's remote commands read these; the
// model zoo and the dataset readers implement them.
#ifndef TOPIARY_TRAINER_SPEC_CATALOG_H_
#define TOPIARY_TRAINER_SPEC_CATALOG_H_

#include <string>
#include <vector>

namespace topiary {

// The most classes a network (and so a dataset, and a checkpoint's graph) may have: one
// bound, so that an image folder a run accepts gives checkpoints every reader reads back.
inline constexpr int kMaxClasses = 1 << 16;

// The architectures BuildModel (model_zoo.h) builds: the one list of their names, with the
// shape of each (the zoo turns a family and its stage depths into layers).
struct ModelArch {
  enum class Family { kLeNet, kCifarResNet, kImageNetResNet, kImageNetBottleneck };
  const char* name;
  Family family;
  std::vector<int> stage_blocks;  // residual blocks per stage (ResNets)
};

inline const std::vector<ModelArch>& ModelArchs() {
  using F = ModelArch::Family;
  static const std::vector<ModelArch> archs = {
      {"lenet5", F::kLeNet, {}},
      {"resnet20", F::kCifarResNet, {3, 3, 3}},
      {"resnet32", F::kCifarResNet, {5, 5, 5}},
      {"resnet44", F::kCifarResNet, {7, 7, 7}},
      {"resnet56", F::kCifarResNet, {9, 9, 9}},
      {"resnet110", F::kCifarResNet, {18, 18, 18}},
      {"resnet18", F::kImageNetResNet, {2, 2, 2, 2}},
      {"resnet34", F::kImageNetResNet, {3, 4, 6, 3}},
      {"resnet50", F::kImageNetBottleneck, {3, 4, 6, 3}},
  };
  return archs;
}

inline std::vector<std::string> ModelNames() {
  std::vector<std::string> names;
  for (const ModelArch& a : ModelArchs()) names.push_back(a.name);
  return names;
}

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

}  // namespace topiary

#endif  // TOPIARY_TRAINER_SPEC_CATALOG_H_

// What a spec may name, without the engine behind it: the model zoo's architectures and the
// default dataset's folder. Spec validation and the CLI's remote commands read these; the
// model zoo and the dataset readers implement them.
#ifndef TOPIARY_TRAINER_SPEC_CATALOG_H_
#define TOPIARY_TRAINER_SPEC_CATALOG_H_

#include <string>
#include <vector>

namespace topiary {

// The architectures BuildModel (model_zoo.h) knows.
inline std::vector<std::string> ModelNames() {
  return {"lenet5",    "resnet20", "resnet32", "resnet44", "resnet56",
          "resnet110", "resnet18", "resnet34", "resnet50"};
}

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

}  // namespace topiary

#endif  // TOPIARY_TRAINER_SPEC_CATALOG_H_

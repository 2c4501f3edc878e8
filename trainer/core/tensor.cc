#include "trainer/core/tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace topiary {

absl::StatusOr<Tensor> Tensor::Create(Device* device, std::vector<int> shape) {
  size_t count = 1;
  for (int d : shape) {
    if (d < 0) return absl::InvalidArgumentError("negative tensor dimension");
    count *= static_cast<size_t>(d);
  }
  Tensor t;
  t.shape_ = std::move(shape);
  auto buffer = Buffer<float>::Create(device, count);
  if (!buffer.ok()) {
    return absl::Status(buffer.status().code(),
                        absl::StrCat("tensor ", t.ShapeString(), ": ", buffer.status().message()));
  }
  t.buffer_ = std::move(*buffer);
  return t;
}

std::string Tensor::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(shape_, ", "), "]");
}

}  // namespace topiary

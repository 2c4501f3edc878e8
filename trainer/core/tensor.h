// Tensor: a shape and the device memory that holds it, row-major (the last dimension varies
// fastest). Activations are NHWC [N, H, W, C]; convolution kernels [K, R, S, C]; linear
// kernels [out, in]. Movable, not copyable; the memory belongs to the Device it came from.
#ifndef TOPIARY_TRAINER_CORE_TENSOR_H_
#define TOPIARY_TRAINER_CORE_TENSOR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/core/device.h"

namespace topiary {

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled memory for `shape` on `device`. Errors (out of memory) name the shape.
  static absl::StatusOr<Tensor> Create(Device* device, std::vector<int> shape);

  const std::vector<int>& shape() const { return shape_; }
  size_t size() const { return buffer_.size(); }
  bool empty() const { return buffer_.empty(); }
  // Device memory (host memory on the CPU device).
  float* data() const { return buffer_.data(); }
  Device* device() const { return buffer_.device(); }

  void CopyFromHost(const float* src) { buffer_.CopyFromHost(src); }
  std::vector<float> ToHost() const { return buffer_.ToHost(); }
  // "[16, 3, 3, 16]"
  std::string ShapeString() const;

 private:
  std::vector<int> shape_;
  Buffer<float> buffer_;
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_CORE_TENSOR_H_

// GPU discovery through the CUDA runtime (built when the toolkit is configured).
#include <cuda_runtime.h>

#include "trainer/core/device.h"

namespace topiary {

bool BuiltWithCuda() { return true; }

std::vector<GpuInfo> ListGpus(std::string* why_none) {
  std::vector<GpuInfo> gpus;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Without a driver this is cudaErrorInsufficientDriver (35): "no GPU", not a failure.
    if (why_none) *why_none = std::string("CUDA runtime: ") + cudaGetErrorString(err);
    return gpus;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    gpus.push_back({i, prop.name, prop.totalGlobalMem, prop.major, prop.minor});
  }
  if (gpus.empty() && why_none) *why_none = "the CUDA runtime reports no devices";
  return gpus;
}

}  // namespace topiary

// TOPIARY_HD marks small shape helpers callable from both host code and CUDA kernels.
#ifndef TOPIARY_KERNELS_RUNTIME_HOST_DEVICE_H_
#define TOPIARY_KERNELS_RUNTIME_HOST_DEVICE_H_

#ifdef __CUDACC__
#define TOPIARY_HD __host__ __device__
#else
#define TOPIARY_HD
#endif

#endif  // TOPIARY_KERNELS_RUNTIME_HOST_DEVICE_H_

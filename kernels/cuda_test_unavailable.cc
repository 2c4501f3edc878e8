// cuda_test in a CPU-only build: nothing to compare, and the skip says why.
#include <gtest/gtest.h>

TEST(CudaKernels, Unavailable) { GTEST_SKIP() << "built without CUDA (no toolkit configured)"; }

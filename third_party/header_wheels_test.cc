// The header wheels (bazel/wheel_headers.bzl) are unpacked, checked and on the include path:
// the versions pinned in WORKSPACE and scripts/build_wheels.txt are the ones compiled against.
#include <cudnn_frontend_version.h>
#include <cutlass/version.h>

#include "gtest/gtest.h"

TEST(HeaderWheels, CutlassIsThePinnedVersion) {
  EXPECT_EQ(CUTLASS_MAJOR, 4);
  EXPECT_EQ(CUTLASS_MINOR, 2);
  EXPECT_EQ(CUTLASS_PATCH, 0);  // (the wheel's getVersionString() is an unconfigured template)
}

TEST(HeaderWheels, CudnnFrontendIsThePinnedVersion) {
  EXPECT_EQ(CUDNN_FRONTEND_MAJOR_VERSION, 1);
  EXPECT_EQ(CUDNN_FRONTEND_MINOR_VERSION, 32);
}

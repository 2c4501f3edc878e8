// The energy meter where NVML or the board is missing: a clear error, never a crash. (On a GPU
// machine the counter itself is exercised by the runner's GPU runs.)
#include "trainer/core/energy.h"

#include <gtest/gtest.h>

namespace topiary {
namespace {

TEST(EnergyMeter, UnknownBoardIsAClearError) {
  auto meter = EnergyMeter::Open("0000:FF:1F.7");
  if (meter.ok()) GTEST_SKIP() << "a GPU answers at that bus id";
  EXPECT_EQ(meter.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string why(meter.status().message());
  EXPECT_TRUE(why.find("NVML") != std::string::npos) << why;
  std::printf("without a board there: %s\n", why.c_str());
}

}  // namespace
}  // namespace topiary

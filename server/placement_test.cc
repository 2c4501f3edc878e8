// The scheduler's placement rules, without GPUs: counts and ordinals, waiting while busy,
// release, CPU slots, and the refusals that name the field.
#include "server/placement.h"

#include <gtest/gtest.h>

namespace topiary::server {
namespace {

topiary::v1::ExperimentSpec Gpus(int count, std::vector<int> ordinals = {}) {
  topiary::v1::ExperimentSpec spec;
  spec.mutable_device()->set_gpu_count(count);
  for (int o : ordinals) spec.mutable_device()->add_gpus(o);
  return spec;
}

TEST(Placement, TwoOneGpuExperimentsSideBySideThenATwoGpuOne) {
  Placement p({0, 1}, 1);
  const Need one = p.NeedOf(Gpus(0));
  EXPECT_FALSE(one.cpu);
  EXPECT_EQ(one.count, 1);
  auto a = p.TryTake("a", one);
  auto b = p.TryTake("b", one);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, std::vector<int>{0});
  EXPECT_EQ(*b, std::vector<int>{1});
  EXPECT_EQ(p.occupants(), (std::vector<std::string>{"a", "b"}));
  const Need two = p.NeedOf(Gpus(2));
  ASSERT_TRUE(p.Feasible(two).ok());
  EXPECT_FALSE(p.TryTake("c", two)) << "waits while both GPUs are busy";
  p.Release("a");
  EXPECT_FALSE(p.TryTake("c", two)) << "one free GPU is not enough";
  EXPECT_EQ(p.running(), 1);
  p.Release("b");
  auto c = p.TryTake("c", two);
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, (std::vector<int>{0, 1}));
  EXPECT_EQ(p.occupants(), (std::vector<std::string>{"c", "c"}));
  EXPECT_EQ(p.running(), 1);
}

TEST(Placement, OrdinalsAreExact) {
  Placement p({0, 1, 2}, 1);
  ASSERT_TRUE(p.TryTake("a", p.NeedOf(Gpus(0, {1}))));
  EXPECT_FALSE(p.TryTake("b", p.NeedOf(Gpus(0, {0, 1})))) << "GPU 1 is busy";
  auto c = p.TryTake("c", p.NeedOf(Gpus(0, {2, 0})));
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, (std::vector<int>{2, 0}));
}

TEST(Placement, RefusesWhatTheDaemonDoesNotHave) {
  Placement p({0, 1}, 1);
  const absl::Status many = p.Feasible(p.NeedOf(Gpus(3)));
  EXPECT_EQ(many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(many.message().find("device.gpu_count: 3 GPUs"), std::string::npos) << many;
  EXPECT_NE(many.message().find("GPUs 0, 1"), std::string::npos) << many;
  const absl::Status absent = p.Feasible(p.NeedOf(Gpus(0, {5})));
  EXPECT_NE(absent.message().find("device.gpus: GPU 5"), std::string::npos) << absent;
}

TEST(Placement, CpuSlots) {
  Placement cpu_daemon({}, 2);
  const Need need = cpu_daemon.NeedOf(Gpus(2));  // no GPUs here: a CPU slot
  EXPECT_TRUE(need.cpu);
  EXPECT_TRUE(cpu_daemon.Feasible(need).ok());
  EXPECT_TRUE(cpu_daemon.TryTake("a", need));
  EXPECT_TRUE(cpu_daemon.TryTake("b", need));
  EXPECT_FALSE(cpu_daemon.TryTake("c", need));
  cpu_daemon.Release("a");
  EXPECT_TRUE(cpu_daemon.TryTake("c", need));
  // On a GPU daemon a CPU experiment takes a CPU slot, not a GPU.
  Placement gpu_daemon({0}, 1);
  topiary::v1::ExperimentSpec cpu;
  cpu.mutable_device()->set_kind(topiary::v1::DeviceSpec::CPU);
  ASSERT_TRUE(gpu_daemon.TryTake("cpu", gpu_daemon.NeedOf(cpu)));
  EXPECT_TRUE(gpu_daemon.TryTake("gpu", gpu_daemon.NeedOf(Gpus(1))));
}

}  // namespace
}  // namespace topiary::server

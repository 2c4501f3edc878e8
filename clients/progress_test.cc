// The round table's block-sparse section: measured passes show both times with the chosen
// side starred, unmeasured ones say so, and runs without any measurement print nothing.
#include "clients/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace topiary {
namespace {

std::string Printed(const topiary::v1::RoundSummary& r) {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  PrintEngineChoices(f, r);
  std::fclose(f);
  std::string out(buf, size);
  std::free(buf);
  return out;
}

TEST(Progress, EngineChoicesShowBothTimesAndTheChoice) {
  topiary::v1::RoundSummary r;
  r.set_round(3);
  auto* a = r.add_layers();
  a->set_layer("stage3.block0.conv2");
  a->set_units(64);
  a->set_zero_units(32);
  auto set = [](topiary::v1::ConvPassChoice* c, const char* engine, double dense, double sparse) {
    c->set_engine(engine);
    c->set_dense_ms(dense);
    c->set_sparse_ms(sparse);
  };
  set(a->mutable_forward(), "block-sparse", 0.020, 0.010);
  set(a->mutable_backward_data(), "dense", 0.015, 0.030);
  set(a->mutable_backward_filter(), "dense", -1, -1);
  r.add_layers()->set_layer("fc");  // no block mask: no row
  const std::string out = Printed(r);
  EXPECT_NE(out.find("round 3"), std::string::npos) << out;
  EXPECT_NE(out.find("stage3.block0.conv2"), std::string::npos) << out;
  EXPECT_NE(out.find("50.0%"), std::string::npos) << out;
  EXPECT_NE(out.find("*0.010 / 0.020"), std::string::npos) << out;
  EXPECT_NE(out.find("0.030 / *0.015"), std::string::npos) << out;
  EXPECT_NE(out.find("dense (not measured)"), std::string::npos) << out;
  EXPECT_EQ(out.find("fc"), std::string::npos) << out;
}

TEST(Progress, NoEngineChoicesPrintNothing) {
  topiary::v1::RoundSummary r;
  r.add_layers()->set_layer("stage1.block0.conv1");
  EXPECT_EQ(Printed(r), "");
}

}  // namespace
}  // namespace topiary

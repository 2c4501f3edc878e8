#include "trainer/util/json.h"

#include <gtest/gtest.h>

#include <string>

#include "topiary/v1/events.pb.h"
#include "topiary/v1/experiment.pb.h"

namespace topiary {
namespace {

TEST(Json, PrintsProtoNamesAndEveryPrimitiveField) {
  topiary::v1::CheckpointMetrics m;
  m.set_test_top1(0.5);
  const std::string json = ToJson(m);
  EXPECT_NE(json.find("\"test_top1\":0.5"), std::string::npos) << json;
  EXPECT_NE(json.find("\"dense_top1\":0"), std::string::npos) << json;  // zeros too
  topiary::v1::CheckpointMetrics back;
  ASSERT_TRUE(FromJson(json, &back, "m", JsonUnknown::kRefuse).ok());
  EXPECT_EQ(back.SerializeAsString(), m.SerializeAsString());
}

TEST(Json, UnknownKeysAreRefusedOrIgnoredAsAsked) {
  topiary::v1::ExperimentSpec spec;
  const absl::Status refused =
      FromJson(R"({"name": "x", "lerning_rate": 1})", &spec, "spec.json", JsonUnknown::kRefuse);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message().rfind("spec.json: not JSON of ExperimentSpec: ", 0), 0u) << refused;
  EXPECT_EQ(spec.name(), "");  // nothing half-parsed is left
  ASSERT_TRUE(
      FromJson(R"({"name": "x", "from_the_future": 1})", &spec, "r", JsonUnknown::kIgnore).ok());
  EXPECT_EQ(spec.name(), "x");
  EXPECT_FALSE(
      FromJson(std::string(kMaxJsonBytes + 1, ' '), &spec, "big", JsonUnknown::kIgnore).ok());
  EXPECT_FALSE(FromJson("{\"name\": ", &spec, "cut", JsonUnknown::kIgnore).ok());
}

// Records written before 0.10 read as records: a field that was a string and is an enum or a
// message now (the sampling scale; the epoch phase, a new key) is left at its default, and
// the rest of the record is kept (an event log line is not lost).
TEST(Json, RecordsOfEarlierVersionsStillRead) {
  topiary::v1::CheckpointMetrics m;
  ASSERT_TRUE(
      FromJson(R"({"test_top1": 0.75, "gradient_sampling": {"top_k": 2, "scale": "unbiased"}})", &m,
               "old.h5: /@metrics", JsonUnknown::kIgnore)
          .ok());
  EXPECT_EQ(m.test_top1(), 0.75);
  EXPECT_EQ(m.gradient_sampling().top_k(), 2);
  topiary::v1::Event e;
  ASSERT_TRUE(FromJson(R"({"seq": 4, "progress": {"phase": "round 3", "epoch": 2, "loss": 1.5}})",
                       &e, "events.jsonl", JsonUnknown::kIgnore)
                  .ok());
  EXPECT_EQ(e.seq(), 4);
  EXPECT_EQ(e.progress().epoch(), 2);
  EXPECT_FALSE(e.progress().has_training_phase());
}

}  // namespace
}  // namespace topiary

#include "trainer/run/tensorboard.h"

#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensorboard/event.pb.h"
#include "util/test_dir.h"

namespace topiary {
namespace {

TEST(TensorBoard, Crc32cMatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value
  EXPECT_EQ(Crc32c("", 0), 0u);
}

// Reads a file back record by record, checking the framing and both CRCs.
void ReadRecords(const std::string& path, std::vector<topiary::tensorboard::Event>* events) {
  std::ifstream f(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), {});
  size_t at = 0;
  while (at < bytes.size()) {
    ASSERT_LE(at + 12, bytes.size());
    uint64_t length;
    uint32_t length_crc, data_crc;
    std::memcpy(&length, bytes.data() + at, 8);
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    ASSERT_EQ(length_crc, MaskCrc(Crc32c(bytes.data() + at, 8)));
    ASSERT_LE(at + 12 + length + 4, bytes.size());
    const std::string record = bytes.substr(at + 12, length);
    std::memcpy(&data_crc, bytes.data() + at + 12 + length, 4);
    ASSERT_EQ(data_crc, MaskCrc(Crc32c(record.data(), record.size())));
    events->emplace_back();
    ASSERT_TRUE(events->back().ParseFromString(record));
    at += 12 + length + 4;
  }
}

TEST(TensorBoard, WritesValidTfRecordsWithScalarSummaries) {
  const std::string dir = testing::TestPath("tb");
  {
    TensorBoardWriter w(dir);
    topiary::v1::Event e;
    e.mutable_progress()->set_step(7);
    e.mutable_progress()->set_loss(0.5);
    e.mutable_progress()->set_lr(0.1);
    w.Write(e);
    topiary::v1::Event r;
    r.mutable_round()->set_round(2);
    r.mutable_round()->set_sparsity(0);  // round 0's sparsity: a value of 0 must be written
    w.Write(r);
    // A round judged on a validation set: its validation top-1, and no test figure.
    r.mutable_round()->set_round(3);
    r.mutable_round()->set_val_top1(0.75);
    r.mutable_round()->set_val_loss(0.5);
    w.Write(r);
  }
  std::vector<topiary::tensorboard::Event> events;
  ReadRecords(dir + "/events.out.tfevents.topiaryd", &events);
  ASSERT_EQ(events.size(), 1u + 3u + 2u + 2u);  // version, 3 progress and 2 + 2 round scalars
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[1].step(), 7);
  EXPECT_EQ(events[1].summary().value(0).tag(), "train/loss");
  EXPECT_FLOAT_EQ(events[1].summary().value(0).simple_value(), 0.5f);
  EXPECT_EQ(events[4].summary().value(0).tag(), "round/sparsity");
  EXPECT_EQ(events[4].step(), 2);
  EXPECT_EQ(events[5].summary().value(0).tag(), "round/test_top1");
  EXPECT_EQ(events[7].summary().value(0).tag(), "round/val_top1");
  EXPECT_EQ(events[7].step(), 3);
  // Scalars of 0 carry their value (readers drop a summary value without one).
  EXPECT_EQ(events[3].summary().value(0).tag(), "train/images_per_s");
  EXPECT_EQ(events[3].summary().value(0).value_case(),
            topiary::tensorboard::Summary::Value::kSimpleValue);
  EXPECT_EQ(events[4].summary().value(0).value_case(),
            topiary::tensorboard::Summary::Value::kSimpleValue);
  // What TensorBoard itself parses: tag (field 1), then simple_value (field 2, fixed32 0).
  const std::string wire = events[4].summary().value(0).SerializeAsString();
  EXPECT_NE(wire.find(std::string("\x15\0\0\0\0", 5)), std::string::npos);
}

// The HParams dashboard's records: the session start with the spec's hyperparameters, per-layer
// sparsity by round, final metrics and the session's end, as TensorBoard's hparams plugin
// reads them (plugin "hparams", content an HParamsPluginData, a float tensor beside it).
TEST(TensorBoard, HParamsSessionAndFinalMetrics) {
  topiary::v1::ExperimentSpec spec;
  spec.set_name("r20/block 50%");  // a run folder's name is made safe
  spec.mutable_model()->set_arch("resnet20");
  spec.mutable_pruning()->set_method(topiary::v1::PruningSpec::BLOCK);
  spec.mutable_pruning()->set_block_in(4);
  spec.mutable_pruning()->set_block_out(8);
  spec.mutable_pruning()->set_target(0.5);
  auto* rule = spec.mutable_approximation()->add_rules();
  rule->set_layer("*");
  rule->set_multiplier("/data/multipliers/mul8u_L40.bin");
  spec.set_init_from_checkpoint("/data/experiments/exp-0002/checkpoints/round-003.h5");
  const std::string out = testing::TestPath("tb_hparams");
  const std::string dir = TensorBoardRunDir(out, spec.name());
  EXPECT_EQ(dir, out + "/tensorboard/r20_block_50_");
  {
    TensorBoardWriter w(dir);
    w.StartSession(HParamsOf(spec, "exp-0007"));
    topiary::v1::Event r;
    r.mutable_round()->set_round(1);
    auto* layer = r.mutable_round()->add_layers();
    layer->set_layer("stage1.conv1");
    layer->set_sparsity(0.25);
    w.Write(r);
    topiary::v1::Event s;
    s.mutable_summary()->set_state(topiary::v1::SUCCEEDED);
    s.mutable_summary()->set_test_top1(0.9);
    w.Write(s);
  }
  {
    TensorBoardWriter again(dir);  // a resumed run does not start a second session
    again.StartSession(HParamsOf(spec, "exp-0007"));
  }
  std::vector<topiary::tensorboard::Event> events;
  ReadRecords(dir + "/events.out.tfevents.topiaryd", &events);
  std::map<std::string, std::string> hparams;
  int starts = 0, ends = 0, end_status = 0;
  double layer_sparsity = -1, final_top1 = -1;
  for (const auto& e : events) {
    for (const auto& v : e.summary().value()) {
      if (v.tag() == "layer_sparsity/stage1.conv1") layer_sparsity = v.simple_value();
      if (v.tag() == "final/test_top1") final_top1 = v.simple_value();
      if (v.metadata().plugin_data().plugin_name() != "hparams") continue;
      EXPECT_EQ(v.tensor().dtype(), 1);
      topiary::tensorboard::HParamsPluginData data;
      ASSERT_TRUE(data.ParseFromString(v.metadata().plugin_data().content()));
      if (v.tag() == "_hparams_/session_start_info") {
        ++starts;
        for (const auto& [k, value] : data.session_start_info().hparams()) {
          hparams[k] = value.kind_case() == topiary::tensorboard::HParamValue::kStringValue
                           ? value.string_value()
                           : absl::StrCat(value.number_value());
        }
      }
      if (v.tag() == "_hparams_/session_end_info") {
        ++ends;
        end_status = data.session_end_info().status();
      }
    }
  }
  EXPECT_EQ(starts, 1);
  EXPECT_EQ(ends, 1);
  EXPECT_EQ(end_status, 1);  // STATUS_SUCCESS
  EXPECT_EQ(hparams["experiment"], "exp-0007");
  EXPECT_EQ(hparams["method"], "BLOCK 4x8");
  EXPECT_EQ(hparams["block"], "4x8");
  EXPECT_EQ(hparams["target"], "0.5");
  EXPECT_EQ(hparams["multiplier"], "mul8u_L40");
  EXPECT_EQ(hparams["weight_code"], "ASYMMETRIC");
  EXPECT_EQ(hparams["parent"], "exp-0002/round-003");
  EXPECT_FLOAT_EQ(layer_sparsity, 0.25f);
  EXPECT_FLOAT_EQ(final_top1, 0.9f);
}

TEST(TensorBoard, AFifoInPlaceOfTheFileNeitherBlocksNorIsWritten) {
  const std::string dir = testing::TestPath("tb_fifo");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(::mkfifo((dir + "/events.out.tfevents.topiaryd").c_str(), 0644), 0);
  TensorBoardWriter w(dir);  // would block forever opening the FIFO for writing
  topiary::v1::Event e;
  e.mutable_progress()->set_step(1);
  w.Write(e);
  struct stat st;
  ASSERT_EQ(::lstat(w.path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

}  // namespace
}  // namespace topiary

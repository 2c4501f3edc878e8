#include "trainer/run/tensorboard.h"

#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "gtest/gtest.h"
#include "tensorboard/event.pb.h"
#include "util/test_dir.h"

namespace topiary {
namespace {

TEST(TensorBoard, Crc32cMatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value
  EXPECT_EQ(Crc32c("", 0), 0u);
}

// Reads the file back record by record, checking the framing and both CRCs.
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
  }
  std::ifstream f(dir + "/events.out.tfevents.topiaryd", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), {});
  size_t at = 0;
  std::vector<topiary::tensorboard::Event> events;
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
    events.emplace_back();
    ASSERT_TRUE(events.back().ParseFromString(record));
    at += 12 + length + 4;
  }
  ASSERT_EQ(events.size(), 1u + 3u + 2u);  // version, 3 progress scalars, 2 round scalars
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[1].step(), 7);
  EXPECT_EQ(events[1].summary().value(0).tag(), "train/loss");
  EXPECT_FLOAT_EQ(events[1].summary().value(0).simple_value(), 0.5f);
  EXPECT_EQ(events[4].summary().value(0).tag(), "round/sparsity");
  EXPECT_EQ(events[4].step(), 2);
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

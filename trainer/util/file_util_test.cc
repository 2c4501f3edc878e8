// The write side against someone who can write into the daemon's data directory: planted
// links (on the file, its temporary name, its folder) and FIFOs where files are written.
#include "trainer/util/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "util/test_dir.h"

namespace topiary {
namespace {

std::string TempDir(const std::string& name) {
  const std::string dir = testing::TestPath(name);
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

std::string Contents(const std::string& path) {
  auto text = ReadFile(path);
  return text.ok() ? *text : "<" + std::string(text.status().message()) + ">";
}

class WriteSide : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    data_ = TempDir(test + "_data");
    outside_ = TempDir(test + "_outside");
    SetWriteRoots({data_});
  }
  void TearDown() override { SetWriteRoots({}); }
  std::string data_, outside_;
};

TEST_F(WriteSide, APlantedLinkIsReplacedNotFollowed) {
  // The record's own name a link out: rename puts the new file in its place.
  const std::string victim = outside_ + "/victim";
  SetWriteRoots({});  // the victim is someone else's file, outside the data directory
  ASSERT_TRUE(WriteFileAtomic(victim, "precious\n").ok());
  SetWriteRoots({data_});
  ASSERT_EQ(::symlink(victim.c_str(), (data_ + "/experiment.json").c_str()), 0);
  ASSERT_FALSE(WriteFileAtomic(data_ + "/experiment.json", "{}\n").ok())
      << "a link where a record goes is refused";
  // Its temporary name a link out: removed and made fresh, the target untouched.
  ASSERT_EQ(::symlink(victim.c_str(), (data_ + "/record.json.tmp").c_str()), 0);
  ASSERT_TRUE(WriteFileAtomic(data_ + "/record.json", "{}\n").ok());
  EXPECT_EQ(Contents(victim), "precious\n");
  EXPECT_EQ(Contents(data_ + "/record.json"), "{}\n");
  // An appended log a link out: refused, the target untouched.
  ASSERT_EQ(::symlink(victim.c_str(), (data_ + "/events.jsonl").c_str()), 0);
  auto st = AppendToFile(data_ + "/events.jsonl", "line\n", true);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(Contents(victim), "precious\n");
}

TEST_F(WriteSide, AFolderLinkedOutOfTheDataDirectoryIsRefused) {
  ASSERT_EQ(::symlink(outside_.c_str(), (data_ + "/checkpoints").c_str()), 0);
  auto st = WriteFileAtomic(data_ + "/checkpoints/round-001.h5", "x");
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_NE(st.message().find("outside where this process writes"), std::string::npos) << st;
  EXPECT_EQ(AppendToFile(data_ + "/checkpoints/log", "x", false).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(MakeDirs(data_ + "/checkpoints/deeper/still").code(),
            absl::StatusCode::kPermissionDenied);
  struct stat st_out;
  EXPECT_NE(::stat((outside_ + "/round-001.h5").c_str(), &st_out), 0);
  // Refused before anything was made out there (the folders used to be made, then refused).
  EXPECT_NE(::stat((outside_ + "/deeper").c_str(), &st_out), 0);
  // A link that stays inside is fine.
  ASSERT_TRUE(MakeDirs(data_ + "/real").ok());
  ASSERT_EQ(::symlink((data_ + "/real").c_str(), (data_ + "/alias").c_str()), 0);
  EXPECT_TRUE(WriteFileAtomic(data_ + "/alias/file", "ok").ok());
}

TEST_F(WriteSide, AFifoNeverBlocksAWriterOrAReader) {
  // Each of these would block forever in open() without O_NONBLOCK: no reader, no writer.
  const std::string fifo = data_ + "/events.jsonl";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_EQ(AppendToFile(fifo, "line\n", true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteFileAtomic(fifo, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadFile(fifo).status().code(), absl::StatusCode::kInvalidArgument);
  const std::string tmp_fifo = data_ + "/record.json.tmp";
  ASSERT_EQ(::mkfifo(tmp_fifo.c_str(), 0644), 0);
  EXPECT_TRUE(WriteFileAtomic(data_ + "/record.json", "{}\n").ok());  // removed, made fresh
}

TEST_F(WriteSide, ErrorsSayWhatHappened) {
  EXPECT_EQ(ErrnoStatus(ENOSPC, "x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(ErrnoStatus(ENOSPC, "x").message().find("the disk is full"), std::string::npos);
  EXPECT_EQ(ErrnoStatus(EDQUOT, "x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(ELOOP, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrnoStatus(EIO, "x").code(), absl::StatusCode::kInternal);
  // A size cap on an appended file leaves it as it was.
  const std::string capped = data_ + "/capped";
  ASSERT_TRUE(AppendToFile(capped, "12345", false, 8).ok());
  EXPECT_EQ(AppendToFile(capped, "6789", false, 8).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Contents(capped), "12345");
}

// The operator's own files outside the data directory (--port_file, the plan cache) are
// written one by one: their folder is no write root (a --port_file in /tmp made all of /tmp
// one). Their own missing folders may be made, nothing beside them.
TEST_F(WriteSide, OwnFilesAreSingleFilesNotFolders) {
  const std::string port = outside_ + "/port";
  const std::string plans = outside_ + "/cache/topiary/plans.tsv";
  SetWriteRoots({data_}, {port, plans});
  EXPECT_TRUE(WriteFileAtomic(port, "7077\n").ok());
  EXPECT_EQ(Contents(port), "7077\n");
  auto other = WriteFileAtomic(outside_ + "/other", "x");
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied) << other;
  EXPECT_TRUE(MakeDirs(outside_ + "/cache/topiary").ok());
  EXPECT_TRUE(AppendToFile(plans, "line\n", false).ok());
  EXPECT_EQ(MakeDirs(outside_ + "/cache/elsewhere").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(MakeDirs(outside_ + "/sibling").code(), absl::StatusCode::kPermissionDenied);
  struct stat st;
  EXPECT_NE(::stat((outside_ + "/sibling").c_str(), &st), 0);
  // A link in the data directory to the own file's folder does not open that folder either.
  ASSERT_EQ(::symlink(outside_.c_str(), (data_ + "/up").c_str()), 0);
  EXPECT_EQ(WriteFileAtomic(data_ + "/up/escaped.h5", "x").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_NE(::stat((outside_ + "/escaped.h5").c_str(), &st), 0);
}

TEST_F(WriteSide, AFileHeadIsReadThroughTheSameChecks) {
  ASSERT_TRUE(WriteFileAtomic(data_ + "/image.png", std::string(100, 'p')).ok());
  auto head = ReadFileHead(data_ + "/image.png", 16);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(*head, std::string(16, 'p'));
  EXPECT_EQ(ReadFileHead(data_ + "/image.png", 1000)->size(), 100u);
  // A FIFO swapped in where an image was: refused at once, never a blocked reader.
  const std::string fifo = data_ + "/swapped.png";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_EQ(ReadFileHead(fifo, 16).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace topiary

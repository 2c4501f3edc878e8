#include "trainer/store/checkpoint.h"

#include <hdf5.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "gtest/gtest.h"
#include "trainer/nn/graph.h"
#include "trainer/nn/masks.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/store/checkpoint_schema.h"
#include "util/test_dir.h"

namespace topiary {
namespace {

std::string TempPath(const std::string& name) { return testing::TestPath(name); }

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

struct Fixture {
  std::unique_ptr<Device> device = MakeCpuDevice(1);
  std::unique_ptr<Model> model;
  Fixture(const std::string& arch, uint64_t seed, float width = 1.0f) {
    model = *BuildModel(arch, width, {1, 28, 28, 1}, 10, device.get());
    model->Initialize(seed);
  }
  Parameter* Param(const std::string& layer, const std::string& role) {
    for (Parameter* p : model->FindLayer(layer)->parameters()) {
      if (ParamRoleName(p->role) == role) return p;
    }
    return nullptr;
  }
};

// Gives every momentum buffer distinct values and installs a block mask on one conv and an
// element mask on the classifier.
void Decorate(Fixture& f) {
  float x = 0.5f;
  for (Parameter* p : f.model->parameters()) {
    if (!p->trainable) continue;
    std::vector<float> m(p->size());
    for (float& v : m) v = (x += 0.001f);
    p->momentum.CopyFromHost(m.data());
  }
  Parameter* conv = f.Param("stage2.block0.conv2", "kernel");  // [32, 3, 3, 32]: 4 x 4 blocks
  MaskInfo block;
  block.kind = MaskInfo::Kind::kBlock;
  block.blocks = kernels::BlockGrid::Dense(32, 32, 8, 8);  // 4 x 4
  block.blocks.kept[1] = block.blocks.kept[6] = 0;         // (0, 1) and (1, 2)
  std::vector<uint8_t> mask(conv->size());
  for (int k = 0; k < 32; ++k)
    for (int t = 0; t < 9; ++t)
      for (int c = 0; c < 32; ++c) mask[(k * 9 + t) * 32 + c] = block.blocks.at(c / 8, k / 8);
  ASSERT_TRUE(InstallMask(conv, mask, block).ok());
  Parameter* fc = f.Param("fc", "kernel");
  std::vector<uint8_t> fc_mask(fc->size(), 1);
  for (size_t i = 0; i < fc_mask.size(); i += 3) fc_mask[i] = 0;
  MaskInfo element;
  element.kind = MaskInfo::Kind::kElement;
  ASSERT_TRUE(InstallMask(fc, fc_mask, element).ok());
}

void ExpectSameState(Model& a, Model& b) {
  auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_EQ(pa[i]->value.ToHost(), pb[i]->value.ToHost()) << pa[i]->full_name();
    if (pa[i]->trainable) {
      ASSERT_EQ(pa[i]->momentum.ToHost(), pb[i]->momentum.ToHost()) << pa[i]->full_name();
    }
    ASSERT_EQ(HostMask(*pa[i]), HostMask(*pb[i])) << pa[i]->full_name();
    ASSERT_EQ(pa[i]->mask_info.kind, pb[i]->mask_info.kind) << pa[i]->full_name();
    ASSERT_EQ(pa[i]->mask_info.blocks, pb[i]->mask_info.blocks) << pa[i]->full_name();
  }
}

TEST(Checkpoint, RoundTripsParametersMomentumMasksAndState) {
  Fixture a("resnet20", 1);
  Decorate(a);
  CheckpointState s;
  s.experiment_id = "exp-1";
  s.position.round = 3;
  s.position.epoch = 7;
  s.position.phase_epoch = 1;
  s.position.epoch_start_step = 1234;
  s.seed = 99;
  s.spec_text = "name: \"x\"\n";
  s.metrics.set_test_top1(0.9);
  s.metrics.add_rounds()->set_round(2);
  s.input.emplace().set_height(28);
  const std::string path = TempPath("roundtrip.h5");
  ASSERT_TRUE(SaveCheckpoint(path, *a.model, s).ok());
  EXPECT_NE(access((path + ".tmp-" + std::to_string(getpid())).c_str(), F_OK), 0);

  Fixture b("resnet20", 2);
  auto loaded = LoadCheckpoint(path, b.model.get(), true);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameState(*a.model, *b.model);
  EXPECT_EQ(loaded->experiment_id, "exp-1");
  EXPECT_EQ(loaded->position.round, 3);
  EXPECT_EQ(loaded->position.epoch, 7);
  EXPECT_EQ(loaded->position.phase_epoch, 1);
  EXPECT_EQ(loaded->position.global_step(), 1234);
  EXPECT_EQ(loaded->seed, 99u);
  EXPECT_EQ(loaded->model_arch, "resnet20");
  EXPECT_EQ(loaded->spec_text, s.spec_text);
  EXPECT_EQ(loaded->metrics.SerializeAsString(), s.metrics.SerializeAsString());
  ASSERT_TRUE(loaded->input.has_value());
  EXPECT_EQ(loaded->input->height(), 28);
  EXPECT_EQ(loaded->created_at.size(), 20u);  // 2026-11-21T10:00:00Z
}

TEST(Checkpoint, StoresConvKernelsOihwAndMaskedWeightsAsZeros) {
  Fixture a("resnet20", 1);
  Decorate(a);
  const std::string path = TempPath("layout.h5");
  ASSERT_TRUE(SaveCheckpoint(path, *a.model, {}).ok());
  auto doc = ReadCheckpointFile(path);
  ASSERT_TRUE(doc.ok()) << doc.status();
  const Parameter* conv = a.Param("stage2.block0.conv2", "kernel");
  const std::vector<float> mem = conv->value.ToHost();  // [K, R, S, C]
  const H5Dataset& disk = doc->datasets.at("/layers/stage2.block0.conv2/kernel");
  ASSERT_EQ(disk.shape, (std::vector<int64_t>{32, 32, 3, 3}));
  for (int k : {0, 5, 31})
    for (int c : {0, 9, 30})
      for (int r = 0; r < 3; ++r)
        for (int s = 0; s < 3; ++s) {
          const float want = mem[((k * 3 + r) * 3 + s) * 32 + c];
          EXPECT_EQ(disk.f32[((k * 32 + c) * 3 + r) * 3 + s], want);
          // Block (input block 0, output block 1) is masked: k in 8..15, c in 0..7.
          if (k >= 8 && k < 16 && c < 8) {
            EXPECT_EQ(want, 0.0f);
          }
        }
  const H5Dataset& grid = doc->datasets.at("/layers/stage2.block0.conv2/mask");
  EXPECT_EQ(grid.shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(AttrString(grid.attrs, "kind"), "block");
  EXPECT_EQ(AttrInt(grid.attrs, "block_in"), 8);
  // The grid is [input blocks, output blocks], and the file says so.
  EXPECT_EQ(AttrString(grid.attrs, "axes"), "input_blocks,output_blocks");
  EXPECT_EQ(AttrString(doc->datasets.at("/layers/fc/mask").attrs, "kind"), "element");
  EXPECT_EQ(doc->datasets.count("/layers/stem.conv/mask"), 0u);
  EXPECT_EQ(doc->datasets.count("/optimizer/momentum/fc/kernel"), 1u);
  EXPECT_EQ(doc->datasets.count("/layers/stage1.block0.bn1/running_var"), 1u);
}

// Bad files are refused with the file and the problem, and the model is left as it was.
void ExpectRefused(const std::string& path, const std::string& needle) {
  Fixture f("resnet20", 5);
  Fixture reference("resnet20", 5);
  auto st = LoadCheckpoint(path, f.model.get(), true);
  ASSERT_FALSE(st.ok()) << path;
  EXPECT_NE(st.status().message().find(path), std::string::npos) << st.status();
  EXPECT_NE(st.status().message().find(needle), std::string::npos) << st.status();
  ExpectSameState(*f.model, *reference.model);
}

TEST(Checkpoint, RefusesMissingForeignTruncatedCorruptedAndMismatchedFiles) {
  Fixture a("resnet20", 1);
  // A distinctive value to find the fc kernel's bytes in the file.
  Parameter* fc = a.Param("fc", "kernel");
  std::vector<float> marker(fc->size(), 1234.5f);
  fc->value.CopyFromHost(marker.data());
  const std::string good = TempPath("good.h5");
  ASSERT_TRUE(SaveCheckpoint(good, *a.model, {}).ok());
  const std::string bytes = ReadAll(good);

  ExpectRefused(TempPath("missing.h5"), "no such file");

  const std::string text = TempPath("text.h5");
  WriteAll(text, "this is not HDF5\n");
  ExpectRefused(text, "not an HDF5 file");

  const std::string truncated = TempPath("truncated.h5");
  WriteAll(truncated, bytes.substr(0, bytes.size() / 2));
  ExpectRefused(truncated, "truncated or extended");

  const std::string corrupted = TempPath("corrupted.h5");
  float probe = 1234.5f;
  std::string pattern(reinterpret_cast<const char*>(&probe), 4);
  pattern += pattern;
  const size_t at = bytes.find(pattern);
  ASSERT_NE(at, std::string::npos);
  std::string flipped = bytes;
  flipped[at + 2] ^= 0x10;
  WriteAll(corrupted, flipped);
  ExpectRefused(corrupted, "whole-file checksum mismatch");
  // Sealed again after the damage: each dataset's own checksum still finds it.
  ASSERT_TRUE(WriteH5Seal(corrupted).ok());
  ExpectRefused(corrupted, "Fletcher32");

  H5Document foreign_doc;
  foreign_doc.groups["/"]["format"] = std::string("something-else");
  foreign_doc.datasets["/x"] = H5Dataset{{2}, {1.0f, 2.0f}, {}, {}};
  const std::string foreign = TempPath("foreign.h5");
  ASSERT_TRUE(WriteH5File(foreign, foreign_doc).ok());
  ExpectRefused(foreign, "not a Topiary checkpoint");

  H5Document future = *ReadH5File(good);
  future.groups["/"]["format_version"] = int64_t{99};
  const std::string newer = TempPath("newer.h5");
  ASSERT_TRUE(WriteH5File(newer, future).ok());
  ExpectRefused(newer, "format_version 99");

  Fixture narrow("resnet20", 1, 0.5f);
  const std::string other = TempPath("narrow.h5");
  ASSERT_TRUE(SaveCheckpoint(other, *narrow.model, {}).ok());
  ExpectRefused(other, "/layers/stem.conv/kernel: shape [8, 1, 3, 3], the model has [16, 1, 3, 3]");

  Fixture lenet("lenet5", 1);
  const std::string arch = TempPath("lenet.h5");
  ASSERT_TRUE(SaveCheckpoint(arch, *lenet.model, {}).ok());
  ExpectRefused(arch, "a checkpoint of lenet5, not resnet20");
}

TEST(Checkpoint, RefusesABlockGridWhoseAxesAreNotInputThenOutputBlocks) {
  Fixture a("resnet20", 1);
  Decorate(a);
  const std::string good = TempPath("axes_good.h5");
  ASSERT_TRUE(SaveCheckpoint(good, *a.model, {}).ok());
  H5Document doc = *ReadH5File(good);
  H5Dataset& grid = doc.datasets.at("/layers/stage2.block0.conv2/mask");
  grid.attrs["axes"] = std::string("output_blocks,input_blocks");
  doc.groups["/"][kMetadataChecksumAttr] = MetadataChecksum(doc);  // a consistent file
  const std::string swapped = TempPath("axes_swapped.h5");
  ASSERT_TRUE(WriteH5File(swapped, doc).ok());
  ExpectRefused(swapped, "/layers/stage2.block0.conv2/mask@axes");
  // Files written before the attribute existed still load.
  grid.attrs.erase("axes");
  doc.groups["/"][kMetadataChecksumAttr] = MetadataChecksum(doc);
  const std::string older = TempPath("axes_absent.h5");
  ASSERT_TRUE(WriteH5File(older, doc).ok());
  Fixture b("resnet20", 2);
  auto loaded = LoadCheckpoint(older, b.model.get(), true);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameState(*a.model, *b.model);
}

// The file records its network: the model is rebuilt from the file alone, the same graph;
// a file without the attribute (written before it existed) builds the zoo's architecture; a
// damaged graph or one for other images is refused naming the file.
TEST(Checkpoint, RecordsItsNetworkGraph) {
  Fixture a("resnet20", 1, 0.5f);
  const std::string path = TempPath("network.h5");
  ASSERT_TRUE(SaveCheckpoint(path, *a.model, {}).ok());
  auto state = ReadCheckpointState(path);
  ASSERT_TRUE(state.ok());
  ASSERT_TRUE(state->network.has_value());
  auto dev = MakeCpuDevice(1);
  auto rebuilt = BuildCheckpointModel(*state, path, 0.5f, {1, 28, 28, 1}, 10, dev.get());
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  EXPECT_EQ(DescribeModel(**rebuilt).SerializeAsString(),
            DescribeModel(*a.model).SerializeAsString());
  ASSERT_TRUE(LoadCheckpoint(path, rebuilt->get(), true).ok());
  ExpectSameState(*a.model, **rebuilt);

  auto other = BuildCheckpointModel(*state, path, 0.5f, {1, 32, 32, 3}, 10, dev.get());
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("reads 28x28x1 images into 10 classes"),
            std::string::npos)
      << other.status();
  CheckpointState damaged = *state;
  damaged.network->mutable_layers(0)->set_kind(topiary::v1::NODE_KIND_UNSPECIFIED);
  EXPECT_FALSE(BuildCheckpointModel(damaged, path, 0.5f, {1, 28, 28, 1}, 10, dev.get()).ok());
  CheckpointState older = *state;
  older.network.reset();
  auto zoo = BuildCheckpointModel(older, path, 0.5f, {1, 28, 28, 1}, 10, dev.get());
  ASSERT_TRUE(zoo.ok()) << zoo.status();
  EXPECT_EQ((*zoo)->arch(), "resnet20");
}

TEST(Checkpoint, RewritingReplacesTheFileAtomically) {
  Fixture a("lenet5", 1);
  const std::string path = TempPath("rewrite.h5");
  CheckpointState s;
  s.position.round = 1;
  ASSERT_TRUE(SaveCheckpoint(path, *a.model, s).ok());
  s.position.round = 2;
  ASSERT_TRUE(SaveCheckpoint(path, *a.model, s).ok());
  auto file = OpenCheckpoint(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->state.position.round, 2);
  // A write into a folder that does not exist fails cleanly and leaves nothing behind.
  EXPECT_FALSE(SaveCheckpoint(TempPath("no/such/dir/x.h5"), *a.model, s).ok());
}

}  // namespace
}  // namespace topiary

namespace topiary {
namespace {

// Writes `data` as a one-chunk dataset through HDF5's own Fletcher-32 filter, sealed or
// (as any other tool writes HDF5) not.
void WriteWithHdf5Filter(const std::string& path, const std::vector<uint8_t>& data,
                         bool sealed = true) {
  hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
  if (sealed) H5Pset_userblock(fcpl, 512);  // for the seal (hdf5_file.h)
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT);
  H5Pclose(fcpl);
  hsize_t dims[1] = {data.size()};
  hid_t space = H5Screate_simple(1, dims, nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, dims);
  H5Pset_fletcher32(dcpl);
  hid_t ds = H5Dcreate2(f, "d", H5T_STD_U8LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
  H5Dclose(ds);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
  if (sealed) {
    ASSERT_TRUE(WriteH5Seal(path).ok());
  }
}

// A file without the seal is refused before libhdf5 parses it; `topiary seal` (SealH5File)
// rewrites it sealed, with the same contents.
TEST(Hdf5File, UnsealedFilesAreRefusedUntilSealed) {
  const std::string path = TempPath("unsealed.h5");
  const std::vector<uint8_t> data = {1, 2, 3, 250};
  WriteWithHdf5Filter(path, data, /*sealed=*/false);
  auto refused = ReadH5File(path);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("without Topiary's seal"), std::string::npos)
      << refused.status();
  EXPECT_FALSE(ReadH5RootAttrs(path).ok());
  ASSERT_TRUE(SealH5File(path).ok());
  auto doc = ReadH5File(path);
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(doc->datasets.at("/d").u8, data);
}

// The seal covers every byte: one flipped anywhere after it (metadata included, where
// libhdf5 itself would be the first to look) is refused as DATA_LOSS, and so is a file
// with bytes appended or a damaged seal.
TEST(Hdf5File, TheSealCoversEveryByte) {
  const std::string path = TempPath("sealed.h5");
  H5Document doc;
  doc.groups["/"]["spec"] = std::string("name: \"x\"");
  doc.datasets["/d"].shape = {3};
  doc.datasets["/d"].u8 = {1, 2, 3};
  ASSERT_TRUE(WriteH5File(path, doc).ok());
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  ASSERT_EQ(bytes.compare(0, 15, "topiary-seal 1\n"), 0);
  const std::string damaged = TempPath("damaged.h5");
  for (size_t at = 512; at < bytes.size(); at += 97) {
    std::string b = bytes;
    b[at] ^= 0x01;
    std::ofstream(damaged, std::ios::binary | std::ios::trunc) << b;
    auto r = ReadH5File(damaged);
    ASSERT_FALSE(r.ok()) << "byte " << at;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  }
  std::ofstream(damaged, std::ios::binary | std::ios::trunc) << bytes << "x";
  EXPECT_EQ(ReadH5File(damaged).status().code(), absl::StatusCode::kDataLoss);
  std::string seal = bytes;
  seal[20] = '9';
  std::ofstream(damaged, std::ios::binary | std::ios::trunc) << seal;
  EXPECT_EQ(ReadH5File(damaged).status().code(), absl::StatusCode::kDataLoss);
}

// Reads dataset "d" through HDF5's filter pipeline (which verifies the checksum itself).
bool ReadWithHdf5Filter(const std::string& path, std::vector<uint8_t>* out) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t ds = H5Dopen2(f, "d", H5P_DEFAULT);
  const herr_t rc = H5Dread(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->data());
  H5Dclose(ds);
  H5Fclose(f);
  return rc >= 0;
}

// Our direct chunk I/O computes Fletcher-32 itself: it must agree with HDF5's filter both
// ways, including odd lengths and sums that are multiples of 65535.
TEST(Hdf5File, ChecksumsAgreeWithHdf5sFilterBothWays) {
  std::vector<std::vector<uint8_t>> cases = {
      {0, 0, 0, 0}, {0xff, 0xff}, {0xff, 0xff, 0xff, 0xff}, {1}, {7, 9, 200}};
  for (size_t n : {1000u, 1001u, 65535u * 2 + 1, 1234567u}) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131 + 7) ^ (i >> 3));
    cases.push_back(v);
  }
  for (const std::vector<uint8_t>& data : cases) {
    const std::string theirs = TempPath("theirs.h5"), ours = TempPath("ours.h5");
    WriteWithHdf5Filter(theirs, data);
    auto doc = ReadH5File(theirs);
    ASSERT_TRUE(doc.ok()) << data.size() << " bytes: " << doc.status();
    EXPECT_EQ(doc->datasets.at("/d").u8, data) << data.size() << " bytes";

    H5Document mine;
    mine.datasets["/d"].shape = {static_cast<int64_t>(data.size())};
    mine.datasets["/d"].u8 = data;
    ASSERT_TRUE(WriteH5File(ours, mine).ok());
    std::vector<uint8_t> back(data.size());
    EXPECT_TRUE(ReadWithHdf5Filter(ours, &back)) << data.size() << " bytes: HDF5 refused it";
    EXPECT_EQ(back, data) << data.size() << " bytes";
  }
}

}  // namespace
}  // namespace topiary

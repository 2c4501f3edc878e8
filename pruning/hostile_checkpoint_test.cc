// Hostile and damaged checkpoint files: each is refused with an error naming the file and the
// object, by the loader (run --resume, init_from_checkpoint, fork) and by the report
// (inspect), before anything is allocated for what the file merely declares. Every case
// here crashed, exhausted memory, escaped the data directory or was silently accepted before.
#include <hdf5.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "gtest/gtest.h"
#include "pruning/checkpoint_report.h"
#include "trainer/checkpoint.h"
#include "trainer/checkpoint_schema.h"
#include "trainer/file_util.h"
#include "trainer/masks.h"
#include "trainer/model_zoo.h"

namespace topiary {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

struct Net {
  std::unique_ptr<Device> device = MakeCpuDevice(1);
  std::unique_ptr<Model> model;
  Net() {
    model = *BuildModel("resnet20", 1.0f, {1, 28, 28, 1}, 10, device.get());
    model->Initialize(3);
  }
};

// A valid resnet20 checkpoint with an element mask on the classifier.
const std::string& GoodFile() {
  static const std::string* path = [] {
    Net n;
    for (Parameter* p : n.model->parameters()) {
      if (p->layer == "fc" && p->role == "kernel") {
        MaskInfo info;
        info.kind = MaskInfo::Kind::kElement;
        std::vector<uint8_t> mask(p->size(), 1);
        for (size_t i = 0; i < mask.size(); i += 3) mask[i] = 0;
        EXPECT_TRUE(InstallMask(p, mask, info, true).ok());
      }
    }
    CheckpointState s;
    s.seed = 7;
    s.spec_text = "name: \"hostile\"\nmodel { arch: \"resnet20\" }\n";
    s.metrics_json = "{\"top1\":0.5}";
    auto* p = new std::string(TempPath("good.h5"));
    EXPECT_TRUE(SaveCheckpoint(*p, *n.model, s).ok());
    return p;
  }();
  return *path;
}

// Both readers refuse `path` with a message naming it and containing `needle`; the model is
// left untouched by the failed load.
void ExpectRefusedByBoth(const std::string& path, const std::string& needle) {
  Net target, reference;
  auto loaded = LoadCheckpoint(path, target.model.get(), true);
  ASSERT_FALSE(loaded.ok()) << path;
  EXPECT_NE(loaded.status().message().find(path), std::string::npos) << loaded.status();
  EXPECT_NE(loaded.status().message().find(needle), std::string::npos) << loaded.status();
  for (size_t i = 0; i < target.model->parameters().size(); ++i) {
    EXPECT_EQ(target.model->parameters()[i]->value.ToHost(),
              reference.model->parameters()[i]->value.ToHost());
  }
  auto report = pruning::InspectCheckpoint(path, "");
  ASSERT_FALSE(report.ok()) << path;
  EXPECT_NE(report.status().message().find(needle), std::string::npos) << report.status();
}

// The good document changed by `edit`, written with a correct metadata checksum, so that
// only the edit itself can be what is refused.
std::string Edited(const std::string& name, const std::function<void(H5Document*)>& edit) {
  auto doc = ReadH5File(GoodFile());
  EXPECT_TRUE(doc.ok()) << doc.status();
  edit(&*doc);
  doc->groups["/"][kMetadataChecksumAttr] = MetadataChecksum(*doc);
  const std::string path = TempPath(name);
  EXPECT_TRUE(WriteH5File(path, *doc).ok());
  return path;
}

// A copy of the good file changed through HDF5's own API (links, storage, declarations that
// our writer never produces).
std::string RawEdited(const std::string& name, const std::function<void(hid_t)>& edit) {
  const std::string path = TempPath(name);
  WriteAll(path, ReadAll(GoodFile()));
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  EXPECT_GE(file, 0);
  edit(file);
  H5Fclose(file);
  return path;
}

TEST(HostileCheckpoint, TheGoodFileLoadsAndReports) {
  Net n;
  ASSERT_TRUE(LoadCheckpoint(GoodFile(), n.model.get(), true).ok());
  auto report = pruning::InspectCheckpoint(GoodFile(), "");
  ASSERT_TRUE(report.ok()) << report.status();
}

TEST(HostileCheckpoint, AFloatMaskIsRefusedNotDereferenced) {
  const std::string path = Edited("float_mask.h5", [](H5Document* d) {
    H5Dataset& mask = d->datasets.at("/layers/fc/mask");
    mask.f32.assign(mask.u8.begin(), mask.u8.end());
    mask.u8.clear();
  });
  ExpectRefusedByBoth(path, "/layers/fc/mask: a mask must be uint8");
}

TEST(HostileCheckpoint, HugeDeclaredDatasetsAreRefusedBeforeAllocation) {
  // Chunked, late allocation: the file stays tiny while the shape claims 7e11 floats.
  const std::string kernel = RawEdited("huge_kernel.h5", [](hid_t f) {
    H5Ldelete(f, "/layers/stage1.block0.conv1/kernel", H5P_DEFAULT);
    hsize_t dims[4] = {8, 8, 3, 3000000000ull}, chunk[4] = {1, 1, 1, 1024};
    const hid_t space = H5Screate_simple(4, dims, nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 4, chunk);
    H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_LATE);
    const hid_t ds = H5Dcreate2(f, "/layers/stage1.block0.conv1/kernel", H5T_IEEE_F32LE, space, H5P_DEFAULT,
                                dcpl, H5P_DEFAULT);
    EXPECT_GE(ds, 0);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
  });
  ExpectRefusedByBoth(kernel, "more than the file's remaining");
  const std::string mask = RawEdited("huge_mask.h5", [](hid_t f) {
    H5Ldelete(f, "/layers/fc/mask", H5P_DEFAULT);
    hsize_t dims[2] = {1000000, 1000000}, chunk[2] = {1000, 1000};
    const hid_t space = H5Screate_simple(2, dims, nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 2, chunk);
    const hid_t ds = H5Dcreate2(f, "/layers/fc/mask", H5T_STD_U8LE, space, H5P_DEFAULT, dcpl,
                                H5P_DEFAULT);
    EXPECT_GE(ds, 0);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
  });
  ExpectRefusedByBoth(mask, "more than the file's remaining");
}

TEST(HostileCheckpoint, UnwrittenDataIsNotReadAsFillValues) {
  const std::string path = RawEdited("unwritten.h5", [](hid_t f) {
    H5Ldelete(f, "/layers/fc/bias", H5P_DEFAULT);
    hsize_t dims[1] = {10};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t ds = H5Dcreate2(f, "/layers/fc/bias", H5T_IEEE_F32LE, space, H5P_DEFAULT,
                                H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(ds);
    H5Sclose(space);
  });
  ExpectRefusedByBoth(path, "unwritten or damaged");
}

TEST(HostileCheckpoint, LinksAndExternalStorageAreNeverFollowed) {
  const std::string outside = TempPath("outside.h5");
  WriteAll(outside, ReadAll(GoodFile()));
  const std::string external = RawEdited("external_link.h5", [&](hid_t f) {
    H5Ldelete(f, "/layers/fc/bias", H5P_DEFAULT);
    H5Lcreate_external(outside.c_str(), "/layers/fc/bias", f, "/layers/fc/bias", H5P_DEFAULT,
                       H5P_DEFAULT);
  });
  ExpectRefusedByBoth(external, "external link (links are never followed)");
  const std::string soft = RawEdited("soft_link.h5", [](hid_t f) {
    H5Lcreate_soft("/layers/fc/bias", f, "/layers/fc/alias", H5P_DEFAULT, H5P_DEFAULT);
  });
  ExpectRefusedByBoth(soft, "soft link");
  const std::string storage = RawEdited("external_storage.h5", [&](hid_t f) {
    H5Ldelete(f, "/layers/fc/bias", H5P_DEFAULT);
    hsize_t dims[1] = {10};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, "/etc/hostname", 0, 40);
    const hid_t ds = H5Dcreate2(f, "/layers/fc/bias", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl,
                                H5P_DEFAULT);
    EXPECT_GE(ds, 0);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
  });
  ExpectRefusedByBoth(storage, "external files (never followed)");
}

TEST(HostileCheckpoint, CompressionFiltersAreRefused) {
  const std::string path = RawEdited("deflate.h5", [](hid_t f) {
    H5Ldelete(f, "/layers/fc/bias", H5P_DEFAULT);
    hsize_t dims[1] = {10};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, dims);
    H5Pset_deflate(dcpl, 6);
    const hid_t ds = H5Dcreate2(f, "/layers/fc/bias", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl,
                                H5P_DEFAULT);
    const float zeros[10] = {};
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
  });
  ExpectRefusedByBoth(path, "only Fletcher-32 is read");
}

TEST(HostileCheckpoint, WrongValuesAreRefused) {
  ExpectRefusedByBoth(Edited("nan.h5",
                             [](H5Document* d) {
                               d->datasets.at("/layers/stem.conv/kernel").f32[5] = std::nanf("");
                             }),
                      "/layers/stem.conv/kernel: value nan at element 5 (must be finite)");
  ExpectRefusedByBoth(Edited("inf.h5",
                             [](H5Document* d) {
                               d->datasets.at("/optimizer/momentum/fc/kernel").f32[0] = INFINITY;
                             }),
                      "/optimizer/momentum/fc/kernel: value inf");
  ExpectRefusedByBoth(
      Edited("negative_var.h5",
             [](H5Document* d) {
               for (auto& [path, ds] : d->datasets) {
                 if (path.find("running_var") != std::string::npos) ds.f32[0] = -1.0f;
               }
             }),
      "running_var: value -1 at element 0 (must be finite and >= 0)");
  ExpectRefusedByBoth(
      Edited("mask2.h5", [](H5Document* d) { d->datasets.at("/layers/fc/mask").u8[4] = 2; }),
      "/layers/fc/mask: mask value 2 at element 4 (masks hold 0 or 1)");
  ExpectRefusedByBoth(Edited("no_rng.h5", [](H5Document* d) { d->groups.erase("/rng"); }),
                      "/rng: missing");
  ExpectRefusedByBoth(Edited("bad_round.h5",
                             [](H5Document* d) { d->groups["/"]["round"] = int64_t{-3}; }),
                      "/@round: -3 is outside");
  ExpectRefusedByBoth(
      Edited("stray.h5",
             [](H5Document* d) { d->datasets["/elsewhere/x"] = H5Dataset{{1}, {1.0f}, {}, {}}; }),
      "/elsewhere/x: not a dataset a checkpoint holds");
}

TEST(HostileCheckpoint, AFlippedByteInTheRootAttributesIsFound) {
  const std::string bytes = ReadAll(GoodFile());
  for (const char* needle : {"hostile", "top1"}) {
    const size_t at = bytes.find(needle);
    ASSERT_NE(at, std::string::npos) << needle;
    std::string flipped = bytes;
    flipped[at + 1] ^= 0x01;
    const std::string path = TempPath(std::string("flipped_") + needle + ".h5");
    WriteAll(path, flipped);
    ExpectRefusedByBoth(path, "checksum mismatch");
  }
}

TEST(HostileCheckpoint, NonRegularFilesAndLinksOutOfTheRootsAreRefused) {
  Net n;
  auto dev = LoadCheckpoint("/dev/zero", n.model.get(), true);
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.status().message().find("not a regular file"), std::string::npos) << dev.status();
  // With the daemon's policy, a link from inside the allowed folder to a file outside it.
  const std::string root = TempPath("root");
  ASSERT_TRUE(MakeDirs(root).ok());
  const std::string link = root + "/link.h5";
  std::remove(link.c_str());
  ASSERT_EQ(::symlink(GoodFile().c_str(), link.c_str()), 0);
  const ReadPolicy saved = GetReadPolicy();
  ReadPolicy policy;
  policy.roots = {root};
  SetReadPolicy(policy);
  auto outside = LoadCheckpoint(link, n.model.get(), true);
  SetReadPolicy(saved);
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(outside.status().message().find("outside the folders"), std::string::npos)
      << outside.status();
}

}  // namespace
}  // namespace topiary

#include "tests/tools/hostile_files.h"

#include <cmath>
#include <fstream>
#include <iterator>

#include "trainer/nn/masks.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/store/checkpoint.h"
#include "trainer/store/checkpoint_schema.h"

namespace topiary::testing {
namespace {

void Copy(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream(to, std::ios::binary | std::ios::trunc)
      << std::string(std::istreambuf_iterator<char>(in), {});
}

// Replaces `path` in `file` by a dataset of `type` and `dims` made with `dcpl`, written with
// `data` when given (else left unwritten).
void Replace(hid_t file, const char* path, hid_t type, std::vector<hsize_t> dims, hid_t dcpl,
             const void* data = nullptr) {
  H5Ldelete(file, path, H5P_DEFAULT);
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t ds = H5Dcreate2(file, path, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (data != nullptr) H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  H5Dclose(ds);
  H5Sclose(space);
}

hid_t Chunked(std::vector<hsize_t> chunk) {
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_LATE);
  return dcpl;
}

}  // namespace

void WriteGoodCheckpoint(const std::string& path) {
  std::unique_ptr<Device> device = MakeCpuDevice(1);
  std::unique_ptr<Model> model = *BuildModel("resnet20", 1.0f, {1, 28, 28, 1}, 10, device.get());
  model->Initialize(3);
  for (Parameter* p : model->parameters()) {
    if (p->layer == "fc" && p->role == ParamRole::kKernel) {
      MaskInfo info;
      info.kind = MaskInfo::Kind::kElement;
      std::vector<uint8_t> mask(p->size(), 1);
      for (size_t i = 0; i < mask.size(); i += 3) mask[i] = 0;
      (void)InstallMask(p, mask, info, true);
    }
  }
  CheckpointState s;
  s.seed = 7;
  s.spec_text = "name: \"hostile\"\nmodel { arch: \"resnet20\" }\n";
  s.metrics.set_test_top1(0.5);
  (void)SaveCheckpoint(path, *model, s);
}

void WriteEdited(const std::string& good, const std::string& path,
                 const std::function<void(H5Document*)>& edit) {
  H5Document doc = *ReadH5File(good);
  edit(&doc);
  doc.groups["/"][kMetadataChecksumAttr] = MetadataChecksum(doc);
  (void)WriteH5File(path, doc);
}

void WriteRawEdited(const std::string& good, const std::string& path,
                    const std::function<void(hid_t)>& edit) {
  Copy(good, path);
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  edit(file);
  H5Fclose(file);
  // Sealed again, as an attacker who can write files would: the readers' own checks of
  // what libhdf5 parses are what these files test.
  if (!WriteH5Seal(path).ok()) std::abort();
}

std::vector<HostileCheckpoint> WriteHostileCheckpoints(const std::string& good,
                                                       const std::string& dir,
                                                       const std::string& outside) {
  std::vector<HostileCheckpoint> out;
  auto edited = [&](const std::string& name, const std::string& needle,
                    const std::function<void(H5Document*)>& edit) {
    WriteEdited(good, dir + "/" + name, edit);
    out.push_back({name, needle});
  };
  auto raw = [&](const std::string& name, const std::string& needle,
                 const std::function<void(hid_t)>& edit) {
    WriteRawEdited(good, dir + "/" + name, edit);
    out.push_back({name, needle});
  };
  edited("float_mask.h5", "/layers/fc/mask: a mask must be uint8", [](H5Document* d) {
    H5Dataset& mask = d->datasets.at("/layers/fc/mask");
    mask.f32.assign(mask.u8.begin(), mask.u8.end());
    mask.u8.clear();
  });
  // Chunked with late allocation: the file stays small while the shapes claim terabytes.
  raw("huge_kernel.h5", "more than the file's remaining", [](hid_t f) {
    const hid_t dcpl = Chunked({1, 1, 1, 1024});
    Replace(f, "/layers/stage1.block0.conv1/kernel", H5T_IEEE_F32LE, {8, 8, 3, 3000000000ull},
            dcpl);
    H5Pclose(dcpl);
  });
  raw("huge_mask.h5", "more than the file's remaining", [](hid_t f) {
    const hid_t dcpl = Chunked({1000, 1000});
    Replace(f, "/layers/fc/mask", H5T_STD_U8LE, {1000000, 1000000}, dcpl);
    H5Pclose(dcpl);
  });
  raw("unwritten.h5", "unwritten or damaged",
      [](hid_t f) { Replace(f, "/layers/fc/bias", H5T_IEEE_F32LE, {10}, H5P_DEFAULT); });
  raw("external_link.h5", "external link (links are never followed)", [&](hid_t f) {
    H5Ldelete(f, "/layers/fc/bias", H5P_DEFAULT);
    H5Lcreate_external(outside.c_str(), "/layers/fc/bias", f, "/layers/fc/bias", H5P_DEFAULT,
                       H5P_DEFAULT);
  });
  raw("soft_link.h5", "soft link", [](hid_t f) {
    H5Lcreate_soft("/layers/fc/bias", f, "/layers/fc/alias", H5P_DEFAULT, H5P_DEFAULT);
  });
  raw("external_storage.h5", "external files (never followed)", [](hid_t f) {
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, "/etc/hostname", 0, 40);
    Replace(f, "/layers/fc/bias", H5T_IEEE_F32LE, {10}, dcpl);
    H5Pclose(dcpl);
  });
  raw("deflate.h5", "only Fletcher-32 is read", [](hid_t f) {
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    const hsize_t chunk = 10;
    H5Pset_chunk(dcpl, 1, &chunk);
    H5Pset_deflate(dcpl, 6);
    const float zeros[10] = {};
    Replace(f, "/layers/fc/bias", H5T_NATIVE_FLOAT, {10}, dcpl, zeros);
    H5Pclose(dcpl);
  });
  edited("nan.h5", "/layers/stem.conv/kernel: value nan at element 5 (must be finite)",
         [](H5Document* d) { d->datasets.at("/layers/stem.conv/kernel").f32[5] = std::nanf(""); });
  edited("inf_momentum.h5", "/optimizer/momentum/fc/kernel: value inf",
         [](H5Document* d) { d->datasets.at("/optimizer/momentum/fc/kernel").f32[0] = INFINITY; });
  edited("negative_var.h5", "running_var: value -1 at element 0 (must be finite and >= 0)",
         [](H5Document* d) {
           d->datasets.at("/layers/stage1.block0.bn1/running_var").f32[0] = -1.0f;
         });
  edited("mask2.h5", "/layers/fc/mask: mask value 2 at element 4 (masks hold 0 or 1)",
         [](H5Document* d) { d->datasets.at("/layers/fc/mask").u8[4] = 2; });
  edited("no_rng.h5", "/rng: missing", [](H5Document* d) { d->groups.erase("/rng"); });
  edited("bad_round.h5", "/@round: -3 is outside",
         [](H5Document* d) { d->groups["/"]["round"] = int64_t{-3}; });
  edited("stray.h5", "/elsewhere/x: not a dataset a checkpoint holds", [](H5Document* d) {
    d->datasets["/elsewhere/x"] = H5Dataset{{1}, {1.0f}, {}, {}};
  });
  // One flipped byte in a root attribute (the spec, then the metrics).
  std::ifstream in(good, std::ios::binary);
  const std::string bytes(std::istreambuf_iterator<char>(in), {});
  for (const char* needle : {"hostile", "top1"}) {
    std::string flipped = bytes;
    flipped[flipped.find(needle) + 1] ^= 0x01;
    const std::string name = std::string("flipped_") + needle + ".h5";
    std::ofstream(dir + "/" + name, std::ios::binary | std::ios::trunc) << flipped;
    out.push_back({name, "checksum mismatch"});
  }
  return out;
}

}  // namespace topiary::testing

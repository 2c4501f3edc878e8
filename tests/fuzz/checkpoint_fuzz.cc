// libFuzzer harness: the checkpoint reader, schema check, loader and report, fed with
// structurally mutated checkpoints. Each input is a program of edits applied to a valid
// lenet5 checkpoint's document (shapes, element types, values, attributes, masks, missing and
// stray objects, links, external storage, the metadata checksum); the result is written as a
// real HDF5 file and read back by every reader. Mutating HDF5's own byte-level structures
// would fuzz libhdf5 rather than Topiary and is left to that project.
#include <hdf5.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "trainer/nn/masks.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/store/checkpoint.h"
#include "trainer/store/checkpoint_report.h"
#include "trainer/store/checkpoint_schema.h"
#include "trainer/util/file_util.h"

namespace {

using topiary::H5Dataset;
using topiary::H5Document;

// Reads the fuzz input front to back; zeros once it is used up.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint32_t U32() {
    return Byte() | Byte() << 8 | Byte() << 16 | static_cast<uint32_t>(Byte()) << 24;
  }
  size_t Pick(size_t n) { return n == 0 ? 0 : U32() % n; }
  std::string Text() {
    std::string s;
    for (size_t n = Byte() % 24; n > 0; --n) s.push_back(static_cast<char>(Byte()));
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_, pos_ = 0;
};

struct World {
  std::unique_ptr<topiary::Device> device = topiary::MakeCpuDevice(1);
  std::unique_ptr<topiary::Model> model;
  H5Document good;
  std::string dir;
  World() {
    const char* tmp = std::getenv("TMPDIR");
    dir = std::string(tmp ? tmp : "/tmp") + "/checkpoint_fuzz." + std::to_string(::getpid());
    (void)topiary::MakeDirs(dir);
    model = *topiary::BuildModel("lenet5", 0.5f, {1, 28, 28, 1}, 10, device.get());
    model->Initialize(1);
    topiary::CheckpointState s;
    s.spec_text = "model { arch: \"lenet5\" width: 0.5 }";
    (void)topiary::SaveCheckpoint(dir + "/good.h5", *model, s);
    good = *topiary::ReadH5File(dir + "/good.h5");
    // A block mask too, so block grids get mutated.
    H5Dataset grid;
    grid.shape = {1, 1};
    grid.u8 = {1};
    grid.attrs["kind"] = std::string("block");
    grid.attrs["block_in"] = int64_t{8};
    grid.attrs["block_out"] = int64_t{8};
    good.datasets["/layers/conv2/mask"] = grid;
  }
};

const char* const kAttrNames[] = {
    "round",          "epoch",       "phase_epoch",     "epoch_step", "global_step",
    "format_version", "layer_order", "metrics",         "spec",       "model_arch",
    "kind",           "block_in",    "block_out",       "n",          "m",
    "seed",           "next_epoch",  "metadata_crc32c", "axes"};

H5Dataset* PickDataset(H5Document* doc, Bytes* in) {
  if (doc->datasets.empty()) return nullptr;
  auto it = doc->datasets.begin();
  std::advance(it, in->Pick(doc->datasets.size()));
  return &it->second;
}

topiary::H5Attr RandomAttr(Bytes* in) {
  switch (in->Byte() % 4) {
    case 0:
      return static_cast<int64_t>(static_cast<int32_t>(in->U32()));
    case 1:
      return static_cast<int64_t>(in->Byte()) - 8;
    case 2:
      return static_cast<double>(static_cast<int32_t>(in->U32())) / 7.0;
    default:
      return in->Text();
  }
}

void Mutate(H5Document* doc, Bytes* in) {
  for (int op = 0; op < 8 && !in->empty(); ++op) {
    H5Dataset* d = PickDataset(doc, in);
    switch (in->Byte() % 9) {
      case 0:  // a new shape, the data resized to fit (at most 2^20 elements)
        if (d) {
          d->shape.assign(1 + in->Byte() % 5, 1);
          size_t n = 1;
          for (int64_t& s : d->shape) {
            s = 1 + in->Byte() % 40;
            n *= s;
          }
          if (n > (1u << 20)) break;
          if (d->u8.empty())
            d->f32.resize(n, 0.5f);
          else
            d->u8.resize(n, 1);
        }
        break;
      case 1:  // the other element type
        if (d && d->u8.empty()) {
          d->u8.assign(d->f32.size(), 1);
          d->f32.clear();
        } else if (d) {
          d->f32.assign(d->u8.begin(), d->u8.end());
          d->u8.clear();
        }
        break;
      case 2: {  // a special value
        if (!d) break;
        const float specials[] = {NAN, INFINITY, -INFINITY, -1.0f, 1e30f, 0.0f};
        const size_t n = d->u8.empty() ? d->f32.size() : d->u8.size();
        const size_t i = in->Pick(n);
        if (d->u8.empty())
          d->f32[i] = specials[in->Byte() % 6];
        else
          d->u8[i] = in->Byte();
        break;
      }
      case 3:  // a missing dataset
        if (!doc->datasets.empty()) {
          auto it = doc->datasets.begin();
          std::advance(it, in->Pick(doc->datasets.size()));
          doc->datasets.erase(it);
        }
        break;
      case 4: {  // a missing group or attribute
        auto it = doc->groups.begin();
        std::advance(it, in->Pick(doc->groups.size()));
        if (it->first != "/" && in->Byte() & 1) {
          doc->groups.erase(it);
        } else if (!it->second.empty()) {
          auto a = it->second.begin();
          std::advance(a, in->Pick(it->second.size()));
          it->second.erase(a);
        }
        break;
      }
      case 5: {  // a group attribute of any type and value
        auto it = doc->groups.begin();
        std::advance(it, in->Pick(doc->groups.size()));
        it->second[kAttrNames[in->Pick(std::size(kAttrNames))]] = RandomAttr(in);
        break;
      }
      case 6:  // a dataset attribute (mask kinds, block sizes, n and m)
        if (d) {
          const char* kinds[] = {"block", "element", "n_of_m", "bogus"};
          if (in->Byte() & 1) {
            d->attrs["kind"] = std::string(kinds[in->Byte() % 4]);
          } else {
            d->attrs[kAttrNames[10 + in->Pick(5)]] = RandomAttr(in);
          }
        }
        break;
      case 7: {  // a stray or duplicate dataset
        const char* paths[] = {"/layers/conv1/mask",
                               "/layers/fc/mask",
                               "/elsewhere/x",
                               "/layers/fc/kernel2",
                               "/optimizer/momentum/fc/bias",
                               "/layers/conv1/running_var"};
        H5Dataset extra;
        extra.shape = {1 + in->Byte() % 16};
        if (in->Byte() & 1)
          extra.u8.assign(extra.shape[0], in->Byte());
        else
          extra.f32.assign(extra.shape[0], -0.5f);
        doc->datasets[paths[in->Pick(6)]] = extra;
        break;
      }
      default:
        break;
    }
  }
}

void RawEdit(const std::string& path, Bytes* in) {
  const uint8_t what = in->Byte() % 8;
  if (what >= 3) return;
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) return;
  if (what == 0) {
    H5Lcreate_soft("/layers/fc/bias", f, "/layers/fc/alias", H5P_DEFAULT, H5P_DEFAULT);
  } else if (what == 1) {
    H5Lcreate_external("/etc/hostname", "/x", f, "/layers/ext", H5P_DEFAULT, H5P_DEFAULT);
  } else {
    const hsize_t n = 1 + in->Byte();
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, "/etc/hostname", 0, n * 4);
    const hid_t ds =
        H5Dcreate2(f, "/layers/fc/extstore", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (ds >= 0) H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
  }
  H5Fclose(f);
  // Sealed again, so the readers' own checks, not the seal, meet the edit.
  (void)topiary::WriteH5Seal(path);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* world = new World;
  Bytes in(data, size);
  H5Document doc = world->good;
  Mutate(&doc, &in);
  if (in.Byte() % 4 != 0) {
    doc.groups["/"][topiary::kMetadataChecksumAttr] = topiary::MetadataChecksum(doc);
  }
  const std::string path = world->dir + "/input.h5";
  if (!topiary::WriteH5File(path, doc).ok()) return 0;
  RawEdit(path, &in);
  auto read = topiary::OpenCheckpoint(path);
  auto report = topiary::InspectCheckpoint(path, in.Byte() & 1 ? "" : "conv*");
  // The two readers agree on whether the file is acceptable (the report may still find no
  // layer matching its pattern).
  if (read.ok() != (report.ok() || report.status().code() == absl::StatusCode::kNotFound)) {
    __builtin_trap();
  }
  auto loaded = topiary::LoadCheckpoint(path, world->model.get(), true);
  if (loaded.ok()) {
    for (const topiary::Parameter* p : world->model->parameters()) {
      for (float v : p->value.ToHost()) {
        if (!std::isfinite(v)) __builtin_trap();  // the loader let a non-finite value in
      }
    }
  }
  return 0;
}

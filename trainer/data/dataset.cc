#include "trainer/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "trainer/core/random.h"
#include "trainer/data/image_folder.h"
#include "trainer/util/file_util.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

using topiary::v1::DataSpec;

uint32_t BigEndian32(const std::string& s, size_t off) {
  return (static_cast<uint32_t>(static_cast<uint8_t>(s[off])) << 24) |
         (static_cast<uint32_t>(static_cast<uint8_t>(s[off + 1])) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(s[off + 2])) << 8) |
         static_cast<uint32_t>(static_cast<uint8_t>(s[off + 3]));
}

// Largest image side and image count an IDX file may declare (far beyond any real set).
constexpr uint32_t kMaxIdxSide = 4096;
constexpr uint32_t kMaxIdxCount = uint32_t{1} << 28;

// Parses an IDX ubyte file with `dims` dimensions; returns the dims. Every declared size is
// bounded and checked against the bytes present before anything is allocated.
absl::StatusOr<std::vector<uint32_t>> ParseIdxHeader(const std::string& path, const std::string& s,
                                                     int dims) {
  const uint32_t want = 0x0800u | static_cast<uint32_t>(dims);
  if (s.size() < 4) return absl::DataLossError(path + ": truncated IDX file (no header)");
  if (BigEndian32(s, 0) != want) {
    // The bytes found are not echoed: the file may be anything.
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not an IDX file of unsigned bytes with %d dimensions (wrong magic number; "
        "expected 0x%08x)",
        path, dims, want));
  }
  if (s.size() < 4 + 4 * static_cast<size_t>(dims)) {
    return absl::DataLossError(path + ": truncated IDX header");
  }
  std::vector<uint32_t> d(dims);
  uint64_t payload = 1;
  for (int i = 0; i < dims; ++i) {
    d[i] = BigEndian32(s, 4 + 4 * i);
    const uint32_t bound = i == 0 ? kMaxIdxCount : kMaxIdxSide;
    if (d[i] == 0 || d[i] > bound) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: IDX dimension %d is %u, outside [1, %u]", path, i, d[i], bound));
    }
    payload *= d[i];  // < 2^28 * 2^12 * 2^12: no overflow in 64 bits
  }
  const uint64_t have = s.size() - 4 - 4 * static_cast<uint64_t>(dims);
  if (have < payload) {
    return absl::DataLossError(
        absl::StrFormat("%s: truncated IDX file: header promises %d bytes of data, file has %d",
                        path, payload, have));
  }
  return d;
}

absl::Status CheckLabels(const std::string& path, const std::vector<int32_t>& labels, int classes) {
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || labels[i] >= classes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: label %d of record %d out of range [0, %d)", path, labels[i], i, classes));
    }
  }
  return absl::OkStatus();
}

// The first of `candidates` (in `dir`) that exists, or NOT_FOUND listing them.
absl::StatusOr<std::string> FindFile(const std::string& dir,
                                     const std::vector<std::string>& candidates) {
  for (const auto& c : candidates) {
    const std::string p = dir + "/" + c;
    if (PathExists(p)) return p;
  }
  return absl::NotFoundError(
      absl::StrCat(dir, ": none of ", absl::StrJoin(candidates, ", "), " found"));
}

absl::Status CheckFolder(const std::string& dir, const std::string& hint) {
  if (IsDirectory(dir)) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("data.path: dataset folder ", dir, " does not exist",
                                          hint.empty() ? "" : "; ", hint));
}

// The names an IDX file of `prefix` ("train", "t10k") and `kind` ("images", "labels") goes
// by: as Yann LeCun's and Zalando's downloads name them, gzipped or not, and as Debian does.
std::vector<std::string> IdxNames(const std::string& prefix, const std::string& kind) {
  const std::string dims = kind == "images" ? "idx3" : "idx1";
  const std::string stem = prefix + "-" + kind;
  return {stem + "-" + dims + "-ubyte", stem + "-" + dims + "-ubyte.gz",
          stem + "." + dims + "-ubyte"};
}

std::string IdxHint(const std::string& name) {
  return name == "fashion_mnist" ? "install Debian's dataset-fashion-mnist package (apt-get "
                                   "install dataset-fashion-mnist) or set data.path"
                                 : "";
}

// The CIFAR binary files of a folder: (train files, test files).
std::pair<std::vector<std::string>, std::vector<std::string>> CifarFiles(bool cifar100) {
  if (cifar100) return {{"train.bin"}, {"test.bin"}};
  std::vector<std::string> train;
  for (int i = 1; i <= 5; ++i) train.push_back(absl::StrCat("data_batch_", i, ".bin"));
  return {train, {"test_batch.bin"}};
}

}  // namespace

absl::Status CheckDatasetFiles(const DataSpec& data) {
  auto in_field = [](const absl::Status& st) {
    return st.ok() || absl::StartsWith(st.message(), "data.path")
               ? st
               : absl::Status(st.code(), absl::StrCat("data.path: ", st.message()));
  };
  switch (data.dataset()) {
    case DataSpec::FASHION_MNIST:
    case DataSpec::DATASET_UNSPECIFIED:
    case DataSpec::MNIST: {
      const std::string name = data.dataset() == DataSpec::MNIST ? "mnist" : "fashion_mnist";
      TOPIARY_RETURN_IF_ERROR(CheckFolder(data.path(), IdxHint(name)));
      for (const char* prefix : {"train", "t10k"}) {
        for (const char* kind : {"images", "labels"}) {
          TOPIARY_RETURN_IF_ERROR(in_field(FindFile(data.path(), IdxNames(prefix, kind)).status()));
        }
      }
      return absl::OkStatus();
    }
    case DataSpec::CIFAR10:
    case DataSpec::CIFAR100: {
      TOPIARY_RETURN_IF_ERROR(CheckFolder(data.path(), ""));
      const auto [train, test] = CifarFiles(data.dataset() == DataSpec::CIFAR100);
      for (const auto* files : {&train, &test}) {
        for (const std::string& f : *files) {
          TOPIARY_RETURN_IF_ERROR(in_field(ResolveReadableFile(data.path() + "/" + f).status()));
        }
      }
      return absl::OkStatus();
    }
    case DataSpec::DIGITS:
      return in_field(ResolveReadableFile(data.path()).status());
    case DataSpec::IMAGE_FOLDER:
      return CheckImageFolder(data.path());
    default:
      return absl::OkStatus();
  }
}

void ImageSet::Truncate(int64_t n) {
  if (n <= 0 || n >= size()) return;
  labels.resize(n);
  if (!streamed()) pixels.resize(n * image_bytes());
}

absl::StatusOr<ImageSet> ParseIdxPair(std::string images, const std::string& labels,
                                      const std::string& images_name,
                                      const std::string& labels_name, int classes) {
  TOPIARY_ASSIGN_OR_RETURN(auto idims, ParseIdxHeader(images_name, images, 3));
  TOPIARY_ASSIGN_OR_RETURN(auto ldims, ParseIdxHeader(labels_name, labels, 1));
  if ((idims)[0] != (ldims)[0]) {
    return absl::InvalidArgumentError(
        absl::StrFormat("image/label count mismatch: %s has %d images, %s has %d labels",
                        images_name, (idims)[0], labels_name, (ldims)[0]));
  }
  ImageSet set;
  set.h = static_cast<int>((idims)[1]);
  set.w = static_cast<int>((idims)[2]);
  set.c = 1;
  const size_t n = (idims)[0];
  set.pixels.assign(images.begin() + 16, images.begin() + 16 + n * set.image_bytes());
  images.clear();
  images.shrink_to_fit();
  set.labels.resize(n);
  for (size_t i = 0; i < n; ++i) set.labels[i] = static_cast<uint8_t>(labels[8 + i]);
  if (auto st = CheckLabels(labels_name, set.labels, classes); !st.ok()) return st;
  return set;
}

absl::StatusOr<ImageSet> ReadIdxPair(const std::string& images_path, const std::string& labels_path,
                                     int classes) {
  TOPIARY_ASSIGN_OR_RETURN(auto img, ReadFileMaybeGzip(images_path));
  TOPIARY_ASSIGN_OR_RETURN(auto lab, ReadFileMaybeGzip(labels_path));
  return ParseIdxPair(std::move(img), lab, images_path, labels_path, classes);
}

absl::StatusOr<Dataset> ReadIdxFolder(const std::string& dir, const std::string& name) {
  if (auto st = CheckFolder(dir, IdxHint(name)); !st.ok()) return st;
  Dataset ds;
  ds.name = name;
  ds.classes = 10;
  for (auto [prefix, set] : {std::pair{"train", &ds.train}, std::pair{"t10k", &ds.test}}) {
    const std::string p(prefix);
    TOPIARY_ASSIGN_OR_RETURN(auto images, FindFile(dir, IdxNames(p, "images")));
    TOPIARY_ASSIGN_OR_RETURN(auto labels, FindFile(dir, IdxNames(p, "labels")));
    TOPIARY_ASSIGN_OR_RETURN(auto s, ReadIdxPair(images, labels, ds.classes));
    *set = std::move(s);
  }
  return ds;
}

absl::Status AppendCifarRecords(const std::string& data, const std::string& name, bool cifar100,
                                ImageSet* set) {
  const int label_bytes = cifar100 ? 2 : 1;  // CIFAR-100: coarse, fine
  const size_t record = label_bytes + 3072;
  if (data.empty() || data.size() % record != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: size %d is not a multiple of the %d-byte CIFAR%s record", name,
                        data.size(), record, cifar100 ? "-100" : "-10"));
  }
  const size_t n = data.size() / record;
  const size_t first = set->labels.size();
  set->h = set->w = 32;
  set->c = 3;
  set->labels.resize(first + n);
  set->pixels.resize((first + n) * 3072);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* rec = reinterpret_cast<const uint8_t*>(data.data()) + i * record;
    set->labels[first + i] = rec[label_bytes - 1];
    // Records are planar (1024 R, 1024 G, 1024 B); the engine wants HWC.
    uint8_t* out = set->pixels.data() + (first + i) * 3072;
    for (int p = 0; p < 1024; ++p)
      for (int ch = 0; ch < 3; ++ch) out[p * 3 + ch] = rec[label_bytes + ch * 1024 + p];
  }
  std::vector<int32_t> these(set->labels.begin() + first, set->labels.end());
  return CheckLabels(name, these, cifar100 ? 100 : 10);
}

absl::StatusOr<Dataset> ReadCifarFolder(const std::string& dir, bool cifar100) {
  if (auto st = CheckFolder(dir, ""); !st.ok()) return st;
  Dataset ds;
  ds.name = cifar100 ? "cifar100" : "cifar10";
  ds.classes = cifar100 ? 100 : 10;
  auto [train_files, test_files] = CifarFiles(cifar100);
  for (auto [files, set] : {std::pair{&train_files, &ds.train}, std::pair{&test_files, &ds.test}}) {
    for (const auto& f : *files) {
      const std::string path = dir + "/" + f;
      TOPIARY_ASSIGN_OR_RETURN(auto data, ReadFile(path));
      if (auto st = AppendCifarRecords(data, path, cifar100, set); !st.ok()) return st;
    }
  }
  return ds;
}

absl::StatusOr<Dataset> ReadDigitsCsv(const std::string& path) {
  auto text = ReadFileMaybeGzip(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat("data.path: ", text.status().message()));
  }
  return ParseDigitsCsv(*text, path);
}

absl::StatusOr<Dataset> ParseDigitsCsv(const std::string& text, const std::string& path) {
  Dataset ds;
  ds.name = "digits";
  ds.classes = 10;
  ds.max_value = 16.0f;
  for (ImageSet* s : {&ds.train, &ds.test}) {
    s->h = s->w = 8;
    s->c = 1;
  }
  int row = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    ++row;
    std::vector<absl::string_view> cells = absl::StrSplit(line, ',');
    if (cells.size() != 65) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: line %d has %d values, expected 65 (64 pixels and a label)", path,
                          row, cells.size()));
    }
    ImageSet& set = (row - 1) % 5 == 4 ? ds.test : ds.train;
    for (int i = 0; i < 65; ++i) {
      double v;
      if (!absl::SimpleAtod(cells[i], &v) || !std::isfinite(v) || v < 0 || v > (i < 64 ? 16 : 9) ||
          (i == 64 && v != std::floor(v))) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: line %d, column %d: '%s' is not a %s", path, row, i + 1, cells[i],
                            i < 64 ? "pixel value in 0..16" : "label in 0..9"));
      }
      if (i < 64) {
        set.pixels.push_back(static_cast<uint8_t>(std::lround(v)));
      } else {
        set.labels.push_back(static_cast<int32_t>(v));
      }
    }
  }
  if (ds.test.size() == 0) return absl::InvalidArgumentError(path + ": fewer than 5 rows");
  return ds;
}

Dataset MakeSynthetic(const topiary::v1::SyntheticSpec& spec, uint64_t seed) {
  Philox rng(seed, RngStream::kData);
  Dataset ds;
  ds.name = "synthetic";
  ds.classes = spec.classes();
  const int h = spec.height(), w = spec.width(), c = spec.channels();
  const size_t image = static_cast<size_t>(h) * w * c;
  // Prototypes: a few random blobs per class, so classes differ in spatial structure.
  std::vector<float> protos(ds.classes * image, 0.0f);
  for (int k = 0; k < ds.classes; ++k) {
    for (int blob = 0; blob < 3; ++blob) {
      const float cy = rng.Uniform() * h, cx = rng.Uniform() * w;
      const float radius = 1.0f + rng.Uniform() * std::max(h, w) / 4.0f;
      const int ch = static_cast<int>(rng.Below(c));
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
          const float d2 = (y - cy) * (y - cy) + (x - cx) * (x - cx);
          protos[k * image + (y * w + x) * c + ch] += std::exp(-d2 / (2 * radius * radius));
        }
    }
  }
  auto fill = [&](ImageSet& set, int n) {
    set.h = h;
    set.w = w;
    set.c = c;
    set.pixels.resize(n * image);
    set.labels.resize(n);
    for (int i = 0; i < n; ++i) {
      const int k = static_cast<int>(rng.Below(ds.classes));
      set.labels[i] = k;
      for (size_t p = 0; p < image; ++p) {
        const float v = protos[k * image + p] + spec.noise() * rng.Normal();
        set.pixels[i * image + p] =
            static_cast<uint8_t>(std::clamp(std::lround(v * 127.0f + 64.0f), 0L, 255L));
      }
    }
  };
  fill(ds.train, spec.train_size());
  fill(ds.test, spec.test_size());
  return ds;
}

absl::StatusOr<Dataset> LoadDataset(const DataSpec& data, uint64_t seed) {
  absl::StatusOr<Dataset> ds;
  switch (data.dataset()) {
    case DataSpec::FASHION_MNIST:
    case DataSpec::DATASET_UNSPECIFIED:
      ds = ReadIdxFolder(data.path(), "fashion_mnist");
      break;
    case DataSpec::MNIST:
      ds = ReadIdxFolder(data.path(), "mnist");
      break;
    case DataSpec::CIFAR10:
      ds = ReadCifarFolder(data.path(), false);
      break;
    case DataSpec::CIFAR100:
      ds = ReadCifarFolder(data.path(), true);
      break;
    case DataSpec::DIGITS:
      ds = ReadDigitsCsv(data.path());
      break;
    case DataSpec::SYNTHETIC:
      ds = MakeSynthetic(data.synthetic(), seed);
      break;
    case DataSpec::IMAGE_FOLDER:
      ds = ReadImageFolder(data);
      break;
    default:
      return absl::InvalidArgumentError("data.dataset: unknown dataset");
  }
  if (!ds.ok()) return ds.status();
  ds->train.Truncate(data.train_limit());
  ds->test.Truncate(data.test_limit());
  TOPIARY_RETURN_IF_ERROR(HoldOutValidation(data.validation_fraction(), &*ds));
  return ds;
}

namespace {

// The images of `set` at `index` (ascending), in that order.
ImageSet Subset(const ImageSet& set, const std::vector<int64_t>& index) {
  ImageSet out;  // the shape; not a copy of the images, which may be gigabytes
  out.h = set.h;
  out.w = set.w;
  out.c = set.c;
  out.out_h = set.out_h;
  out.out_w = set.out_w;
  std::shared_ptr<StreamedFiles> files;
  if (set.streamed()) {
    files = std::make_shared<StreamedFiles>();
    files->spec = set.files->spec;
    files->root = set.files->root;
    files->real_root = set.files->real_root;
    files->sample = set.files->sample;
  }
  const size_t bytes = set.image_bytes();
  out.labels.reserve(index.size());
  if (!files) out.pixels.reserve(index.size() * bytes);
  for (const int64_t i : index) {
    out.labels.push_back(set.labels[i]);
    if (files) {
      files->rel.push_back(set.files->rel[i]);
    } else {
      out.pixels.insert(out.pixels.end(), set.pixels.begin() + i * bytes,
                        set.pixels.begin() + (i + 1) * bytes);
    }
  }
  out.files = std::move(files);
  return out;
}

}  // namespace

absl::Status HoldOutValidation(double fraction, Dataset* ds) {
  if (!(fraction >= 0 && fraction <= 0.5)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("data.validation_fraction: %g is not in [0, 0.5]", fraction));
  }
  if (fraction == 0) return absl::OkStatus();
  const ImageSet& train = ds->train;
  std::vector<std::vector<int64_t>> by_class(std::max(ds->classes, 1));
  for (int64_t i = 0; i < train.size(); ++i) {
    const int32_t label = train.labels[i];
    if (label < 0 || label >= ds->classes) {
      return absl::InternalError(absl::StrFormat("training image %d: label %d", i, label));
    }
    by_class[label].push_back(i);
  }
  // A fixed key: the split must not move with spec.seed (see the header).
  Philox rng(0x7661'6c69'6461'7465ull, RngStream::kData);
  std::vector<char> held(train.size(), 0);
  for (size_t c = 0; c < by_class.size(); ++c) {
    std::vector<int64_t>& idx = by_class[c];
    const int64_t take = std::llround(fraction * static_cast<double>(idx.size()));
    if (take > 0 && take >= static_cast<int64_t>(idx.size())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "data.validation_fraction: %g would hold out all %d training images of class %d",
          fraction, idx.size(), c));
    }
    for (int64_t k = 0; k < take; ++k) {  // a partial Fisher-Yates shuffle: the first `take`
      const int64_t j = k + rng.Below(static_cast<uint32_t>(idx.size() - k));
      std::swap(idx[k], idx[j]);
      held[idx[k]] = 1;
    }
  }
  std::vector<int64_t> keep, out;
  for (int64_t i = 0; i < train.size(); ++i) (held[i] ? out : keep).push_back(i);
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("data.validation_fraction: %g of %d training images holds out none",
                        fraction, train.size()));
  }
  ds->validation = Subset(train, out);
  ds->train = Subset(train, keep);
  return absl::OkStatus();
}

}  // namespace topiary

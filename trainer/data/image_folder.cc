#include "trainer/data/image_folder.h"

#include <dirent.h>
#include <png.h>
#include <sys/stat.h>
#include <turbojpeg.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/spec/catalog.h"
#include "trainer/util/file_util.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

using topiary::v1::DataSpec;
using topiary::v1::ImageFolderSpec;

constexpr int kMaxExamples = 10;  // skipped files named in the started event
constexpr uint64_t kMaxImageFileBytes = 256 << 20;
constexpr double kMaxCacheBytes = 32.0 * (1ull << 30);

absl::Status Bad(const std::string& name, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", why));
}

absl::StatusOr<DecodedImage> DecodeJpeg(const std::string& bytes, const std::string& name,
                                        int channels, int64_t max_pixels, int min_side) {
  tjhandle tj = tjInitDecompress();
  if (tj == nullptr) return absl::InternalError("libjpeg-turbo: cannot make a decompressor");
  auto* buf = reinterpret_cast<const unsigned char*>(bytes.data());
  DecodedImage img;
  int subsamp = 0, colorspace = 0;
  absl::Status st;
  if (tjDecompressHeader3(tj, buf, bytes.size(), &img.width, &img.height, &subsamp, &colorspace) !=
      0) {
    st = Bad(name, absl::StrCat("not a readable JPEG (", tjGetErrorStr2(tj), ")"));
  } else if (img.width < 1 || img.height < 1 ||
             static_cast<int64_t>(img.width) * img.height > max_pixels) {
    st = Bad(name, absl::StrFormat("%dx%d pixels (at most %d allowed)", img.width, img.height,
                                   max_pixels));
  } else {
    // libjpeg-turbo scales in the DCT: the smallest of 1/2, 1/4 and 1/8 (its SIMD paths;
    // the other eighths are slower than a full decode) that keeps the shorter side at least
    // min_side decodes fewer pixels and is itself a good area filter.
    int best_w = img.width, best_h = img.height;
    for (int denom : {2, 4, 8}) {
      if (min_side <= 0) break;
      const tjscalingfactor factor = {1, denom};
      const int w = TJSCALED(img.width, factor), h = TJSCALED(img.height, factor);
      if (std::min(w, h) >= min_side && w * static_cast<int64_t>(h) < best_w * int64_t{best_h}) {
        best_w = w;
        best_h = h;
      }
    }
    img.width = best_w;
    img.height = best_h;
    img.channels = channels;
    img.pixels.resize(static_cast<size_t>(img.width) * img.height * channels);
    // Stop at the first warning: a truncated file is an error, not a half-grey image.
    if (tjDecompress2(tj, buf, bytes.size(), img.pixels.data(), img.width, 0, img.height,
                      channels == 3 ? TJPF_RGB : TJPF_GRAY,
                      TJFLAG_STOPONWARNING | TJFLAG_ACCURATEDCT) != 0) {
      st = Bad(name, absl::StrCat("a truncated or corrupt JPEG (", tjGetErrorStr2(tj), ")"));
    }
  }
  tjDestroy(tj);
  if (!st.ok()) return st;
  return img;
}

absl::StatusOr<DecodedImage> DecodePng(const std::string& bytes, const std::string& name,
                                       int channels, int64_t max_pixels) {
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size())) {
    return Bad(name, absl::StrCat("not a readable PNG (", png.message, ")"));
  }
  DecodedImage img;
  img.width = static_cast<int>(std::min<png_uint_32>(png.width, 1u << 30));
  img.height = static_cast<int>(std::min<png_uint_32>(png.height, 1u << 30));
  if (static_cast<int64_t>(png.width) * png.height > max_pixels) {
    png_image_free(&png);
    return Bad(name, absl::StrFormat("%dx%d pixels (at most %d allowed)", png.width, png.height,
                                     max_pixels));
  }
  png.format = channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  img.channels = channels;
  img.pixels.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, img.pixels.data(), 0, nullptr)) {
    return Bad(name, absl::StrCat("a truncated or corrupt PNG (", png.message, ")"));
  }
  return img;
}

bool IsImageName(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (const char* ext : {".jpg", ".jpeg", ".png"}) {
    if (lower.size() > std::strlen(ext) &&
        lower.compare(lower.size() - std::strlen(ext), std::string::npos, ext) == 0) {
      return true;
    }
  }
  return false;
}

// Entries of `dir` (not . and ..), sorted; `dirs` picks folders or the rest.
absl::StatusOr<std::vector<std::string>> List(const std::string& dir, bool dirs) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(errno, "data.path: cannot list " + dir);
  std::vector<std::string> out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (stat((dir + "/" + name).c_str(), &st) != 0) {
      if (!dirs) out.push_back(name);  // a dangling link: reported as a bad file
      continue;
    }
    if (S_ISDIR(st.st_mode) == dirs) out.push_back(name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// The split folder of `root`: its first of `names` that exists.
std::string SplitDir(const std::string& root, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (IsDirectory(root + "/" + n)) return n;
  }
  return "";
}

struct Item {
  std::string rel;  // e.g. "train/cat/x.jpg"
  int label;
};

// One file's fitted pixels, checked as the header says.
absl::StatusOr<std::vector<uint8_t>> LoadOne(const std::string& root, const std::string& real_root,
                                             const Item& item, const ImageFolderSpec& f) {
  TOPIARY_ASSIGN_OR_RETURN(std::string bytes, ReadImageFile(root, real_root, item.rel));
  TOPIARY_ASSIGN_OR_RETURN(DecodedImage img, DecodeImage(bytes, item.rel, f.channels(),
                                                         f.max_image_pixels(), f.image_size()));
  return FitImage(img, f.image_size());
}

// Counts a bad file (SKIP) or returns the error that stops the load (FAIL).
absl::Status Reject(const absl::Status& error, const ImageFolderSpec& f, Dataset* ds) {
  if (f.bad_images() == ImageFolderSpec::FAIL) {
    return absl::Status(error.code(),
                        absl::StrCat("data.path: ", error.message(),
                                     " (data.image_folder.bad_images: SKIP skips such files)"));
  }
  ++ds->skipped;
  if (ds->skipped_examples.size() < kMaxExamples) {
    ds->skipped_examples.push_back(std::string(error.message()));
  }
  return absl::OkStatus();
}

void SetShape(const ImageFolderSpec& f, ImageSet* set) {
  set->h = set->w = f.image_size();
  set->c = f.channels();
  if (f.crop_size() > 0 && f.crop_size() < f.image_size()) set->out_h = set->out_w = f.crop_size();
}

// Decodes `items` into `set` on `threads` threads, in item order; bad files fail or are
// skipped as the spec says.
absl::Status LoadSplit(const std::string& root, const std::string& real_root,
                       const std::vector<Item>& items, const ImageFolderSpec& f, int threads,
                       ImageSet* set, Dataset* ds) {
  const size_t image_bytes = static_cast<size_t>(f.image_size()) * f.image_size() * f.channels();
  std::vector<std::vector<uint8_t>> pixels(items.size());
  const std::vector<absl::Status> errors =
      ForEachFile(items.size(), threads, [&](size_t i) -> absl::Status {
        TOPIARY_ASSIGN_OR_RETURN(pixels[i], LoadOne(root, real_root, items[i], f));
        return absl::OkStatus();
      });
  SetShape(f, set);
  for (size_t i = 0; i < items.size(); ++i) {
    if (!errors[i].ok()) {
      TOPIARY_RETURN_IF_ERROR(Reject(errors[i], f, ds));
      continue;
    }
    set->pixels.insert(set->pixels.end(), pixels[i].begin(), pixels[i].end());
    set->labels.push_back(items[i].label);
    std::vector<uint8_t>().swap(pixels[i]);
  }
  if (set->pixels.size() != set->labels.size() * image_bytes) {
    return absl::InternalError("image folder: inconsistent image sizes");
  }
  return absl::OkStatus();
}

// A file's first bytes: enough for any header but a JPEG's with large metadata before its
// frame (then the whole file).
constexpr size_t kHeaderBytes = 64 << 10;

// Where image file `rel` under `root` really is, checked: inside `real_root` once links are
// followed, and within the read policy. Errors name `rel`.
absl::StatusOr<std::string> ResolveImageFile(const std::string& root, const std::string& real_root,
                                             const std::string& rel) {
  auto real = ResolveReadableFile(root + "/" + rel, kMaxImageFileBytes);
  if (!real.ok()) return Bad(rel, std::string(real.status().message()));
  if (!IsInsideFolder(*real, real_root)) {
    return Bad(rel, "a link leading out of data.path (to " + *real + ")");
  }
  return real;
}

absl::Status CheckHeader(const std::string& root, const std::string& real_root, const Item& item,
                         const ImageFolderSpec& f) {
  TOPIARY_ASSIGN_OR_RETURN(const std::string real, ResolveImageFile(root, real_root, item.rel));
  auto read = ReadFileHead(real, kHeaderBytes, kMaxImageFileBytes);
  if (!read.ok()) return Bad(item.rel, std::string(read.status().message()));
  std::string head = std::move(*read);
  auto size = ReadImageSize(head, item.rel, f.max_image_pixels());
  if (!size.ok() && head.size() == kHeaderBytes) {
    TOPIARY_ASSIGN_OR_RETURN(head, ReadImageFile(root, real_root, item.rel));
    size = ReadImageSize(head, item.rel, f.max_image_pixels());
  }
  return size.status();
}

// Pipeline STREAM: checks every file's header (bad files fail or are skipped), keeps the
// names, and decodes a sample for the normalization statistics.
absl::Status ListSplit(const std::string& root, const std::string& real_root,
                       const std::vector<Item>& items, const ImageFolderSpec& f, int threads,
                       ImageSet* set, Dataset* ds) {
  const std::vector<absl::Status> errors = ForEachFile(
      items.size(), threads, [&](size_t i) { return CheckHeader(root, real_root, items[i], f); });
  SetShape(f, set);
  auto files = std::make_shared<StreamedFiles>();
  files->spec = f;
  files->root = root;
  files->real_root = real_root;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!errors[i].ok()) {
      TOPIARY_RETURN_IF_ERROR(Reject(errors[i], f, ds));
      continue;
    }
    files->rel.push_back(items[i].rel);
    set->labels.push_back(items[i].label);
  }
  // The sample: evenly spaced images at a small size (files that fail to decode left out).
  // At most image_size: no upscaling, and a small set's sample is exactly the cache's pixels.
  const int kSize = std::min(StreamedFiles::kStatsSampleSize, f.image_size());
  const size_t n = std::min<size_t>(files->rel.size(), StreamedFiles::kStatsSampleImages);
  std::vector<std::vector<uint8_t>> sample(n);
  ForEachFile(n, threads, [&](size_t i) -> absl::Status {
    const std::string& rel = files->rel[i * files->rel.size() / n];
    TOPIARY_ASSIGN_OR_RETURN(std::string bytes, ReadImageFile(root, real_root, rel));
    TOPIARY_ASSIGN_OR_RETURN(DecodedImage img,
                             DecodeImage(bytes, rel, f.channels(), f.max_image_pixels(), kSize));
    sample[i] = FitImage(img, kSize);
    return absl::OkStatus();
  });
  for (const auto& px : sample) files->sample.insert(files->sample.end(), px.begin(), px.end());
  set->files = std::move(files);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadImageFile(const std::string& root, const std::string& real_root,
                                          const std::string& rel) {
  TOPIARY_ASSIGN_OR_RETURN(const std::string real, ResolveImageFile(root, real_root, rel));
  auto bytes = ReadFile(real, kMaxImageFileBytes);
  if (!bytes.ok()) return Bad(rel, std::string(bytes.status().message()));
  return bytes;
}

absl::StatusOr<std::pair<int, int>> ReadImageSize(const std::string& bytes, const std::string& name,
                                                  int64_t max_pixels) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  int64_t width = 0, height = 0;
  if (bytes.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) {
    tjhandle tj = tjInitDecompress();
    if (tj == nullptr) return absl::InternalError("libjpeg-turbo: cannot make a decompressor");
    int w = 0, h = 0, subsamp = 0, colorspace = 0;
    const int rc = tjDecompressHeader3(tj, b, bytes.size(), &w, &h, &subsamp, &colorspace);
    tjDestroy(tj);
    if (rc != 0) return Bad(name, "not a readable JPEG");
    width = w;
    height = h;
  } else if (bytes.size() >= 24 && std::memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0 &&
             std::memcmp(b + 12, "IHDR", 4) == 0) {
    // IHDR comes first: width and height as big-endian 32-bit numbers.
    for (int i = 0; i < 4; ++i) {
      width = width << 8 | b[16 + i];
      height = height << 8 | b[20 + i];
    }
  } else {
    return Bad(name, "not a JPEG or PNG image");
  }
  // Each side bounded first: two 32-bit PNG sides would overflow the product.
  if (width < 1 || height < 1 || width > max_pixels || height > max_pixels ||
      width * height > max_pixels) {
    return Bad(name,
               absl::StrFormat("%dx%d pixels (at most %d allowed)", width, height, max_pixels));
  }
  return std::make_pair(static_cast<int>(width), static_cast<int>(height));
}

absl::StatusOr<DecodedImage> DecodeImage(const std::string& bytes, const std::string& name,
                                         int channels, int64_t max_pixels, int min_side) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) {
    return DecodeJpeg(bytes, name, channels, max_pixels, min_side);
  }
  if (bytes.size() >= 8 && std::memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0) {
    return DecodePng(bytes, name, channels, max_pixels);
  }
  return Bad(name, "not a JPEG or PNG image");
}

namespace {

// One output pixel's source pixels along an axis and their weights (summing to 1).
struct Taps {
  int first = 0;
  std::vector<float> w;
};

// For `out` outputs cropped from a `src`-long axis scaled by `scale` (starting `offset`
// scaled pixels in): area averaging when shrinking, bilinear with centres aligned when growing.
std::vector<Taps> AxisTaps(int src, int out, double scale, double offset) {
  std::vector<Taps> taps(out);
  for (int o = 0; o < out; ++o) {
    Taps& t = taps[o];
    if (scale < 1) {
      const double a = (o + offset) / scale, b = (o + 1 + offset) / scale;
      t.first = std::clamp(static_cast<int>(a), 0, src - 1);
      const int last = std::clamp(static_cast<int>(std::ceil(b)) - 1, t.first, src - 1);
      double sum = 0;
      for (int i = t.first; i <= last; ++i) {
        const double w = std::max(0.0, std::min<double>(i + 1, b) - std::max<double>(i, a));
        t.w.push_back(static_cast<float>(w));
        sum += w;
      }
      for (float& w : t.w) w = sum > 0 ? static_cast<float>(w / sum) : 1.0f / t.w.size();
    } else {
      const double p = std::clamp((o + 0.5 + offset) / scale - 0.5, 0.0, src - 1.0);
      t.first = static_cast<int>(p);
      const float f = static_cast<float>(p - t.first);
      t.w = {1 - f};
      if (t.first + 1 < src) t.w.push_back(f);
    }
  }
  return taps;
}

}  // namespace

std::vector<uint8_t> FitImage(const DecodedImage& img, int size) {
  const int c = img.channels;
  if (img.width == size && img.height == size) return img.pixels;
  const double scale = static_cast<double>(size) / std::min(img.width, img.height);
  // The resized image is (width * scale) x (height * scale); the crop starts at its centre
  // minus size / 2, in resized pixels. Separable: rows first, whole source rows at a time
  // (contiguous and vectorized), then columns of the size rows left.
  const auto rows = AxisTaps(img.height, size, scale, (img.height * scale - size) / 2);
  const auto cols = AxisTaps(img.width, size, scale, (img.width * scale - size) / 2);
  // Only the source columns the crop reads go through the first pass: its buffer and time
  // follow the output (and the shorter side), however long the other side is.
  int col0 = img.width, col1 = 0;
  for (const Taps& t : cols) {
    col0 = std::min(col0, t.first);
    col1 = std::max(col1, t.first + static_cast<int>(t.w.size()) - 1);
  }
  const int row_len = (col1 - col0 + 1) * c;
  std::vector<float> tmp(static_cast<size_t>(size) * row_len, 0.0f);
  for (int y = 0; y < size; ++y) {
    float* dst = tmp.data() + static_cast<size_t>(y) * row_len;
    const Taps& t = rows[y];
    for (size_t j = 0; j < t.w.size(); ++j) {
      const uint8_t* src = img.pixels.data() + (static_cast<size_t>(t.first) + j) * img.width * c +
                           static_cast<size_t>(col0) * c;
      const float w = t.w[j];
#pragma omp simd
      for (int i = 0; i < row_len; ++i) dst[i] += w * src[i];
    }
  }
  std::vector<uint8_t> out(static_cast<size_t>(size) * size * c);
  for (int y = 0; y < size; ++y) {
    const float* src = tmp.data() + static_cast<size_t>(y) * row_len;
    uint8_t* dst = out.data() + static_cast<size_t>(y) * size * c;
    for (int x = 0; x < size; ++x) {
      const Taps& t = cols[x];
      for (int k = 0; k < c; ++k) {
        float v = 0;
        for (size_t j = 0; j < t.w.size(); ++j) v += t.w[j] * src[(t.first - col0 + j) * c + k];
        // Weights are >= 0: round half up without a libm call per pixel.
        dst[x * c + k] = static_cast<uint8_t>(std::min(v + 0.5f, 255.0f));
      }
    }
  }
  return out;
}

absl::Status CheckImageFolder(const std::string& path) {
  if (!IsDirectory(path)) return absl::NotFoundError("data.path: no folder " + path);
  if (SplitDir(path, {"train"}).empty()) {
    return absl::NotFoundError("data.path: " + path +
                               " has no train/ folder (class folders go there)");
  }
  if (SplitDir(path, {"val", "test"}).empty()) {
    return absl::NotFoundError("data.path: " + path + " has no val/ or test/ folder");
  }
  return absl::OkStatus();
}

absl::StatusOr<Dataset> ReadImageFolder(const DataSpec& data) {
  const std::string& root = data.path();
  TOPIARY_RETURN_IF_ERROR(CheckImageFolder(root));
  char* real = realpath(root.c_str(), nullptr);
  if (real == nullptr) return ErrnoStatus(errno, "data.path: " + root);
  const std::string real_root = real;
  free(real);
  const ImageFolderSpec& f = data.image_folder();
  Dataset ds;
  ds.name = "image_folder";
  TOPIARY_ASSIGN_OR_RETURN(std::vector<std::string> classes, List(root + "/train", true));
  if (classes.empty())
    return absl::InvalidArgumentError("data.path: " + root + "/train has no class folders");
  if (classes.size() > static_cast<size_t>(kMaxClasses)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("data.path: %s/train has %d class folders; a network has at most %d "
                        "classes",
                        root, classes.size(), kMaxClasses));
  }
  ds.classes = static_cast<int>(classes.size());
  const std::string test_dir = SplitDir(root, {"val", "test"});
  std::vector<Item> splits[2];
  for (int s = 0; s < 2; ++s) {
    const std::string split = s == 0 ? "train" : test_dir;
    TOPIARY_ASSIGN_OR_RETURN(std::vector<std::string> dirs, List(root + "/" + split, true));
    for (const std::string& cls : dirs) {
      const auto label = std::lower_bound(classes.begin(), classes.end(), cls);
      if (label == classes.end() || *label != cls) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.path: ", split, "/", cls, " is a class train/ does not have"));
      }
      TOPIARY_ASSIGN_OR_RETURN(std::vector<std::string> files,
                               List(root + "/" + split + "/" + cls, false));
      int images = 0;
      for (const std::string& file : files) {
        if (!IsImageName(file)) continue;
        splits[s].push_back(
            {split + "/" + cls + "/" + file, static_cast<int>(label - classes.begin())});
        ++images;
      }
      if (images == 0 && s == 0) {
        return absl::InvalidArgumentError(absl::StrCat("data.path: the class folder ", split, "/",
                                                       cls, " has no .jpg, .jpeg or .png files"));
      }
    }
  }
  // Before decoding: the cache must fit.
  const double bytes = f.pipeline() == ImageFolderSpec::STREAM
                           ? 0
                           : static_cast<double>(splits[0].size() + splits[1].size()) *
                                 f.image_size() * f.image_size() * f.channels();
  if (bytes > kMaxCacheBytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "data.image_folder.image_size: %d images of %dx%dx%d need %.1f GiB in memory (at most "
        "32)",
        splits[0].size() + splits[1].size(), f.image_size(), f.image_size(), f.channels(),
        bytes / (1ull << 30)));
  }
  const int threads = f.decode_threads() > 0 ? f.decode_threads()
                                             : std::max(1u, std::thread::hardware_concurrency());
  const auto load = f.pipeline() == ImageFolderSpec::STREAM ? ListSplit : LoadSplit;
  TOPIARY_RETURN_IF_ERROR(load(root, real_root, splits[0], f, threads, &ds.train, &ds));
  TOPIARY_RETURN_IF_ERROR(load(root, real_root, splits[1], f, threads, &ds.test, &ds));
  return ds;
}

}  // namespace topiary

// IMAGE_FOLDER datasets: class-per-folder trees of JPEG and PNG files (path/train/<class>/,
// path/val/<class>/ or path/test/<class>/). Pipeline CACHE decodes them once into memory (an
// ImageSet of image_size x image_size bytes per image), on CPU threads; pipeline STREAM checks
// their headers and keeps their names (StreamedFiles), and batches read and decode them every
// epoch (trainer/data/image_stream.h).
//
// Every file is checked before it is decoded: it must stay inside data.path once links are
// followed and pass the process's read policy (regular file, size); its header's
// dimensions must be positive and at most max_image_pixels before any pixel memory is
// allocated. A bad file stops the load naming it (bad_images: FAIL) or is skipped and
// counted (SKIP). A class folder with no images is an error naming it.
#ifndef TOPIARY_TRAINER_DATA_IMAGE_FOLDER_H_
#define TOPIARY_TRAINER_DATA_IMAGE_FOLDER_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/data/dataset.h"

namespace topiary {

// IMAGE_FOLDER with pipeline STREAM: one split's files, read and decoded every epoch.
struct StreamedFiles {
  topiary::v1::ImageFolderSpec spec;
  std::string root, real_root;   // data.path, and with links resolved: reads stay inside it
  std::vector<std::string> rel;  // per image (as ImageSet::labels), e.g. "train/cat/x.jpg"
  // A sample of the split's images (up to kStatsSampleImages, fitted like the cache's images
  // to min(kStatsSampleSize, image_size) px), for the per-channel normalization statistics.
  std::vector<uint8_t> sample;
  static constexpr int kStatsSampleImages = 256, kStatsSampleSize = 64;
};

// Runs fn(i) for i in [0, n) on up to `threads` threads (files read and decoded in parallel);
// returns each call's status, in index order.
template <typename Fn>
std::vector<absl::Status> ForEachFile(size_t n, int threads, Fn fn) {
  std::vector<absl::Status> errors(n);
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (size_t t = 0; t < std::min<size_t>(threads, n); ++t) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) errors[i] = fn(i);
    });
  }
  for (auto& th : pool) th.join();
  return errors;
}

// The bytes of image file `rel` under `root`, checked as at load time: it must stay inside
// `real_root` once links are followed and pass the read policy. Errors name `rel`.
absl::StatusOr<std::string> ReadImageFile(const std::string& root, const std::string& real_root,
                                          const std::string& rel);

// A decoded image: rows of width * channels bytes (channels 1 or 3).
struct DecodedImage {
  int width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;
};

// JPEG or PNG (found by content, not by name) into `channels` (1: grayscale, 3: RGB);
// `name` names the file in errors. Images over `max_pixels` are refused from the header.
// min_side > 0: a JPEG may be decoded scaled down (libjpeg-turbo's DCT scaling, 1/8 steps)
// as far as its shorter side stays >= min_side.
absl::StatusOr<DecodedImage> DecodeImage(const std::string& bytes, const std::string& name,
                                         int channels, int64_t max_pixels, int min_side = 0);

// Width and height from a JPEG's or PNG's header (bytes may stop after the header); images
// over `max_pixels` are refused.
absl::StatusOr<std::pair<int, int>> ReadImageSize(const std::string& bytes, const std::string& name,
                                                  int64_t max_pixels);

// The shorter side resized to `size` (area averaging when shrinking, bilinear when
// growing), then the center size x size square.
std::vector<uint8_t> FitImage(const DecodedImage& image, int size);

// The dataset `data` names (REQUIRES: dataset IMAGE_FOLDER, defaults filled in). Skipped
// files (bad_images: SKIP) are counted in Dataset::skipped, the first few named.
absl::StatusOr<Dataset> ReadImageFolder(const topiary::v1::DataSpec& data);

// Whether the folder's train/ and val/ (or test/) exist, without reading images.
absl::Status CheckImageFolder(const std::string& path);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DATA_IMAGE_FOLDER_H_

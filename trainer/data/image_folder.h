// IMAGE_FOLDER datasets: class-per-folder trees of JPEG and PNG files (path/train/<class>/,
// path/val/<class>/ or path/test/<class>/), decoded once into memory (the decoded-image
// cache: an ImageSet of image_size x image_size bytes per image), on CPU threads.
//
// Every file is checked before it is decoded: it must stay inside data.path once links are
// followed and pass the process's read policy (regular file, size); its header's
// dimensions must be positive and at most max_image_pixels before any pixel memory is
// allocated. A bad file stops the load naming it (bad_images: FAIL) or is skipped and
// counted (SKIP). A class folder with no images is an error naming it.
#ifndef TOPIARY_TRAINER_DATA_IMAGE_FOLDER_H_
#define TOPIARY_TRAINER_DATA_IMAGE_FOLDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/data/dataset.h"

namespace topiary {

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

// Test support: JPEG and PNG encoding (libjpeg-turbo, libpng) for image-folder tests and
// tools, and the Fashion-MNIST IDX files as such folders.
#ifndef TOPIARY_TESTS_TOOLS_IMAGE_FILES_H_
#define TOPIARY_TESTS_TOOLS_IMAGE_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace topiary::testing {

// `pixels`: rows of width * channels bytes (channels 1 or 3). Empty on failure.
std::string EncodePng(const std::vector<uint8_t>& pixels, int width, int height, int channels);
std::string EncodeJpeg(const std::vector<uint8_t>& pixels, int width, int height, int channels,
                       int quality);

}  // namespace topiary::testing

#endif  // TOPIARY_TESTS_TOOLS_IMAGE_FILES_H_

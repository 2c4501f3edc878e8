// Image-folder input speed: writes N JPEGs of an ImageNet-like size (default 500x375, smooth
// content with noise, quality 90) into a class-per-folder tree, then times ReadImageFolder
// decoding and resizing them to `size` (shorter side, centre crop) on all cores. The figure is
// what the CPU decoders (libjpeg-turbo) deliver per second: the rate a training run's input
// pipeline can feed, to compare with the model's images per second.
//   image_decode_bench [--images N] [--size S] [--width W --height H] [--threads T] [--dir D]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "tests/tools/image_files.h"
#include "trainer/data/image_folder.h"
#include "trainer/util/file_util.h"

int main(int argc, char** argv) {
  using namespace topiary;
  int images = 4096, size = 224, width = 500, height = 375, threads = 0;
  std::string dir = "/tmp/topiary_decode_bench";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    int* target = flag == "--images"    ? &images
                  : flag == "--size"    ? &size
                  : flag == "--width"   ? &width
                  : flag == "--height"  ? &height
                  : flag == "--threads" ? &threads
                                        : nullptr;
    if (flag == "--dir") {
      dir = value;
    } else if (target == nullptr || !absl::SimpleAtoi(value, target)) {
      std::fprintf(stderr, "image_decode_bench: bad flag %s %s\n", flag.c_str(), value.c_str());
      return 2;
    }
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> noise(0, 12);
  std::string file_bytes;
  size_t total_bytes = 0;
  for (int i = 0; i < images; ++i) {
    const std::string split = i % 8 == 7 ? "val" : "train";
    const std::string cls = absl::StrFormat("c%02d", i % 10);
    std::vector<uint8_t> px(static_cast<size_t>(width) * height * 3);
    const float fx = 0.01f + (i % 13) * 0.003f, fy = 0.02f + (i % 7) * 0.002f;
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < width; ++x)
        for (int c = 0; c < 3; ++c) {
          const float v = 128 + 90 * std::sin(fx * x + c) * std::cos(fy * y) + noise(rng);
          px[(static_cast<size_t>(y) * width + x) * 3 + c] =
              static_cast<uint8_t>(std::clamp(v, 0.0f, 255.0f));
        }
    const std::string bytes = testing::EncodeJpeg(px, width, height, 3, 90);
    total_bytes += bytes.size();
    const std::string folder = dir + "/" + split + "/" + cls;
    if (!MakeDirs(folder).ok() ||
        !WriteFileAtomic(absl::StrFormat("%s/%06d.jpg", folder, i), bytes).ok()) {
      std::fprintf(stderr, "image_decode_bench: cannot write into %s\n", dir.c_str());
      return 1;
    }
  }
  topiary::v1::DataSpec spec;
  spec.set_dataset(topiary::v1::DataSpec::IMAGE_FOLDER);
  spec.set_path(dir);
  auto* f = spec.mutable_image_folder();
  f->set_image_size(size);
  f->set_channels(3);
  f->set_max_image_pixels(int64_t{1} << 26);
  f->set_decode_threads(threads);
  const auto start = std::chrono::steady_clock::now();
  auto ds = ReadImageFolder(spec);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!ds.ok()) {
    std::fprintf(stderr, "%s\n", std::string(ds.status().message()).c_str());
    return 1;
  }
  const int used = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  std::printf(
      "{\"images\":%d,\"source\":\"%dx%d JPEG q90, %.1f KB mean\",\"size\":%d,\"threads\":%d,"
      "\"seconds\":%.3f,\"images_per_s\":%.0f,\"images_per_s_per_thread\":%.0f}\n",
      images, width, height, total_bytes / 1024.0 / images, size, used, s, images / s,
      images / s / used);
  return 0;
}

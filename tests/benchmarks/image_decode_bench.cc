// Image-folder input speed: writes N JPEGs of an ImageNet-like size (default 500x375, smooth
// content with noise, quality 90) into a class-per-folder tree, then times one of the two
// pipelines on them:
//   --pipeline cache   ReadImageFolder decoding every image once and resizing it to `size`
//                      (shorter side, centre crop) on all cores: what the CPU decoders
//                      (libjpeg-turbo) deliver per second.
//   --pipeline stream  the streaming pipeline a training run uses (StreamBatches): batches of
//                      `batch` random-resized crops of `crop` px with flips, read and decoded
//                      every epoch (nvJPEG on a GPU unless --decoder cpu) a few batches ahead,
//                      normalized into float batches on the device; `epochs` epochs, the
//                      first with a cold reader.
// The figure to compare with a model's training rate (images per second).
//   image_decode_bench [--images N] [--size S] [--width W --height H] [--threads T] [--dir D]
//                      [--pipeline cache|stream] [--decoder auto|cpu|gpu] [--batch B]
//                      [--crop C] [--epochs E] [--prefetch P] [--cpu]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "tests/tools/image_files.h"
#include "trainer/core/device.h"
#include "trainer/data/batcher.h"
#include "trainer/data/device_batches.h"
#include "trainer/data/image_folder.h"
#include "trainer/util/file_util.h"

namespace topiary {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Writes `images` JPEGs (every eighth into val/) on all cores; returns their total bytes.
size_t WriteImages(const std::string& dir, int images, int width, int height) {
  std::atomic<size_t> total{0};
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < std::max(1u, std::thread::hardware_concurrency()); ++t) {
    pool.emplace_back([&] {
      for (int i = next++; i < images; i = next++) {
        std::mt19937 rng(i);
        std::normal_distribution<float> noise(0, 12);
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
        total += bytes.size();
        const std::string folder = dir + "/" + split + "/" + cls;
        if (!MakeDirs(folder).ok() ||
            !WriteFileAtomic(absl::StrFormat("%s/%06d.jpg", folder, i), bytes).ok()) {
          failed = true;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  return failed ? 0 : total.load();
}

// The streaming pipeline's rate over `epochs` epochs of the train split.
int BenchStream(const topiary::v1::DataSpec& spec, int batch, int epochs, bool cpu,
                const std::string& source) {
  auto start = std::chrono::steady_clock::now();
  auto ds = ReadImageFolder(spec);
  if (!ds.ok()) {
    std::fprintf(stderr, "%s\n", std::string(ds.status().message()).c_str());
    return 1;
  }
  const double list_s = SecondsSince(start);
  std::unique_ptr<Device> device;
  if (!cpu) {
    auto gpu = MakeCudaDevice(0);
    if (gpu.ok()) device = std::move(*gpu);
  }
  if (device == nullptr) device = MakeCpuDevice(0);
  topiary::v1::Augment augment;
  augment.set_random_resized_crop(true);
  augment.set_horizontal_flip(true);
  const Normalization norm = ComputeNormalization(ds->train, ds->max_value, true);
  Batcher batcher(&ds->train, ds->max_value, norm, augment, 1);
  auto data = DeviceBatches::Create(&batcher, device.get());
  if (!data.ok()) {
    std::fprintf(stderr, "%s\n", std::string(data.status().message()).c_str());
    return 1;
  }
  const ImageSet& set = ds->train;
  const size_t pixels = static_cast<size_t>(batch) * set.batch_h() * set.batch_w() * set.c;
  auto x = Buffer<float>::Create(device.get(), pixels);
  auto labels = Buffer<int32_t>::Create(device.get(), batch);
  if (!x.ok() || !labels.ok()) return 1;
  const int steps = static_cast<int>(set.size() / batch);
  std::vector<double> rates;
  for (int e = 0; e < epochs; ++e) {
    if (!data->SetOrder(batcher.EpochOrder(e)).ok()) return 1;
    start = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) {
      const absl::Status st = data->Assemble(nullptr, e, static_cast<int64_t>(s) * batch, batch,
                                             true, x->data(), labels->data());
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.ToString().c_str());
        return 1;
      }
    }
    if (!device->Synchronize().ok()) return 1;
    rates.push_back(steps * batch / SecondsSince(start));
  }
  std::string per_epoch;
  for (double r : rates) per_epoch += absl::StrFormat("%s%.0f", per_epoch.empty() ? "" : ",", r);
  std::printf(
      "{\"pipeline\":\"stream\",\"images\":%d,\"source\":\"%s\",\"crop\":%d,\"batch\":%d,"
      "\"device\":\"%s\",\"decoder\":\"%s\",\"header_check_s\":%.3f,"
      "\"images_per_s_by_epoch\":[%s]}\n",
      static_cast<int>(set.size()), source.c_str(), set.batch_h(), batch, device->name().c_str(),
      data->decoder().c_str(), list_s, per_epoch.c_str());
  return 0;
}

}  // namespace
}  // namespace topiary

int main(int argc, char** argv) {
  using namespace topiary;
  int images = 4096, size = 224, width = 500, height = 375, threads = 0;
  int batch = 256, crop = 224, epochs = 2, prefetch = 3;
  bool cpu = false;
  std::string dir = "/tmp/topiary_decode_bench", pipeline = "cache", decoder = "auto";
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--cpu") {  // the CPU device even where a GPU is
      cpu = true;
      --i;
      continue;
    }
    const std::string value = i + 1 < argc ? argv[i + 1] : "";
    int* target = flag == "--images"     ? &images
                  : flag == "--size"     ? &size
                  : flag == "--width"    ? &width
                  : flag == "--height"   ? &height
                  : flag == "--threads"  ? &threads
                  : flag == "--batch"    ? &batch
                  : flag == "--crop"     ? &crop
                  : flag == "--epochs"   ? &epochs
                  : flag == "--prefetch" ? &prefetch
                                         : nullptr;
    if (flag == "--dir") {
      dir = value;
    } else if (flag == "--pipeline" && (value == "cache" || value == "stream")) {
      pipeline = value;
    } else if (flag == "--decoder" && (value == "auto" || value == "cpu" || value == "gpu")) {
      decoder = value;
    } else if (target == nullptr || !absl::SimpleAtoi(value, target)) {
      std::fprintf(stderr, "image_decode_bench: bad flag %s %s\n", flag.c_str(), value.c_str());
      return 2;
    }
  }
  const size_t total_bytes = WriteImages(dir, images, width, height);
  if (total_bytes == 0) {
    std::fprintf(stderr, "image_decode_bench: cannot write into %s\n", dir.c_str());
    return 1;
  }
  const std::string source =
      absl::StrFormat("%dx%d JPEG q90, %.1f KB mean", width, height, total_bytes / 1024.0 / images);
  topiary::v1::DataSpec spec;
  spec.set_dataset(topiary::v1::DataSpec::IMAGE_FOLDER);
  spec.set_path(dir);
  auto* f = spec.mutable_image_folder();
  f->set_image_size(size);
  f->set_channels(3);
  f->set_max_image_pixels(int64_t{1} << 26);
  f->set_decode_threads(threads);
  if (pipeline == "stream") {
    f->set_pipeline(topiary::v1::ImageFolderSpec::STREAM);
    f->set_crop_size(crop);
    f->set_prefetch_batches(prefetch);
    f->set_decoder(decoder == "cpu"   ? topiary::v1::ImageFolderSpec::CPU
                   : decoder == "gpu" ? topiary::v1::ImageFolderSpec::GPU
                                      : topiary::v1::ImageFolderSpec::AUTO);
    return BenchStream(spec, batch, epochs, cpu, source);
  }
  const auto start = std::chrono::steady_clock::now();
  auto ds = ReadImageFolder(spec);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!ds.ok()) {
    std::fprintf(stderr, "%s\n", std::string(ds.status().message()).c_str());
    return 1;
  }
  const int used = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  std::printf(
      "{\"pipeline\":\"cache\",\"images\":%d,\"source\":\"%s\",\"size\":%d,\"threads\":%d,"
      "\"seconds\":%.3f,\"images_per_s\":%.0f,\"images_per_s_per_thread\":%.0f}\n",
      images, source.c_str(), size, used, s, images / s, images / s / used);
  return 0;
}

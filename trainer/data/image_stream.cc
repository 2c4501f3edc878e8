#include "trainer/data/image_stream.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/image/augment_impl.h"
#include "trainer/data/image_folder.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

using topiary::v1::ImageFolderSpec;

// fn(i) for i in [0, n) on the reading threads; the first error wins.
template <typename Fn>
absl::Status ParallelFor(int n, int threads, Fn fn) {
  for (const absl::Status& e : ForEachFile(n, threads, fn)) TOPIARY_RETURN_IF_ERROR(e);
  return absl::OkStatus();
}

// Evaluation's box: the shorter side resized to image_size, then the centre crop x crop.
kernels::CropBox CentreBox(int width, int height, int image_size, int crop) {
  kernels::CropBox b;
  const int side = std::max(
      1, static_cast<int>(static_cast<int64_t>(std::min(width, height)) * crop / image_size));
  b.w = std::min(side, width);
  b.h = std::min(side, height);
  b.x0 = (width - b.w) / 2;
  b.y0 = (height - b.h) / 2;
  return b;
}

}  // namespace

ImageStream::ImageStream(const Batcher* batcher, int threads)
    : batcher_(batcher),
      set_(&batcher->set()),
      threads_(threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency())) {}

absl::Status ImageStream::Failed(const absl::Status& error, StreamedImage* image) {
  if (set_->files->spec.bad_images() == ImageFolderSpec::FAIL) {
    return absl::Status(error.code(),
                        absl::StrCat("data.path: ", error.message(),
                                     " (data.image_folder.bad_images: SKIP skips such files)"));
  }
  image->bad = true;
  if (skipped_++ < 10) std::fprintf(stderr, "topiary: skipped %s\n", error.ToString().c_str());
  return absl::OkStatus();
}

absl::Status ImageStream::Read(const std::vector<int32_t>& order, int epoch, int64_t first,
                               int count, bool augment, std::vector<StreamedImage>* images,
                               const std::function<bool(const StreamedImage&)>& gpu_takes) {
  const StreamedFiles& files = *set_->files;
  const kernels::AssembleParams base = batcher_->Params(epoch, first, count, augment);
  images->assign(count, StreamedImage{});
  return ParallelFor(count, threads_, [&](int i) -> absl::Status {
    StreamedImage& img = (*images)[i];
    const int32_t idx = order[first + i];
    img.name = &files.rel[idx];
    img.label = set_->labels[idx];
    img.out_index = i;
    auto bytes = ReadImageFile(files.root, files.real_root, *img.name);
    auto size = bytes.ok() ? ReadImageSize(*bytes, *img.name, files.spec.max_image_pixels())
                           : absl::StatusOr<std::pair<int, int>>(bytes.status());
    if (!size.ok()) return Failed(size.status(), &img);
    img.bytes = std::move(*bytes);
    img.width = size->first;
    img.height = size->second;
    kernels::AssembleParams p = base;
    p.h = img.height;
    p.w = img.width;
    const kernels::Placement pl = kernels::DrawPlacement(p, first + i);
    img.box = CentreBox(img.width, img.height, set_->h, out_h());
    if (augment && p.random_resized_crop) img.box = {pl.x0, pl.y0, pl.cw, pl.ch, false};
    img.box.flip = pl.flip;
    img.gpu = gpu_takes != nullptr && gpu_takes(img);
    return absl::OkStatus();
  });
}

kernels::CropBox ImageStream::ScaledBox(const StreamedImage& image, int width, int height) {
  kernels::CropBox b = image.box;
  if (width == image.width && height == image.height) return b;
  b.x0 = static_cast<int>(static_cast<int64_t>(b.x0) * width / image.width);
  b.y0 = static_cast<int>(static_cast<int64_t>(b.y0) * height / image.height);
  b.w = std::clamp(static_cast<int>(static_cast<int64_t>(b.w) * width / image.width), 1,
                   width - b.x0);
  b.h = std::clamp(static_cast<int>(static_cast<int64_t>(b.h) * height / image.height), 1,
                   height - b.y0);
  return b;
}

absl::Status ImageStream::Decode(const std::vector<StreamedImage*>& images, uint8_t* out) {
  const StreamedFiles& files = *set_->files;
  return ParallelFor(static_cast<int>(images.size()), threads_, [&](int i) -> absl::Status {
    StreamedImage& img = *images[i];
    // A JPEG may decode scaled down (1/2, 1/4, 1/8) while its box stays >= the batch size.
    const int box_side = std::max(1, std::min(img.box.w, img.box.h));
    const int min_side = static_cast<int>(
        (static_cast<int64_t>(std::min(img.width, img.height)) * out_h() + box_side - 1) /
        box_side);
    auto decoded =
        DecodeImage(img.bytes, *img.name, channels(), files.spec.max_image_pixels(), min_side);
    if (!decoded.ok()) return Failed(decoded.status(), &img);
    kernels::ResizeJob job;
    job.pixels = decoded->pixels.data();
    job.width = decoded->width;
    job.height = decoded->height;
    job.stride = decoded->width * channels();
    job.box = ScaledBox(img, decoded->width, decoded->height);
    job.out_index = img.out_index;
    kernels::CropResizeCpu(job, channels(), out_h(), out_w(), out);
    return absl::OkStatus();
  });
}

}  // namespace topiary

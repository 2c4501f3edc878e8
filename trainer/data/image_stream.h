// Batches of a streamed image set (IMAGE_FOLDER pipeline STREAM): each image's file is read,
// its crop box drawn from its full-size dimensions (training: a random-resized crop when the
// spec asks for one, else the centre crop evaluation takes: the shorter side resized to
// image_size, the centre crop_size square), and it is decoded and scaled into the batch by the
// antialiased filter of kernels/image/resize.h. The draws are the cached pipeline's (position j of
// the epoch's order, kernels/image/augment_impl.h), so any batch can be rebuilt on its own.
// Decoding here is on CPU threads; trainer/data/stream_batches.h sends JPEGs to nvJPEG instead.
#ifndef TOPIARY_TRAINER_DATA_IMAGE_STREAM_H_
#define TOPIARY_TRAINER_DATA_IMAGE_STREAM_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/image/resize.h"
#include "trainer/data/batcher.h"

namespace topiary {

struct StreamedImage {
  std::string bytes;                  // the file
  const std::string* name = nullptr;  // its path under data.path, for errors
  int width = 0, height = 0;          // full size, from the header
  kernels::CropBox box;               // in full-size pixels
  int out_index = 0;                  // its row in the batch
  int32_t label = 0;
  bool bad = false;  // could not be read (bad_images: SKIP): its row stays black
  bool gpu = false;  // the GPU decoder takes it (Read's gpu_takes)
};

class ImageStream {
 public:
  // REQUIRES: batcher->set().streamed(); the batcher outlives this. threads 0: every core.
  ImageStream(const Batcher* batcher, int threads);

  int out_h() const { return set_->batch_h(); }
  int out_w() const { return set_->batch_w(); }
  int channels() const { return set_->c; }
  int threads() const { return threads_; }
  // Files that could not be read or decoded while streaming and were left black (SKIP).
  int64_t skipped() const { return skipped_.load(); }

  // Reads the files of images order[first, first + count) and draws their boxes. A file that
  // fails is an error naming it (bad_images: FAIL) or marked bad (SKIP). gpu_takes (when
  // given) marks the images a GPU decoder takes, on the same threads.
  absl::Status Read(const std::vector<int32_t>& order, int epoch, int64_t first, int count,
                    bool augment, std::vector<StreamedImage>* images,
                    const std::function<bool(const StreamedImage&)>& gpu_takes = nullptr);

  // Decodes `images` (not bad) on the CPU threads into out ([*, out_h, out_w, c], host), each
  // at its out_index. REQUIRES: out zeroed where bad images go.
  absl::Status Decode(const std::vector<StreamedImage*>& images, uint8_t* out);

  // One image's box mapped onto a decoded image of width x height (a scaled JPEG decode).
  static kernels::CropBox ScaledBox(const StreamedImage& image, int width, int height);

 private:
  // A file that failed: the error that stops the run (FAIL), or OK after counting it (SKIP).
  absl::Status Failed(const absl::Status& error, StreamedImage* image);

  const Batcher* batcher_;
  const ImageSet* set_;
  int threads_;
  std::atomic<int64_t> skipped_{0};
};

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DATA_IMAGE_STREAM_H_

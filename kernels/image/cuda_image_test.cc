// CUDA kernels of batch assembly and crop-and-resize against their CPU twins, over the shared
// fixture of kernels/cuda_test_util.h.
#include "kernels/cuda_test_util.h"
#include "kernels/image/augment.h"
#include "kernels/image/resize.h"

namespace topiary::kernels {
namespace {

using namespace testing;  // NOLINT: the shared fixture and helpers (cuda_test_util.h)

// Batch assembly: the GPU builds the CPU's batches bit for bit, with zero-padded crops and
// flips, with random-resized crops into smaller images, and with the evaluation centre crop.
TEST_F(CudaKernels, AssembleBatchMatchesCpuBitForBit) {
  const int n = 37, h = 19, w = 23, c = 3;
  std::vector<uint8_t> pixels(static_cast<size_t>(n) * h * w * c);
  for (size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  std::vector<int32_t> labels(n), order(n);
  for (int i = 0; i < n; ++i) {
    labels[i] = i % 10;
    order[i] = (i * 7) % n;
  }
  std::vector<float> lut(c * 256);
  for (size_t i = 0; i < lut.size(); ++i) lut[i] = static_cast<float>(i % 256) * 0.01f - 1.0f;
  Dev<uint8_t> dpix(pixels);
  Dev<int32_t> dlab(labels), dord(order);
  Dev<float> dlut(lut);
  for (int mode = 0; mode < 3; ++mode) {
    SCOPED_TRACE(mode);
    AssembleParams p;
    p.h = h;
    p.w = w;
    p.c = c;
    p.count = 20;
    p.first = 5;
    p.epoch = 3;
    p.augment = mode < 2;
    p.horizontal_flip = true;
    p.crop_padding = mode == 0 ? 3 : 0;
    p.random_resized_crop = mode == 1;
    if (mode > 0) p.out_h = p.out_w = 11;
    p.key0 = 12345;
    p.key1 = 678;
    const size_t out = static_cast<size_t>(p.count) * p.oh() * p.ow() * c;
    Dev<float> dx(out);
    Dev<int32_t> dl(p.count);
    ASSERT_TRUE(AssembleBatchCuda(p, nullptr, dpix.get(), dlab.get(), dord.get(), dlut.get(),
                                  dx.get(), dl.get(), ctx_)
                    .ok());
    std::vector<float> x(out);
    std::vector<int32_t> bl(p.count);
    AssembleBatchCpu(p, pixels.data(), labels.data(), order.data(), lut.data(), x.data(),
                     bl.data());
    Sync();
    EXPECT_EQ(dx.Host(), x);
    EXPECT_EQ(dl.Host(), bl);
  }
}

// The streamed pipeline's crop-and-resize: the CUDA kernel writes the CPU's bytes (integer
// filter), for images of several sizes, boxes, flips and scales in one launch.
TEST_F(CudaKernels, CropResizeMatchesCpuBitForBit) {
  const int c = 3, oh = 29, ow = 23;
  const int sizes[][2] = {{500, 375}, {31, 29}, {7, 640}, {224, 224}};
  std::vector<std::vector<uint8_t>> images;
  std::vector<std::unique_ptr<Dev<uint8_t>>> dimages;
  std::vector<ResizeJob> jobs, djobs;
  for (int i = 0; i < 4; ++i) {
    const int w = sizes[i][0], h = sizes[i][1];
    images.emplace_back(static_cast<size_t>(w) * h * c);
    for (size_t j = 0; j < images[i].size(); ++j)
      images[i][j] = static_cast<uint8_t>((j + i) * 2654435761u >> 24);
    dimages.push_back(std::make_unique<Dev<uint8_t>>(images[i]));
    ResizeJob job;
    job.width = w;
    job.height = h;
    job.stride = w * c;
    job.box = {w / 5, h / 7, std::max(1, w / 2 + i), std::max(1, h / 3), i % 2 == 1};
    job.out_index = 3 - i;
    job.pixels = images[i].data();
    jobs.push_back(job);
    job.pixels = dimages[i]->get();
    djobs.push_back(job);
  }
  std::vector<uint8_t> out(4 * oh * ow * c);
  for (const ResizeJob& job : jobs) CropResizeCpu(job, c, oh, ow, out.data());
  std::vector<uint8_t> jobs_bytes(djobs.size() * sizeof(ResizeJob));
  std::memcpy(jobs_bytes.data(), djobs.data(), jobs_bytes.size());
  Dev<uint8_t> djob_mem(jobs_bytes), dout(out.size());
  ASSERT_TRUE(CropResizeCuda(reinterpret_cast<const ResizeJob*>(djob_mem.get()), 4, c, oh, ow,
                             dout.get(), ctx_)
                  .ok());
  Sync();
  EXPECT_EQ(dout.Host(), out);
}

}  // namespace
}  // namespace topiary::kernels

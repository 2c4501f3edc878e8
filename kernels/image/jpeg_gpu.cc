#include "kernels/image/jpeg_gpu.h"

#include <dlfcn.h>
#include <nvjpeg.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/runtime/cuda_context.h"
#include "util/status_macros.h"

namespace topiary::kernels {
namespace {

// The nvJPEG entry points used, resolved from the library once per process.
struct NvjpegApi {
#define TOPIARY_NVJPEG_FN(name) decltype(&::name) name = nullptr;
  TOPIARY_NVJPEG_FN(nvjpegCreateEx)
  TOPIARY_NVJPEG_FN(nvjpegDestroy)
  TOPIARY_NVJPEG_FN(nvjpegJpegStateCreate)
  TOPIARY_NVJPEG_FN(nvjpegJpegStateDestroy)
  TOPIARY_NVJPEG_FN(nvjpegGetImageInfo)
  TOPIARY_NVJPEG_FN(nvjpegDecodeBatchedInitialize)
  TOPIARY_NVJPEG_FN(nvjpegDecodeBatched)
  TOPIARY_NVJPEG_FN(nvjpegJpegStreamCreate)
  TOPIARY_NVJPEG_FN(nvjpegJpegStreamDestroy)
  TOPIARY_NVJPEG_FN(nvjpegJpegStreamParseHeader)
  TOPIARY_NVJPEG_FN(nvjpegDecodeBatchedSupported)
#undef TOPIARY_NVJPEG_FN
  std::string error;  // why the library is unusable; empty when loaded
};

const NvjpegApi& Api() {
  static const NvjpegApi* api = [] {
    auto* a = new NvjpegApi;
    const char* env = std::getenv("TOPIARY_NVJPEG_LIBRARY");
    const std::string lib = env != nullptr && *env != '\0' ? env : "libnvjpeg.so.13";
    void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      a->error = absl::StrCat("cannot load ", lib, " (", dlerror(),
                              "; pip install nvidia-nvjpeg, then add its nvidia/cu13/lib to "
                              "LD_LIBRARY_PATH or name the file in TOPIARY_NVJPEG_LIBRARY)");
      return a;
    }
    auto resolve = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (fn == nullptr && a->error.empty()) a->error = absl::StrCat(lib, " lacks ", name);
    };
#define TOPIARY_NVJPEG_RESOLVE(name) resolve(a->name, #name);
    TOPIARY_NVJPEG_RESOLVE(nvjpegCreateEx)
    TOPIARY_NVJPEG_RESOLVE(nvjpegDestroy)
    TOPIARY_NVJPEG_RESOLVE(nvjpegJpegStateCreate)
    TOPIARY_NVJPEG_RESOLVE(nvjpegJpegStateDestroy)
    TOPIARY_NVJPEG_RESOLVE(nvjpegGetImageInfo)
    TOPIARY_NVJPEG_RESOLVE(nvjpegDecodeBatchedInitialize)
    TOPIARY_NVJPEG_RESOLVE(nvjpegDecodeBatched)
    TOPIARY_NVJPEG_RESOLVE(nvjpegJpegStreamCreate)
    TOPIARY_NVJPEG_RESOLVE(nvjpegJpegStreamDestroy)
    TOPIARY_NVJPEG_RESOLVE(nvjpegJpegStreamParseHeader)
    TOPIARY_NVJPEG_RESOLVE(nvjpegDecodeBatchedSupported)
#undef TOPIARY_NVJPEG_RESOLVE
    return a;
  }();
  return *api;
}

absl::Status NvjpegStatus(nvjpegStatus_t st, const char* what) {
  if (st == NVJPEG_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("nvJPEG: ", what, " failed (status ", st, ")"));
}

}  // namespace

struct GpuJpegDecoder::Impl {
  const NvjpegApi* api = nullptr;
  nvjpegHandle_t handle = nullptr;
  nvjpegJpegState_t state = nullptr;
  std::string backend;
  int channels = 3;
  int batch = -1;  // the size DecodeBatchedInitialize was last called with
  // Header parsers for Supports(), which the reading threads call at once: one each, reused.
  std::mutex parse_mu;
  std::vector<nvjpegJpegStream_t> parsers;
  ~Impl() {
    for (nvjpegJpegStream_t p : parsers) api->nvjpegJpegStreamDestroy(p);
    if (state != nullptr) api->nvjpegJpegStateDestroy(state);
    if (handle != nullptr) api->nvjpegDestroy(handle);
  }
};

GpuJpegDecoder::GpuJpegDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuJpegDecoder::~GpuJpegDecoder() = default;

const std::string& GpuJpegDecoder::backend() const { return impl_->backend; }

absl::StatusOr<std::unique_ptr<GpuJpegDecoder>> GpuJpegDecoder::Create(int channels) {
  const NvjpegApi& api = Api();
  if (!api.error.empty()) return absl::FailedPreconditionError("nvJPEG: " + api.error);
  auto impl = std::make_unique<Impl>();
  impl->api = &api;
  impl->channels = channels;
  // The JPEG engines where the GPU has them; CUDA cores (with CPU Huffman decoding) elsewhere.
  if (api.nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, 0, &impl->handle) ==
      NVJPEG_STATUS_SUCCESS) {
    impl->backend = "hardware";
  } else {
    impl->handle = nullptr;
    absl::Status st = NvjpegStatus(
        api.nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, 0, &impl->handle), "create");
    if (!st.ok()) return absl::FailedPreconditionError(st.message());
    impl->backend = "cuda";
  }
  TOPIARY_RETURN_IF_ERROR(
      NvjpegStatus(api.nvjpegJpegStateCreate(impl->handle, &impl->state), "state"));
  return std::unique_ptr<GpuJpegDecoder>(new GpuJpegDecoder(std::move(impl)));
}

bool GpuJpegDecoder::Supports(const uint8_t* data, size_t size, int* width, int* height) {
  const NvjpegApi& api = *impl_->api;
  int components = 0;
  nvjpegChromaSubsampling_t subsampling;
  int widths[NVJPEG_MAX_COMPONENT], heights[NVJPEG_MAX_COMPONENT];
  if (api.nvjpegGetImageInfo(impl_->handle, data, size, &components, &subsampling, widths,
                             heights) != NVJPEG_STATUS_SUCCESS ||
      (components != 1 && components != 3) || widths[0] < 1 || heights[0] < 1) {
    return false;
  }
  *width = widths[0];
  *height = heights[0];
  if (impl_->backend != "hardware") return true;
  // The engines decode baseline, single-scan JPEGs of most subsamplings: ask.
  nvjpegJpegStream_t parser = nullptr;
  {
    std::lock_guard<std::mutex> lock(impl_->parse_mu);
    if (!impl_->parsers.empty()) {
      parser = impl_->parsers.back();
      impl_->parsers.pop_back();
    }
  }
  if (parser == nullptr &&
      api.nvjpegJpegStreamCreate(impl_->handle, &parser) != NVJPEG_STATUS_SUCCESS) {
    return false;
  }
  int unsupported = 1;
  const bool ok =
      api.nvjpegJpegStreamParseHeader(impl_->handle, data, size, parser) == NVJPEG_STATUS_SUCCESS &&
      api.nvjpegDecodeBatchedSupported(impl_->handle, parser, &unsupported) ==
          NVJPEG_STATUS_SUCCESS &&
      unsupported == 0;
  std::lock_guard<std::mutex> lock(impl_->parse_mu);
  impl_->parsers.push_back(parser);
  return ok;
}

absl::Status GpuJpegDecoder::Decode(const std::vector<const uint8_t*>& data,
                                    const std::vector<size_t>& sizes,
                                    const std::vector<int>& widths,
                                    const std::vector<uint8_t*>& out, const CudaContext& ctx) {
  const NvjpegApi& api = *impl_->api;
  const int n = static_cast<int>(data.size());
  if (n == 0) return absl::OkStatus();
  const nvjpegOutputFormat_t format = impl_->channels == 3 ? NVJPEG_OUTPUT_RGBI : NVJPEG_OUTPUT_Y;
  if (n != impl_->batch) {  // the batch size is part of the state
    absl::Status st = NvjpegStatus(
        api.nvjpegDecodeBatchedInitialize(impl_->handle, impl_->state, n, 1, format), "init");
    if (!st.ok()) return st;
    impl_->batch = n;
  }
  std::vector<nvjpegImage_t> images(n);
  for (int i = 0; i < n; ++i) {
    images[i] = nvjpegImage_t{};
    images[i].channel[0] = out[i];
    images[i].pitch[0] = static_cast<size_t>(widths[i]) * impl_->channels;
  }
  absl::Status st = NvjpegStatus(api.nvjpegDecodeBatched(impl_->handle, impl_->state, data.data(),
                                                         sizes.data(), images.data(), ctx.stream),
                                 "batched decode");
  if (!st.ok()) impl_->batch = -1;  // a failed batch leaves the state to be initialized again
  return st;
}

}  // namespace topiary::kernels

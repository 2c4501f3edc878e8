#include "kernels/conv/conv_onednn.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace topiary::kernels {

using dnnl::memory;
using Tag = memory::format_tag;

namespace {

// A primitive with its arguments, bound once; the user's pointers are set per call.
struct Bound {
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;
  void Run(dnnl::stream& s) { prim.execute(s, args); }
};

// A reorder between the user's filter layout and a primitive's, or nothing when they match.
struct FilterCopy {
  memory dst;
  std::unique_ptr<Bound> reorder;  // null: the primitive reads the user's memory directly
};

FilterCopy MakeFilterCopy(const memory& user, const memory::desc& wanted, const dnnl::engine& eng,
                          bool to_user) {
  FilterCopy f;
  if (wanted == user.get_desc()) {
    f.dst = user;
    return f;
  }
  f.dst = memory(wanted, eng);
  f.reorder = std::make_unique<Bound>();
  const memory& from = to_user ? f.dst : user;
  const memory& to = to_user ? user : f.dst;
  f.reorder->prim = dnnl::reorder(from, to);
  f.reorder->args = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
  return f;
}

// Moves `pd` past the implementations whose name starts with `prefix`, where oneDNN offers
// another (it always ends with a reference implementation).
template <typename PrimitiveDesc>
void SkipImplementations(PrimitiveDesc* pd, const std::string& prefix) {
  while (std::string(pd->impl_info_str()).rfind(prefix, 0) == 0) {
    if (!pd->next_impl()) return;
  }
}

}  // namespace

struct ConvOneDnnPlan::Impl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  // The user's operands (handles set per call).
  memory x, y, w, bias, dx, dy, dw, dbias;
  std::vector<float> zero_bias, dbias_sink;  // when the layer has no bias
  FilterCopy w_fwd, w_bwd, dw_out;
  Bound fwd, bwd_data, bwd_filter;
  memory scratch[3];
  std::string names[3];
};

bool ConvOneDnnPlan::Enabled() {
  const char* env = std::getenv("TOPIARY_CPU_CONV");
  return env == nullptr || std::strcmp(env, "reference") != 0;
}

absl::StatusOr<std::unique_ptr<ConvOneDnnPlan>> ConvOneDnnPlan::Create(const ConvShape& s) {
  if (auto st = CheckConvShape(s); !st.ok()) return st;
  std::unique_ptr<ConvOneDnnPlan> plan(new ConvOneDnnPlan());
  try {
    plan->impl_ = std::make_unique<Impl>();
    Impl& m = *plan->impl_;
    const auto f32 = memory::data_type::f32;
    const memory::dims x_dims = {s.n, s.c, s.h, s.w}, y_dims = {s.n, s.k, s.ho(), s.wo()},
                       w_dims = {s.k, s.c, s.r, s.s}, b_dims = {s.k};
    const memory::dims strides = {s.stride_h, s.stride_w}, pad = {s.pad_h, s.pad_w};
    // The bottom/right padding that makes oneDNN's output size ours (the last window may stop
    // short of the padded edge, as in cuDNN and PyTorch).
    const memory::dims pad_r = {(s.ho() - 1) * s.stride_h + s.r - s.h - s.pad_h,
                                (s.wo() - 1) * s.stride_w + s.s - s.w - s.pad_w};
    const memory::desc x_md(x_dims, f32, Tag::nhwc), y_md(y_dims, f32, Tag::nhwc),
        w_user_md(w_dims, f32, Tag::ohwi), b_md(b_dims, f32, Tag::a), w_any(w_dims, f32, Tag::any);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);

    const dnnl::convolution_forward::desc fd(dnnl::prop_kind::forward_training,
                                             dnnl::algorithm::convolution_direct, x_md, w_any, b_md,
                                             y_md, strides, pad, pad_r);
    const dnnl::convolution_forward::primitive_desc fpd(fd, attr, m.eng);
    const dnnl::convolution_backward_data::desc bd(dnnl::algorithm::convolution_direct, x_md, w_any,
                                                   y_md, strides, pad, pad_r);
    dnnl::convolution_backward_data::primitive_desc bpd(bd, attr, m.eng, fpd);
    const dnnl::convolution_backward_weights::desc wd(dnnl::algorithm::convolution_direct, x_md,
                                                      w_any, b_md, y_md, strides, pad, pad_r);
    dnnl::convolution_backward_weights::primitive_desc wpd(wd, attr, m.eng, fpd);
    // oneDNN 2.6's jit_1x1 backward kernels on strided 1x1 convolutions ("reduce to unit
    // stride") overrun their buffers for some shapes on AVX-512 machines (resnet20 at width
    // 0.75, batch 33: 28x28x12 -> 24, stride 2 corrupted the heap and killed topiaryd; the
    // shape is in conv_test). Strided 1x1 layers are shortcuts, a sliver of the work: they
    // take the next implementation oneDNN offers.
    if (s.r == 1 && s.s == 1 && (s.stride_h > 1 || s.stride_w > 1)) {
      SkipImplementations(&bpd, "jit_1x1");
      SkipImplementations(&wpd, "jit_1x1");
    }

    m.x = memory(x_md, m.eng, nullptr);
    m.y = memory(y_md, m.eng, nullptr);
    m.dx = memory(x_md, m.eng, nullptr);
    m.dy = memory(y_md, m.eng, nullptr);
    m.w = memory(w_user_md, m.eng, nullptr);
    m.dw = memory(w_user_md, m.eng, nullptr);
    m.bias = memory(b_md, m.eng, nullptr);
    m.dbias = memory(b_md, m.eng, nullptr);
    m.zero_bias.assign(s.k, 0.0f);
    m.dbias_sink.assign(s.k, 0.0f);
    m.w_fwd = MakeFilterCopy(m.w, fpd.weights_desc(), m.eng, false);
    m.w_bwd = MakeFilterCopy(m.w, bpd.weights_desc(), m.eng, false);
    m.dw_out = MakeFilterCopy(m.dw, wpd.diff_weights_desc(), m.eng, true);
    m.scratch[0] = memory(fpd.scratchpad_desc(), m.eng);
    m.scratch[1] = memory(bpd.scratchpad_desc(), m.eng);
    m.scratch[2] = memory(wpd.scratchpad_desc(), m.eng);

    m.fwd.prim = dnnl::convolution_forward(fpd);
    m.fwd.args = {{DNNL_ARG_SRC, m.x},
                  {DNNL_ARG_WEIGHTS, m.w_fwd.dst},
                  {DNNL_ARG_BIAS, m.bias},
                  {DNNL_ARG_DST, m.y},
                  {DNNL_ARG_SCRATCHPAD, m.scratch[0]}};
    m.bwd_data.prim = dnnl::convolution_backward_data(bpd);
    m.bwd_data.args = {{DNNL_ARG_DIFF_DST, m.dy},
                       {DNNL_ARG_WEIGHTS, m.w_bwd.dst},
                       {DNNL_ARG_DIFF_SRC, m.dx},
                       {DNNL_ARG_SCRATCHPAD, m.scratch[1]}};
    m.bwd_filter.prim = dnnl::convolution_backward_weights(wpd);
    m.bwd_filter.args = {{DNNL_ARG_SRC, m.x},
                         {DNNL_ARG_DIFF_DST, m.dy},
                         {DNNL_ARG_DIFF_WEIGHTS, m.dw_out.dst},
                         {DNNL_ARG_DIFF_BIAS, m.dbias},
                         {DNNL_ARG_SCRATCHPAD, m.scratch[2]}};
    m.names[0] = fpd.impl_info_str();
    m.names[1] = bpd.impl_info_str();
    m.names[2] = wpd.impl_info_str();
  } catch (const dnnl::error& e) {
    return absl::InternalError(
        absl::StrFormat("oneDNN convolution [%d,%d,%d,%d] * [%d,%d,%d,%d] stride %d pad %d: %s",
                        s.n, s.h, s.w, s.c, s.k, s.r, s.s, s.c, s.stride_h, s.pad_h, e.what()));
  }
  return plan;
}

ConvOneDnnPlan::~ConvOneDnnPlan() = default;

namespace {

// Runs f, turning oneDNN's exceptions into a status naming the pass.
template <typename F>
absl::Status Guarded(const char* pass, F f) {
  try {
    f();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN convolution ", pass, ": ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ConvOneDnnPlan::Forward(const float* x, const float* w, const float* bias, float* y) {
  Impl& m = *impl_;
  return Guarded("forward", [&] {
    m.x.set_data_handle(const_cast<float*>(x));
    m.w.set_data_handle(const_cast<float*>(w));
    m.bias.set_data_handle(const_cast<float*>(bias != nullptr ? bias : m.zero_bias.data()));
    m.y.set_data_handle(y);
    if (m.w_fwd.reorder) m.w_fwd.reorder->Run(m.stream);
    m.fwd.Run(m.stream);
    m.stream.wait();
  });
}

absl::Status ConvOneDnnPlan::BackwardData(const float* dy, const float* w, float* dx) {
  Impl& m = *impl_;
  return Guarded("backward data", [&] {
    m.dy.set_data_handle(const_cast<float*>(dy));
    m.w.set_data_handle(const_cast<float*>(w));
    m.dx.set_data_handle(dx);
    if (m.w_bwd.reorder) m.w_bwd.reorder->Run(m.stream);
    m.bwd_data.Run(m.stream);
    m.stream.wait();
  });
}

absl::Status ConvOneDnnPlan::BackwardFilter(const float* x, const float* dy, float* dw,
                                            float* dbias) {
  Impl& m = *impl_;
  return Guarded("backward filter", [&] {
    m.x.set_data_handle(const_cast<float*>(x));
    m.dy.set_data_handle(const_cast<float*>(dy));
    m.dw.set_data_handle(dw);
    m.dbias.set_data_handle(dbias != nullptr ? dbias : m.dbias_sink.data());
    m.bwd_filter.Run(m.stream);
    if (m.dw_out.reorder) m.dw_out.reorder->Run(m.stream);
    m.stream.wait();
  });
}

std::string ConvOneDnnPlan::implementations() const {
  return absl::StrCat(impl_->names[0], " / ", impl_->names[1], " / ", impl_->names[2]);
}

}  // namespace topiary::kernels

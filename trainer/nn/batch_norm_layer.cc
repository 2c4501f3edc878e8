#include "trainer/nn/init.h"
#include "trainer/nn/layers.h"
#include "util/status_macros.h"

namespace topiary {

namespace {

// The moments of the input that the convolution writing it computed (LayerIo::moments), or
// null: the batch norm reads its input for them.
const kernels::BatchNormMoments* GivenMoments(const LayerIo& io) {
  return io.moments != nullptr && io.moments->slices > 0 ? io.moments : nullptr;
}

}  // namespace

kernels::BatchNormShape BatchNorm2d::ShapeFor(int batch) const {
  kernels::BatchNormShape s;
  s.m = static_cast<int64_t>(batch) * in_.h * in_.w;
  s.c = in_.c;
  s.relu = relu_;
  s.eps = eps_;
  return s;
}

absl::StatusOr<Shape4> BatchNorm2d::Setup(const std::vector<Shape4>& inputs, Device* device) {
  if (inputs.size() != 1) return absl::InvalidArgumentError(name() + ": takes one input");
  in_ = inputs[0];
  const std::vector<int> shape = {in_.c};
  for (auto [role, slot, trainable] :
       {std::tuple{ParamRole::kGamma, &gamma_, true}, std::tuple{ParamRole::kBeta, &beta_, true},
        std::tuple{ParamRole::kRunningMean, &mean_, false},
        std::tuple{ParamRole::kRunningVar, &var_, false}}) {
    TOPIARY_ASSIGN_OR_RETURN(auto p, AddParameter(device, role, shape, trainable, false));
    *slot = p;
  }
  return in_;
}

void BatchNorm2d::Initialize(Philox& rng) {
  FillConstant(gamma_, 1.0f);
  FillConstant(beta_, 0.0f);
  FillConstant(mean_, 0.0f);
  FillConstant(var_, 1.0f);
}

void BatchNorm2d::Describe(topiary::v1::LayerNode* node) const {
  Layer::Describe(node);
  node->set_relu(relu_);
  node->set_epsilon(eps_);
}

absl::StatusOr<LayerResources> BatchNorm2d::Prepare(int batch, Device* device,
                                                    const PlanOptions& options) {
  LayerResources r;
  // Saved mean and inverse std; on a GPU also the scale and shift, for the ReLU's mask.
  r.scratch_floats = (device->cuda() != nullptr ? 4 : 2) * static_cast<size_t>(in_.c);
  r.workspace_bytes =
      (device->cuda() != nullptr
           ? kernels::BatchNormWorkspaceFloatsCuda(ShapeFor(batch), options.batch_norm_ranks)
           : kernels::BatchNormWorkspaceFloatsCpu(ShapeFor(batch))) *
      sizeof(float);
  return r;
}

absl::Status BatchNorm2d::Forward(const LayerIo& io, bool training) {
  const kernels::BatchNormShape s = ShapeFor(io.batch);
  float* save_mean = io.scratch;
  float* save_inv_std = io.scratch + in_.c;
  if (io.cuda) {
    if (!training) {
      return kernels::BatchNormForwardEvalCuda(io.dtype, s, io.x[0], gamma_->value.data(),
                                               beta_->value.data(), mean_->value.data(),
                                               var_->value.data(), io.y, *io.cuda);
    }
    return kernels::BatchNormForwardTrainCuda(
        io.dtype, s, io.x[0], gamma_->value.data(), beta_->value.data(), mean_->value.data(),
        var_->value.data(), save_mean, save_inv_std, io.scratch + 2 * in_.c, io.y,
        static_cast<float*>(io.workspace), *io.cuda, io.batch_norm_sync, GivenMoments(io));
  }
  if (training) {
    return kernels::BatchNormForwardTrainCpu(s, io.xf(0), gamma_->value.data(), beta_->value.data(),
                                             mean_->value.data(), var_->value.data(), save_mean,
                                             save_inv_std, io.yf(),
                                             static_cast<float*>(io.workspace), io.batch_norm_sync);
  } else {
    kernels::BatchNormForwardEvalCpu(s, io.xf(0), gamma_->value.data(), beta_->value.data(),
                                     mean_->value.data(), var_->value.data(), io.yf(),
                                     static_cast<float*>(io.workspace));
  }
  return absl::OkStatus();
}

absl::Status BatchNorm2d::Backward(const LayerIo& io) {
  const kernels::BatchNormShape s = ShapeFor(io.batch);
  if (io.cuda) {
    return kernels::BatchNormBackwardCuda(
        io.dtype, s, io.x[0], io.dy, gamma_->value.data(), io.scratch, io.scratch + in_.c,
        io.scratch + 2 * in_.c, io.dx[0], gamma_->grad.data(), beta_->grad.data(),
        static_cast<float*>(io.workspace), *io.cuda, io.batch_norm_sync);
  }
  return kernels::BatchNormBackwardCpu(s, io.xf(0), io.yf(), io.dyf(), gamma_->value.data(),
                                       io.scratch, io.scratch + in_.c, io.dxf(0),
                                       gamma_->grad.data(), beta_->grad.data(),
                                       static_cast<float*>(io.workspace), io.batch_norm_sync);
}

absl::Status BatchNorm2d::ForwardFolded(const LayerIo& io, bool training, float* scale_shift) {
  if (io.cuda == nullptr || relu_) {
    return absl::InternalError(name() + ": only a GPU batch norm without ReLU folds");
  }
  const kernels::BatchNormShape s = ShapeFor(io.batch);
  if (!training) {
    return kernels::BatchNormFoldEvalCuda(s, gamma_->value.data(), beta_->value.data(),
                                          mean_->value.data(), var_->value.data(), scale_shift,
                                          *io.cuda);
  }
  return kernels::BatchNormForwardTrainCuda(
      io.dtype, s, io.x[0], gamma_->value.data(), beta_->value.data(), mean_->value.data(),
      var_->value.data(), io.scratch, io.scratch + in_.c, scale_shift, nullptr,
      static_cast<float*>(io.workspace), *io.cuda, io.batch_norm_sync, GivenMoments(io));
}

kernels::FoldedBatchNorm BatchNorm2d::Folded(const LayerIo& io, const float* scale_shift) const {
  kernels::FoldedBatchNorm f;
  f.x = io.x[0];
  f.scale_shift = scale_shift;
  f.gamma = gamma_->value.data();
  f.save_mean = io.scratch;
  f.save_inv_std = io.scratch + in_.c;
  f.dx = io.dx.empty() ? nullptr : io.dx[0];
  f.dgamma = gamma_->grad.empty() ? nullptr : gamma_->grad.data();
  f.dbeta = beta_->grad.empty() ? nullptr : beta_->grad.data();
  return f;
}

}  // namespace topiary

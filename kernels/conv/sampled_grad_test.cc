// Sampled weight gradients against float64 references on random inputs and awkward shapes:
// keeping every position must give the exact filter gradient; any top_k must give the
// method's formula (selection, ratio, scale, mask) evaluated in double precision.
#include "kernels/conv/sampled_grad.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/test_util.h"

namespace topiary::kernels {
namespace {

using testing::MakeConv;
using testing::RandomFloats;
using testing::RelError;

// The formula of sampled_grad.h in double precision, written from its definition (a stable
// sort of positions by magnitude rather than the kernel's partial sort).
struct Reference {
  std::vector<double> dw, dbias;
};
Reference SampledReference(const ConvShape& s, int top_k, double scale, const std::vector<float>& x,
                           const std::vector<float>& dy, const std::vector<uint8_t>& mask) {
  const int count = s.ho() * s.wo();
  const int kk = std::min(top_k, count);
  Reference ref{std::vector<double>(static_cast<size_t>(s.k) * s.patch(), 0.0),
                std::vector<double>(s.k, 0.0)};
  for (int n = 0; n < s.n; ++n) {
    for (int k = 0; k < s.k; ++k) {
      auto g = [&](int p) {
        return static_cast<double>(dy[(static_cast<size_t>(n) * count + p) * s.k + k]);
      };
      std::vector<int> order(count);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return std::abs(g(a)) > std::abs(g(b)); });
      double sum = 0.0, kept = 0.0, kept_abs = 0.0;
      for (int p = 0; p < count; ++p) sum += g(p);
      for (int t = 0; t < kk; ++t) kept += g(order[t]), kept_abs += std::abs(g(order[t]));
      const bool ratio = kk < count && kept != 0.0 && std::abs(kept) >= 0.5 * kept_abs;
      const double r = ratio ? sum / kept : 1.0;
      ref.dbias[k] += sum;
      for (int t = 0; t < kk; ++t) {
        const int p = order[t];
        const double weight = r * g(p);
        for (int i = 0; i < s.r; ++i) {
          for (int j = 0; j < s.s; ++j) {
            const int h = (p / s.wo()) * s.stride_h - s.pad_h + i;
            const int w = (p % s.wo()) * s.stride_w - s.pad_w + j;
            if (h < 0 || h >= s.h || w < 0 || w >= s.w) continue;
            for (int c = 0; c < s.c; ++c) {
              ref.dw[((static_cast<size_t>(k) * s.r + i) * s.s + j) * s.c + c] +=
                  weight * x[((static_cast<size_t>(n) * s.h + h) * s.w + w) * s.c + c];
            }
          }
        }
      }
    }
  }
  for (size_t e = 0; e < ref.dw.size(); ++e) {
    ref.dw[e] = !mask.empty() && mask[e] == 0 ? 0.0 : scale * ref.dw[e];
  }
  return ref;
}

struct Result {
  std::vector<float> dw, dbias;
};
Result Sampled(const ConvShape& s, int top_k, float scale, const std::vector<float>& x,
               const std::vector<float>& dy, const std::vector<uint8_t>& mask = {}) {
  EXPECT_TRUE(CheckSampledWeightGradShape(s, top_k).ok());
  Result out{std::vector<float>(static_cast<size_t>(s.k) * s.patch(), -7.0f),
             std::vector<float>(s.k, -7.0f)};
  std::vector<unsigned char> ws(SampledWeightGradWorkspaceBytesCpu(s, top_k));
  SampledWeightGradCpu(s, WeightGradSampling{top_k, scale}, x.data(), dy.data(),
                       mask.empty() ? nullptr : mask.data(), out.dw.data(), out.dbias.data(),
                       ws.data());
  return out;
}

std::vector<float> Dy(const ConvShape& s, uint32_t seed) {
  return RandomFloats(static_cast<size_t>(s.n) * s.ho() * s.wo() * s.k, seed);
}
std::vector<float> X(const ConvShape& s, uint32_t seed) {
  return RandomFloats(static_cast<size_t>(s.n) * s.h * s.w * s.c, seed);
}

// Stride 2, 1x1, batch 1, odd channel counts, padding wider than stride, a 1x1 output.
const ConvShape kShapes[] = {
    MakeConv(2, 7, 7, 3, 5, 3, 3, 1, 1),  MakeConv(1, 9, 8, 5, 4, 3, 3, 2, 1),
    MakeConv(3, 6, 6, 4, 6, 1, 1, 1, 0),  MakeConv(2, 5, 5, 17, 33, 3, 3, 2, 0),
    MakeConv(2, 8, 8, 7, 3, 5, 5, 1, 2),  MakeConv(1, 3, 3, 2, 3, 3, 3, 1, 0),
    MakeConv(4, 10, 10, 3, 9, 1, 1, 2, 0)};

TEST(SampledWeightGrad, KeepingEveryPositionIsTheExactGradient) {
  uint32_t seed = 1;
  for (const ConvShape& s : kShapes) {
    const auto x = X(s, seed++), dy = Dy(s, seed++);
    std::vector<float> dw(static_cast<size_t>(s.k) * s.patch()), dbias(s.k);
    std::vector<float> ws(ConvWorkspaceFloatsCpu(s) + 1);
    Conv2dBackwardFilterCpu(s, x.data(), dy.data(), dw.data(), dbias.data(), ws.data());
    const Reference exact = SampledReference(s, 1 << 30, 1.0, x, dy, {});
    EXPECT_LT(RelError(dw, exact.dw), 1e-5);  // the reference itself is the exact gradient
    for (int top_k : {s.ho() * s.wo(), s.ho() * s.wo() + 5}) {
      const Result got = Sampled(s, top_k, 1.0f, x, dy);
      const std::string what =
          absl::StrFormat("shape n%d %dx%dx%d k%d %dx%d s%d p%d top_k %d", s.n, s.h, s.w, s.c, s.k,
                          s.r, s.s, s.stride_h, s.pad_h, top_k);
      EXPECT_LT(RelError(got.dw, exact.dw), 1e-5) << what;
      EXPECT_LT(RelError(got.dbias, exact.dbias), 1e-5) << what;
    }
  }
}

TEST(SampledWeightGrad, MatchesTheFormulaInDoublePrecision) {
  uint32_t seed = 100;
  for (const ConvShape& s : kShapes) {
    for (int top_k : {1, 2, 3, 17}) {
      const auto x = X(s, seed++), dy = Dy(s, seed++);
      for (float scale : {1.0f, 1.0f / s.n}) {
        const Result got = Sampled(s, top_k, scale, x, dy);
        const Reference ref = SampledReference(s, top_k, scale, x, dy, {});
        const std::string what = absl::StrFormat("shape n%d %dx%dx%d k%d top_k %d scale %g", s.n,
                                                 s.h, s.w, s.c, s.k, top_k, scale);
        EXPECT_LT(RelError(got.dw, ref.dw), 1e-5) << what;
        EXPECT_LT(RelError(got.dbias, ref.dbias), 1e-5) << what;
      }
    }
  }
}

TEST(SampledWeightGrad, TopOneIsTheSignedSumAtTheLargestMagnitude) {
  // One image, one channel: dW = S * patch(argmax |dY|), whatever the other values.
  const ConvShape s = MakeConv(1, 5, 5, 2, 1, 3, 3, 1, 1);
  const auto x = X(s, 7);
  std::vector<float> dy(25, 0.1f);
  dy[13] = -0.9f;  // the largest magnitude, at (2, 3)
  dy[20] = 0.5f;
  const float sum = 23 * 0.1f - 0.9f + 0.5f;
  const Result got = Sampled(s, 1, 1.0f, x, dy);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int c = 0; c < 2; ++c) {
        const int h = 2 - 1 + i, w = 3 - 1 + j;
        const float in = (h < 5 && w < 5) ? x[(h * 5 + w) * 2 + c] : 0.0f;
        EXPECT_NEAR(got.dw[(i * 3 + j) * 2 + c], sum * in, 1e-5) << i << " " << j << " " << c;
      }
    }
  }
  EXPECT_NEAR(got.dbias[0], sum, 1e-5);
}

TEST(SampledWeightGrad, TiesGoToTheEarlierPosition) {
  // Every |dY| equal: top-1 must take position 0 (whose patch is padding above and left).
  const ConvShape s = MakeConv(1, 4, 4, 1, 1, 3, 3, 1, 1);
  const auto x = X(s, 9);
  std::vector<float> dy(16);
  for (int p = 0; p < 16; ++p) dy[p] = p % 3 == 0 ? -1.0f : 1.0f;
  const float sum = std::accumulate(dy.begin(), dy.end(), 0.0f);
  const Result got = Sampled(s, 1, 1.0f, x, dy);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      const float in = (i >= 1 && j >= 1) ? x[(i - 1) * 4 + (j - 1)] : 0.0f;
      EXPECT_FLOAT_EQ(got.dw[i * 3 + j], sum * in) << i << " " << j;
    }
  }
}

TEST(SampledWeightGrad, CancellingKeptValuesFallBackToTruncation) {
  // Kept values 1 and -1 sum to 0: r = S / T would divide by zero; weights stay dY_t.
  const ConvShape s = MakeConv(1, 2, 2, 1, 1, 1, 1, 1, 0);
  const std::vector<float> x = {2.0f, 3.0f, 5.0f, 7.0f};
  const std::vector<float> dy = {1.0f, 0.25f, -1.0f, 0.5f};
  const Result got = Sampled(s, 2, 1.0f, x, dy);
  EXPECT_FLOAT_EQ(got.dw[0], 1.0f * 2.0f - 1.0f * 5.0f);
  EXPECT_FLOAT_EQ(got.dbias[0], 0.75f);
  // Kept 1 and 0.5 agree in sign: r = S / T = 2 / 1.5.
  const std::vector<float> dy2 = {1.0f, 0.25f, 0.25f, 0.5f};
  EXPECT_FLOAT_EQ(Sampled(s, 2, 1.0f, x, dy2).dw[0], (2.0f / 1.5f) * (1.0f * 2.0f + 0.5f * 7.0f));
}

TEST(SampledWeightGrad, MaskedEntriesAreZeroAndOthersUnchanged) {
  uint32_t seed = 300;
  for (const ConvShape& s : kShapes) {
    const auto x = X(s, seed++), dy = Dy(s, seed++);
    std::vector<uint8_t> mask(static_cast<size_t>(s.k) * s.patch());
    std::mt19937 gen(seed++);
    for (auto& m : mask) m = gen() % 2;
    const Result dense = Sampled(s, 2, 1.0f, x, dy);
    const Result masked = Sampled(s, 2, 1.0f, x, dy, mask);
    for (size_t e = 0; e < mask.size(); ++e) {
      EXPECT_EQ(masked.dw[e], mask[e] ? dense.dw[e] : 0.0f) << e;
    }
  }
}

TEST(SampledWeightGrad, RefusesBadArguments) {
  EXPECT_FALSE(CheckSampledWeightGradShape(MakeConv(1, 4, 4, 1, 1, 3, 3, 1, 1), 0).ok());
  EXPECT_FALSE(CheckSampledWeightGradShape(MakeConv(1, 2, 2, 1, 1, 3, 3, 1, 0), 1).ok());
  EXPECT_TRUE(CheckSampledWeightGradShape(MakeConv(1, 4, 4, 1, 1, 3, 3, 1, 1), 1000).ok());
}

}  // namespace
}  // namespace topiary::kernels

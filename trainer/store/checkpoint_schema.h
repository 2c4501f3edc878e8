// What a checkpoint document must be before anything reads it (docs/checkpoint-format.md):
// the root attributes with their types and ranges, the metadata checksum, `/rng`, and every
// dataset's place, type, shape and values (finite weights and momentum, running variances
// >= 0, masks of 0 and 1 whose shape fits their kernel). Both the loader and `inspect` call
// it, so neither meets a file it has to guess about.
#ifndef TOPIARY_TRAINER_STORE_CHECKPOINT_SCHEMA_H_
#define TOPIARY_TRAINER_STORE_CHECKPOINT_SCHEMA_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/approx/approx_conv.h"
#include "trainer/nn/conv_engine.h"
#include "trainer/store/hdf5_file.h"
#include "trainer/util/enum_pairs.h"

namespace topiary {

// The checkpoint's names, here once: the store writes them, the schema check and the report
// read them, and the service asks the store (docs/checkpoint-format.md describes each).
// Groups.
inline constexpr char kRootGroup[] = "/";
inline constexpr char kRngGroup[] = "/rng";
inline constexpr char kOptimizerGroup[] = "/optimizer";
inline constexpr char kLayersPrefix[] = "/layers/";                // + layer + "/" + role
inline constexpr char kMomentumPrefix[] = "/optimizer/momentum/";  // + layer + "/" + role
inline constexpr char kMaskRole[] = "mask";  // /layers/<layer>/mask (roles: ParamRoleName)
// Root attributes.
inline constexpr char kFormatAttr[] = "format";
inline constexpr char kFormatVersionAttr[] = "format_version";
inline constexpr char kMetadataChecksumAttr[] = "metadata_crc32c";
inline constexpr char kExperimentIdAttr[] = "experiment_id";
inline constexpr char kRoundAttr[] = "round";
inline constexpr char kEpochAttr[] = "epoch";
inline constexpr char kPhaseEpochAttr[] = "phase_epoch";
inline constexpr char kEpochStepAttr[] = "epoch_step";
inline constexpr char kGlobalStepAttr[] = "global_step";
inline constexpr char kModelArchAttr[] = "model_arch";
inline constexpr char kSpecAttr[] = "spec";
inline constexpr char kParentAttr[] = "parent";
inline constexpr char kCreatedAtAttr[] = "created_at";
inline constexpr char kMetricsAttr[] = "metrics";
inline constexpr char kInputAttr[] = "input";
inline constexpr char kNetworkAttr[] = "network";  // topiary.v1.NetworkGraph as JSON
inline constexpr char kLayerOrderAttr[] = "layer_order";
// /rng and /optimizer attributes.
inline constexpr char kSeedAttr[] = "seed";
inline constexpr char kNextEpochAttr[] = "next_epoch";
inline constexpr char kGeneratorAttr[] = "generator";
inline constexpr char kStreamsAttr[] = "streams";
inline constexpr char kAlgorithmAttr[] = "algorithm";
// Mask attributes. kind: MaskKindName (block, element, n_of_m). A block mask's dataset is the
// grid [input-channel blocks, output-channel blocks] (the transpose of the kernel's [K, C]
// order); its `axes` attribute says so in the file.
inline constexpr char kMaskKindAttr[] = "kind";
inline constexpr char kBlockInAttr[] = "block_in";
inline constexpr char kBlockOutAttr[] = "block_out";
inline constexpr char kMaskAxesAttr[] = "axes";
inline constexpr char kBlockMaskAxes[] = "input_blocks,output_blocks";
inline constexpr char kNAttr[] = "n";
inline constexpr char kMAttr[] = "m";
// /layers/<layer> group attributes: approximation and sampled weight gradients.
inline constexpr char kMultiplierAttr[] = "multiplier";
inline constexpr char kMultiplierSha256Attr[] = "multiplier_sha256";
inline constexpr char kWeightTuningAttr[] = "weight_tuning";
inline constexpr char kWeightCodeAttr[] = "weight_code";            // kWeightCodeNames
inline constexpr char kWeightScalesAttr[] = "weight_scales";        // kWeightScalesNames
inline constexpr char kActivationRangeAttr[] = "activation_range";  // kRangeNames
inline constexpr char kWeightGradientAttr[] = "weight_gradient";    // "sampled"
inline constexpr char kWeightGradientTopKAttr[] = "weight_gradient_top_k";
inline constexpr char kWeightGradientScaleAttr[] = "weight_gradient_scale";  // kSamplingScaleNames

// The file's names for the engine's enums (docs/checkpoint-format.md): the one place either
// way between an enum and its string (trainer/util/enum_pairs.h looks them up), for the
// writer, the document check and the report.
inline constexpr std::pair<kernels::WeightCode, const char*> kWeightCodeNames[] = {
    {kernels::WeightCode::kAsymmetric, "asymmetric"},
    {kernels::WeightCode::kSignMagnitude, "sign_magnitude"}};
inline constexpr std::pair<kernels::WeightScales, const char*> kWeightScalesNames[] = {
    {kernels::WeightScales::kPerTensor, "per_tensor"},
    {kernels::WeightScales::kPerChannel, "per_channel"}};
inline constexpr std::pair<ConvApproximation::Range, const char*> kRangeNames[] = {
    {ConvApproximation::Range::kPerBatch, "per_batch"},
    {ConvApproximation::Range::kMovingAverage, "moving_average"}};
inline constexpr std::pair<GradientSampling::Scale, const char*> kSamplingScaleNames[] = {
    {GradientSampling::Scale::kUnbiased, "unbiased"},
    {GradientSampling::Scale::kReference, "reference"}};

// "[8, 1, 3, 3]": shapes in messages.
std::string ShapeText(const std::vector<int64_t>& shape);

// CRC-32C of MetadataText(doc, kMetadataChecksumAttr), stored as that root attribute.
int64_t MetadataChecksum(const H5Document& doc);

// Errors name the file and the object: DATA_LOSS for damage and contradictions.
absl::Status ValidateCheckpointDocument(const std::string& path, const H5Document& doc);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_STORE_CHECKPOINT_SCHEMA_H_

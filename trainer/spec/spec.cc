#include "trainer/spec/spec.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "trainer/spec/catalog.h"
#include "trainer/util/file_util.h"
#include "trainer/util/json.h"
#include "trainer/util/utf8.h"
#include "util/status_macros.h"

namespace topiary {
namespace {

using topiary::v1::DataSpec;
using topiary::v1::ExperimentSpec;

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first.empty())
      first = absl::StrCat("line ", line + 1, ", column ", column + 1, ": ", message);
  }
  std::string first;
};

absl::Status Invalid(const std::string& field, const std::string& rule) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", rule));
}

#define CHECK_RULE(cond, field, rule) \
  if (!(cond)) return Invalid(field, rule)

// Bounds on counts: far beyond any sensible experiment, small enough that nothing sized by
// them (schedules, tables, threads) can exhaust a machine.
constexpr int kMaxRounds = 1000;
constexpr int kMaxThreads = 1024;
constexpr int kMaxListEntries = 1000;   // milestones, overrides, gpus
constexpr int kDefaultBatchSize = 128;  // data.batch_size when unset
constexpr size_t kMaxText = 4096;       // names, paths, patterns

bool Finite(double v) { return std::isfinite(v); }

// Names and paths are printed in tables and logs and stored as JSON: valid UTF-8 (proto3
// strings must be; the text-format parser does not check), no control characters.
bool PlainText(const std::string& s) { return s.size() <= kMaxText && IsPlainText(s); }

// Proto3 enums are open: a number no enumerator names parses fine and must be refused here.
#define CHECK_ENUM(valid, value, field) \
  CHECK_RULE(valid(value), field, absl::StrCat("unknown value ", static_cast<int>(value)))

absl::Status ValidateData(const DataSpec& d) {
  CHECK_ENUM(DataSpec::Dataset_IsValid, d.dataset(), "data.dataset");
  CHECK_RULE(PlainText(d.path()), "data.path",
             "must be valid UTF-8 of at most 4096 bytes, without control characters");
  CHECK_RULE(d.batch_size() >= 0, "data.batch_size", "must be > 0");
  CHECK_RULE(d.batch_size() <= 65536, "data.batch_size", "must be <= 65536");
  CHECK_RULE(d.eval_batch_size() >= 0, "data.eval_batch_size", "must be > 0");
  CHECK_RULE(d.eval_batch_size() <= 65536, "data.eval_batch_size", "must be <= 65536");
  CHECK_RULE(d.train_limit() >= 0, "data.train_limit", "must be >= 0 (0: all)");
  CHECK_RULE(d.test_limit() >= 0, "data.test_limit", "must be >= 0 (0: all)");
  CHECK_RULE(d.validation_fraction() >= 0 && d.validation_fraction() <= 0.5,
             "data.validation_fraction", "must be in [0, 0.5] (0: no validation set)");
  CHECK_RULE(d.augment().crop_padding() >= 0 && d.augment().crop_padding() <= 64,
             "data.augment.crop_padding", "must be in [0, 64]");
  CHECK_RULE(!d.augment().random_resized_crop() || d.augment().crop_padding() == 0,
             "data.augment.random_resized_crop", "replaces crop_padding: set one of them");
  const bool needs_path = d.dataset() == DataSpec::MNIST || d.dataset() == DataSpec::CIFAR10 ||
                          d.dataset() == DataSpec::CIFAR100 || d.dataset() == DataSpec::DIGITS ||
                          d.dataset() == DataSpec::IMAGE_FOLDER;
  CHECK_RULE(!needs_path || !d.path().empty(), "data.path",
             "required for " + DataSpec::Dataset_Name(d.dataset()));
  if (d.has_image_folder()) {
    const auto& f = d.image_folder();
    CHECK_RULE(d.dataset() == DataSpec::IMAGE_FOLDER, "data.image_folder",
               "only allowed with dataset: IMAGE_FOLDER");
    CHECK_RULE(f.image_size() >= 0 && f.image_size() <= 1024, "data.image_folder.image_size",
               "must be in [1, 1024]");
    CHECK_RULE(f.channels() == 0 || f.channels() == 1 || f.channels() == 3,
               "data.image_folder.channels", "must be 1 or 3");
    CHECK_ENUM(topiary::v1::ImageFolderSpec::BadImages_IsValid, f.bad_images(),
               "data.image_folder.bad_images");
    CHECK_RULE(f.max_image_pixels() >= 0 && f.max_image_pixels() <= (int64_t{1} << 30),
               "data.image_folder.max_image_pixels", "must be in [1, 2^30]");
    CHECK_RULE(f.decode_threads() >= 0 && f.decode_threads() <= 1024,
               "data.image_folder.decode_threads", "must be in [0, 1024]");
    const int stored = f.image_size() > 0 ? f.image_size() : 32;  // the default
    CHECK_RULE(f.crop_size() >= 0 && f.crop_size() <= stored, "data.image_folder.crop_size",
               "must be in [1, image_size]");
    CHECK_ENUM(topiary::v1::ImageFolderSpec::Pipeline_IsValid, f.pipeline(),
               "data.image_folder.pipeline");
    CHECK_ENUM(topiary::v1::ImageFolderSpec::Decoder_IsValid, f.decoder(),
               "data.image_folder.decoder");
    const bool stream = f.pipeline() == topiary::v1::ImageFolderSpec::STREAM;
    CHECK_RULE(stream || f.decoder() == topiary::v1::ImageFolderSpec::AUTO,
               "data.image_folder.decoder", "only with pipeline: STREAM");
    CHECK_RULE(f.prefetch_batches() >= 0 && f.prefetch_batches() <= 16,
               "data.image_folder.prefetch_batches", "must be in [1, 16]");
    CHECK_RULE(stream || f.prefetch_batches() == 0, "data.image_folder.prefetch_batches",
               "only with pipeline: STREAM");
    CHECK_RULE(!stream || d.augment().crop_padding() == 0, "data.augment.crop_padding",
               "not with pipeline: STREAM (its training crops are random_resized_crop's)");
  }
  if (d.has_synthetic()) {
    CHECK_RULE(d.dataset() == DataSpec::SYNTHETIC, "data.synthetic",
               "only allowed with dataset: SYNTHETIC");
    const auto& s = d.synthetic();
    CHECK_RULE(s.height() >= 0 && s.height() <= 512, "data.synthetic.height",
               "must be in [1, 512]");
    CHECK_RULE(s.width() >= 0 && s.width() <= 512, "data.synthetic.width", "must be in [1, 512]");
    CHECK_RULE(s.channels() >= 0 && s.channels() <= 16, "data.synthetic.channels",
               "must be in [1, 16]");
    CHECK_RULE(s.classes() == 0 || (s.classes() >= 2 && s.classes() <= 1000),
               "data.synthetic.classes", "must be in [2, 1000]");
    CHECK_RULE(s.train_size() >= 0 && s.train_size() <= 10000000, "data.synthetic.train_size",
               "must be in [1, 10000000]");
    CHECK_RULE(s.test_size() >= 0 && s.test_size() <= 10000000, "data.synthetic.test_size",
               "must be in [1, 10000000]");
    CHECK_RULE(s.noise() >= 0 && s.noise() <= 100, "data.synthetic.noise", "must be in [0, 100]");
    // Synthetic images are generated in memory as bytes: keep them within 8 GiB.
    const double bytes = (static_cast<double>(s.train_size()) + s.test_size()) *
                         std::max(1, s.height()) * std::max(1, s.width()) *
                         std::max(1, s.channels());
    CHECK_RULE(bytes <= 8.0 * (1ull << 30), "data.synthetic.train_size",
               "train_size + test_size images of this shape need more than 8 GiB");
  }
  return absl::OkStatus();
}

absl::Status ValidateTrain(const topiary::v1::TrainSpec& t) {
  CHECK_RULE(t.epochs() >= 0 && t.epochs() <= kMaxEpochs, "train.epochs",
             absl::StrCat("must be in [0, ", kMaxEpochs, "]"));
  CHECK_RULE(t.eval_every_epochs() >= 0 && t.eval_every_epochs() <= kMaxEpochs,
             "train.eval_every_epochs", absl::StrCat("must be in [0, ", kMaxEpochs, "]"));
  CHECK_ENUM(topiary::v1::TrainSpec::Precision_IsValid, t.precision(), "train.precision");
  CHECK_RULE(t.label_smoothing() >= 0 && t.label_smoothing() < 1, "train.label_smoothing",
             "must be in [0, 1)");
  const auto& o = t.optimizer();
  CHECK_RULE(Finite(o.lr()) && o.lr() >= 0 && o.lr() <= 1000, "train.optimizer.lr",
             "must be a finite number in (0, 1000]");
  CHECK_ENUM(topiary::v1::OptimizerSpec::WeightDecayMode_IsValid, o.weight_decay_mode(),
             "train.optimizer.weight_decay_mode");
  CHECK_RULE(!o.has_momentum() || (o.momentum() >= 0 && o.momentum() < 1),
             "train.optimizer.momentum", "must be in [0, 1)");
  CHECK_RULE(!o.nesterov() || !o.has_momentum() || o.momentum() > 0, "train.optimizer.nesterov",
             "needs momentum > 0");
  CHECK_RULE(!o.has_weight_decay() || (o.weight_decay() >= 0 && o.weight_decay() <= 1),
             "train.optimizer.weight_decay", "must be in [0, 1]");
  const auto& s = t.lr_schedule();
  CHECK_ENUM(topiary::v1::LrSchedule::Kind_IsValid, s.kind(), "train.lr_schedule.kind");
  CHECK_RULE(s.milestones_size() <= kMaxListEntries, "train.lr_schedule.milestones",
             "at most 1000 entries");
  for (int i = 0; i < s.milestones_size(); ++i) {
    CHECK_RULE(s.milestones(i) > 0 && s.milestones(i) <= kMaxEpochs &&
                   (i == 0 || s.milestones(i) > s.milestones(i - 1)),
               "train.lr_schedule.milestones", "must be positive and strictly increasing");
  }
  CHECK_RULE(!s.has_gamma() || (s.gamma() > 0 && s.gamma() <= 1), "train.lr_schedule.gamma",
             "must be in (0, 1]");
  CHECK_RULE(Finite(s.min_lr()) && s.min_lr() >= 0, "train.lr_schedule.min_lr",
             "must be a finite number >= 0");
  CHECK_RULE(Finite(s.warmup_epochs()) && s.warmup_epochs() >= 0 && s.warmup_epochs() <= kMaxEpochs,
             "train.lr_schedule.warmup_epochs", "must be a finite number in [0, 10000]");
  return absl::OkStatus();
}

absl::Status ValidatePruning(const topiary::v1::PruningSpec& p) {
  CHECK_ENUM(topiary::v1::PruningSpec::Method_IsValid, p.method(), "pruning.method");
  CHECK_ENUM(topiary::v1::PruningSpec::Score_IsValid, p.score(), "pruning.score");
  CHECK_RULE(p.block_in() >= 0 && p.block_in() <= 1024, "pruning.block_in", "must be in [1, 1024]");
  CHECK_RULE(p.block_out() >= 0 && p.block_out() <= 1024, "pruning.block_out",
             "must be in [1, 1024]");
  CHECK_RULE(p.target() >= 0 && p.target() < 1, "pruning.target", "must be in (0, 1)");
  CHECK_RULE(p.step_fraction() >= 0 && p.step_fraction() <= 1, "pruning.step_fraction",
             "must be in (0, 1]");
  CHECK_RULE(p.finetune_epochs() >= 0 && p.finetune_epochs() <= kMaxEpochs,
             "pruning.finetune_epochs", absl::StrCat("must be in [0, ", kMaxEpochs, "]"));
  CHECK_RULE(p.max_rounds() >= 0 && p.max_rounds() <= kMaxRounds, "pruning.max_rounds",
             absl::StrCat("must be in [0, ", kMaxRounds, "]"));
  CHECK_RULE(!p.has_finetune_lr() ||
                 (Finite(p.finetune_lr()) && p.finetune_lr() > 0 && p.finetune_lr() <= 1000),
             "pruning.finetune_lr", "must be a finite number in (0, 1000]");
  CHECK_RULE(p.overrides_size() <= kMaxListEntries, "pruning.overrides", "at most 1000 entries");
  CHECK_RULE(p.n() >= 0 && p.m() >= 0 && p.m() <= 64, "pruning.m", "must be in [1, 64]");
  if (p.method() == topiary::v1::PruningSpec::N_OF_M) {
    const int n = p.n() ? p.n() : 2, m = p.m() ? p.m() : 4;
    CHECK_RULE(n < m, "pruning.n", "must be < pruning.m");
  }
  CHECK_RULE(!p.global() || p.method() == topiary::v1::PruningSpec::MAGNITUDE, "pruning.global",
             "only applies to method: MAGNITUDE");
  const bool channel = p.method() == topiary::v1::PruningSpec::CHANNEL;
  CHECK_RULE(p.score() != topiary::v1::PruningSpec::BN_SCALE || channel, "pruning.score",
             "BN_SCALE only applies to method: CHANNEL");
  CHECK_RULE(p.round_to() >= 0 && p.round_to() <= 1024, "pruning.round_to", "must be in [0, 1024]");
  CHECK_RULE(p.round_to() <= 1 || channel, "pruning.round_to", "only applies to method: CHANNEL");
  CHECK_RULE(p.min_channels() >= 0 && p.min_channels() <= 65536, "pruning.min_channels",
             "must be in [0, 65536]");
  CHECK_RULE(p.min_channels() == 0 || channel, "pruning.min_channels",
             "only applies to method: CHANNEL");
  CHECK_RULE(p.target_flops() >= 0 && p.target_flops() < 1, "pruning.target_flops",
             "must be in (0, 1)");
  CHECK_RULE(p.target_flops() == 0 || channel, "pruning.target_flops",
             "only applies to method: CHANNEL");
  CHECK_RULE(p.max_fraction() >= 0 && p.max_fraction() <= 1, "pruning.max_fraction",
             "must be in (0, 1]");
  CHECK_RULE(p.max_fraction() == 0 || p.target_flops() > 0, "pruning.max_fraction",
             "only applies with target_flops (per-group targets say each group's share)");
  for (int i = 0; i < p.overrides_size(); ++i) {
    const auto& o = p.overrides(i);
    const std::string f = absl::StrCat("pruning.overrides[", i, "]");
    CHECK_RULE(!o.layer().empty(), f + ".layer", "must name a layer pattern");
    CHECK_RULE(PlainText(o.layer()), f + ".layer",
               "must be valid UTF-8 of at most 4096 bytes, without control characters");
    CHECK_RULE(!o.has_target() || (o.target() > 0 && o.target() < 1), f + ".target",
               "must be in (0, 1)");
    CHECK_RULE(!o.has_target() || !p.global(), f + ".target",
               "not allowed with pruning.global (one threshold serves every layer); use exclude");
  }
  return absl::OkStatus();
}

absl::Status ValidateApproximation(const topiary::v1::ApproximationSpec& a) {
  CHECK_ENUM(topiary::v1::ApproximationSpec::RangeMode_IsValid, a.range(), "approximation.range");
  CHECK_ENUM(topiary::v1::ApproximationSpec::WeightCode_IsValid, a.weight_code(),
             "approximation.weight_code");
  CHECK_RULE(!a.weight_tuning() || a.weight_code() == topiary::v1::ApproximationSpec::ASYMMETRIC,
             "approximation.weight_tuning",
             "remaps asymmetric weight codes: not with weight_code: SIGN_MAGNITUDE");
  CHECK_RULE(a.rules_size() > 0, "approximation.rules", "at least one rule");
  CHECK_RULE(a.rules_size() <= kMaxListEntries, "approximation.rules", "at most 1000 entries");
  for (int i = 0; i < a.rules_size(); ++i) {
    const auto& r = a.rules(i);
    const std::string f = absl::StrCat("approximation.rules[", i, "]");
    CHECK_RULE(!r.layer().empty(), f + ".layer", "must name a layer pattern");
    CHECK_RULE(PlainText(r.layer()), f + ".layer",
               "must be valid UTF-8 of at most 4096 bytes, without control characters");
    CHECK_RULE(r.exclude() || !r.multiplier().empty(), f + ".multiplier",
               "required (a .bin table file or a family such as exact, trunc:4, drum:6) unless "
               "exclude is set");
    CHECK_RULE(!r.exclude() || r.multiplier().empty(), f + ".multiplier",
               "must be empty when exclude is set");
    CHECK_RULE(PlainText(r.multiplier()), f + ".multiplier",
               "must be valid UTF-8 of at most 4096 bytes, without control characters");
  }
  return absl::OkStatus();
}

absl::Status ValidateGlobs(const google::protobuf::RepeatedPtrField<std::string>& globs,
                           const std::string& field) {
  CHECK_RULE(globs.size() <= kMaxListEntries, field, "at most 1000 entries");
  for (int i = 0; i < globs.size(); ++i) {
    const std::string f = absl::StrCat(field, "[", i, "]");
    CHECK_RULE(!globs[i].empty(), f, "must name a layer pattern");
    CHECK_RULE(PlainText(globs[i]), f,
               "must be valid UTF-8 of at most 4096 bytes, without control characters");
  }
  return absl::OkStatus();
}

absl::Status ValidateGradientSampling(const topiary::v1::GradientSamplingSpec& g) {
  using G = topiary::v1::GradientSamplingSpec;
  if (auto st = ValidateGlobs(g.layers(), "gradient_sampling.layers"); !st.ok()) return st;
  if (auto st = ValidateGlobs(g.exclude(), "gradient_sampling.exclude"); !st.ok()) return st;
  CHECK_RULE(g.top_k() >= 0 && g.top_k() <= (1 << 20), "gradient_sampling.top_k",
             "must be in [1, 1048576] (0: the default, 1)");
  CHECK_ENUM(G::Scale_IsValid, g.scale(), "gradient_sampling.scale");
  if (g.steps_case() == G::kProbability) {
    CHECK_RULE(Finite(g.probability()) && g.probability() > 0 && g.probability() <= 1,
               "gradient_sampling.probability", "must be in (0, 1]");
  }
  if (g.steps_case() == G::kEveryNSteps) {
    CHECK_RULE(g.every_n_steps() >= 1 && g.every_n_steps() <= 1000000,
               "gradient_sampling.every_n_steps", "must be in [1, 1000000]");
  }
  if (g.steps_case() == G::kAlternateEpochs) {
    CHECK_RULE(g.alternate_epochs(), "gradient_sampling.alternate_epochs",
               "set it to true or leave it out (the steps oneof)");
  }
  CHECK_RULE(g.warmup_epochs() >= 0 && g.warmup_epochs() <= kMaxEpochs,
             "gradient_sampling.warmup_epochs", absl::StrCat("must be in [0, ", kMaxEpochs, "]"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExperimentSpec> ParseSpec(const std::string& text, const std::string& source) {
  if (text.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": a spec of ", text.size(), " bytes; the limit is ", kMaxSpecBytes));
  }
  ExperimentSpec spec;
  const absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(text);
  if (!trimmed.empty() && trimmed.front() == '{') {
    TOPIARY_RETURN_IF_ERROR(FromJson(text, &spec, source, JsonUnknown::kRefuse));
    return spec;
  }
  google::protobuf::TextFormat::Parser parser;
  CollectErrors errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &spec)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid spec: ", errors.first));
  }
  return spec;
}

absl::StatusOr<topiary::v1::DataSpec> ParseDataFlag(const std::string& text, int image_size,
                                                    int channels) {
  using topiary::v1::DataSpec;
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  const std::string path = colon == std::string::npos ? "" : text.substr(colon + 1);
  static const std::pair<const char*, DataSpec::Dataset> kKinds[] = {
      {"fashion_mnist", DataSpec::FASHION_MNIST},
      {"mnist", DataSpec::MNIST},
      {"cifar10", DataSpec::CIFAR10},
      {"cifar100", DataSpec::CIFAR100},
      {"digits", DataSpec::DIGITS},
      {"folder", DataSpec::IMAGE_FOLDER}};
  DataSpec data;
  bool known = false;
  for (const auto& [name, dataset] : kKinds) {
    if (kind == name) {
      data.set_dataset(dataset);
      known = true;
    }
  }
  if (!known || (path.empty() && data.dataset() != DataSpec::FASHION_MNIST)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data: '", text,
                     "' is not one of fashion_mnist[:PATH], mnist:PATH, cifar10:PATH, "
                     "cifar100:PATH, digits:FILE, folder:PATH (an image folder)"));
  }
  data.set_path(path.empty() ? kFashionMnistDir : path);
  if (data.dataset() == DataSpec::IMAGE_FOLDER) {
    data.mutable_image_folder()->set_image_size(image_size);
    data.mutable_image_folder()->set_channels(channels);
  }
  return data;
}

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// The names of a message's fields, for errors.
std::string FieldNames(const google::protobuf::Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  return absl::StrJoin(names, ", ");
}

// "rules[2]" -> ("rules", 2); "target" -> ("target", -1); false on a malformed index.
bool SplitIndex(absl::string_view part, std::string* name, int* index) {
  *index = -1;
  const size_t open = part.find('[');
  if (open == absl::string_view::npos) {
    *name = std::string(part);
    return !name->empty();
  }
  *name = std::string(part.substr(0, open));
  if (!absl::EndsWith(part, "]")) return false;
  return absl::SimpleAtoi(part.substr(open + 1, part.size() - open - 2), index) && *index >= 0 &&
         !name->empty();
}

// A message in text format ("{ layer: "*" multiplier: "drum:6" }", braces optional) into
// `out`; the parser's own words on failure.
absl::Status ParseMessageText(absl::string_view text, Message* out) {
  text = absl::StripAsciiWhitespace(text);
  if (absl::StartsWith(text, "{") && absl::EndsWith(text, "}")) {
    text = text.substr(1, text.size() - 2);
  }
  google::protobuf::TextFormat::Parser parser;
  CollectErrors errors;
  parser.RecordErrorsTo(&errors);
  if (parser.ParseFromString(std::string(text), out)) return absl::OkStatus();
  std::string why = errors.first;
  if (const size_t colon = why.find(": "); why.rfind("line ", 0) == 0 && colon != why.npos) {
    why = why.substr(colon + 2);
  }
  return absl::InvalidArgumentError(why);
}

}  // namespace

absl::Status ApplySpecChange(const std::string& change, ExperimentSpec* spec) {
  const size_t eq = change.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("set: '", change, "' is not field.path=value (e.g. pruning.target=0.75)"));
  }
  const std::string value = change.substr(eq + 1);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("set: '", change, "': ", why));
  };
  ExperimentSpec changed = *spec;
  Message* msg = &changed;
  const std::vector<std::string> parts = absl::StrSplit(change.substr(0, eq), '.');
  std::string walked;  // the path so far, for errors
  for (size_t k = 0; k < parts.size(); ++k) {
    std::string name;
    int index;
    if (!SplitIndex(parts[k], &name, &index)) {
      return bad(absl::StrCat("'", parts[k], "' is not a field name or name[index]"));
    }
    const google::protobuf::Descriptor* d = msg->GetDescriptor();
    const FieldDescriptor* f = d->FindFieldByName(name);
    if (f == nullptr) {
      return bad(absl::StrCat(walked.empty() ? "the spec" : walked, " has no field '", name,
                              "' (it has ", FieldNames(d), ")"));
    }
    walked = walked.empty() ? parts[k] : walked + "." + parts[k];
    const google::protobuf::Reflection* r = msg->GetReflection();
    if (index >= 0 && !f->is_repeated()) return bad(walked + " is not a list");
    if (index >= 0 && index >= r->FieldSize(*msg, f)) {
      return bad(absl::StrCat(walked, ": the list has ", r->FieldSize(*msg, f), " entries"));
    }
    const bool last = k + 1 == parts.size();
    if (!last) {  // into a message
      if (f->type() != FieldDescriptor::TYPE_MESSAGE) return bad(walked + " is not a message");
      if (f->is_repeated() && index < 0) return bad(walked + " is a list: name an entry, [0]");
      msg = f->is_repeated() ? r->MutableRepeatedMessage(msg, f, index) : r->MutableMessage(msg, f);
      continue;
    }
    // The field itself: "none" removes it, a message in braces replaces it, else a value.
    if (value == "none" && index < 0 &&
        (f->is_repeated() || f->type() == FieldDescriptor::TYPE_MESSAGE)) {
      r->ClearField(msg, f);
    } else if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      std::unique_ptr<Message> parsed(
          r->GetMessageFactory()->GetPrototype(f->message_type())->New());
      if (auto st = ParseMessageText(value, parsed.get()); !st.ok()) {
        return bad(absl::StrCat(walked, " takes a ", f->message_type()->name(),
                                " in braces, or none: ", st.message()));
      }
      if (!f->is_repeated()) {
        r->MutableMessage(msg, f)->CopyFrom(*parsed);
      } else if (index >= 0) {
        r->MutableRepeatedMessage(msg, f, index)->CopyFrom(*parsed);
      } else {  // the whole list becomes this one entry
        r->ClearField(msg, f);
        r->AddMessage(msg, f)->CopyFrom(*parsed);
      }
    } else {
      if (f->is_repeated()) {
        return bad(walked +
                   " is a list of values: set it whole in its message, or remove it (none)");
      }
      // The value as text format writes it (strings in quotes or bare).
      std::string text = value;
      if (f->type() == FieldDescriptor::TYPE_STRING && !absl::StartsWith(value, "\"")) {
        text = absl::StrCat("\"", absl::CEscape(value), "\"");
      }
      google::protobuf::TextFormat::Parser parser;
      CollectErrors quiet;  // the message below says it; nothing goes to the log
      parser.RecordErrorsTo(&quiet);
      if (!parser.ParseFieldValueFromString(text, f, msg)) {
        std::string kind = f->type() == FieldDescriptor::TYPE_ENUM
                               ? absl::StrCat(
                                     "one of its names (",
                                     [&] {
                                       std::vector<std::string> v;
                                       for (int i = 0; i < f->enum_type()->value_count(); ++i)
                                         v.push_back(f->enum_type()->value(i)->name());
                                       return absl::StrJoin(v, ", ");
                                     }(),
                                     ")")
                               : f->cpp_type_name();
        return bad(absl::StrCat(walked, " takes ", kind, ", not '", value, "'"));
      }
    }
  }
  *spec = std::move(changed);
  return absl::OkStatus();
}

absl::StatusOr<ExperimentSpec> LoadSpecFile(const std::string& path) {
  TOPIARY_ASSIGN_OR_RETURN(auto text, ReadFile(path, kMaxSpecBytes));
  TOPIARY_ASSIGN_OR_RETURN(auto spec, ParseSpec(text, path));
  if (spec.name().empty()) {
    std::string base = path.substr(path.find_last_of('/') + 1);
    base = base.substr(0, base.find('.'));
    spec.set_name(base);
  }
  return spec;
}

absl::StatusOr<ExperimentSpec> LoadValidSpec(const std::string& path) {
  TOPIARY_ASSIGN_OR_RETURN(auto spec, LoadSpecFile(path));
  if (auto st = ValidateSpec(spec); !st.ok()) return st;
  return spec;
}

absl::Status ValidateSpec(const ExperimentSpec& spec) {
  CHECK_RULE(
      PlainText(spec.name()) && spec.name().size() <= 256, "name",
      "must be valid UTF-8 of at most 256 bytes, without control characters (newlines, tabs, "
      "C1 controls, bidirectional formatting)");
  CHECK_RULE(PlainText(spec.init_from_checkpoint()), "init_from_checkpoint",
             "must be valid UTF-8 of at most 4096 bytes, without control characters");
  const auto names = ModelNames();
  // Empty: the network is the one init_from_checkpoint records (an imported model, say).
  CHECK_RULE(!spec.model().arch().empty() || !spec.init_from_checkpoint().empty(), "model.arch",
             "required (unless init_from_checkpoint names a checkpoint, whose network is then "
             "used); one of " +
                 absl::StrJoin(names, ", "));
  CHECK_RULE(spec.model().arch().empty() ||
                 std::find(names.begin(), names.end(), spec.model().arch()) != names.end(),
             "model.arch",
             "unknown architecture '" + spec.model().arch() + "'; one of " +
                 absl::StrJoin(names, ", ") +
                 " (or leave it empty to use init_from_checkpoint's network)");
  CHECK_RULE(spec.model().width() >= 0 && spec.model().width() <= 16, "model.width",
             "must be in (0, 16]");
  if (auto st = ValidateData(spec.data()); !st.ok()) return st;
  if (auto st = ValidateTrain(spec.train()); !st.ok()) return st;
  if (spec.has_pruning()) {
    if (auto st = ValidatePruning(spec.pruning()); !st.ok()) return st;
  }
  if (spec.has_approximation()) {
    if (auto st = ValidateApproximation(spec.approximation()); !st.ok()) return st;
    CHECK_RULE(spec.train().precision() != topiary::v1::TrainSpec::BF16, "train.precision",
               "BF16 cannot be combined with approximation: approximate convolutions read fp32 "
               "activations (use FP32 or TF32)");
  }
  if (spec.has_gradient_sampling()) {
    if (auto st = ValidateGradientSampling(spec.gradient_sampling()); !st.ok()) return st;
  }
  CHECK_RULE(
      spec.checkpoints().every_epochs() >= 0 && spec.checkpoints().every_epochs() <= kMaxEpochs,
      "checkpoints.every_epochs", absl::StrCat("must be in [0, ", kMaxEpochs, "]"));
  CHECK_RULE(spec.checkpoints().keep_last() >= 0 && spec.checkpoints().keep_last() <= 1000000,
             "checkpoints.keep_last", "must be in [0, 1000000]");
  const auto& dev = spec.device();
  CHECK_ENUM(topiary::v1::DeviceSpec::Kind_IsValid, dev.kind(), "device.kind");
  CHECK_ENUM(topiary::v1::DeviceSpec::CudaGraphs_IsValid, dev.cuda_graphs(), "device.cuda_graphs");
  CHECK_RULE(dev.threads() >= 0 && dev.threads() <= kMaxThreads, "device.threads",
             absl::StrCat("must be in [0, ", kMaxThreads, "] (0: all cores)"));
  CHECK_RULE(dev.gpus_size() <= 64, "device.gpus", "at most 64 ordinals");
  for (int i = 0; i < dev.gpus_size(); ++i) {
    const int g = dev.gpus(i);
    CHECK_RULE(g >= 0 && g < 64, "device.gpus", "ordinals must be in [0, 64)");
    for (int j = 0; j < i; ++j) {
      CHECK_RULE(dev.gpus(j) != g, "device.gpus", absl::StrCat("ordinal ", g, " appears twice"));
    }
  }
  CHECK_RULE(dev.gpu_count() >= 0 && dev.gpu_count() <= 64, "device.gpu_count",
             "must be in [0, 64] (0: the length of device.gpus, or one GPU)");
  CHECK_RULE(dev.gpu_count() == 0 || dev.gpus_size() == 0 || dev.gpu_count() == dev.gpus_size(),
             "device.gpu_count",
             absl::StrCat(dev.gpu_count(), " disagrees with the ", dev.gpus_size(),
                          " ordinals of device.gpus (give one of them)"));
  CHECK_RULE(dev.cpu_ranks() >= 0 && dev.cpu_ranks() <= 64, "device.cpu_ranks",
             "must be in [0, 64] (0: one)");
  // Every CPU rank starts its own threads: bounded together, since a thread the system
  // refuses ends the whole process (the OpenMP runtime aborts).
  CHECK_RULE(static_cast<int64_t>(std::max(1, dev.threads())) * CpuRanks(dev) <= kMaxThreads,
             "device.threads",
             absl::StrCat(dev.threads(), " threads on each of ", CpuRanks(dev),
                          " CPU ranks: at most ", kMaxThreads, " threads in all"));
  // The global batch (defaulted as the run will) is split evenly: every rank takes the same
  // number of images, on GPUs or, AUTO without one, on CPU ranks.
  const int batch = spec.data().batch_size() > 0 ? spec.data().batch_size() : kDefaultBatchSize;
  for (const auto& [ranks, field] : {std::pair<int, const char*>{RequestedGpus(dev), "GPUs"},
                                     std::pair<int, const char*>{CpuRanks(dev), "CPU ranks"}}) {
    CHECK_RULE(batch % ranks == 0, "data.batch_size",
               absl::StrCat(batch, " does not split evenly across ", ranks, " ", field,
                            " (the batch size is the global batch)"));
  }
  CHECK_RULE(
      spec.train().epochs() > 0 || !spec.init_from_checkpoint().empty() || spec.has_pruning(),
      "train.epochs", "must be > 0 unless pruning or init_from_checkpoint is set");
  return absl::OkStatus();
}

#undef CHECK_ENUM
#undef CHECK_RULE

int RequestedGpus(const topiary::v1::DeviceSpec& device) {
  if (device.gpus_size() > 0) return device.gpus_size();
  return std::max(1, device.gpu_count());
}

int CpuRanks(const topiary::v1::DeviceSpec& device) { return std::max(1, device.cpu_ranks()); }

ExperimentSpec WithDefaults(ExperimentSpec s) {
  if (s.model().width() == 0) s.mutable_model()->set_width(1.0f);
  auto* d = s.mutable_data();
  if (d->dataset() == DataSpec::DATASET_UNSPECIFIED) d->set_dataset(DataSpec::FASHION_MNIST);
  if (d->dataset() == DataSpec::FASHION_MNIST && d->path().empty()) d->set_path(kFashionMnistDir);
  if (d->batch_size() == 0) d->set_batch_size(kDefaultBatchSize);
  if (d->eval_batch_size() == 0) d->set_eval_batch_size(d->batch_size());
  if (!d->has_normalize()) d->set_normalize(true);
  if (d->dataset() == DataSpec::SYNTHETIC) {
    auto* y = d->mutable_synthetic();
    if (y->height() == 0) y->set_height(16);
    if (y->width() == 0) y->set_width(16);
    if (y->channels() == 0) y->set_channels(1);
    if (y->classes() == 0) y->set_classes(10);
    if (y->train_size() == 0) y->set_train_size(2048);
    if (y->test_size() == 0) y->set_test_size(512);
    if (y->noise() == 0) y->set_noise(0.5f);
  }
  if (d->dataset() == DataSpec::IMAGE_FOLDER) {
    auto* f = d->mutable_image_folder();
    if (f->image_size() == 0) f->set_image_size(32);
    if (f->channels() == 0) f->set_channels(3);
    if (f->max_image_pixels() == 0) f->set_max_image_pixels(int64_t{1} << 26);
    if (f->crop_size() == 0) f->set_crop_size(f->image_size());
    if (f->pipeline() == topiary::v1::ImageFolderSpec::STREAM && f->prefetch_batches() == 0) {
      f->set_prefetch_batches(3);
    }
  }
  if (s.has_gradient_sampling() && s.gradient_sampling().top_k() == 0) {
    s.mutable_gradient_sampling()->set_top_k(1);
  }
  auto* t = s.mutable_train();
  if (t->eval_every_epochs() == 0) t->set_eval_every_epochs(1);
  auto* o = t->mutable_optimizer();
  if (o->lr() == 0) o->set_lr(0.1f);
  if (!o->has_momentum()) o->set_momentum(0.9f);
  if (!o->has_weight_decay()) o->set_weight_decay(5e-4f);
  if (!t->lr_schedule().has_gamma()) t->mutable_lr_schedule()->set_gamma(0.1f);
  if (s.has_pruning()) {
    auto* p = s.mutable_pruning();
    if (p->block_in() == 0) p->set_block_in(8);
    if (p->block_out() == 0) p->set_block_out(8);
    if (p->target() == 0) p->set_target(0.5f);
    if (p->step_fraction() == 0) p->set_step_fraction(0.2f);
    if (p->finetune_epochs() == 0) p->set_finetune_epochs(3);
    if (p->max_rounds() == 0) p->set_max_rounds(20);
    if (p->n() == 0) p->set_n(2);
    if (p->m() == 0) p->set_m(4);
    if (!p->has_finetune_lr()) p->set_finetune_lr(o->lr() / 10);
    if (p->method() == topiary::v1::PruningSpec::CHANNEL && p->min_channels() == 0) {
      p->set_min_channels(1);
    }
    if (p->target_flops() > 0 && p->max_fraction() == 0) p->set_max_fraction(0.75f);
  }
  return s;
}

std::string SpecToText(const ExperimentSpec& spec) {
  std::string out;
  google::protobuf::TextFormat::PrintToString(spec, &out);
  return out;
}

}  // namespace topiary

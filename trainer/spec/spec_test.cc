#include "trainer/spec/spec.h"

#include <gtest/gtest.h>

#include "trainer/core/random.h"
#include "trainer/optim/lr_schedule.h"
#include "util/test_dir.h"

namespace topiary {
namespace {

std::string Error(const std::string& text) {
  auto spec = ParseSpec(text, "test.textproto");
  if (!spec.ok()) return std::string(spec.status().message());
  auto st = ValidateSpec(*spec);
  return st.ok() ? "" : std::string(st.message());
}

constexpr char kBase[] = "model { arch: 'lenet5' } ";
// kBase plus a train block: train { epochs: 1 <inner> }
std::string WithTrain(const std::string& inner) {
  return std::string(kBase) + "train { epochs: 1 " + inner + " }";
}

TEST(Spec, TextAndJsonGiveTheSameSpec) {
  auto a = ParseSpec("name: 'x' seed: 3 model { arch: 'resnet20' } data { batch_size: 32 }", "a");
  auto b = ParseSpec(R"({"name": "x", "seed": "3", "model": {"arch": "resnet20"},
                         "data": {"batch_size": 32}})",
                     "b");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString());
}

TEST(Spec, UnknownFieldsAreErrors) {
  EXPECT_NE(Error("model { arch: 'lenet5' depth: 3 }").find("depth"), std::string::npos);
  EXPECT_NE(Error(R"({"model": {"arch": "lenet5"}, "bogus": 1})").find("bogus"), std::string::npos);
  EXPECT_NE(Error("model { arch: 'lenet5' }\n  lr: 0.1").find("line 2"), std::string::npos);
}

TEST(Spec, ValidationNamesTheField) {
  EXPECT_EQ(Error(WithTrain("")), "");
  EXPECT_EQ(Error(WithTrain("") + "data { batch_size: -1 }"), "data.batch_size: must be > 0");
  EXPECT_EQ(Error(WithTrain("") + "data { batch_size: 100000 }"),
            "data.batch_size: must be <= 65536");
  EXPECT_EQ(Error(WithTrain("") + "data { dataset: SYNTHETIC synthetic { height: 512 width: 512 "
                                  "channels: 16 train_size: 10000 } }"),
            "data.synthetic.train_size: train_size + test_size images of this shape need more "
            "than 8 GiB");
  EXPECT_NE(Error("train { epochs: 1 }").find("model.arch: required"), std::string::npos);
  EXPECT_NE(Error("model { arch: 'vgg99' } train { epochs: 1 }").find("model.arch: unknown"),
            std::string::npos);
  EXPECT_EQ(Error(WithTrain("") + "data { dataset: CIFAR10 }"), "data.path: required for CIFAR10");
  EXPECT_EQ(Error(WithTrain("optimizer { momentum: 1.5 }")),
            "train.optimizer.momentum: must be in [0, 1)");
  EXPECT_EQ(Error(WithTrain("lr_schedule { kind: MULTISTEP milestones: [5, 3] }")),
            "train.lr_schedule.milestones: must be positive and strictly increasing");
  EXPECT_EQ(Error(WithTrain("") + "pruning { target: 1.5 }"), "pruning.target: must be in (0, 1)");
  EXPECT_EQ(Error(WithTrain("") + "pruning { method: N_OF_M n: 4 m: 4 }"),
            "pruning.n: must be < pruning.m");
  EXPECT_EQ(Error(WithTrain("") + "pruning { overrides { target: 0.3 } }"),
            "pruning.overrides[0].layer: must name a layer pattern");
  EXPECT_EQ(Error(WithTrain("") + "data { synthetic { height: 4 } }"),
            "data.synthetic: only allowed with dataset: SYNTHETIC");
  EXPECT_EQ(Error("model { arch: 'lenet5' }"),
            "train.epochs: must be > 0 unless pruning or init_from_checkpoint is set");
  // Data parallelism: the global batch, defaulted or not, must split across the ranks.
  EXPECT_EQ(Error(WithTrain("") + "device { gpu_count: 3 }"),
            "data.batch_size: 128 does not split evenly across 3 GPUs (the batch size is the "
            "global batch)");
  EXPECT_EQ(Error(WithTrain("") + "data { batch_size: 96 } device { gpu_count: 3 }"), "");
  EXPECT_EQ(Error(WithTrain("") + "data { batch_size: 96 } device { cpu_ranks: 5 }"),
            "data.batch_size: 96 does not split evenly across 5 CPU ranks (the batch size is the "
            "global batch)");
  EXPECT_EQ(Error(WithTrain("") + "device { gpus: [0, 1] gpu_count: 4 }"),
            "device.gpu_count: 4 disagrees with the 2 ordinals of device.gpus (give one of them)");
}

// Each of these passed validation and then ran wild (memory, NaN losses, threads).
TEST(Spec, HostileValuesAreBoundedAndNamed) {
  EXPECT_EQ(Error(std::string(kBase) + "train { epochs: 100000000 }"),
            "train.epochs: must be in [0, 10000]");
  EXPECT_EQ(Error(WithTrain("optimizer { lr: inf }")),
            "train.optimizer.lr: must be a finite number in (0, 1000]");
  EXPECT_EQ(Error(WithTrain("optimizer { lr: nan }")),
            "train.optimizer.lr: must be a finite number in (0, 1000]");
  EXPECT_EQ(Error(WithTrain("lr_schedule { warmup_epochs: inf }")),
            "train.lr_schedule.warmup_epochs: must be a finite number in [0, 10000]");
  EXPECT_EQ(Error(WithTrain("") + "data { dataset: 99 }"), "data.dataset: unknown value 99");
  EXPECT_EQ(Error(WithTrain("precision: 7")), "train.precision: unknown value 7");
  EXPECT_EQ(Error(WithTrain("") + "device { threads: 100000 }"),
            "device.threads: must be in [0, 1024] (0: all cores)");
  // Bounded apart, they multiply: each CPU rank starts its own threads.
  EXPECT_EQ(Error(WithTrain("") + "data { batch_size: 64 } device { threads: 1000 cpu_ranks: 64 }"),
            "device.threads: 1000 threads on each of 64 CPU ranks: at most 1024 threads in all");
  EXPECT_EQ(Error(WithTrain("") + "device { kind: 5 }"), "device.kind: unknown value 5");
  EXPECT_EQ(
      Error(WithTrain("") + "data { dataset: SYNTHETIC synthetic { train_size: 2147483647 } }"),
      "data.synthetic.train_size: must be in [1, 10000000]");
  EXPECT_EQ(Error(WithTrain("") + "pruning { max_rounds: 1000000 }"),
            "pruning.max_rounds: must be in [0, 1000]");
  EXPECT_EQ(Error(WithTrain("") + "pruning { finetune_lr: inf }"),
            "pruning.finetune_lr: must be a finite number in (0, 1000]");
  // Channel pruning's fields: ranges, and only with method CHANNEL.
  EXPECT_EQ(Error(WithTrain("") + "pruning { round_to: 8 }"),
            "pruning.round_to: only applies to method: CHANNEL");
  EXPECT_EQ(Error(WithTrain("") + "pruning { method: CHANNEL round_to: -8 }"),
            "pruning.round_to: must be in [0, 1024]");
  EXPECT_EQ(Error(WithTrain("") + "pruning { method: CHANNEL target_flops: 1.5 }"),
            "pruning.target_flops: must be in (0, 1)");
  EXPECT_EQ(Error(WithTrain("") + "pruning { method: BLOCK target_flops: 0.5 }"),
            "pruning.target_flops: only applies to method: CHANNEL");
  EXPECT_EQ(
      Error(WithTrain("") + "pruning { method: CHANNEL target_flops: 0.5 max_fraction: -0.5 }"),
      "pruning.max_fraction: must be in (0, 1]");
  EXPECT_EQ(Error(WithTrain("") + "pruning { method: CHANNEL target: 0.5 max_fraction: 0.5 }"),
            "pruning.max_fraction: only applies with target_flops (per-group targets say each "
            "group's share)");
  auto flops = ParseSpec(WithTrain("") + "pruning { method: CHANNEL target_flops: 0.5 }", "x");
  ASSERT_TRUE(flops.ok());
  EXPECT_FLOAT_EQ(WithDefaults(*flops).pruning().max_fraction(), 0.75f);
  EXPECT_EQ(Error(WithTrain("") + "pruning { min_channels: 4 }"),
            "pruning.min_channels: only applies to method: CHANNEL");
  EXPECT_EQ(Error(WithTrain("") + "pruning { score: BN_SCALE }"),
            "pruning.score: BN_SCALE only applies to method: CHANNEL");
  EXPECT_EQ(Error("name: 'two\\nlines' " + WithTrain("")),
            "name: must be valid UTF-8 of at most 256 bytes, without control characters "
            "(newlines, tabs, C1 controls, bidirectional formatting)");
  // Names that print as other names: a right-to-left override, a C1 control (CSI).
  EXPECT_EQ(Error("name: 'exp\342\200\256txt' " + WithTrain("")).substr(0, 25),
            "name: must be valid UTF-8");
  EXPECT_EQ(Error("name: 'a\302\233b' " + WithTrain("")).substr(0, 25),
            "name: must be valid UTF-8");
  // Found by spec_fuzz: the text-format parser accepts bytes that are not UTF-8.
  EXPECT_EQ(Error("name: 'caf\\351' " + WithTrain("")).substr(0, 25), "name: must be valid UTF-8");
  EXPECT_EQ(Error(WithTrain("") + "data { path: '/a\\300\\200' }").substr(0, 30),
            "data.path: must be valid UTF-8");
  EXPECT_EQ(Error("name: 'caf\\303\\251' " + WithTrain("")), "");
  EXPECT_NE(Error(std::string(2 << 20, ' ') + WithTrain("")).find("the limit is 1048576"),
            std::string::npos);
}

TEST(Spec, GradientSamplingIsValidatedFieldByField) {
  auto with = [](const std::string& block) {
    return Error(WithTrain("") + "gradient_sampling { " + block + " }");
  };
  EXPECT_EQ(with(""), "");
  EXPECT_EQ(with("layers: 'stage*' exclude: 'stem' every_other: true top_k: 4 scale: REFERENCE "
                 "probability: 0.5 warmup_epochs: 2"),
            "");
  EXPECT_EQ(with("every_n_steps: 3"), "");
  EXPECT_EQ(with("alternate_epochs: true"), "");
  EXPECT_EQ(with("top_k: -1"),
            "gradient_sampling.top_k: must be in [1, 1048576] (0: the default, 1)");
  EXPECT_EQ(with("top_k: 2000000000"),
            "gradient_sampling.top_k: must be in [1, 1048576] (0: the default, 1)");
  EXPECT_EQ(with("scale: 9"), "gradient_sampling.scale: unknown value 9");
  EXPECT_EQ(with("probability: 0"), "gradient_sampling.probability: must be in (0, 1]");
  EXPECT_EQ(with("probability: nan"), "gradient_sampling.probability: must be in (0, 1]");
  EXPECT_EQ(with("probability: 1.5"), "gradient_sampling.probability: must be in (0, 1]");
  EXPECT_EQ(with("every_n_steps: 0"), "gradient_sampling.every_n_steps: must be in [1, 1000000]");
  EXPECT_EQ(with("alternate_epochs: false"),
            "gradient_sampling.alternate_epochs: set it to true or leave it out (the steps oneof)");
  EXPECT_EQ(with("warmup_epochs: -1"), "gradient_sampling.warmup_epochs: must be in [0, 10000]");
  EXPECT_EQ(with("layers: ''"), "gradient_sampling.layers[0]: must name a layer pattern");
  EXPECT_EQ(with("layers: 'a' exclude: 'b\\001'").substr(0, 41),
            "gradient_sampling.exclude[0]: must be val");
  // The steps are a oneof: naming two is a parse error that names the second.
  EXPECT_NE(with("probability: 0.5 every_n_steps: 2").find("every_n_steps"), std::string::npos);
  auto spec = ParseSpec(WithTrain("") + "gradient_sampling { every_n_steps: 2 }", "x");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(WithDefaults(*spec).gradient_sampling().top_k(), 1);
}

TEST(Spec, OnlyRegularFilesOfBoundedSizeAreRead) {
  auto dev = LoadSpecFile("/dev/zero");
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.status().message().find("not a regular file"), std::string::npos) << dev.status();
  auto dir = LoadSpecFile(testing::TestDir());
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("is a folder, not a file"), std::string::npos)
      << dir.status();
}

TEST(Spec, DefaultsFilledIn) {
  auto spec = ParseSpec(WithTrain(""), "x");
  ASSERT_TRUE(spec.ok());
  const auto full = WithDefaults(*spec);
  EXPECT_EQ(full.data().dataset(), topiary::v1::DataSpec::FASHION_MNIST);
  EXPECT_EQ(full.data().path(), "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(full.data().batch_size(), 128);
  EXPECT_EQ(full.data().eval_batch_size(), 128);
  EXPECT_FLOAT_EQ(full.train().optimizer().lr(), 0.1f);
  EXPECT_FLOAT_EQ(full.train().optimizer().momentum(), 0.9f);
  // An explicit zero momentum is kept (presence, not value, decides).
  auto zero = ParseSpec(WithTrain("optimizer { momentum: 0 }"), "x");
  EXPECT_FLOAT_EQ(WithDefaults(*zero).train().optimizer().momentum(), 0.0f);
}

TEST(LrSchedule, Shapes) {
  topiary::v1::LrSchedule s;
  EXPECT_DOUBLE_EQ(LearningRate(s, 0.1, 3.5, 10), 0.1);
  s.set_kind(topiary::v1::LrSchedule::MULTISTEP);
  s.add_milestones(2);
  s.add_milestones(4);
  s.set_gamma(0.1f);
  EXPECT_NEAR(LearningRate(s, 1.0, 1.9, 10), 1.0, 1e-12);
  EXPECT_NEAR(LearningRate(s, 1.0, 2.0, 10), 0.1, 1e-7);
  EXPECT_NEAR(LearningRate(s, 1.0, 4.5, 10), 0.01, 1e-7);
  s.set_kind(topiary::v1::LrSchedule::COSINE);
  s.set_min_lr(0.0f);
  EXPECT_NEAR(LearningRate(s, 1.0, 0.0, 10), 1.0, 1e-12);
  EXPECT_NEAR(LearningRate(s, 1.0, 5.0, 10), 0.5, 1e-12);
  EXPECT_NEAR(LearningRate(s, 1.0, 10.0, 10), 0.0, 1e-12);
  s.set_warmup_epochs(2.0f);
  EXPECT_NEAR(LearningRate(s, 1.0, 1.0, 10), 0.5 * (0.5 * (1 + std::cos(M_PI * 0.1))), 1e-7);
}

TEST(Philox, KnownAnswersOfRandom123) {
  // Test vectors of Random123's kat_vectors for philox4x32_10.
  EXPECT_EQ(Philox4x32({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(Philox4x32({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}),
            (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(Philox, StreamsDifferAndRestoreResumesExactly) {
  Philox a(5, RngStream::kShuffle), b(5, RngStream::kAugment);
  EXPECT_NE(a.NextU32(), b.NextU32());
  Philox c(9, RngStream::kInit);
  for (int i = 0; i < 7; ++i) c.NextU32();
  const uint64_t counter = c.counter();
  const int index = c.index();
  std::vector<uint32_t> next;
  for (int i = 0; i < 10; ++i) next.push_back(c.NextU32());
  Philox d(9, RngStream::kInit);
  d.Restore(counter, index);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(d.NextU32(), next[i]);
  // Normal draws have roughly unit variance.
  double sum = 0, sq = 0;
  for (int i = 0; i < 20000; ++i) {
    const double v = d.Normal();
    sum += v;
    sq += v * v;
  }
  EXPECT_NEAR(sum / 20000, 0.0, 0.03);
  EXPECT_NEAR(sq / 20000, 1.0, 0.05);
}

}  // namespace
}  // namespace topiary

namespace topiary {
namespace {

// fork --set: what is wrong with a change is said, not only that it does not fit.
TEST(ApplySpecChange, MergesAChangeOrSaysWhyNot) {
  topiary::v1::ExperimentSpec spec;
  spec.mutable_pruning()->set_target(0.5f);
  ASSERT_TRUE(ApplySpecChange("pruning.target=0.75", &spec).ok());
  EXPECT_FLOAT_EQ(spec.pruning().target(), 0.75f);
  auto typo = ApplySpecChange("pruning.targt=0.7", &spec);
  EXPECT_EQ(typo.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(typo.message().find("set: 'pruning.targt=0.7': "), std::string::npos) << typo;
  EXPECT_NE(typo.message().find("pruning has no field 'targt' (it has method, block_in"),
            std::string::npos)
      << typo;
  auto word = ApplySpecChange("pruning.target=high", &spec);
  EXPECT_NE(word.message().find("high"), std::string::npos) << word;
  EXPECT_EQ(ApplySpecChange("=1", &spec).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FLOAT_EQ(spec.pruning().target(), 0.75f);  // failures change nothing
}

// What a fork does with inherited blocks: remove one, replace one whole, change one entry of
// a list; and the errors say where the path went wrong.
TEST(ApplySpecChange, DropsReplacesAndIndexes) {
  auto spec = ParseSpec(R"(
    model { arch: "resnet20" }
    pruning { method: BLOCK target: 0.5 }
    approximation { rules { layer: "*" multiplier: "mul8u_L40" }
                    rules { layer: "stem*" exclude: true } })",
                        "t");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(ApplySpecChange("approximation.rules[0].multiplier=drum:6", &*spec).ok());
  EXPECT_EQ(spec->approximation().rules(0).multiplier(), "drum:6");  // a bare string
  EXPECT_EQ(spec->approximation().rules_size(), 2);
  ASSERT_TRUE(
      ApplySpecChange("approximation={rules {layer: \"*\" multiplier: \"trunc:4\"}}", &*spec).ok());
  ASSERT_EQ(spec->approximation().rules_size(), 1);  // replaced whole, not merged
  EXPECT_EQ(spec->approximation().rules(0).multiplier(), "trunc:4");
  ASSERT_TRUE(ApplySpecChange("pruning=none", &*spec).ok());
  EXPECT_FALSE(spec->has_pruning());
  ASSERT_TRUE(ApplySpecChange("approximation.rules=none", &*spec).ok());
  EXPECT_EQ(spec->approximation().rules_size(), 0);
  ASSERT_TRUE(ApplySpecChange("pruning.method=CHANNEL", &*spec).ok());  // a block anew
  EXPECT_EQ(spec->pruning().method(), topiary::v1::PruningSpec::CHANNEL);
  auto range = ApplySpecChange("approximation.rules[3].layer=x", &*spec);
  EXPECT_NE(range.message().find("approximation.rules[3]: the list has 0 entries"),
            std::string::npos)
      << range;
  auto list = ApplySpecChange("approximation.rules.layer=x", &*spec);
  EXPECT_NE(list.message().find("is a list: name an entry"), std::string::npos) << list;
  auto enum_word = ApplySpecChange("pruning.method=BLOK", &*spec);
  EXPECT_NE(enum_word.message().find("one of its names (BLOCK, MAGNITUDE"), std::string::npos)
      << enum_word;
  auto braces = ApplySpecChange("pruning={target: high}", &*spec);
  EXPECT_NE(braces.message().find("pruning takes a PruningSpec in braces"), std::string::npos)
      << braces;
  EXPECT_EQ(spec->pruning().method(), topiary::v1::PruningSpec::CHANNEL);  // unchanged
}

}  // namespace
}  // namespace topiary

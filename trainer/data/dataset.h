// Datasets: images held whole in memory as uint8 NHWC plus int32 labels. Loaders check
// everything they read and name the file and the problem when something is wrong.
#ifndef TOPIARY_TRAINER_DATA_DATASET_H_
#define TOPIARY_TRAINER_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "topiary/v1/experiment.pb.h"
#include "trainer/spec/catalog.h"

namespace topiary {

struct StreamedFiles;  // trainer/data/image_folder.h

struct ImageSet {
  int h = 0, w = 0, c = 0;  // as stored
  // The images batches hold, when smaller than the stored ones (0: h, w): the centre crop in
  // evaluation, a random-resized crop in training (IMAGE_FOLDER's crop_size).
  int out_h = 0, out_w = 0;
  int batch_h() const { return out_h > 0 ? out_h : h; }
  int batch_w() const { return out_w > 0 ? out_w : w; }
  std::vector<uint8_t> pixels;  // [size, h, w, c]
  std::vector<int32_t> labels;  // [size], each in [0, classes)
  // IMAGE_FOLDER with pipeline STREAM: the files batches read and decode every epoch; pixels
  // is then empty and h, w are image_size (evaluation's resize before its centre crop).
  std::shared_ptr<const StreamedFiles> files;
  bool streamed() const { return files != nullptr; }
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  size_t image_bytes() const { return static_cast<size_t>(h) * w * c; }
  // Keeps only the first n images (n <= 0 or n >= size: unchanged).
  void Truncate(int64_t n);
};

struct Dataset {
  std::string name;  // e.g. "fashion_mnist"
  int classes = 0;
  float max_value = 255.0f;  // the pixel value that means full intensity (16 for DIGITS)
  ImageSet train, test;
  // data.validation_fraction's held-out training images (empty without): see HoldOutValidation.
  ImageSet validation;
  // IMAGE_FOLDER with bad_images: SKIP: the files left out, and the first few with why.
  int64_t skipped = 0;
  std::vector<std::string> skipped_examples;
};

// Loads what spec.data names (train_limit / test_limit applied). REQUIRES: a spec with
// defaults filled in (see spec.h).
absl::StatusOr<Dataset> LoadDataset(const topiary::v1::DataSpec& data, uint64_t seed);

// Moves round(fraction * n_c) of each class's n_c training images into ds->validation
// (fraction in [0, 0.5]; 0: nothing): a fixed draw, independent of the run's seed, so every
// experiment on the same data and fraction holds out the same images. Both sets keep the
// training set's order. Errors when a class would be left with no training image.
absl::Status HoldOutValidation(double fraction, Dataset* ds);

// Whether the files LoadDataset would read are there (present, regular, within the read
// policy), without reading them: checked when a spec is submitted or validated, so that a
// wrong data.path is refused then and not when the run starts. Errors name data.path.
absl::Status CheckDatasetFiles(const topiary::v1::DataSpec& data);

// One IDX image file ([n, rows, cols] ubyte) and its label file ([n] ubyte), raw or gzipped
// (found by content, not by name). Labels must be < classes.
absl::StatusOr<ImageSet> ReadIdxPair(const std::string& images_path, const std::string& labels_path,
                                     int classes);
// The parsers behind the readers, on bytes in memory (`*_name` names them in errors); the
// fuzz harnesses (tests/fuzz/) call these.
absl::StatusOr<ImageSet> ParseIdxPair(std::string images, const std::string& labels,
                                      const std::string& images_name,
                                      const std::string& labels_name, int classes);
absl::Status AppendCifarRecords(const std::string& data, const std::string& name, bool cifar100,
                                ImageSet* set);
absl::StatusOr<Dataset> ParseDigitsCsv(const std::string& text, const std::string& name);
// The four IDX files of MNIST-format data in `dir` (train-/t10k-, -idx3-ubyte[.gz]).
absl::StatusOr<Dataset> ReadIdxFolder(const std::string& dir, const std::string& name);
// CIFAR-10 ("binary version": data_batch_1..5.bin, test_batch.bin) or CIFAR-100 (train.bin,
// test.bin; fine labels) from `dir`.
absl::StatusOr<Dataset> ReadCifarFolder(const std::string& dir, bool cifar100);
// scikit-learn's digits.csv[.gz]: 1797 rows of 64 pixel values (0..16) and the label.
// Every fifth row (index % 5 == 4) is the test set.
absl::StatusOr<Dataset> ReadDigitsCsv(const std::string& path);
// Seeded, learnable: a random smooth prototype per class plus Gaussian noise.
Dataset MakeSynthetic(const topiary::v1::SyntheticSpec& spec, uint64_t seed);

}  // namespace topiary

#endif  // TOPIARY_TRAINER_DATA_DATASET_H_

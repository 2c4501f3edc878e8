// Writes an IDX image set (Fashion-MNIST's, say) as an IMAGE_FOLDER tree of PNG or JPEG files:
//   make_image_folder IDX_FOLDER OUT_FOLDER png|jpeg [TRAIN_LIMIT] [TEST_LIMIT]
// OUT_FOLDER/train/<label>/<index>.png and OUT_FOLDER/val/<label>/... (labels as 00..99).
#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "tests/tools/image_files.h"
#include "trainer/data/dataset.h"
#include "trainer/util/file_util.h"

int main(int argc, char** argv) {
  using namespace topiary;
  int64_t limits[2] = {0, 0};
  if (argc < 4 || (std::string(argv[3]) != "png" && std::string(argv[3]) != "jpeg") ||
      (argc > 4 && !absl::SimpleAtoi(argv[4], &limits[0])) ||
      (argc > 5 && !absl::SimpleAtoi(argv[5], &limits[1]))) {
    std::fprintf(stderr, "usage: make_image_folder IDX_FOLDER OUT png|jpeg [TRAIN_N] [TEST_N]\n");
    return 2;
  }
  auto ds = ReadIdxFolder(argv[1], "idx");
  if (!ds.ok()) {
    std::fprintf(stderr, "%s\n", std::string(ds.status().message()).c_str());
    return 1;
  }
  const bool png = std::string(argv[3]) == "png";
  for (int s = 0; s < 2; ++s) {
    ImageSet& set = s == 0 ? ds->train : ds->test;
    set.Truncate(limits[s]);
    for (int64_t i = 0; i < set.size(); ++i) {
      const std::string dir =
          absl::StrFormat("%s/%s/%02d", argv[2], s == 0 ? "train" : "val", set.labels[i]);
      if (!MakeDirs(dir).ok()) return 1;
      std::vector<uint8_t> px(set.pixels.begin() + i * set.image_bytes(),
                              set.pixels.begin() + (i + 1) * set.image_bytes());
      const std::string bytes = png ? testing::EncodePng(px, set.w, set.h, set.c)
                                    : testing::EncodeJpeg(px, set.w, set.h, set.c, 95);
      if (bytes.empty() ||
          !WriteFileAtomic(absl::StrFormat("%s/%06d.%s", dir, i, png ? "png" : "jpg"), bytes)
               .ok()) {
        return 1;
      }
    }
  }
  return 0;
}

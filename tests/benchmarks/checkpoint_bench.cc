// Checkpoint speed: writing and reading a checkpoint of a resnet50-sized model (25.6M
// parameters plus momentum and a mask) against a plain sequential write and read of the
// same number of bytes on the same disk. Both writes end with fsync; both reads come from
// the page cache right after the write (no root needed to drop caches), so the ratio
// measures the format's overhead: HDF5, Fletcher-32 checksums, OIHW conversion and the
// copies from the model.
//
// With --cold (root only) the page cache is dropped before each read, so both reads come
// from the disk itself.
//
//   checkpoint_bench [--dir DIR] [--repeats N] [--arch resnet50] [--cold 1]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "trainer/nn/masks.h"
#include "trainer/nn/model_zoo.h"
#include "trainer/store/checkpoint.h"

namespace topiary {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double PlainWrite(const std::string& path, const std::vector<char>& bytes) {
  const double t0 = Now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        ::write(fd, bytes.data() + done, std::min<size_t>(bytes.size() - done, 64 << 20));
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  return Now() - t0;
}

double PlainRead(const std::string& path, std::vector<char>* bytes) {
  const double t0 = Now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  size_t done = 0;
  while (done < bytes->size()) {
    const ssize_t n = ::read(fd, bytes->data() + done, bytes->size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return Now() - t0;
}

bool DropCaches() {
  ::sync();
  std::FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w");
  if (f == nullptr || std::fputs("3\n", f) < 0 || std::fclose(f) != 0) {
    absl::FPrintF(stderr, "--cold: cannot write /proc/sys/vm/drop_caches (needs root)\n");
    return false;
  }
  return true;
}

int Main(int argc, char** argv) {
  std::string dir = "/tmp", arch = "resnet50";
  int repeats = 5;
  bool cold = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dir") dir = argv[i + 1];
    if (flag == "--repeats") repeats = std::max(1, std::atoi(argv[i + 1]));
    if (flag == "--arch") arch = argv[i + 1];
    if (flag == "--cold") cold = std::atoi(argv[i + 1]) != 0;
  }
  auto device = MakeCpuDevice(0);
  auto model = BuildModel(arch, 1.0f, {1, 224, 224, 3}, 1000, device.get());
  if (!model.ok()) {
    absl::FPrintF(stderr, "%s\n", model.status().message());
    return 1;
  }
  (*model)->Initialize(1);
  // Momentum with real values, and a 2:4-like element mask on every kernel, so that every
  // dataset a pruning run writes is there.
  size_t payload = 0;
  for (Parameter* p : (*model)->parameters()) {
    payload += p->size() * 4;
    if (!p->trainable) continue;
    std::vector<float> m = p->value.ToHost();
    for (float& x : m) x *= 0.5f;
    p->momentum.CopyFromHost(m.data());
    payload += p->size() * 4;
    if (p->role == ParamRole::kKernel) {
      std::vector<uint8_t> mask(p->size());
      for (size_t i = 0; i < mask.size(); ++i) mask[i] = (i % 4) < 2;
      MaskInfo info;
      info.kind = MaskInfo::Kind::kElement;
      if (!InstallMask(p, mask, info).ok()) return 1;
      payload += p->size();
    }
  }
  const std::string ckpt = dir + "/checkpoint_bench.h5", plain = dir + "/checkpoint_bench.bin";
  std::vector<char> bytes(payload, 1);
  std::vector<double> w_ckpt, r_ckpt, w_plain, r_plain;
  for (int r = 0; r < repeats; ++r) {
    double t0 = Now();
    if (auto st = SaveCheckpoint(ckpt, **model, {}); !st.ok()) {
      absl::FPrintF(stderr, "%s\n", st.message());
      return 1;
    }
    w_ckpt.push_back(Now() - t0);
    if (cold && !DropCaches()) return 1;
    t0 = Now();
    auto loaded = LoadCheckpoint(ckpt, model->get(), true);
    if (!loaded.ok()) {
      absl::FPrintF(stderr, "%s\n", loaded.status().message());
      return 1;
    }
    r_ckpt.push_back(Now() - t0);
    if (cold && !DropCaches()) return 1;
    t0 = Now();
    auto doc = ReadH5File(ckpt);
    const double read_file = Now() - t0;
    t0 = Now();
    (void)WriteH5File(ckpt + ".2", *doc);
    absl::PrintF("  (file only: write %.3f s, read %.3f s)\n", Now() - t0, read_file);
    std::remove((ckpt + ".2").c_str());
    w_plain.push_back(PlainWrite(plain, bytes));
    if (cold && !DropCaches()) return 1;
    r_plain.push_back(PlainRead(plain, &bytes));
  }
  std::remove(ckpt.c_str());
  std::remove(plain.c_str());
  const double mb = payload / 1e6;
  const double wc = Median(w_ckpt), rc = Median(r_ckpt), wp = Median(w_plain), rp = Median(r_plain);
  absl::PrintF(
      "%s checkpoint: %.1f MB of parameters, momentum and masks; %d repeats, medians; "
      "reads %s\n",
      arch, mb, repeats, cold ? "cold (page cache dropped)" : "warm (page cache)");
  absl::PrintF("write: checkpoint %.3f s (%.0f MB/s), plain %.3f s (%.0f MB/s): %.2fx of plain\n",
               wc, mb / wc, wp, mb / wp, wp / wc);
  absl::PrintF("read:  checkpoint %.3f s (%.0f MB/s), plain %.3f s (%.0f MB/s): %.2fx of plain\n",
               rc, mb / rc, rp, mb / rp, rp / rc);
  return 0;
}

}  // namespace
}  // namespace topiary

int main(int argc, char** argv) { return topiary::Main(argc, argv); }

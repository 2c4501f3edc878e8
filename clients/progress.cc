#include "clients/progress.h"

#include <cmath>
#include <string>

#include "absl/strings/str_format.h"

namespace topiary {

std::string FormatDuration(double seconds) {
  const long s = std::lround(std::max(seconds, 0.0));
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%d:%02d", s / 60, s % 60);
  return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
}

void ProgressPrinter::Print(const topiary::v1::Event& e) {
  if (e.has_started()) {
    const auto& s = e.started();
    absl::FPrintF(out_, "%s: %s on %s (%d train / %d test images), %d parameters, %s\n", s.name(),
                  s.model_arch(), s.dataset(), s.train_images(), s.test_images(), s.parameters(),
                  s.device());
  } else if (e.has_progress() && tty_) {
    const auto& p = e.progress();
    const double frac =
        p.images_total() ? static_cast<double>(p.images_done()) / p.images_total() : 0;
    constexpr int kWidth = 28;
    const int filled = static_cast<int>(frac * kWidth);
    const std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
    absl::FPrintF(out_, "\r\033[Kepoch %d/%d [%s] %3.0f%%  %6.0f img/s  loss %.4f  lr %.4g  ETA %s",
                  p.epoch(), p.epochs(), bar, 100 * frac, p.images_per_s(), p.loss(), p.lr(),
                  FormatDuration(p.eta_s()));
    bar_open_ = true;
  } else if (e.has_epoch()) {
    const auto& ep = e.epoch();
    if (bar_open_) absl::FPrintF(out_, "\r\033[K");
    bar_open_ = false;
    absl::FPrintF(out_, "epoch %d: train loss %.4f top-1 %.2f%%  %.0f img/s  %s", ep.epoch(),
                  ep.train_loss(), 100 * ep.train_top1(), ep.images_per_s(),
                  FormatDuration(ep.seconds()));
    if (ep.evaluated()) {
      absl::FPrintF(out_, "  | test loss %.4f top-1 %.2f%% top-5 %.2f%%", ep.test_loss(),
                    100 * ep.test_top1(), 100 * ep.test_top5());
    }
    absl::FPrintF(out_, "\n");
  } else if (e.has_summary()) {
    const auto& s = e.summary();
    if (bar_open_) absl::FPrintF(out_, "\n");
    bar_open_ = false;
    if (s.state() != "SUCCEEDED") {
      absl::FPrintF(out_, "%s: %s\n", s.state(), s.error());
    } else {
      absl::FPrintF(out_,
                    "%s: test top-1 %.2f%%, top-5 %.2f%%, loss %.4f after %d epochs in %s on %s "
                    "(%.0f train img/s)\n",
                    s.state(), 100 * s.test_top1(), 100 * s.test_top5(), s.test_loss(), s.epochs(),
                    FormatDuration(s.seconds()), s.device(), s.train_images_per_s());
    }
    if (!s.out_dir().empty()) absl::FPrintF(out_, "outputs: %s\n", s.out_dir());
  }
  std::fflush(out_);
}

}  // namespace topiary

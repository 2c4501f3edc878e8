// Terminal rendering of run events: a progress bar per epoch on a terminal, plain lines
// otherwise, and the final summary.
#ifndef TOPIARY_CLIENTS_PROGRESS_H_
#define TOPIARY_CLIENTS_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "topiary/v1/events.pb.h"

namespace topiary {

class ProgressPrinter {
 public:
  // tty: redraw one bar line in place (with \r); otherwise print only whole lines.
  ProgressPrinter(std::FILE* out, bool tty) : out_(out), tty_(tty) {}
  void Print(const topiary::v1::Event& event);

 private:
  void PrintStarted(const topiary::v1::RunStarted& s);
  void PrintPlanning(const topiary::v1::Planning& p);
  void PrintProgress(const topiary::v1::Progress& p);
  void PrintEpoch(const topiary::v1::EpochSummary& ep);
  void PrintState(const topiary::v1::StateChanged& st);
  void PrintRound(const topiary::v1::RoundSummary& r);
  void PrintSummary(const topiary::v1::RunSummary& s);

  std::FILE* out_;
  bool tty_;
  bool bar_open_ = false;
};

// What a round was judged by: its validation figures when the run held out a validation set
// (data.validation_fraction), else its test figures.
struct HeldOut {
  const char* set;  // "val" | "test"
  double top1, loss;
};
inline HeldOut HeldOutOf(const topiary::v1::RoundSummary& r) {
  return r.val_loss() > 0 ? HeldOut{"val", r.val_top1(), r.val_loss()}
                          : HeldOut{"test", r.test_top1(), r.test_loss()};
}

// The round table of a pruning run: round, overall sparsity, the layers' range, test
// top-1, loss, time; then each pruned layer's sparsity per round.
void PrintRoundTable(std::FILE* out, const topiary::v1::RunSummary& summary);

// The block-masked convolutions' kernel choices of a round (GPU runs): per pass the measured
// block-sparse and dense times and which one ran. Prints nothing when none was measured.
void PrintEngineChoices(std::FILE* out, const topiary::v1::RoundSummary& round);

// One line on the convolutions' input sparsity: the mean zero fraction and the extremes.
void PrintInputSparsity(
    std::FILE* out,
    const google::protobuf::RepeatedPtrField<topiary::v1::ConvInputSparsity>& layers);

// A transfer's progress (upload, download): on a terminal one line redrawn at most ten
// times a second ("upload  37/120 files  12.5 MiB of 40 MiB  31%  8.2 MiB/s"); otherwise
// nothing until Done, which ends it with a line of totals.
class TransferProgress {
 public:
  TransferProgress(std::FILE* out, bool tty, std::string verb, int files, uint64_t bytes);
  // `files` finished and `bytes` moved so far.
  void Update(int files, uint64_t bytes);
  void Done(const std::string& summary);

 private:
  std::FILE* out_;
  bool tty_;
  std::string verb_;
  int files_;
  uint64_t bytes_;
  double start_, last_ = 0;
};

// "1:02:03" / "2:03" / "45s"
std::string FormatDuration(double seconds);

}  // namespace topiary

#endif  // TOPIARY_CLIENTS_PROGRESS_H_

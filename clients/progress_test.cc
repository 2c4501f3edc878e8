// The round table's block-sparse section: measured passes show both times with the chosen
// side starred, unmeasured ones say so, and runs without any measurement print nothing.
// Planning events: a redrawn line on a terminal, one summary line per network otherwise.
#include "clients/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace topiary {
namespace {

std::string Printed(const topiary::v1::RoundSummary& r) {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  PrintEngineChoices(f, r);
  std::fclose(f);
  std::string out(buf, size);
  std::free(buf);
  return out;
}

TEST(Progress, EngineChoicesShowBothTimesAndTheChoice) {
  topiary::v1::RoundSummary r;
  r.set_round(3);
  auto* a = r.add_layers();
  a->set_layer("stage3.block0.conv2");
  a->set_units(64);
  a->set_zero_units(32);
  using Choice = topiary::v1::ConvPassChoice;
  auto set = [](Choice* c, Choice::Engine engine, double dense, double sparse) {
    c->set_chosen(engine);
    c->set_dense_ms(dense);
    c->set_sparse_ms(sparse);
  };
  set(a->mutable_forward(), Choice::BLOCK_SPARSE, 0.020, 0.010);
  set(a->mutable_backward_data(), Choice::DENSE, 0.015, 0.030);
  set(a->mutable_backward_filter(), Choice::DENSE, -1, -1);
  r.add_layers()->set_layer("fc");  // no block mask: no row
  const std::string out = Printed(r);
  EXPECT_NE(out.find("round 3"), std::string::npos) << out;
  EXPECT_NE(out.find("stage3.block0.conv2"), std::string::npos) << out;
  EXPECT_NE(out.find("50.0%"), std::string::npos) << out;
  EXPECT_NE(out.find("*0.010 / 0.020"), std::string::npos) << out;
  EXPECT_NE(out.find("0.030 / *0.015"), std::string::npos) << out;
  EXPECT_NE(out.find("dense (not measured)"), std::string::npos) << out;
  EXPECT_EQ(out.find("fc"), std::string::npos) << out;
}

TEST(Progress, NoEngineChoicesPrintNothing) {
  topiary::v1::RoundSummary r;
  r.add_layers()->set_layer("stage1.block0.conv1");
  EXPECT_EQ(Printed(r), "");
}

std::string PrintedEvents(const std::vector<topiary::v1::Event>& events, bool tty) {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  ProgressPrinter printer(f, tty);
  for (const auto& e : events) printer.Print(e);
  std::fclose(f);
  std::string out(buf, size);
  std::free(buf);
  return out;
}

TEST(Progress, PlanningShowsLayersAndHowConvolutionsWerePlanned) {
  std::vector<topiary::v1::Event> events(2);
  auto* p = events[0].mutable_planning();
  p->set_network("training, batch 256");
  p->set_layers_done(40);
  p->set_layers_total(175);
  p->set_convolutions_cached(3);
  p->set_convolutions_measured(5);
  p->set_seconds(1.2);
  auto* done = events[1].mutable_planning();
  *done = *p;
  done->set_layers_done(175);
  done->set_convolutions_untimed(2);
  done->set_done(true);
  done->set_planned_bytes(int64_t{3} << 30);
  done->add_cache_notes("/x/conv_plans.tsv: 1 damaged lines skipped");
  const std::string tty = PrintedEvents(events, true);
  EXPECT_NE(
      tty.find("\r\033[Kplanning training, batch 256: 40/175 layers, convolutions: 3 cached, 5 "
               "measured"),
      std::string::npos)
      << tty;
  EXPECT_NE(tty.find("175/175 layers, convolutions: 3 cached, 5 measured, 2 untimed  1s, 3 GiB\n"),
            std::string::npos)
      << tty;
  EXPECT_NE(tty.find("plan cache: /x/conv_plans.tsv: 1 damaged lines skipped\n"),
            std::string::npos);
  const std::string log = PrintedEvents(events, false);  // no redrawn lines in a log
  EXPECT_EQ(log.find("40/175"), std::string::npos) << log;
  EXPECT_NE(log.find("175/175"), std::string::npos) << log;
}

TEST(Progress, APausedRunSaysWhereItStoppedNotAnEmptyReason) {
  std::vector<topiary::v1::Event> events(1);
  auto* s = events[0].mutable_summary();
  s->set_state(topiary::v1::PAUSED);
  s->set_epochs(3);
  s->set_checkpoint("/data/experiments/exp-0002/checkpoints/pause.h5");
  const std::string out = PrintedEvents(events, false);
  EXPECT_NE(out.find("PAUSED after 3 epochs; it resumes from "
                     "/data/experiments/exp-0002/checkpoints/pause.h5"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("PAUSED: \n"), std::string::npos) << out;
}

}  // namespace
}  // namespace topiary

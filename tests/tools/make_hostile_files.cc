// make_hostile_files DIR: writes good.h5 and every hostile checkpoint of hostile_files.h
// into DIR, and prints one line per file: NAME<TAB>the error text every reader must give.
// tests/hostile_daemon_test.sh feeds them to the CLI and the daemon.
#include <cstdio>
#include <string>

#include "tests/tools/hostile_files.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_hostile_files DIR OUTSIDE_FILE\n");
    return 2;
  }
  const std::string dir = argv[1];
  topiary::testing::WriteGoodCheckpoint(dir + "/good.h5");
  topiary::testing::WriteGoodCheckpoint(argv[2]);
  for (const auto& c : topiary::testing::WriteHostileCheckpoints(dir + "/good.h5", dir, argv[2])) {
    std::printf("%s\t%s\n", c.name.c_str(), c.needle.c_str());
  }
  return 0;
}

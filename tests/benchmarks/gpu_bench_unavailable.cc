// A GPU benchmark in a CPU-only build: says why it cannot run.
#include <cstdio>

int main() {
  std::fprintf(stderr, "this benchmark needs a CUDA build (no toolkit was configured)\n");
  return 2;
}

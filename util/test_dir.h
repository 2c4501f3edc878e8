// Where a test writes its files: Bazel's TEST_TMPDIR, or, for a test binary run by hand (the
// GPU tests on the device machine, a test under a debugger), a fresh folder of its own under
// $TMPDIR or /tmp, made once per process. Tests never crash for want of the variable.
#ifndef TOPIARY_UTIL_TEST_DIR_H_
#define TOPIARY_UTIL_TEST_DIR_H_

#include <cstdlib>
#include <string>

namespace topiary::testing {

inline const std::string& TestDir() {
  static const std::string* dir = [] {
    if (const char* bazel = std::getenv("TEST_TMPDIR"); bazel != nullptr && *bazel != '\0') {
      return new std::string(bazel);
    }
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/topiary_test_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();  // no writable temporary folder
    return new std::string(pattern);
  }();
  return *dir;
}

// `name` under TestDir() (not created).
inline std::string TestPath(const std::string& name) { return TestDir() + "/" + name; }

}  // namespace topiary::testing

#endif  // TOPIARY_UTIL_TEST_DIR_H_

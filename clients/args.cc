#include "clients/args.h"

#include <set>

namespace topiary {

int ExitCodeForStatus(int code) {
  switch (code) {
    case 0:  // OK
      return kExitOk;
    case 3:   // INVALID_ARGUMENT
    case 15:  // DATA_LOSS
      return kExitInvalid;
    case 5:  // NOT_FOUND
      return kExitNotFound;
    case 9:  // FAILED_PRECONDITION
      return kExitWrongState;
    case 14:  // UNAVAILABLE
    case 4:   // DEADLINE_EXCEEDED
      return kExitUnavailable;
    case 16:  // UNAUTHENTICATED
    case 7:   // PERMISSION_DENIED
      return kExitDenied;
    case 8:  // RESOURCE_EXHAUSTED
      return kExitResourceLimit;
    default:
      return kExitFailed;
  }
}

bool ParseArgs(int argc, char** argv, Args* a, std::string* error) {
  static const std::set<std::string> kValued = {"out",        "resume", "file",  "layer", "server",
                                                "token_file", "tls_ca", "state", "from",  "target",
                                                "step",       "epochs", "name",  "set"};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      a->command = "help";
      return true;
    }
    if (arg == "--json" || arg == "--watch") {
      (arg == "--json" ? a->json : a->watch) = true;
      continue;
    }
    if (arg.rfind("--", 0) == 0) {
      std::string name = arg.substr(2), value;
      const size_t eq = name.find('=');
      const bool inline_value = eq != std::string::npos;
      if (inline_value) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      if (!kValued.count(name)) {
        *error = "unknown flag " + arg;
        return false;
      }
      if (!inline_value) {
        if (++i >= argc) {
          *error = "--" + name + " needs a value";
          return false;
        }
        value = argv[i];
      }
      if (name == "set") {
        a->sets.push_back(value);
      } else {
        a->flags[name] = value;
      }
      continue;
    }
    if (arg.rfind("-", 0) == 0 && arg.size() > 1) {
      *error = "unknown flag " + arg;
      return false;
    }
    if (a->command.empty()) {
      a->command = arg;
    } else {
      a->positional.push_back(arg);
    }
  }
  if (a->command.empty()) a->command = "help";
  return true;
}

}  // namespace topiary

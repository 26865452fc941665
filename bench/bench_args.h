// Command lines of the plain benchmark programs: "--option value" pairs and --help.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "qmesh/error.h"

namespace qmesh::bench {

// Calls set(option, value) for each "--option value" pair of argv, in order. "--help" or
// "-h" prints usage(argv[0]) and exits with status 0. Error for an option without a value;
// `set` throws for an option it does not know.
inline void for_each_option(
    int argc, char** argv, const std::function<void(const char*)>& usage,
    const std::function<void(const std::string&, const std::string&)>& set) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      usage(argv[0]);
      std::exit(0);
    }
    QMESH_CHECK(i + 1 < argc, "option ", arg, " needs a value (see --help)");
    set(arg, argv[++i]);
  }
}

// The value of option `arg` as an integer >= 1 (Error naming the option otherwise).
inline int positive(const std::string& arg, const std::string& value) {
  const int v = std::atoi(value.c_str());
  QMESH_CHECK(v >= 1, arg, " must be a positive integer, got '", value, "'");
  return v;
}

}  // namespace qmesh::bench

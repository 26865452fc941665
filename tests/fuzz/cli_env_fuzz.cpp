// libFuzzer target: the command line of train_mlp (parse_options, then validate against a
// 4-rank world) and the QMESH_* environment parsing (param_int, param_double,
// param_string). The input is NUL-separated: the first field is the value of an environment
// variable, the rest are the arguments. Every input must parse or throw an exception that
// train_mlp's main reports (qmesh::Error, Boost.Program_options' errors: std::exception); a
// crash or sanitizer report is a bug.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "options.h"
#include "qmesh/error.h"
#include "qmesh/param.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> fields(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      fields.emplace_back();
    } else {
      fields.back() += static_cast<char>(data[i]);
    }
  }
  setenv("QMESH_FUZZ_VALUE", fields[0].c_str(), 1);
  try {
    qmesh::param_int("FUZZ_VALUE", 0);
  } catch (const qmesh::Error&) {
  }
  try {
    qmesh::param_double("FUZZ_VALUE", 0.0);
  } catch (const qmesh::Error&) {
  }
  try {
    qmesh::param_string("FUZZ_VALUE", "");
  } catch (const qmesh::Error&) {
  }
  std::vector<char*> argv{const_cast<char*>("train_mlp")};
  for (size_t i = 1; i < fields.size(); ++i) argv.push_back(fields[i].data());
  argv.push_back(nullptr);
  static std::FILE* quiet = std::freopen("/dev/null", "w", stdout);  // --help prints
  (void)quiet;
  try {
    if (auto options = train_mlp::parse_options(static_cast<int>(argv.size()) - 1, argv.data()))
      train_mlp::validate(*options, 4, 4);
  } catch (const std::exception&) {
  }
  return 0;
}

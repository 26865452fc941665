// Command-line parsing shared by the benchmarks that use Boost.Program_options.
#pragma once

#include <boost/program_options.hpp>
#include <iostream>

namespace bench {

// Parses argv into the variables `desc` names. Returns false after printing `desc` when
// --help was given (the program then exits 0); throws boost::program_options::error on a
// bad option.
inline bool parse_options(int argc, char** argv,
                          const boost::program_options::options_description& desc) {
  namespace po = boost::program_options;
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return false;
  }
  po::notify(vm);
  return true;
}

}  // namespace bench

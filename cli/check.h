// `meshsim check`: the property suite with a progress display; a failure is shrunk, written as a
// trace and printed with the exact `meshsim replay` command.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace meshsim::cli {

struct CheckArgs {
  int cases = 100;
  uint64_t seed = 0;
  bool seed_given = false;  // otherwise a fresh seed, printed before the run starts
  std::vector<std::string> properties;
  std::string mutant;
  std::string out_dir = "meshsim-counterexamples";
  bool list = false;
  bool coverage = false;  // report rule coverage; a reachable rule never exercised fails the run
};

int cmd_check(const CheckArgs& args, std::ostream& out);

}  // namespace meshsim::cli

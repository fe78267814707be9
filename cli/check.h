// `meshsim check`: the property suite (or the user's scenarios as properties, --scenario), split
// into units of at most kChunkCases cases that CI can shard (--shard I/N) and run in parallel
// processes (-j N) with the same results; reported for people (a failure in meshsim's words: the
// shrunk scenario, its failing checks with their numbers, the commands that reproduce it), as JSON
// (--json, meshsim.check/1) and as JUnit XML (--junit FILE).
#pragma once

#include <cstdint>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshsim::cli {

// Cases per unit: a property's run is split into runs of this many cases, each with its own seed
// (RapidCheck spreads the sizes over each run, so every unit draws small and large cases).
constexpr int kChunkCases = 25;

struct CheckArgs {
  int cases = 100;
  uint64_t seed = 0;
  bool seed_given = false;  // otherwise a fresh seed, printed before the run starts
  std::vector<std::string> properties;
  std::vector<std::string> scenarios;  // --scenario FILE: the user's scenarios as properties
  std::string mutant;
  std::string out_dir = "meshsim-counterexamples";
  bool list = false;
  bool coverage = false;  // report rule coverage; a reachable rule never exercised fails the run
  bool json = false;      // print meshsim.check/1 instead of the report
  std::string junit;      // write JUnit XML here
  std::string shard;      // "I/N", 1 <= I <= N: every N-th unit from the I-th
  int jobs = 1;           // worker processes
  std::string worker_units;  // internal (-j): run these units of the selection, one JSON line each
};

// A -j worker died before it reported its units (exit 1): which, and its last words.
class WorkerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

int cmd_check(const CheckArgs& args, std::ostream& out);

}  // namespace meshsim::cli

// What a scenario needs before it runs: an estimate of its memory and the limits it is held to
// (issue: bounded resources). A run over the limits is refused with the estimate (ErrorKind::
// ResourceLimit, exit 2); memory that runs out all the same is ErrorKind::OutOfMemory (exit 6).
#pragma once

#include <cstdint>
#include <string>

#include "core/scenario.h"

namespace meshsim {

// The default mesh-size limit: every rank is simulated in this one process, and each op costs
// time in proportion to the ranks (a 4,096-rank FSDP step takes about a second).
inline constexpr int64_t kDefaultMaxRanks = 16384;

struct ResourceLimits {
  double max_bytes = 0;                // 0: default_max_memory()
  int64_t max_ranks = kDefaultMaxRanks;
  int processes = 1;                   // validate: every worker simulates the whole mesh
};

struct ResourceEstimate {
  double mesh_bytes = 0;     // every rank's locals of every value
  double oracle_bytes = 0;   // the single-device oracle's global values
  double autograd_bytes = 0; // gradients and what autograd saves for them
  double overhead_bytes = 0; // per value and rank: tensor headers, trace hashes
  double total() const { return mesh_bytes + oracle_bytes + autograd_bytes + overhead_bytes; }
  std::string largest;       // the value that holds the most over the mesh
  std::string largest_path;  // its JSON path ("/inputs/0", "/program/3")
  double largest_bytes = 0;
};

// Half of this machine's physical memory.
double default_max_memory();

// A static estimate from the inputs' shapes and the program's ops (shapes inferred as the rules
// infer them; an op whose shape cannot be inferred is taken as large as its largest argument).
ResourceEstimate estimate_resources(const Scenario& sc, const RunOptions& options);

// Throws SemanticError(ResourceLimit) naming /mesh/shape or the largest value, with the estimate,
// when the scenario needs more ranks or memory than `limits` allow.
void check_resources(const Scenario& sc, const RunOptions& options, const ResourceLimits& limits);

// "1.5 GiB", "800 MB"-style sizes: binary units, three significant digits.
std::string format_bytes(double bytes);

// "8G", "512M", "1.5GiB", "1000000" (bytes); std::invalid_argument with a plain message otherwise.
double parse_byte_size(const std::string& text);

}  // namespace meshsim

// One checked run: the scenario on the fake mesh and on the single-device oracle, compared, as a
// result (DESIGN.md, contract 3) with the run's events (contract 4).
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "core/event.h"
#include "core/scenario.h"

namespace meshsim {

struct CheckedRun {
  nlohmann::json result;  // meshsim.result/1
  std::vector<Event> events;
  int exit_code = 0;      // 0 pass, 1 a check failed, 2 or 3 an error (contract 1)
};

// Never throws for a scenario that parsed: errors of the semantics become status "error", and
// whatever libtorch raises (in the run, the oracle or the comparison) a failed check or an error.
CheckedRun check_scenario(const Scenario& sc, const RunOptions& options);

// How far the mesh's values and gradients may differ from the oracle's, relative to the largest
// finite magnitude of the oracle's (at least 1): 0 (bit for bit) for float64 integer data on meshes
// whose axis sizes are powers of two when every op of the program, local_map bodies and references
// included, is exact on integers (no exp, tanh, sin, softmax, div or mean; scale by an integer or
// a power of two); else 1e-12, and 1e-4 in float32.
double comparison_tolerance(const Scenario& sc, const RunOptions& options);

// Whether an op's results on integer data are integers (exact in any order of the sums); the
// generators use it too, to keep rounded values away from relu's kink and large magnitudes.
bool exact_op(const OpDecl& op);

}  // namespace meshsim

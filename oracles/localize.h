// Where a failing run first goes wrong (result "first_divergence", DESIGN.md contract 3): the op
// whose result first differs from the oracle's (forward), or the op, in backward order, whose
// gradient for an operand differs while the gradients of its results agree (backward): that op's
// backward is the culprit (a rule, a redistribution, a body collective, a Function's backward).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/scenario.h"
#include "oracles/oracle.h"
#include "sim/interpreter.h"

namespace meshsim {

// The forward divergence: `failed` are the values whose comparison failed, in scenario order, and
// `mismatches` the result's mismatch entries (for their messages). Null when none failed.
nlohmann::json forward_divergence(const Scenario& sc, const std::vector<std::string>& failed,
                                  const nlohmann::json& mismatches);

// The backward divergence, from a run and an oracle made with localize always (every value's
// gradient kept, with the graphs). Every value's gradient is compared with the oracle's, latest
// first: the latest value whose gradient differs has only consumers whose results' gradients agree;
// the one consumer among them whose contribution differs is the culprit (each consumer's
// contribution is computed again through the kept graphs, with nothing recorded). Null when every
// value's gradient agrees. `mutant`: the planted bug the run had (its backward nodes run again).
// When the culprit is a local_map, the body op whose backward fails the adjoint test (body_divergence)
// is named too ("body").
nlohmann::json backward_divergence(const Scenario& sc, SimRun& run, const OracleRun& oracle, double tol,
                                   const std::string& mutant = "", DType dtype = DType::Float64);

// Inside a local_map (from a run with localize always): the last body op whose backward is not the
// adjoint of its forward. For each op and each operand, with a random cotangent ybar of the result
// and a random direction dx of the operand (each equal across the groups where its LTensor is
// invariant): <backward(ybar), dx> must equal <ybar, (f(x + eps dx) - f(x - eps dx)) / 2 eps>, where
// the inner products count each rank's term once on variant and reduced axes and 1/n on invariant
// ones (an invariant value is one value held n times). A collective's backward that all_reduces
// again, swaps the wrong dims, a missing mark_varying or a Function's backward off by a factor fail
// it; the libtorch kernels' backward pass it. Plain local code (check_variance false) keeps no sets,
// so its ops get no verdict. Null when every op passes.
nlohmann::json body_divergence(const Scenario& sc, const OpDecl& local_map, SimRun& run, const std::string& mutant,
                               DType dtype);

// The one line a person reads first.
std::string divergence_line(const nlohmann::json& divergence);

}  // namespace meshsim

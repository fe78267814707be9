// The single-device reference: the scenario on global tensors (a redistribution is the identity),
// with libtorch autograd for the input gradients.
#pragma once

#include <functional>
#include <map>
#include <string>

#include <ATen/ATen.h>

#include "core/scenario.h"
#include "oracles/dtypes.h"

namespace meshsim {

struct OracleRun {
  std::map<std::string, at::Tensor> values;
  std::map<std::string, at::Tensor> grads;  // inputs that require grad
  // With keep_graph: the gradient of every program value (undefined where none flows), and the
  // values with their autograd graph, kept for contribution(). Every value is then its own autograd
  // node (a redistribution is a view of its operand, not the operand itself), so that its gradient
  // is its consumers' alone.
  std::map<std::string, at::Tensor> value_grads;
  std::map<std::string, at::Tensor> live;
  // With keep_graph: each program op's operands as that op received them (a view of its own per
  // use), by (op index, operand), as SimRun::operand_uses.
  std::map<std::pair<int, int>, at::Tensor> operand_uses;
};

// What the oracle may ask of the mesh's run: a program value's global (assembled) tensor, or an
// undefined tensor where there is none.
using MeshValues = std::function<at::Tensor(const std::string& name)>;

// A local_map reference that libtorch refuses throws SemanticError(InvalidScenario) naming its JSON
// path; a program op the oracle cannot run (the mesh could) throws std::runtime_error.
// Creation ops make float values of `dtype` (the run's, or their own; float64 in the reference). Random ops (dropout, rand, randn) draw the
// global tensor whole from the run's `seed` (core/random.h): pass the mesh run's, or they differ.
//
// Ties broken by rounding: the gradient of amax / amin is split among the elements equal to the
// extremum, and is not continuous where elements tie. Where the mesh's operand and the oracle's
// differ by rounding (a P(sum) summed in another order), an element may tie the extremum in one and
// miss it by an ulp in the other: the two gradients then differ by whole elements although both are
// right. With `mesh` and a `tolerance` > 0 (the comparison's: an absolute bound of tolerance times
// max(1, |largest operand element|)), a program's amax / amin whose oracle tie set differs from the
// mesh's only by elements within that bound of the extremum takes the mesh's tie set for its
// gradient (its value stays the oracle's). The mesh's tie set is the one its forward values give,
// which the forward check compares: a kernel that splits g otherwise, or a wrong extremum, still
// fails. Exact programs (tolerance 0) never take it.
OracleRun run_oracle(const Scenario& sc, const std::map<std::string, at::Tensor>& input_globals,
                     DType dtype = DType::Float64, const MeshValues& mesh = nullptr, double tolerance = 0.0,
                     bool keep_graph = false, uint64_t seed = 0);

// After run_oracle(keep_graph): the gradient that flows into `use` (an operand_uses entry) from the
// values `outs` when their gradients are `grads` (one op's contribution); undefined where none flows.
at::Tensor oracle_contribution(const OracleRun& run, const std::vector<std::string>& outs,
                               const std::vector<at::Tensor>& grads, const at::Tensor& use);

}  // namespace meshsim

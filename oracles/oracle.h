// The single-device reference: the scenario on global tensors (a redistribution is the identity),
// with libtorch autograd for the input gradients.
#pragma once

#include <map>
#include <string>

#include <ATen/ATen.h>

#include "core/scenario.h"

namespace meshsim {

struct OracleRun {
  std::map<std::string, at::Tensor> values;
  std::map<std::string, at::Tensor> grads;  // inputs that require grad
};

// A local_map reference that libtorch refuses throws SemanticError(InvalidScenario) naming its JSON
// path; a program op the oracle cannot run (the mesh could) throws std::runtime_error.
// Creation ops make float values of `dtype` (the run's).
OracleRun run_oracle(const Scenario& sc, const std::map<std::string, at::Tensor>& input_globals,
                     DType dtype = DType::Float64);

}  // namespace meshsim

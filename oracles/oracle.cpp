#include "oracles/oracle.h"

#include <torch/csrc/autograd/autograd.h>

#include "sim/local_ops.h"

namespace meshsim {

OracleRun run_oracle(const Scenario& sc, const std::map<std::string, at::Tensor>& input_globals) {
  OracleRun run;
  std::vector<at::Tensor> leaves;
  std::vector<std::string> leaf_names;
  for (const auto& in : sc.inputs) {
    at::Tensor t = input_globals.at(in.name).detach().clone().requires_grad_(in.requires_grad);
    run.values[in.name] = t;
    if (in.requires_grad) {
      leaves.push_back(t);
      leaf_names.push_back(in.name);
    }
  }
  for (const auto& op : sc.program) {
    std::vector<at::Tensor> xs;
    for (const auto& a : op.args) xs.push_back(run.values.at(a));
    run.values[op.out] = op.op == "redistribute" ? xs.at(0) : local_op(op.op, op_attrs(op), xs);
  }
  if (!sc.backward.empty() && !leaves.empty()) {
    const at::Tensor& loss = run.values.at(sc.backward);
    if (loss.requires_grad()) {
      auto grads = torch::autograd::grad({loss}, leaves, {at::ones_like(loss)}, false, false, true);
      for (size_t i = 0; i < leaves.size(); ++i)
        run.grads[leaf_names[i]] = grads[i].defined() ? grads[i] : at::zeros_like(leaves[i]);
    } else {
      for (size_t i = 0; i < leaves.size(); ++i) run.grads[leaf_names[i]] = at::zeros_like(leaves[i]);
    }
  }
  for (auto& [name, t] : run.values) t = t.detach();
  return run;
}

}  // namespace meshsim

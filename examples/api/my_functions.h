// Functions of a user's own, as meshsim::FunctionDef: rank-local ones and ones that communicate,
// one output or two, each with its reference on global tensors so that the oracle checks them.
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include "meshsim/meshsim.h"

namespace mine {

// A fused all_reduce(sum) kernel over one group: it sees every member's local and returns the sum
// to each. Its backward is the identity: the cotangent of its invariant output is invariant.
struct FusedAllReduce : public torch::autograd::Function<FusedAllReduce> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext*, at::TensorList group) {
    at::Tensor sum = group[0].clone();
    for (size_t k = 1; k < group.size(); ++k) sum.add_(group[k]);
    torch::autograd::variable_list out;
    for (size_t k = 0; k < group.size(); ++k) out.push_back(sum.clone());
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return grads;
  }
};

// A fused reduce_scatter kernel over one group along dim 0: member k gets the k-th block of rows of
// the sum. Its backward gathers: every member's input gradient is the blocks of all members'.
struct ScatterRows : public torch::autograd::Function<ScatterRows> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext*, at::TensorList group) {
    at::Tensor sum = group[0].clone();
    for (size_t k = 1; k < group.size(); ++k) sum.add_(group[k]);
    torch::autograd::variable_list out;
    for (const auto& block : sum.chunk(static_cast<int64_t>(group.size()), 0)) out.push_back(block.clone());
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor all = at::cat(grads, 0);
    return torch::autograd::variable_list(grads.size(), all);
  }
};

// scale_by: x * factor on each rank's local; the default variance (that of x) is right.
inline meshsim::FunctionDef scale_by() {
  meshsim::FunctionDef f;
  f.name = "scale_by";
  f.rank_local = [](const std::vector<at::Tensor>& xs, const nlohmann::json& attrs) {
    return xs[0] * attrs.value("factor", 1.0);
  };
  f.reference = f.rank_local;  // the same on global tensors
  return f;
}

// fused_all_reduce: the kernel above over the mesh axis the call names. Its output is invariant
// over that axis (the strategy), globally it is the identity (the sum of a P(sum) value's locals
// is the value), and it performs one all_reduce.
inline meshsim::FunctionDef fused_all_reduce() {
  meshsim::FunctionDef f;
  f.name = "fused_all_reduce";
  f.group = [](const std::vector<at::Tensor>& group, const nlohmann::json&) {
    return FusedAllReduce::apply(at::TensorList(group));
  };
  f.variance = [](const meshsim::VarianceInput& in) {
    meshsim::VarianceOutput out;
    out.variant = in.variant[0];
    out.variant.erase(in.attrs.at("axis").get<std::string>());
    return out;
  };
  f.reference = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) { return xs[0]; };
  f.collective = meshsim::CollectiveDecl{"all_reduce", "", nullptr};
  return f;
}

// scatter_rows: the reduce_scatter kernel above. Its output still varies over the axis (each
// member holds other rows); globally it is the identity (rows of the sum, split); it performs a
// reduce_scatter forward and an all_gather backward.
inline meshsim::FunctionDef scatter_rows() {
  meshsim::FunctionDef f;
  f.name = "scatter_rows";
  f.group = [](const std::vector<at::Tensor>& group, const nlohmann::json&) {
    return ScatterRows::apply(at::TensorList(group));
  };
  f.variance = [](const meshsim::VarianceInput& in) { return meshsim::VarianceOutput{in.variant[0], std::nullopt}; };
  f.reference = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) { return xs[0]; };
  f.collective = meshsim::CollectiveDecl{"reduce_scatter", "all_gather", nullptr};
  return f;
}

// fused_reduce_keep: a Function with two outputs (FunctionDef::outputs), the kernel's all_reduce(sum)
// over the call's axis and each member's own local kept beside it, as a residual stream keeps its
// input. Each output has its own sets: the sum is invariant over the axis, the kept local varies.
inline meshsim::FunctionDef fused_reduce_keep() {
  meshsim::FunctionDef f;
  f.name = "fused_reduce_keep";
  f.outputs = 2;
  f.group_outputs = [](const std::vector<at::Tensor>& group, const nlohmann::json&) {
    std::vector<at::Tensor> kept;
    for (const auto& x : group) kept.push_back(x.clone());
    return std::vector<std::vector<at::Tensor>>{FusedAllReduce::apply(at::TensorList(group)), kept};
  };
  f.variance = [](const meshsim::VarianceInput& in) {
    meshsim::VarianceOutput sum, kept, both;
    sum.variant = in.variant[0];
    sum.variant.erase(in.attrs.at("axis").get<std::string>());
    kept.variant = in.variant[0];
    both.outputs = {sum, kept};
    return both;
  };
  // Globally a P(sum) value's sum is the value, and so is what its kept locals stand for.
  f.reference_outputs = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) {
    return std::vector<at::Tensor>{xs[0], xs[0]};
  };
  f.collective = meshsim::CollectiveDecl{"all_reduce", "", nullptr};
  return f;
}

// sum_and_difference: a rank-local Function with two outputs, a + b and a - b (the default
// variance, the union of the inputs', is right for both).
inline meshsim::FunctionDef sum_and_difference() {
  meshsim::FunctionDef f;
  f.name = "sum_and_difference";
  f.arity = 2;
  f.outputs = 2;
  f.rank_local_outputs = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) {
    return std::vector<at::Tensor>{xs[0] + xs[1], xs[0] - xs[1]};
  };
  f.reference_outputs = f.rank_local_outputs;
  return f;
}

}  // namespace mine

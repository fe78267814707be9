// Your own custom autograd Functions under LTensor variance tracking, registered both ways.
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include "sim/local_map.h"

namespace user {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A fused all_reduce kernel: one call per group, it sees every member's local and returns the
// sum to each. Variance tracking cannot see inside it, so it needs a strategy.
struct FusedAllReduce : public torch::autograd::Function<FusedAllReduce> {
  static variable_list forward(AutogradContext* ctx, at::TensorList group) {
    at::Tensor sum = group[0].clone();
    for (size_t k = 1; k < group.size(); ++k) sum.add_(group[k]);
    variable_list out;
    for (size_t k = 0; k < group.size(); ++k) out.push_back(sum.clone());
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) { return grads; }
};

// Style 1, the registry (decorator style): a strategy registered for the Function's type. It
// receives the inputs' variant and reduced sets, the mesh and the call's arguments, and returns
// the output's variant set (and, optionally, its reduced set).
inline void register_fused_all_reduce() {
  meshsim::register_variance_tracking_strategy<FusedAllReduce>([](const meshsim::StrategyInput& in) {
    meshsim::StrategyResult out;
    out.variant = in.variant.at(0);
    out.variant.erase(in.mesh.axis_index(in.args.at("axis").get<std::string>()));
    return out;
  });
}

// Style 2, the mixin: the Function declares its strategy as a static member.
struct FusedAllReduceMixin : public torch::autograd::Function<FusedAllReduceMixin> {
  static variable_list forward(AutogradContext* ctx, at::TensorList group) {
    return FusedAllReduce::forward(ctx, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) { return grads; }

  static meshsim::StrategyResult variance_strategy(const meshsim::StrategyInput& in) {
    meshsim::StrategyResult out;
    out.variant = in.variant.at(0);
    out.variant.erase(in.mesh.axis_index(in.args.at("axis").get<std::string>()));
    return out;
  }
};

// Either can then be called on LTensors inside a body, and made callable from scenario files:
inline void register_user_functions() {
  register_fused_all_reduce();
  meshsim::register_scenario_function(
      "fused_all_reduce", [](meshsim::BodyContext& ctx, const std::vector<meshsim::LTensor>& xs,
                             const meshsim::OpDecl& op) {
        int axis = ctx.runtime().mesh().axis_index(op.attrs.at("axis").get<std::string>());
        return std::vector<meshsim::LTensor>{ctx.call_group<FusedAllReduce>(xs.at(0), axis, op.attrs, op.out)};
      });
  meshsim::register_scenario_function(
      "fused_all_reduce_mixin", [](meshsim::BodyContext& ctx, const std::vector<meshsim::LTensor>& xs,
                                   const meshsim::OpDecl& op) {
        int axis = ctx.runtime().mesh().axis_index(op.attrs.at("axis").get<std::string>());
        return std::vector<meshsim::LTensor>{ctx.call_group<FusedAllReduceMixin>(xs.at(0), axis, op.attrs, op.out)};
      });
}

}  // namespace user

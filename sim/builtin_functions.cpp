// The custom autograd Functions a scenario can `call` by name: a rank-local one, for which the
// default variance metadata is right; an opaque all_reduce kernel with a registered strategy; and
// the same kernel unregistered, whose output meshsim flags as untracked.
#include <torch/csrc/autograd/custom_function.h>

#include "core/error.h"
#include "core/mutants.h"
#include "sim/communicator.h"
#include "sim/local_map.h"

namespace meshsim {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x * x on one rank's local: rank-local math, the default (union / intersection) is right.
struct LocalSquare : public torch::autograd::Function<LocalSquare> {
  static variable_list forward(AutogradContext* ctx, at::TensorList xs) {
    ctx->save_for_backward({xs[0]});
    return {xs[0] * xs[0]};
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    // The planted bug function_backward_wrong_factor: the gradient scaled by 2 (4x for 2x).
    const double factor = mutant_on(Mutant::FunctionBackwardWrongFactor) ? 4 : 2;
    return {factor * ctx->get_saved_variables()[0] * g[0]};
  }
};

// An opaque all_reduce(sum) kernel over one group: it sees every member's local and returns the
// sum to each, in rank order, through the communicator (on a real engine, its own rank's sum comes
// from the engine). Its backward is the identity (the cotangent of its invariant output is
// invariant, Megatron's g). Variance tracking cannot see inside it.
struct OpaqueAllReduce : public torch::autograd::Function<OpaqueAllReduce> {
  static variable_list forward(AutogradContext* ctx, at::TensorList group) {
    const Locals sums = communicator().all_reduce(current_group(), Locals(group.begin(), group.end()), ReduceOp::Sum);
    variable_list out;
    for (const auto& s : sums) out.push_back(s.clone());  // one output tensor per member
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) { return g; }
};

// The same kernel, a distinct type that nobody registered a strategy for.
struct OpaqueAllReduceUnregistered : public torch::autograd::Function<OpaqueAllReduceUnregistered> {
  static variable_list forward(AutogradContext* ctx, at::TensorList group) {
    return OpaqueAllReduce::forward(ctx, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) { return g; }
};

// A Function with two outputs (seed 001's "tuple result"): the all_reduce(sum) of the group and
// each member's own local, kept (a fused reduce that also hands back its input, as a residual
// stream does). Backward: each member's gradient is the sum's cotangent (the identity, as
// opaque_all_reduce) plus the kept local's. Its strategy gives each output its own sets.
struct OpaqueAllReduceKeepLocal : public torch::autograd::Function<OpaqueAllReduceKeepLocal> {
  static variable_list forward(AutogradContext* ctx, at::TensorList group) {
    variable_list out = OpaqueAllReduce::forward(ctx, group);
    for (const auto& x : group) out.push_back(x.clone());
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const size_t n = g.size() / 2;
    variable_list out(n);
    for (size_t m = 0; m < n; ++m) {
      const at::Tensor& a = g[m];
      const at::Tensor& b = g[n + m];
      out[m] = !a.defined() ? b : !b.defined() ? a : a + b;
    }
    return out;
  }
};

// The one argument of a Function that takes one (invalid_scenario otherwise).
const LTensor& only_arg(const std::vector<LTensor>& xs, const OpDecl& op, const std::string& fn) {
  if (xs.size() != 1)
    throw SemanticError(ErrorKind::InvalidScenario, op.path + "/args: " + fn + " takes 1 argument, got " +
                                                        std::to_string(xs.size()));
  return xs[0];
}

int axis_of(const BodyContext& ctx, const OpDecl& op, const std::string& fn) {
  if (!op.attrs.contains("axis"))
    throw SemanticError(ErrorKind::InvalidScenario, op.path + ": call " + fn + " needs \"axis\"");
  return const_cast<BodyContext&>(ctx).runtime().mesh().axis_index(op.attrs["axis"].get<std::string>());
}

void register_builtins() {
  // Decorator style: the strategy registered for the Function type. The output is invariant
  // over the kernel's axis.
  register_variance_tracking_strategy<OpaqueAllReduce>([](const StrategyInput& in) {
    StrategyResult r;
    r.variant = in.variant.at(0);
    r.variant.erase(in.mesh.axis_index(in.args.at("axis").get<std::string>()));
    return r;
  });
  // Per output: the sum is invariant over the kernel's axis, the kept local is the input's.
  register_variance_tracking_strategy<OpaqueAllReduceKeepLocal>([](const StrategyInput& in) {
    StrategyResult sum, kept;
    sum.variant = in.variant.at(0);
    sum.variant.erase(in.mesh.axis_index(in.args.at("axis").get<std::string>()));
    kept.variant = in.variant.at(0);
    StrategyResult r;
    r.outputs = {sum, kept};
    return r;
  });
  register_scenario_function("local_square", [](BodyContext& ctx, const std::vector<LTensor>& xs, const OpDecl& op) {
    only_arg(xs, op, "local_square");
    return std::vector<LTensor>{ctx.call<LocalSquare>(xs, op.attrs, op.out)};
  }, {1});
  register_function_reference("local_square", [](const std::vector<at::Tensor>& xs, const nlohmann::json&) {
    return std::vector<at::Tensor>{xs.at(0) * xs.at(0)};
  });
  register_scenario_function("opaque_all_reduce", [](BodyContext& ctx, const std::vector<LTensor>& xs, const OpDecl& op) {
    const LTensor& x = only_arg(xs, op, "opaque_all_reduce");
    return std::vector<LTensor>{ctx.call_group<OpaqueAllReduce>(x, axis_of(ctx, op, "opaque_all_reduce"), op.attrs, op.out)};
  }, {1});
  register_scenario_function("opaque_all_reduce_unregistered",
                             [](BodyContext& ctx, const std::vector<LTensor>& xs, const OpDecl& op) {
                               const LTensor& x = only_arg(xs, op, "opaque_all_reduce_unregistered");
                               return std::vector<LTensor>{ctx.call_group<OpaqueAllReduceUnregistered>(
                                   x, axis_of(ctx, op, "opaque_all_reduce_unregistered"), op.attrs, op.out)};
                             },
                             {1});
  register_scenario_function("all_reduce_keep_local",
                             [](BodyContext& ctx, const std::vector<LTensor>& xs, const OpDecl& op) {
                               const LTensor& x = only_arg(xs, op, "all_reduce_keep_local");
                               return ctx.call_group_outputs<OpaqueAllReduceKeepLocal>(
                                   x, axis_of(ctx, op, "all_reduce_keep_local"), op.attrs, op.outs);
                             },
                             {1, 2});
  // On global tensors a Partial's value is its sum, which the kept local stands for as well.
  register_function_reference("all_reduce_keep_local", [](const std::vector<at::Tensor>& xs, const nlohmann::json&) {
    return std::vector<at::Tensor>{xs.at(0), xs.at(0)};
  });
}

std::map<std::string, FunctionReference>& references() {
  static std::map<std::string, FunctionReference> r;
  return r;
}

std::map<std::string, FunctionInvoker>& functions() {
  static std::map<std::string, FunctionInvoker> f;
  return f;
}

std::map<std::string, FunctionSignature>& signatures() {
  static std::map<std::string, FunctionSignature> s;
  return s;
}

// The built-ins go in first, so that a Function of the user's of the same name replaces them.
bool registering_builtins = false;

void ensure_builtins() {
  if (registering_builtins) return;
  static bool done = [] {
    registering_builtins = true;
    register_builtins();
    registering_builtins = false;
    return true;
  }();
  (void)done;
}

}  // namespace

void register_scenario_function(const std::string& name, FunctionInvoker invoker, FunctionSignature signature) {
  ensure_builtins();
  functions()[name] = std::move(invoker);
  signatures()[name] = signature;
}

FunctionSignature scenario_function_signature(const std::string& name) {
  ensure_builtins();
  auto it = signatures().find(name);
  return it == signatures().end() ? FunctionSignature{} : it->second;
}

const FunctionInvoker* find_scenario_function(const std::string& name) {
  ensure_builtins();
  auto it = functions().find(name);
  return it == functions().end() ? nullptr : &it->second;
}

void register_function_reference(const std::string& name, FunctionReference reference) {
  ensure_builtins();
  references()[name] = std::move(reference);
}

void unregister_function_reference(const std::string& name) {
  ensure_builtins();
  references().erase(name);
}

const FunctionReference* find_function_reference(const std::string& name) {
  ensure_builtins();
  auto it = references().find(name);
  return it == references().end() ? nullptr : &it->second;
}

std::vector<std::string> scenario_function_names() {
  ensure_builtins();
  std::vector<std::string> out;
  for (const auto& [name, f] : functions()) out.push_back(name);
  return out;
}

}  // namespace meshsim

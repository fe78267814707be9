// meshsim::register_function: a FunctionDef becomes a scenario Function (sim/local_map.h), its
// variance strategy a registry entry, its reference the oracle's, and its declared collective
// events like meshsim's own collectives (in the result's `collectives`, traces and diagrams).
#include <algorithm>
#include <optional>
#include <stdexcept>

#include "core/cost_model.h"
#include "core/error.h"
#include "core/ops.h"
#include "meshsim/meshsim.h"
#include "sim/local_map.h"
#include "sim/local_ops.h"
#include "sim/mesh_node.h"

namespace meshsim {

namespace {

// The collectives a Function may declare, by the names meshsim's own steps have.
const StepKind kDeclarable[] = {StepKind::AllReduce, StepKind::AllGather, StepKind::ReduceScatter, StepKind::AllToAll};

std::optional<StepKind> declarable(const std::string& op) {
  for (StepKind k : kDeclarable)
    if (op == step_kind_name(k)) return k;
  return std::nullopt;
}

AxisNames names_of(const Mesh& mesh, const AxisSet& axes) {
  AxisNames out;
  for (int a : axes) out.insert(mesh.axes()[a]);
  return out;
}

AxisSet indices_of(const Mesh& mesh, const AxisNames& names, const std::string& fn) {
  AxisSet out;
  for (const auto& n : names) {
    const int a = mesh.axis_index(n);
    if (a < 0)
      throw SemanticError(ErrorKind::InvalidScenario,
                          "the variance strategy of Function \"" + fn + "\" names mesh axis \"" + n + "\", which the mesh lacks");
    out.insert(a);
  }
  return out;
}

StrategyResult result_of(const Mesh& mesh, const VarianceOutput& out, const std::string& fn) {
  StrategyResult r;
  r.variant = indices_of(mesh, out.variant, fn);
  if (out.reduced) r.reduced = indices_of(mesh, *out.reduced, fn);
  for (const auto& o : out.outputs) r.outputs.push_back(result_of(mesh, o, fn));
  return r;
}

Strategy strategy_of(const std::string& fn, VarianceStrategy v) {
  return [fn, v](const StrategyInput& in) {
    std::vector<AxisNames> variant, reduced;
    for (const auto& s : in.variant) variant.push_back(names_of(in.mesh, s));
    for (const auto& s : in.reduced) reduced.push_back(names_of(in.mesh, s));
    return result_of(in.mesh, v(VarianceInput{variant, reduced, in.mesh.axes(), in.args}), fn);
  };
}

std::string strategy_key(const std::string& name) { return "function:def:" + name; }

// The registry key of a public target: ops by their name (the key BodyContext::op looks up), Functions
// by the name scenarios call them (BodyContext::call_rank_local and call_on_groups look it up first).
std::string key_of(const StrategyTarget& t) {
  const std::string who = "register_variance_tracking_strategy: ";
  if (t.name.empty()) throw std::invalid_argument(who + "a target has no name");
  if (t.kind == StrategyTarget::Kind::Function) return function_name_key(t.name);
  const OpSchema* found = find_op(t.name);
  const OpSchema* rule = found && (found->scopes & kBody) && !is_split_op(t.name) ? found : nullptr;
  if (!rule || rule->local_code)
    throw std::invalid_argument(who + "op \"" + t.name + "\" " +
                                (rule ? "has meshsim's own variance rule (a collective, a cast or call)"
                                      : "is not an op of a local_map body") +
                                "; a target op is one a body runs through variance tracking (mul, exp, mm, ...)");
  return t.name;
}

// The Function's own strategy (FunctionDef::variance); the registry's entry for its name comes
// first (BodyContext::call_rank_local).
std::optional<Strategy> own_strategy(const FunctionDef& def) {
  if (!def.variance) return std::nullopt;
  return strategy_of(def.name, *def.variance);
}

void check_arity(const FunctionDef& def, const std::vector<LTensor>& xs, const OpDecl& op) {
  if (def.arity >= 0 && xs.size() != static_cast<size_t>(def.arity))
    throw SemanticError(ErrorKind::InvalidScenario, op.path + "/args: " + def.name + " takes " +
                                                        std::to_string(def.arity) + " argument" +
                                                        (def.arity == 1 ? "" : "s") + ", got " + std::to_string(xs.size()));
}

// The declared collective of a call over one axis: its bytes per rank, from the first group's inputs.
int64_t declared_bytes(const CollectiveDecl& c, const Locals& group) {
  if (c.bytes) return c.bytes(group);
  if (group.empty()) return 0;
  const int64_t n = static_cast<int64_t>(group.size());
  const int64_t local = group[0].numel() * static_cast<int64_t>(group[0].element_size());
  const int64_t full = c.op == "all_gather" ? local * n : local;
  return collective_bytes(*declarable(c.op), full, n);
}

void record_declared(Runtime& rt, const std::string& op, int axis, int64_t bytes, const std::string& value,
                     const Locals& locals, const std::string& fn, const std::string& grad_of = "") {
  Event e = rt.make_event("collective", op, value, locals);
  e.axis = rt.mesh().axes()[axis];
  e.bytes = bytes;
  e.note = (grad_of.empty() ? "declared by " : "backward, declared by ") + fn;
  if (!grad_of.empty()) e.args = {grad_of};
  rt.recorder().add(std::move(e));
}

std::vector<LTensor> call_group(const FunctionDef& def, const std::optional<Strategy>& own, BodyContext& ctx,
                                const std::vector<LTensor>& xs, const OpDecl& op) {
  check_arity(def, xs, op);
  if (!op.attrs.contains("axis") || !op.attrs["axis"].is_string())
    throw SemanticError(ErrorKind::InvalidScenario, op.path + ": call " + def.name + " needs \"axis\" (a mesh axis name)");
  Runtime& rt = ctx.runtime();
  const int axis = rt.mesh().axis_index(op.attrs["axis"].get<std::string>());
  int64_t bytes = -1;
  const nlohmann::json attrs = op.attrs;
  const std::optional<CollectiveDecl> decl = def.collective;
  const std::vector<std::string> outs = result_names(op);
  std::vector<LTensor> ts = ctx.call_on_groups(strategy_key(def.name), own, xs.at(0), axis, op.attrs, outs,
                                               [&](const Locals& group) {
    if (decl && bytes < 0) bytes = declared_bytes(*decl, group);
    std::vector<Locals> out = def.group_outputs ? def.group_outputs(group, attrs)
                                                : std::vector<Locals>{def.group(group, attrs)};
    for (const auto& o : out)
      if (o.size() != group.size())
        throw SemanticError(ErrorKind::InvalidScenario, op.path + ": Function " + def.name + " returned " +
                                                            std::to_string(o.size()) + " tensors of an output for a group of " +
                                                            std::to_string(group.size()));
    return out;
  });
  if (!decl) return ts;
  LTensor& t = ts.front();
  record_declared(rt, decl->op, axis, std::max<int64_t>(bytes, 0), op.out, t.locals, def.name);
  if (!decl->backward_op.empty() && at::GradMode::is_enabled() && any_requires_grad(t.locals)) {
    // An identity node on the first output that records the backward's collective when its
    // gradient flows through.
    Runtime* runtime = &rt;
    const Locals inputs = t.locals;
    Locals outs_locals = detached(t.locals);
    const LocalShapes like(t.locals);
    const std::string back = decl->backward_op, fn = def.name, value = op.out;
    const CollectiveDecl backward_decl{back, "", decl->bytes};
    connect("declared " + back, inputs, outs_locals, [=](torch::autograd::variable_list&& g) {
      Locals grads = like.defined(std::move(g));
      const auto groups = runtime->mesh().groups(axis);
      Locals first;
      for (auto r : groups.at(0)) first.push_back(grads[r]);
      record_declared(*runtime, back, axis, declared_bytes(backward_decl, first), value, grads, fn, value);
      return grads;
    });
    t.locals = outs_locals;
  }
  return ts;
}

}  // namespace

void register_function(FunctionDef def) {
  if (def.name.empty()) throw std::invalid_argument("register_function: the Function has no name");
  const std::string who = "register_function(\"" + def.name + "\"): ";
  const int bodies = static_cast<bool>(def.rank_local) + static_cast<bool>(def.group) +
                     static_cast<bool>(def.rank_local_outputs) + static_cast<bool>(def.group_outputs);
  if (bodies != 1)
    throw std::invalid_argument(who + "give exactly one of rank_local, group, rank_local_outputs and group_outputs");
  const bool communicating = def.group || def.group_outputs;
  if (def.arity < -1) throw std::invalid_argument(who + "arity must be -1 (any) or at least 0");
  if (def.outputs < 1) throw std::invalid_argument(who + "outputs must be at least 1");
  if (def.outputs > 1 && (def.rank_local || def.group))
    throw std::invalid_argument(who + "a Function with several outputs gives rank_local_outputs or group_outputs");
  if (def.reference && def.reference_outputs)
    throw std::invalid_argument(who + "give at most one of reference and reference_outputs");
  if (def.outputs > 1 && def.reference)
    throw std::invalid_argument(who + "a Function with several outputs gives reference_outputs");
  if (communicating && def.arity != 1) throw std::invalid_argument(who + "a communicating Function takes 1 argument");
  if (def.collective) {
    if (!communicating) throw std::invalid_argument(who + "a rank-local Function performs no collective");
    auto unknown = [&](const std::string& op) {
      return std::invalid_argument(who + "unknown collective \"" + op +
                                   "\" (all_reduce, all_gather, reduce_scatter or all_to_all)");
    };
    if (!declarable(def.collective->op)) throw unknown(def.collective->op);
    const std::string& back = def.collective->backward_op;
    if (!back.empty() && !declarable(back)) throw unknown(back);
  }
  if (def.reference) {
    auto ref = def.reference;
    register_function_reference(def.name, [ref](const std::vector<at::Tensor>& xs, const nlohmann::json& attrs) {
      return std::vector<at::Tensor>{ref(xs, attrs)};
    });
  } else if (def.reference_outputs) {
    register_function_reference(def.name, def.reference_outputs);
  } else {
    unregister_function_reference(def.name);
  }
  auto shared = std::make_shared<FunctionDef>(std::move(def));
  const std::optional<Strategy> own = own_strategy(*shared);  // once, not per call
  register_scenario_function(shared->name, [shared, own](BodyContext& ctx, const std::vector<LTensor>& xs, const OpDecl& op) {
    if (shared->group || shared->group_outputs) return call_group(*shared, own, ctx, xs, op);
    check_arity(*shared, xs, op);
    const nlohmann::json attrs = op.attrs;
    const auto single = shared->rank_local;
    const auto several = shared->rank_local_outputs;
    return ctx.call_rank_local(strategy_key(shared->name), own, xs, op.attrs, result_names(op),
                               [single, several, attrs](const std::vector<at::Tensor>& in) {
                                 return several ? several(in, attrs) : std::vector<at::Tensor>{single(in, attrs)};
                               });
  }, FunctionSignature{shared->arity, shared->outputs});
}

void register_variance_tracking_strategy(const std::vector<StrategyTarget>& targets, VarianceStrategy strategy) {
  if (!strategy) throw std::invalid_argument("register_variance_tracking_strategy: the strategy is empty");
  for (const auto& t : targets) key_of(t);  // every target checked before any is registered
  for (const auto& t : targets)
    register_variance_tracking_strategy(key_of(t), strategy_of(t.name, strategy));
}

void unregister_variance_tracking_strategy(const StrategyTarget& target) {
  unregister_variance_tracking_strategy(key_of(target));
}

std::vector<std::string> function_names() {
  std::vector<std::string> names = scenario_function_names();
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace meshsim

// meshsim::register_function: a FunctionDef becomes a scenario Function (sim/local_map.h), its
// variance strategy a registry entry, its reference the oracle's, and its declared collective
// events like meshsim's own collectives (in the result's `collectives`, traces and diagrams).
#include <algorithm>
#include <optional>
#include <stdexcept>

#include "core/cost_model.h"
#include "core/error.h"
#include "meshsim/meshsim.h"
#include "sim/local_map.h"
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

Strategy strategy_of(const std::string& fn, VarianceStrategy v) {
  return [fn, v](const StrategyInput& in) {
    std::vector<AxisNames> variant, reduced;
    for (const auto& s : in.variant) variant.push_back(names_of(in.mesh, s));
    for (const auto& s : in.reduced) reduced.push_back(names_of(in.mesh, s));
    const VarianceOutput out = v(VarianceInput{variant, reduced, in.mesh.axes(), in.args});
    StrategyResult r;
    r.variant = indices_of(in.mesh, out.variant, fn);
    if (out.reduced) r.reduced = indices_of(in.mesh, *out.reduced, fn);
    return r;
  };
}

std::string strategy_key(const std::string& name) { return "function:name:" + name; }

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

LTensor call_group(const FunctionDef& def, BodyContext& ctx, const std::vector<LTensor>& xs, const OpDecl& op) {
  check_arity(def, xs, op);
  if (!op.attrs.contains("axis") || !op.attrs["axis"].is_string())
    throw SemanticError(ErrorKind::InvalidScenario, op.path + ": call " + def.name + " needs \"axis\" (a mesh axis name)");
  Runtime& rt = ctx.runtime();
  const int axis = rt.mesh().axis_index(op.attrs["axis"].get<std::string>());
  const Strategy* strategy = find_variance_tracking_strategy(strategy_key(def.name));
  int64_t bytes = -1;
  auto group_fn = def.group;
  const nlohmann::json attrs = op.attrs;
  const std::optional<CollectiveDecl> decl = def.collective;
  LTensor t = ctx.call_on_groups(strategy_key(def.name), strategy ? std::optional<Strategy>(*strategy) : std::nullopt,
                                 xs.at(0), axis, op.attrs, op.out, [&](const Locals& group) {
                                   if (decl && bytes < 0) bytes = declared_bytes(*decl, group);
                                   Locals out = group_fn(group, attrs);
                                   if (out.size() != group.size())
                                     throw SemanticError(ErrorKind::InvalidScenario,
                                                         op.path + ": Function " + def.name + " returned " +
                                                             std::to_string(out.size()) + " outputs for a group of " +
                                                             std::to_string(group.size()));
                                   return out;
                                 });
  if (!decl) return t;
  record_declared(rt, decl->op, axis, std::max<int64_t>(bytes, 0), op.out, t.locals, def.name);
  if (!decl->backward_op.empty() && at::GradMode::is_enabled() && any_requires_grad(t.locals)) {
    // An identity node that records the backward's collective when the gradient flows through.
    Runtime* runtime = &rt;
    const Locals inputs = t.locals;
    Locals outs = detached(t.locals);
    const Locals like = detached(t.locals);
    const std::string back = decl->backward_op, fn = def.name, value = op.out;
    const CollectiveDecl backward_decl{back, "", decl->bytes};
    connect("declared " + back, inputs, outs, [=](torch::autograd::variable_list&& g) {
      Locals grads = defined_grads(std::move(g), like);
      const auto groups = runtime->mesh().groups(axis);
      Locals first;
      for (auto r : groups.at(0)) first.push_back(grads[r]);
      record_declared(*runtime, back, axis, declared_bytes(backward_decl, first), value, grads, fn, value);
      return grads;
    });
    t.locals = outs;
  }
  return t;
}

}  // namespace

void register_function(FunctionDef def) {
  if (def.name.empty()) throw std::invalid_argument("register_function: the Function has no name");
  const std::string who = "register_function(\"" + def.name + "\"): ";
  if (static_cast<bool>(def.rank_local) == static_cast<bool>(def.group))
    throw std::invalid_argument(who + "give exactly one of rank_local and group");
  if (def.arity < -1) throw std::invalid_argument(who + "arity must be -1 (any) or at least 0");
  if (def.group && def.arity != 1) throw std::invalid_argument(who + "a communicating Function takes 1 argument");
  if (def.collective) {
    if (def.rank_local) throw std::invalid_argument(who + "a rank-local Function performs no collective");
    auto unknown = [&](const std::string& op) {
      return std::invalid_argument(who + "unknown collective \"" + op +
                                   "\" (all_reduce, all_gather, reduce_scatter or all_to_all)");
    };
    if (!declarable(def.collective->op)) throw unknown(def.collective->op);
    const std::string& back = def.collective->backward_op;
    if (!back.empty() && !declarable(back)) throw unknown(back);
  }
  if (def.variance)
    register_variance_tracking_strategy(strategy_key(def.name), strategy_of(def.name, *def.variance));
  else
    unregister_variance_tracking_strategy(strategy_key(def.name));
  if (def.reference)
    register_function_reference(def.name, def.reference);
  else
    unregister_function_reference(def.name);
  auto shared = std::make_shared<FunctionDef>(std::move(def));
  register_scenario_function(shared->name, [shared](BodyContext& ctx, const std::vector<LTensor>& xs, const OpDecl& op) {
    if (shared->group) return call_group(*shared, ctx, xs, op);
    check_arity(*shared, xs, op);
    const nlohmann::json attrs = op.attrs;
    auto f = shared->rank_local;
    const Strategy* strategy = find_variance_tracking_strategy(strategy_key(shared->name));
    return ctx.call_rank_local(strategy_key(shared->name), strategy ? std::optional<Strategy>(*strategy) : std::nullopt,
                               xs, op.attrs, op.out, [f, attrs](const std::vector<at::Tensor>& in) { return f(in, attrs); });
  }, FunctionSignature{shared->arity});
}

std::vector<std::string> function_names() {
  std::vector<std::string> names = scenario_function_names();
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace meshsim

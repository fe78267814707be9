#include "sim/local_map.h"

#include "core/scoped.h"

#include <torch/csrc/autograd/grad_mode.h>

#include "core/coverage.h"
#include "core/error.h"
#include "core/mutants.h"
#include "core/scoped.h"
#include "sim/communicator.h"
#include "sim/data.h"
#include "sim/local_ops.h"
#include "sim/mesh_node.h"

namespace meshsim {

using torch::autograd::variable_list;

// ---------------------------------------------------------------------------------------------
// Sets and the strategy registry

std::string axes_str(const Mesh& mesh, const AxisSet& axes) {
  std::string out = "[";
  for (int a : axes) out += (out.size() > 1 ? ", " : "") + mesh.axes().at(a);
  return out + "]";
}

std::string meta_str(const Mesh& mesh, const LTensor& t) {
  if (t.untracked) return "untracked";
  if (t.unchecked) return "unchecked";
  return "variant=" + axes_str(mesh, t.variant) + " reduced=" + axes_str(mesh, t.reduced);
}

namespace {

std::map<std::string, Strategy>& strategy_registry() {
  static std::map<std::string, Strategy> r;
  return r;
}

AxisSet set_union(const std::vector<LTensor>& xs) {
  AxisSet out;
  for (const auto& x : xs) out.insert(x.variant.begin(), x.variant.end());
  return out;
}

AxisSet set_intersection(const std::vector<LTensor>& xs) {
  if (xs.empty()) return {};
  AxisSet out = xs[0].reduced;
  for (const auto& x : xs)
    for (auto it = out.begin(); it != out.end();) it = x.reduced.count(*it) ? std::next(it) : out.erase(it);
  return out;
}

AxisSet with(AxisSet s, int a) {
  s.insert(a);
  return s;
}
AxisSet without(AxisSet s, int a) {
  s.erase(a);
  return s;
}

RedistStep step(StepKind kind, int axis, int64_t dim = 0, ReduceOp op = ReduceOp::Sum) {
  RedistStep s;
  s.kind = kind;
  s.axis = axis;
  s.dim = dim;
  s.op = op;
  return s;
}

}  // namespace

void register_variance_tracking_strategy(const std::string& key, Strategy strategy) {
  strategy_registry()[key] = std::move(strategy);
}
void unregister_variance_tracking_strategy(const std::string& key) { strategy_registry().erase(key); }
const Strategy* find_variance_tracking_strategy(const std::string& key) {
  if (mutant_on(Mutant::StrategyRegistryIgnored)) return nullptr;
  auto it = strategy_registry().find(key);
  return it == strategy_registry().end() ? nullptr : &it->second;
}

void check_exclusive(const Mesh& mesh, const LTensor& t, const std::string& what) {
  for (int a : t.variant)
    if (t.reduced.count(a))
      throw SemanticError(ErrorKind::ExclusivityViolation,
                          what + ": \"" + t.name + "\" is both variant and reduced over mesh axis \"" +
                              mesh.axes()[a] + "\" (" + meta_str(mesh, t) + ")");
}

// ---------------------------------------------------------------------------------------------
// Entering and leaving

LTensor BodyContext::enter(const DTensor& x_in, const std::string& name, const Spec* grad) {
  const Mesh& mesh = rt_.mesh();
  const DTensor x = grad ? rt_.grad_placements_boundary(x_in, *grad) : x_in;
  LTensor t{name.empty() ? x.name : name, &mesh, x.locals, {}, {}, false, {}, !checked_};
  for (int a = 0; a < mesh.ndim() && checked_; ++a) {
    const Placement& p = x.spec[a];
    if (p.is_partial() && p.op != ReduceOp::Sum)
      throw SemanticError(ErrorKind::InvalidScenario,
                          "local_map: \"" + x.name + "\" is " + p.str() + " over \"" + mesh.axes()[a] +
                              "\": a tracked local_map supports P(sum) only among the Partials");
    if (p.is_reduced()) t.reduced.insert(a);
    else if (p.is_shard() || p.is_partial()) t.variant.insert(a);
  }
  if (!checked_ && mutant_on(Mutant::UncheckedInsertsMarkVarying))  // planted bug: plain local code tracks variance
    for (int a = 0; a < mesh.ndim(); ++a)
      if (x.spec[a].is_shard() || x.spec[a].is_partial()) t.variant.insert(a);
  Event e = rt_.make_event("op", "enter_local_map", t.name, t.locals);
  e.args = {x.name};
  e.in_specs = {spec_str(x.spec)};
  e.out_spec = meta_str(mesh, t);
  rt_.recorder().add(std::move(e));
  return t;
}

DTensor BodyContext::leave(const LTensor& t, const Spec& out_written, const std::string& name) {
  const Mesh& mesh = rt_.mesh();
  // Negative dims count from the end of the locals' dims (a local has the global's rank).
  Spec out;
  try {
    out = normalize_spec(out_written, t.locals.empty() ? 0 : t.locals[0].dim());
  } catch (const std::invalid_argument& e) {
    throw SemanticError(ErrorKind::ShapeMismatch, "local_map returns \"" + t.name + "\" as " + spec_str(out_written) + ": " + e.what());
  }
  if (t.untracked) {
    rt_.flag_untracked(name, t.untracked_why);
  } else if (!t.unchecked) {
    for (int a = 0; a < mesh.ndim(); ++a) {
      const Placement& p = out[a];
      const bool v = t.variant.count(a) > 0, r = t.reduced.count(a) > 0;
      std::string want;
      if ((p.is_shard() || (p.is_partial() && p.op == ReduceOp::Sum)) && !v) want = "variant";
      else if (p.is_plain_replicate() && (v || r)) want = "neither variant nor reduced";
      else if (p.is_reduced() && !r) want = "reduced";
      else if (p.is_partial() && p.op != ReduceOp::Sum) want = "P(sum) among the Partials";
      if (!want.empty())
        throw SemanticError(ErrorKind::OutSpecMismatch,
                            "local_map returns \"" + t.name + "\" (" + meta_str(mesh, t) + ") as " +
                                p.str() + " over \"" + mesh.axes()[a] + "\", which needs it " + want);
    }
  }
  DTensor d{name, {}, out, t.locals};
  try {
    d.shape = assemble(mesh, out, detached(t.locals)).sizes().vec();
  } catch (const c10::Error&) {
    throw SemanticError(ErrorKind::ShapeMismatch,
                        "local_map: the locals of \"" + t.name + "\" do not form a tensor laid out as " + spec_str(out));
  }
  Event e = rt_.make_event("op", "leave_local_map", name, d.locals);
  e.args = {t.name};
  e.in_specs = {meta_str(mesh, t)};
  e.out_spec = spec_str(out);
  rt_.recorder().add(std::move(e));
  return rt_.gradient_boundary(d, "gradient of \"" + name + "\" into local code: to the cotangent of " + spec_str(out));
}

// ---------------------------------------------------------------------------------------------
// Ops, casts and collectives

void BodyContext::check_mesh(const std::vector<LTensor>& xs, const std::string& what) const {
  for (const auto& x : xs)
    if (!x.mesh || *x.mesh != rt_.mesh())
      throw SemanticError(ErrorKind::MeshMismatch, what + ": \"" + x.name + "\" lives on another mesh");
}

LTensor BodyContext::wrap(const std::string& kind, const std::string& name, const std::string& out, Locals locals,
                          AxisSet variant, AxisSet reduced, const std::vector<LTensor>& inputs) {
  if (coverage_sink() && checked_) cover("local_map: " + name);
  // Plain local code keeps no sets (but under the planted bug unchecked_inserts_mark_varying).
  if (!checked_ && !mutant_on(Mutant::UncheckedInsertsMarkVarying)) variant.clear(), reduced.clear();
  LTensor t{out, &rt_.mesh(), std::move(locals), std::move(variant), std::move(reduced), false, {}, !checked_};
  for (const auto& x : inputs)
    if (x.untracked) {
      t.untracked = true;
      t.untracked_why = x.untracked_why;
    }
  check_exclusive(rt_.mesh(), t, name);
  Event e = rt_.make_event(kind, name, out, t.locals);
  for (const auto& x : inputs) {
    e.args.push_back(x.name);
    e.in_specs.push_back(meta_str(rt_.mesh(), x));
  }
  e.out_spec = meta_str(rt_.mesh(), t);
  rt_.recorder().add(std::move(e));
  rt_.record_body_value(t);
  return t;
}

AxisSet BodyContext::fit_inputs(std::vector<LTensor>& xs, const AxisSet& variant,
                                const std::optional<AxisSet>& strategy_reduced, const std::string& out) {
  const auto& axes = rt_.mesh().axes();
  for (size_t i = 0; i < xs.size(); ++i)
    for (int a : variant)
      if (!xs[i].variant.count(a)) {
        const std::string name = out + ".in" + std::to_string(i) + "." + axes[a];
        if (xs[i].reduced.count(a) && !mutant_on(Mutant::MarkVaryingForReduced))
          xs[i] = reduced_to_varying(xs[i], a, name);
        else if (!mutant_on(Mutant::MissingMarkVarying))
          xs[i] = mark_varying(xs[i], a, name);
      }
  const AxisSet reduced = strategy_reduced ? *strategy_reduced : set_intersection(xs);
  // A reduced input whose output is invariant on that axis (it meets an invariant operand) is
  // cast reduced -> invariant: free forward; backward, the invariant cotangent becomes an
  // unreduced one (divided by n, or kept on rank 0), as DTensor's Rd -> R relabel does.
  for (size_t i = 0; i < xs.size(); ++i)
    for (int a : AxisSet(xs[i].reduced))
      if (!reduced.count(a) && !variant.count(a) && !mutant_on(Mutant::MissingReducedInvariantCast))
        xs[i] = reduced_to_invariant(xs[i], a, out + ".in" + std::to_string(i) + ".invariant." + axes[a]);
  return reduced;
}

// The output sets of an op or rank-local Function: a strategy's if one is in force, else variant by
// union (reduced by intersection is computed once inputs are fitted).
std::pair<AxisSet, std::optional<AxisSet>> BodyContext::output_sets(const std::vector<LTensor>& xs,
                                                                    const Strategy* strategy,
                                                                    const nlohmann::json& args) const {
  if (!strategy) return {set_union(xs), std::nullopt};
  std::vector<AxisSet> vs, rs;
  for (const auto& x : xs) {
    vs.push_back(x.variant);
    rs.push_back(x.reduced);
  }
  StrategyResult r = (*strategy)({vs, rs, rt_.mesh(), args});
  return {r.variant, r.reduced};
}

LTensor BodyContext::op(const std::string& op, const nlohmann::json& attrs, std::vector<LTensor> xs,
                        const std::string& out) {
  check_mesh(xs, op);
  AxisSet variant, reduced;
  if (checked_ || mutant_on(Mutant::UncheckedInsertsMarkVarying)) {  // planted bug: fit_inputs in plain local code
    auto [v, strategy_reduced] = output_sets(xs, find_variance_tracking_strategy(op), attrs);
    variant = v;
    reduced = fit_inputs(xs, variant, strategy_reduced, out);
  }
  OpDecl decl;
  decl.op = op;
  decl.attrs = attrs;
  OpAttrs a = op_attrs(decl);
  // A vocab- or class-parallel lookup ({axis, vocab} / {axis, classes}): the rank's torch.chunk of
  // the table's global extent along that mesh axis.
  const Mesh& mesh = rt_.mesh();
  const int axis = attrs.contains("axis") ? mesh.axis_index(attrs["axis"].get<std::string>()) : -1;
  const int64_t extent = attrs.value("vocab", attrs.value("classes", int64_t{0}));
  Locals locals(xs.at(0).locals.size());
  for (size_t r = 0; r < locals.size(); ++r) {
    std::vector<at::Tensor> in;
    for (const auto& x : xs) in.push_back(x.locals[r]);
    if (axis >= 0)
      a.range = chunk_of(extent, mesh.axis_size(axis), mesh.coords(static_cast<int64_t>(r))[static_cast<size_t>(axis)]);
    locals[r] = local_op(op, a, in);
  }
  return wrap("op", op, out, std::move(locals), variant, reduced, xs);
}

Locals BodyContext::collective_node(const std::string& name, const LTensor& x, const std::string& out,
                                    const std::optional<RedistStep>& fwd, const Backward& bwd) {
  const Mesh& mesh = rt_.mesh();
  Locals in = detached(x.locals);
  Locals outs = in;
  if (fwd) {
    outs = apply_step(mesh, *fwd, in);
    record_step(rt_, *fwd, in, outs, out, "");
  }
  outs = detached(outs);
  if (at::GradMode::is_enabled() && any_requires_grad(x.locals)) {
    // The backward runs after the body has returned, when this context is gone: it holds the
    // Runtime (which outlives the graph) and copies of everything else, never `this`.
    Runtime* rt = &rt_;
    const Locals like = detached(outs);
    const size_t n = x.locals.size();
    const std::string grad_of = x.name;
    const int program_op = rt->recorder().program_op;
    connect("LTensor::" + name, x.locals, outs,
            [rt, like, n, grad_of, name, out, bwd, program_op](variable_list&& g) -> variable_list {
      ScopedOverride<int> at(rt->recorder().program_op, program_op);
      return rt->guarded(n, [&] {
        Locals grads = defined_grads(std::move(g), like);
        if (!bwd.differentiable)
          throw SemanticError(ErrorKind::NotDifferentiable, name + " is not differentiable");
        if (!bwd.step) return grads;  // the identity: nothing moves
        Locals moved = apply_step(rt->mesh(), *bwd.step, grads);
        record_step(*rt, *bwd.step, grads, moved, out, "backward of " + name, grad_of);
        return moved;
      }, out);
    });
  }
  return outs;
}

void BodyContext::record_step(Runtime& rt, const RedistStep& s, const Locals& in, const Locals& out,
                              const std::string& value, const std::string& note, const std::string& grad_of) {
  Event e = rt.make_event(s.communicates() ? "collective" : "local", step_kind_name(s.kind), value, out);
  e.axis = rt.mesh().axes()[s.axis];
  e.bytes = step_bytes(rt.mesh(), s, in);
  e.note = note;
  if (!grad_of.empty()) e.args = {grad_of};
  rt.recorder().add(std::move(e));
}

LTensor BodyContext::varying_on(const LTensor& x, int axis, const std::string& out) {
  if (!checked_ || x.variant.count(axis)) return x;
  const std::string name = out + ".varying." + rt_.mesh().axes()[axis];
  const bool cast = x.reduced.count(axis) && !mutant_on(Mutant::MarkVaryingForReduced);
  return cast ? reduced_to_varying(x, axis, name) : mark_varying(x, axis, name);
}

LTensor BodyContext::mark_varying(const LTensor& x, int axis, const std::string& out) {
  Locals locals = collective_node("mark_varying", x, out, std::nullopt, {true, step(StepKind::AllReduce, axis)});
  return wrap("op", "mark_varying", out, std::move(locals), with(x.variant, axis), without(x.reduced, axis), {x});
}

LTensor BodyContext::reduced_to_varying(const LTensor& x, int axis, const std::string& out) {
  // Free both ways: the cotangent is cast varying -> unreduced (JAX's reduced_vary_cast).
  Locals locals = collective_node("reduced_vary_cast", x, out, std::nullopt, {true, std::nullopt});
  return wrap("op", "reduced_vary_cast", out, std::move(locals), with(x.variant, axis), without(x.reduced, axis), {x});
}

LTensor BodyContext::reduced_to_invariant(const LTensor& x, int axis, const std::string& out) {
  RedistStep back = step(StepKind::PartialFromReplicate, axis);
  back.convention = rt_.options().partial_from_replicate;
  Locals locals = collective_node("reduced_invariant_cast", x, out, std::nullopt, {true, back});
  return wrap("op", "reduced_invariant_cast", out, std::move(locals), x.variant, without(x.reduced, axis), {x});
}

LTensor BodyContext::all_reduce(const LTensor& in, int axis, ReduceOp op, const std::string& out) {
  LTensor x = varying_on(in, axis, out);
  // sum: the backward is the identity (Megatron's g); avg: the gradient divided by n; max, min:
  // not differentiable.
  Backward bwd{is_linear(op), std::nullopt};
  if (op == ReduceOp::Avg) bwd.step = step(StepKind::PartialFromReplicate, axis);
  if (op == ReduceOp::Sum && mutant_on(Mutant::AllReduceBackwardAllReduces)) bwd.step = step(StepKind::AllReduce, axis);
  Locals locals = collective_node("all_reduce", x, out, step(StepKind::AllReduce, axis, 0, op), bwd);
  return wrap("op", std::string("all_reduce_") + reduce_op_name(op), out, std::move(locals),
              without(x.variant, axis), x.reduced, {x});
}

LTensor BodyContext::all_gather(const LTensor& in, int axis, int64_t dim, bool to_reduced, const std::string& out) {
  LTensor x = varying_on(in, axis, out);
  Locals locals = collective_node("all_gather", x, out, step(StepKind::AllGather, axis, dim),
                                  {true, step(StepKind::ReduceScatter, axis, dim)});
  if (to_reduced)
    return wrap("op", "all_gather_to_reduced", out, std::move(locals), without(x.variant, axis), with(x.reduced, axis), {x});
  const AxisSet variant = mutant_on(Mutant::AllGatherVaryingDropsAxis) ? without(x.variant, axis) : x.variant;
  return wrap("op", "all_gather_to_varying", out, std::move(locals), variant, x.reduced, {x});
}

LTensor BodyContext::reduce_scatter(const LTensor& in, int axis, int64_t dim, const std::string& out) {
  LTensor x = varying_on(in, axis, out);
  int64_t back_dim = dim;
  if (mutant_on(Mutant::ReduceScatterBackwardWrongDim) && x.locals.at(0).dim() > 1)
    back_dim = (dim + 1) % x.locals.at(0).dim();  // planted bug
  Locals locals = collective_node("reduce_scatter", x, out, step(StepKind::ReduceScatter, axis, dim),
                                  {true, step(StepKind::AllGather, axis, back_dim)});
  return wrap("op", "reduce_scatter", out, std::move(locals), with(x.variant, axis), without(x.reduced, axis), {x});
}

LTensor BodyContext::all_to_all(const LTensor& in, int axis, int64_t split_dim, int64_t concat_dim, const std::string& out) {
  LTensor x = varying_on(in, axis, out);
  RedistStep fwd = step(StepKind::AllToAll, axis);
  fwd.split_dim = split_dim;
  fwd.concat_dim = concat_dim;
  RedistStep back = fwd;  // the backward swaps split and concat
  if (!mutant_on(Mutant::AllToAllBackwardUnswapped)) std::swap(back.split_dim, back.concat_dim);
  Locals locals = collective_node("all_to_all", x, out, fwd, {true, back});
  return wrap("op", "all_to_all", out, std::move(locals), x.variant, x.reduced, {x});
}

// ---------------------------------------------------------------------------------------------
// Custom autograd Functions

LTensor BodyContext::call_rank_local(const std::string& key, const std::optional<Strategy>& strategy,
                                     std::vector<LTensor> xs, const nlohmann::json& args, const std::string& out,
                                     const RankFn& f) {
  check_mesh(xs, key);
  AxisSet variant, reduced;
  if (checked_) {
    auto [v, strategy_reduced] = output_sets(xs, strategy ? &*strategy : nullptr, args);
    variant = v;
    reduced = fit_inputs(xs, variant, strategy_reduced, out);
  }
  Locals locals(xs.at(0).locals.size());
  for (size_t r = 0; r < locals.size(); ++r) {
    std::vector<at::Tensor> in;
    for (const auto& x : xs) in.push_back(x.locals[r]);
    locals[r] = f(in);
  }
  return wrap("op", "call " + args.value("function", key), out, std::move(locals), variant, reduced, xs);
}

LTensor BodyContext::call_on_groups(const std::string& key, const std::optional<Strategy>& strategy, LTensor x,
                                    int axis, const nlohmann::json& args, const std::string& out, const GroupFn& f) {
  check_mesh({x}, key);
  const Mesh& mesh = rt_.mesh();
  // The kernel communicates over `axis` as a collective does: an input invariant there is made
  // varying first (its backward all_reduces the gradient of every replica's contribution).
  x = varying_on(x, axis, out);
  Locals locals(x.locals.size());
  for (const auto& ranks : mesh.groups(axis)) {
    Locals group;
    for (auto r : ranks) group.push_back(x.locals[r]);
    InGroup in_group(ranks);  // a kernel's own collectives reach the communicator with these ranks
    Locals result = f(group);
    for (size_t k = 0; k < ranks.size(); ++k) locals[ranks[k]] = result.at(k);
  }
  const std::string name = "call " + args.value("function", key);
  if (!checked_) return wrap("op", name, out, std::move(locals), {}, {}, {x});
  if (!strategy) {
    LTensor t = wrap("op", name, out, std::move(locals), x.variant, x.reduced, {x});
    t.untracked = true;
    t.untracked_why = "\"" + out + "\" comes from " + name + ", a Function that communicates over \"" +
                      mesh.axes()[axis] + "\" and has no variance-tracking strategy: its variant and reduced sets are unknown";
    rt_.record_body_value(t);
    return t;
  }
  StrategyResult r = (*strategy)({{x.variant}, {x.reduced}, mesh, args});
  return wrap("op", name, out, std::move(locals), r.variant, r.reduced ? *r.reduced : x.reduced, {x});
}

// ---------------------------------------------------------------------------------------------
// A body op of a scenario

LTensor BodyContext::run(const OpDecl& op, const std::map<std::string, LTensor>& env) {
  std::vector<LTensor> args;
  for (const auto& a : op.args) args.push_back(env.at(a));
  const nlohmann::json& at = op.attrs;
  auto axis = [&] { return rt_.mesh().axis_index(at.at("axis").get<std::string>()); };
  if (op.op == "all_reduce")
    return all_reduce(args[0], axis(), parse_reduce_op(at.value("reduce", "sum")), op.out);
  if (op.op == "all_gather") {
    const std::string to = at.value("to", "varying");
    if (to != "varying" && to != "reduced")
      throw SemanticError(ErrorKind::InvalidScenario,
                          op.path + "/to: expected \"varying\" or \"reduced\", got \"" + to + "\"");
    return all_gather(args[0], axis(), at.at("dim").get<int64_t>(), to == "reduced", op.out);
  }
  if (op.op == "reduce_scatter") return reduce_scatter(args[0], axis(), at.at("dim").get<int64_t>(), op.out);
  if (op.op == "all_to_all")
    return all_to_all(args[0], axis(), at.at("split_dim").get<int64_t>(), at.at("concat_dim").get<int64_t>(), op.out);
  if (op.op == "mark_varying") return mark_varying(args[0], axis(), op.out);
  if (op.op == "call") {
    const std::string fn = at.at("function").get<std::string>();
    const FunctionInvoker* invoke = find_scenario_function(fn);
    if (!invoke) {
      std::string known;
      for (const auto& n : scenario_function_names()) known += (known.empty() ? "" : ", ") + n;
      throw SemanticError(ErrorKind::UnsupportedOp,
                          op.path + ": call: unknown function \"" + fn + "\" (known: " + known +
                              "). A Function of your own is registered with meshsim::register_function: load it into "
                              "this command with `meshsim --plugin libyours.so run ...`, or build a meshsim of your own "
                              "that calls meshsim::main (docs/cpp-api.md)");
    }
    return (*invoke)(*this, args, op);
  }
  return this->op(op.op, at, args, op.out);
}

}  // namespace meshsim

#include "sim/local_map.h"

#include <set>

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
  std::string out = "variant=" + axes_str(mesh, t.variant) + " reduced=" + axes_str(mesh, t.reduced);
  if (!t.unreduced.empty()) {
    out += " unreduced=[";
    for (const auto& [a, op] : t.unreduced)
      out += (out.back() == '[' ? "" : ", ") + mesh.axes().at(a) + ":" + reduce_op_name(op);
    out += "]";
  }
  return out;
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
  for (const auto& [a, op] : t.unreduced)
    if (t.variant.count(a) || t.reduced.count(a))
      throw SemanticError(ErrorKind::ExclusivityViolation,
                          what + ": \"" + t.name + "\" is unreduced and " + (t.variant.count(a) ? "variant" : "reduced") +
                              " over mesh axis \"" + mesh.axes()[a] + "\" (" + meta_str(mesh, t) + ")");
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
    if (p.is_reduced()) t.reduced.insert(a);
    else if (p.is_partial() && rt_.options().partial_entry == PartialEntry::Unreduced) t.unreduced[a] = p.op;
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
      const auto u = t.unreduced.find(a);
      std::string want;
      if (u != t.unreduced.end()) {
        if (!p.is_partial() || p.op != u->second)
          throw SemanticError(ErrorKind::UnreducedMisuse,
                              "local_map returns \"" + t.name + "\" (" + meta_str(mesh, t) + ") as " + p.str() + " over \"" +
                                  mesh.axes()[a] + "\": its locals still need their " + reduce_op_name(u->second) +
                                  " over it (all_reduce " + reduce_op_name(u->second) +
                                  (u->second == ReduceOp::Sum ? ", or reduce_scatter" : "") + " first), or return it as P(" +
                                  reduce_op_name(u->second) + ")");
        continue;
      }
      if ((p.is_shard() || p.is_partial()) && !v) want = "variant";
      else if (p.is_plain_replicate() && (v || r)) want = "neither variant nor reduced";
      else if (p.is_reduced() && !r) want = "reduced";
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
                          AxisSet variant, AxisSet reduced, const std::vector<LTensor>& inputs, Unreduced unreduced) {
  if (coverage_sink() && checked_) cover("local_map: " + name);
  // Plain local code keeps no sets (but under the planted bug unchecked_inserts_mark_varying).
  if (!checked_ && !mutant_on(Mutant::UncheckedInsertsMarkVarying)) variant.clear(), reduced.clear(), unreduced.clear();
  LTensor t{out, &rt_.mesh(), std::move(locals), std::move(variant), std::move(reduced), false, {}, !checked_,
            std::move(unreduced)};
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
                                const std::optional<AxisSet>& strategy_reduced, const std::string& out,
                                const AxisSet& keep) {
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
      if (!reduced.count(a) && !variant.count(a) && !keep.count(a) && !mutant_on(Mutant::MissingReducedInvariantCast))
        xs[i] = reduced_to_invariant(xs[i], a, out + ".in" + std::to_string(i) + ".invariant." + axes[a]);
  return reduced;
}

LTensor BodyContext::op(const std::string& op, const nlohmann::json& attrs, std::vector<LTensor> xs,
                        const std::string& out) {
  check_mesh(xs, op);
  AxisSet variant, reduced;
  Unreduced unreduced;
  if (checked_ || mutant_on(Mutant::UncheckedInsertsMarkVarying)) {  // planted bug: fit_inputs in plain local code
    unreduced = unreduced_of(op, attrs, xs);
    AxisSet keep;
    for (const auto& u : unreduced) keep.insert(u.first);
    const StrategyResult sets = function_sets(xs, find_variance_tracking_strategy(op), attrs, 1, op).front();
    variant = sets.variant;
    reduced = fit_inputs(xs, variant, sets.reduced, out, keep);
  }
  OpDecl decl;
  decl.op = op;
  decl.out = out;
  decl.attrs = attrs;
  OpAttrs a = op_attrs(decl);
  // dropout on a local tensor: the user's code draws from each rank's own generator, seeded as the
  // scenario says (same_seed: alike on every rank; rank_seed: the run's seed plus the rank), over the
  // local as a whole tensor (index 0 at its first element): docs/semantics.md, "Randomness".
  const bool rank_seeded = attrs.value("generator", "same_seed") == "rank_seed";
  a.draw.seed = rt_.options().seed;
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
    OpAttrs ar = a;
    if (rank_seeded) ar.draw.seed += r;
    locals[r] = local_op(op, ar, in);
  }
  return wrap("op", op, out, std::move(locals), variant, reduced, xs, unreduced);
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
    const LocalShapes like(outs);
    const size_t n = x.locals.size();
    const std::string grad_of = x.name;
    const int program_op = rt->recorder().program_op;
    connect("LTensor::" + name, x.locals, outs,
            [rt, like, n, grad_of, name, out, bwd, program_op](variable_list&& g) -> variable_list {
      ScopedOverride<int> at(rt->recorder().program_op, program_op);
      return rt->guarded(n, [&] {
        Locals grads = like.defined(std::move(g));
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
  // Unreduced there, the collective takes the locals as they are (carried() says which may).
  if (!checked_ || x.variant.count(axis) || x.unreduced.count(axis)) return x;
  const std::string name = out + ".varying." + rt_.mesh().axes()[axis];
  const bool cast = x.reduced.count(axis) && !mutant_on(Mutant::MarkVaryingForReduced);
  return cast ? reduced_to_varying(x, axis, name) : mark_varying(x, axis, name);
}

LTensor BodyContext::mark_varying(const LTensor& x, int axis, const std::string& out) {
  Locals locals = collective_node("mark_varying", x, out, std::nullopt, {true, step(StepKind::AllReduce, axis)});
  return wrap("op", "mark_varying", out, std::move(locals), with(x.variant, axis), without(x.reduced, axis), {x},
              carried(x, axis, "mark_varying", false, false));
}

LTensor BodyContext::reduced_to_varying(const LTensor& x, int axis, const std::string& out) {
  // Free both ways: the cotangent is cast varying -> unreduced (JAX's reduced_vary_cast).
  Locals locals = collective_node("reduced_vary_cast", x, out, std::nullopt, {true, std::nullopt});
  return wrap("op", "reduced_vary_cast", out, std::move(locals), with(x.variant, axis), without(x.reduced, axis), {x},
              x.unreduced);
}

LTensor BodyContext::reduced_to_invariant(const LTensor& x, int axis, const std::string& out) {
  RedistStep back = step(StepKind::PartialFromReplicate, axis);
  back.convention = rt_.options().partial_from_replicate;
  Locals locals = collective_node("reduced_invariant_cast", x, out, std::nullopt, {true, back});
  return wrap("op", "reduced_invariant_cast", out, std::move(locals), x.variant, without(x.reduced, axis), {x},
              x.unreduced);
}

LTensor BodyContext::all_reduce(const LTensor& in, int axis, ReduceOp op, const std::string& out) {
  // An unreduced axis takes the reduction its locals need, and that one only.
  const auto u = in.unreduced.find(axis);
  if (u != in.unreduced.end() && u->second != op && !mutant_on(Mutant::UnreducedAllReduceAnyOp))
    throw SemanticError(ErrorKind::UnreducedMisuse,
                        "all_reduce(" + std::string(reduce_op_name(op)) + ") of \"" + in.name + "\" (" +
                            meta_str(rt_.mesh(), in) + ") over \"" + rt_.mesh().axes()[axis] + "\": its locals stand for their " +
                            reduce_op_name(u->second) + ", so the " + reduce_op_name(op) + " of them is not its value (all_reduce " +
                            reduce_op_name(u->second) + ")");
  const Unreduced left = carried(in, axis, "all_reduce", is_linear(op), true);
  LTensor x = varying_on(in, axis, out);
  // sum: the backward is the identity (Megatron's g); avg: the gradient divided by n; max, min:
  // not differentiable.
  Backward bwd{is_linear(op), std::nullopt};
  if (op == ReduceOp::Avg) bwd.step = step(StepKind::PartialFromReplicate, axis);
  if (op == ReduceOp::Sum && mutant_on(Mutant::AllReduceBackwardAllReduces)) bwd.step = step(StepKind::AllReduce, axis);
  Locals locals = collective_node("all_reduce", x, out, step(StepKind::AllReduce, axis, 0, op), bwd);
  return wrap("op", std::string("all_reduce_") + reduce_op_name(op), out, std::move(locals),
              without(x.variant, axis), x.reduced, {x}, left);
}

LTensor BodyContext::all_gather(const LTensor& in, int axis, int64_t dim, bool to_reduced, const std::string& out) {
  const Unreduced left = carried(in, axis, "all_gather", true, false);
  LTensor x = varying_on(in, axis, out);
  Locals locals = collective_node("all_gather", x, out, step(StepKind::AllGather, axis, dim),
                                  {true, step(StepKind::ReduceScatter, axis, dim)});
  if (to_reduced)
    return wrap("op", "all_gather_to_reduced", out, std::move(locals), without(x.variant, axis), with(x.reduced, axis), {x},
                left);
  const AxisSet variant = mutant_on(Mutant::AllGatherVaryingDropsAxis) ? without(x.variant, axis) : x.variant;
  return wrap("op", "all_gather_to_varying", out, std::move(locals), variant, x.reduced, {x}, left);
}

LTensor BodyContext::reduce_scatter(const LTensor& in, int axis, int64_t dim, const std::string& out) {
  const auto u = in.unreduced.find(axis);
  if (u != in.unreduced.end() && u->second != ReduceOp::Sum)
    throw SemanticError(ErrorKind::UnreducedMisuse,
                        "reduce_scatter of \"" + in.name + "\" (" + meta_str(rt_.mesh(), in) + ") over \"" +
                            rt_.mesh().axes()[axis] + "\": reduce_scatter sums the locals, which stand for their " +
                            reduce_op_name(u->second));
  const Unreduced left = carried(in, axis, "reduce_scatter", true, true);
  LTensor x = varying_on(in, axis, out);
  int64_t back_dim = dim;
  if (mutant_on(Mutant::ReduceScatterBackwardWrongDim) && x.locals.at(0).dim() > 1)
    back_dim = (dim + 1) % x.locals.at(0).dim();  // planted bug
  Locals locals = collective_node("reduce_scatter", x, out, step(StepKind::ReduceScatter, axis, dim),
                                  {true, step(StepKind::AllGather, axis, back_dim)});
  return wrap("op", "reduce_scatter", out, std::move(locals), with(x.variant, axis), without(x.reduced, axis), {x}, left);
}

LTensor BodyContext::all_to_all(const LTensor& in, int axis, int64_t split_dim, int64_t concat_dim, const std::string& out) {
  const Unreduced left = carried(in, axis, "all_to_all", true, false);
  LTensor x = varying_on(in, axis, out);
  RedistStep fwd = step(StepKind::AllToAll, axis);
  fwd.split_dim = split_dim;
  fwd.concat_dim = concat_dim;
  RedistStep back = fwd;  // the backward swaps split and concat
  if (!mutant_on(Mutant::AllToAllBackwardUnswapped)) std::swap(back.split_dim, back.concat_dim);
  Locals locals = collective_node("all_to_all", x, out, fwd, {true, back});
  return wrap("op", "all_to_all", out, std::move(locals), x.variant, x.reduced, {x}, left);
}

// ---------------------------------------------------------------------------------------------
// partial_in_local_map unreduced (JAX 0.10's {U:axis}; docs/semantics.md, "Partial placements
// entering a local_map"): a value whose locals still need a reduction takes only ops that are
// linear in it, so that the reduction still gives the value the program means.

namespace {

// Ops linear in their one tensor operand (views, and sums of elements).
bool linear_unary(const std::string& op) {
  static const std::set<std::string> ops = {"neg",     "scale",     "sum",   "mean",   "reshape", "view",
                                            "flatten", "unflatten", "transpose", "permute", "narrow", "squeeze",
                                            "unsqueeze", "expand",  "tril",  "triu", "repeat", "repeat_interleave", "detach"};
  return ops.count(op) > 0;
}

// Ops linear in each operand, the others held (a product): one operand may be unreduced if the
// others are reduced over its axes (their gradients are then unreduced, as JAX 0.10 requires).
bool product_like(const std::string& op) {
  static const std::set<std::string> ops = {"mul", "div", "mm", "matmul", "bmm", "linear"};
  return ops.count(op) > 0;
}

}  // namespace

Unreduced BodyContext::carried(const LTensor& x, int axis, const std::string& what, bool linear, bool reduces) const {
  if (x.unreduced.empty()) return {};
  const Mesh& mesh = rt_.mesh();
  const auto refuse = [&](const std::string& why) {
    throw SemanticError(ErrorKind::UnreducedMisuse, what + " over \"" + mesh.axes()[axis] + "\" of \"" + x.name + "\" (" +
                                                        meta_str(mesh, x) + "): " + why);
  };
  Unreduced left = x.unreduced;
  const auto u = left.find(axis);
  if (u != left.end()) {
    if (!reduces)
      refuse("its locals still need their " + std::string(reduce_op_name(u->second)) +
             " over that axis, which this would mix up (all_reduce or reduce_scatter it first)");
    left.erase(u);
  }
  for (const auto& [a, op] : left)
    if (!linear || !is_linear(op))
      refuse("its locals still need their " + std::string(reduce_op_name(op)) + " over \"" + mesh.axes()[a] +
             "\", and this collective does not commute with it (reduce it first)");
  return left;
}

Unreduced BodyContext::unreduced_of(const std::string& op, const nlohmann::json& attrs,
                                    const std::vector<LTensor>& xs) const {
  const LTensor* first = nullptr;
  for (const auto& x : xs)
    if (!x.unreduced.empty()) {
      first = &x;
      break;
    }
  if (!first) return {};
  const Mesh& mesh = rt_.mesh();
  const Unreduced& u = first->unreduced;
  const auto refuse = [&](const LTensor& x, const std::string& why) {
    throw SemanticError(ErrorKind::UnreducedMisuse, op + ": \"" + x.name + "\" (" + meta_str(mesh, x) + ") " + why);
  };
  std::string axes;
  for (const auto& [a, r] : u) axes += (axes.empty() ? "\"" : ", \"") + mesh.axes()[a] + "\"";
  for (const auto& [a, r] : u)
    if (!is_linear(r))
      refuse(*first, std::string("is unreduced by ") + reduce_op_name(r) + " over \"" + mesh.axes()[a] +
                         "\": no op but all_reduce(" + reduce_op_name(r) + ") keeps what its locals stand for");
  const bool scalar = attrs.is_object() && attrs.contains("value");
  if (xs.size() == 1) {
    const bool linear = linear_unary(op) || (scalar && (op == "mul" || op == "div"));
    if (!linear)
      refuse(*first, "is unreduced over " + axes + ": " + op + " is not linear, so on the locals it does not compute " +
                         op + " of the value (all_reduce it first)");
    return u;
  }
  if (op == "add" || op == "sub" || op == "cat" || op == "stack") {
    for (const auto& x : xs)
      if (x.unreduced != u)
        refuse(x, "meets \"" + first->name + "\", unreduced over " + axes + ": both must be unreduced over the same " +
                      "axes by the same op (what is not would be added once per rank)");
    return u;
  }
  if (product_like(op) && !(op == "div" && first != &xs[0]) && !(op == "linear" && xs.size() > 2)) {
    for (const auto& x : xs) {
      if (&x == first) continue;
      if (!x.unreduced.empty())
        refuse(x, "and \"" + first->name + "\" are both unreduced: " + op + " is bilinear (reduce one first)");
      for (const auto& [a, r] : u)
        if (!x.reduced.count(a))
          refuse(x, "meets \"" + first->name + "\", unreduced over \"" + mesh.axes()[a] + "\", in " + op +
                        ": it must be reduced (Rd) there, so that its gradient, unreduced, is summed where it is reduced "
                        "(as JAX 0.10 requires)");
    }
    return u;
  }
  refuse(*first, "is unreduced over " + axes + ": " + op + " is not linear in it (all_reduce it first)");
  return u;
}

// ---------------------------------------------------------------------------------------------
// Custom autograd Functions

std::vector<StrategyResult> BodyContext::function_sets(const std::vector<LTensor>& xs, const Strategy* strategy,
                                                       const nlohmann::json& args, size_t outputs,
                                                       const std::string& key) const {
  if (!strategy) return std::vector<StrategyResult>(outputs, StrategyResult{set_union(xs), std::nullopt, {}});
  std::vector<AxisSet> vs, rs;
  for (const auto& x : xs) {
    vs.push_back(x.variant);
    rs.push_back(x.reduced);
  }
  StrategyResult r = (*strategy)({vs, rs, rt_.mesh(), args});
  if (r.outputs.empty()) return std::vector<StrategyResult>(outputs, r);
  if (r.outputs.size() != outputs)
    throw SemanticError(ErrorKind::InvalidScenario,
                        "call " + args.value("function", key) + ": its variance strategy gives " +
                            std::to_string(r.outputs.size()) + " outputs' sets, the call has " + std::to_string(outputs) +
                            " outputs");
  // The planted bug function_outputs_share_sets: every output takes the first output's sets.
  if (mutant_on(Mutant::FunctionOutputsShareSets)) return std::vector<StrategyResult>(outputs, r.outputs.front());
  return r.outputs;
}

namespace {

// A Function is opaque: whether it is linear in an unreduced input is unknown.
void refuse_unreduced(const Mesh& mesh, const std::vector<LTensor>& xs, const nlohmann::json& args, const std::string& key) {
  for (const auto& x : xs)
    if (!x.unreduced.empty())
      throw SemanticError(ErrorKind::UnreducedMisuse,
                          "call " + args.value("function", key) + ": \"" + x.name + "\" (" + meta_str(mesh, x) +
                              ") is unreduced, and a Function is opaque: nothing says it is linear in it (all_reduce it first)");
}

// The registry entry for the called Function's name, else the strategy the caller found.
std::optional<Strategy> in_force(const nlohmann::json& args, const std::optional<Strategy>& strategy) {
  if (args.is_object() && args.contains("function") && args["function"].is_string())
    if (const Strategy* s = find_variance_tracking_strategy(function_name_key(args["function"].get<std::string>())))
      return *s;
  return strategy;
}

}  // namespace

std::vector<LTensor> BodyContext::call_rank_local(const std::string& key, const std::optional<Strategy>& own,
                                                  std::vector<LTensor> xs, const nlohmann::json& args,
                                                  const std::vector<std::string>& outs, const RankFn& f) {
  check_mesh(xs, key);
  if (checked_) refuse_unreduced(rt_.mesh(), xs, args, key);
  const std::optional<Strategy> strategy = in_force(args, own);
  std::vector<StrategyResult> sets(outs.size());
  if (checked_) {
    sets = function_sets(xs, strategy ? &*strategy : nullptr, args, outs.size(), key);
    // One computation on every rank: the inputs meet as an op's do, at the union of the outputs'
    // variant sets (an output reduced where the strategy says so keeps its inputs reduced there).
    AxisSet variant;
    std::optional<AxisSet> reduced;
    for (const auto& o : sets) {
      variant.insert(o.variant.begin(), o.variant.end());
      if (o.reduced) (reduced ? *reduced : reduced.emplace()).insert(o.reduced->begin(), o.reduced->end());
    }
    fit_inputs(xs, variant, reduced, outs.front());
    for (auto& o : sets)
      if (!o.reduced) o.reduced = set_intersection(xs);
  }
  std::vector<Locals> locals(outs.size(), Locals(xs.at(0).locals.size()));
  for (size_t r = 0; r < xs.at(0).locals.size(); ++r) {
    std::vector<at::Tensor> in;
    for (const auto& x : xs) in.push_back(x.locals[r]);
    std::vector<at::Tensor> ys = f(in);
    if (ys.size() != outs.size())
      throw SemanticError(ErrorKind::InvalidScenario, "call " + args.value("function", key) + " returned " +
                                                          std::to_string(ys.size()) + " tensors, the call names " +
                                                          std::to_string(outs.size()) + " outputs");
    for (size_t k = 0; k < outs.size(); ++k) locals[k][r] = std::move(ys[k]);
  }
  std::vector<LTensor> result;
  for (size_t k = 0; k < outs.size(); ++k)
    result.push_back(wrap("op", "call " + args.value("function", key), outs[k], std::move(locals[k]), sets[k].variant,
                          sets[k].reduced.value_or(AxisSet{}), xs));
  return result;
}

std::vector<LTensor> BodyContext::call_on_groups(const std::string& key, const std::optional<Strategy>& own, LTensor x,
                                                 int axis, const nlohmann::json& args,
                                                 const std::vector<std::string>& outs, const GroupFn& f) {
  check_mesh({x}, key);
  if (checked_) refuse_unreduced(rt_.mesh(), {x}, args, key);
  const std::optional<Strategy> strategy = in_force(args, own);
  const Mesh& mesh = rt_.mesh();
  // The kernel communicates over `axis` as a collective does: an input invariant there is made
  // varying first (its backward all_reduces the gradient of every replica's contribution).
  x = varying_on(x, axis, outs.front());
  std::vector<Locals> locals(outs.size(), Locals(x.locals.size()));
  for (const auto& ranks : mesh.groups(axis)) {
    Locals group;
    for (auto r : ranks) group.push_back(x.locals[r]);
    InGroup in_group(ranks);  // a kernel's own collectives reach the communicator with these ranks
    std::vector<Locals> result = f(group);
    if (result.size() != outs.size())
      throw SemanticError(ErrorKind::InvalidScenario, "call " + args.value("function", key) + " returned " +
                                                          std::to_string(result.size()) + " outputs, the call names " +
                                                          std::to_string(outs.size()));
    for (size_t k = 0; k < outs.size(); ++k)
      for (size_t m = 0; m < ranks.size(); ++m) locals[k][ranks[m]] = result[k].at(m);
  }
  const std::string name = "call " + args.value("function", key);
  std::vector<LTensor> result;
  if (!checked_) {
    for (size_t k = 0; k < outs.size(); ++k) result.push_back(wrap("op", name, outs[k], std::move(locals[k]), {}, {}, {x}));
    return result;
  }
  if (!strategy) {
    for (size_t k = 0; k < outs.size(); ++k) {
      LTensor t = wrap("op", name, outs[k], std::move(locals[k]), x.variant, x.reduced, {x});
      t.untracked = true;
      t.untracked_why = "\"" + outs[k] + "\" comes from " + name + ", a Function that communicates over \"" +
                        mesh.axes()[axis] + "\" and has no variance-tracking strategy: its variant and reduced sets are unknown";
      rt_.record_body_value(t);
      result.push_back(std::move(t));
    }
    return result;
  }
  const std::vector<StrategyResult> sets = function_sets({x}, &*strategy, args, outs.size(), key);
  for (size_t k = 0; k < outs.size(); ++k)
    result.push_back(wrap("op", name, outs[k], std::move(locals[k]), sets[k].variant,
                          sets[k].reduced ? *sets[k].reduced : x.reduced, {x}));
  return result;
}

LTensor BodyContext::created(const OpDecl& op) {
  if (!is_creation_op(op.op) || op_schema(op.op).gen != GenClass::Creation)
    throw SemanticError(ErrorKind::InvalidScenario, op.path + ": " + op.op + " is not supported in local code");
  Locals locals(static_cast<size_t>(rt_.mesh().size()), created_value(op, rt_.options().dtype));
  return wrap("op", op.op, op.out, std::move(locals), {}, {}, {});
}

// ---------------------------------------------------------------------------------------------
// A body op of a scenario

std::vector<LTensor> BodyContext::run_all(const OpDecl& op, const std::map<std::string, LTensor>& env) {
  std::vector<LTensor> args;
  for (const auto& a : op.args) args.push_back(env.at(a));
  const nlohmann::json& at = op.attrs;
  auto axis = [&] { return rt_.mesh().axis_index(at.at("axis").get<std::string>()); };
  if (op.op == "all_reduce")
    return {all_reduce(args[0], axis(), parse_reduce_op(at.value("reduce", "sum")), op.out)};
  if (op.op == "all_gather") {
    const std::string to = at.value("to", "varying");
    if (to != "varying" && to != "reduced")
      throw SemanticError(ErrorKind::InvalidScenario,
                          op.path + "/to: expected \"varying\" or \"reduced\", got \"" + to + "\"");
    return {all_gather(args[0], axis(), at.at("dim").get<int64_t>(), to == "reduced", op.out)};
  }
  if (op.op == "reduce_scatter") return {reduce_scatter(args[0], axis(), at.at("dim").get<int64_t>(), op.out)};
  if (op.op == "all_to_all") {
    const int64_t split_dim = at.value("split_dim", int64_t{0}), concat_dim = at.value("concat_dim", int64_t{0});
    if (args.size() == 1) return {all_to_all(args[0], axis(), split_dim, concat_dim, op.out)};
    if (args.size() != 3)
      throw SemanticError(ErrorKind::InvalidScenario,
                          op.path + "/args: all_to_all takes x alone (equal splits) or x, input_split_sizes and "
                                    "output_split_sizes, got " + std::to_string(args.size()) + " args");
    if (split_dim != 0 || concat_dim != 0)
      throw SemanticError(ErrorKind::InvalidScenario,
                          op.path + "/" + (split_dim != 0 ? "split_dim" : "concat_dim") +
                              ": all_to_all with split sizes moves rows of dim 0 (all_to_all_single): split_dim and "
                              "concat_dim are 0");
    return {all_to_all_split(args[0], args[1], args[2], axis(), op.out, op.path)};
  }
  if (op.op == "mark_varying") return {mark_varying(args[0], axis(), op.out)};
  if (is_creation_op(op.op)) return {created(op)};
  if (op.op == "call") {
    const std::string fn = at.at("function").get<std::string>();
    const FunctionInvoker* invoke = find_scenario_function(fn);
    if (!invoke) {
      std::string known;
      for (const auto& n : scenario_function_names()) known += (known.empty() ? "" : ", ") + n;
      throw SemanticError(ErrorKind::UnsupportedOp,
                          op.path + ": call: unknown function \"" + shown(fn) + "\" (known: " + known +
                              "). A Function of your own is registered with meshsim::register_function: load it into "
                              "this command with `meshsim --plugin libyours.so run ...`, or build a meshsim of your own "
                              "that calls meshsim::main (docs/cpp-api.md)");
    }
    const int outputs = scenario_function_signature(fn).outputs;
    const size_t named = result_names(op).size();
    if (static_cast<size_t>(outputs) != named)
      throw SemanticError(ErrorKind::InvalidScenario,
                          op.path + "/out: Function \"" + fn + "\" returns " + std::to_string(outputs) + " tensor" +
                              (outputs == 1 ? "" : "s") + ", the call names " + std::to_string(named) +
                              (outputs == 1 ? " (a string names its one output)" : " (out lists one name per output)"));
    return (*invoke)(*this, args, op);
  }
  return {this->op(op.op, at, args, op.out)};
}

}  // namespace meshsim

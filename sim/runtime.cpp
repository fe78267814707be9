#include "sim/runtime.h"

#include <algorithm>
#include <functional>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "core/cotangent.h"
#include "core/error.h"
#include "core/explain.h"
#include "core/mutants.h"
#include "core/reduced_policy.h"
#include "core/scoped.h"
#include "core/semantics.h"
#include "sim/data.h"
#include "sim/local_ops.h"
#include "sim/mesh_node.h"
#include "sim/rank_calls.h"
#include "sim/vjps.h"

namespace meshsim {

namespace {

using torch::autograd::variable_list;

// A redistribute's target with negative shard dims wrapped by x's rank; a dim out of range, or a
// strided shard that does not divide x evenly, is a shape_mismatch.
Spec normalized_target(const Mesh& mesh, const DTensor& x, const Spec& to) {
  Spec out;
  try {
    out = normalize_spec(to, static_cast<int64_t>(x.shape.size()));
  } catch (const std::invalid_argument& e) {
    throw SemanticError(ErrorKind::ShapeMismatch, "redistribute \"" + x.name + "\" to " + spec_str(to) + ": " + e.what());
  }
  if (std::string why = check_strided(mesh, out, x.shape); !why.empty())
    throw SemanticError(ErrorKind::ShapeMismatch, "redistribute \"" + x.name + "\" " + shape_str(x.shape) + " to " +
                                                      spec_str(to) + ": " + why);
  return out;
}

// PyTorch's Redistribute.backward target: the source's placements with every Partial replaced by
// Replicate (a gradient is never made Partial again).
Spec partial_as_replicate(Spec spec) {
  for (auto& p : spec)
    if (p.is_partial()) p = Placement::replicate();
  return spec;
}

// `locals` cast to `dtype` (nothing: as they are); a new tensor only where the dtype differs.
Locals cast_locals(Locals locals, std::optional<DType> dtype) {
  if (!dtype) return locals;
  for (auto& l : locals)
    if (l.defined() && l.scalar_type() != scalar_type(*dtype)) l = l.to(scalar_type(*dtype));
  return locals;
}

}  // namespace

void Recorder::add(Event e) {
  if (muted) return;
  e.seq = static_cast<int64_t>(events_.size());
  if (e.implicit.empty() && !algorithm) e.implicit = implicit;
  events_.push_back(std::move(e));
  ops_.push_back(program_op);
}

std::string Runtime::implicit_move(ImplicitMove m) {
  const std::string at = m.program_op >= 0 ? " at /program/" + std::to_string(m.program_op) : "";
  std::string why;
  if (m.phase == "backward") {
    why = "backward of " + m.op + " \"" + m.value + "\"" + at + ": its rule for operand " +
          std::to_string(m.operand_index) + "'s gradient takes the incoming gradient as " + spec_str(m.to) +
          ", it arrived " + spec_str(m.from);
  } else {
    why = m.op + " \"" + m.value + "\"" + at + ": operand " + std::to_string(m.operand_index) + " \"" + m.operand +
          "\" " + spec_str(m.from) + " -> " + spec_str(m.to) + ": ";
    std::string axes;
    for (size_t a = 0; a < m.from.size(); ++a) {
      if (m.from[a] == m.to[a]) continue;
      std::string others;
      for (const auto& alt : m.alternatives)
        if (alt.axis == mesh_.axes()[a])
          others += (others.empty() ? "" : ", ") + ("\"" + alt.row + "\" " + std::to_string(alt.bytes) + " B");
      axes += (axes.empty() ? "" : "; ") + std::string("over ") + mesh_.axes()[a] + " no row of " + m.op +
              " takes the operands as they are; the row chosen is \"" + (a < m.rows.size() ? m.rows[a] : "") + "\"" +
              (others.empty() ? "" : " (the other legal rows: " + others + ")");
    }
    why += axes;
  }
  m.reason = "implicit: " + why;
  if (recorder_.muted) return m.reason;  // a re-run's move was recorded the first time
  implicit_moves_.push_back(m);
  return implicit_moves_.back().reason;
}

Runtime::Runtime(Mesh mesh, RunOptions options) : mesh_(std::move(mesh)), options_(std::move(options)) {
  if (follows(Difference::ReplicateToPartialDivides) &&
      options_.partial_from_replicate != PartialFromReplicate::Divide)
    throw SemanticError(ErrorKind::InvalidScenario,
                        "/options: semantics pytorch divides R -> P(sum) by the group size "
                        "(Partial._partition_value); partial_from_replicate rank0 has no meaning there");
}

bool Runtime::follows(Difference d) const { return meshsim::follows(options_.semantics, d); }

bool& local_hashes_enabled() {
  static thread_local bool enabled = true;
  return enabled;
}

bool& result_detail_enabled() {
  static thread_local bool enabled = true;
  return enabled;
}

Event Runtime::make_event(const std::string& kind, const std::string& name, const std::string& value,
                          const Locals& locals) const {
  Event e;
  e.phase = phase_;
  e.kind = kind;
  e.name = name;
  e.value = value;
  const bool hashed = local_hashes_enabled();
  for (const auto& t : locals) {
    e.local_shapes.push_back(t.sizes().vec());
    if (hashed) e.hashes.push_back(tensor_hash(t));
  }
  return e;
}

Locals Runtime::run_plan(const std::vector<RedistStep>& plan, const Spec& from, Locals locals,
                         const std::string& value, const std::string& note, const std::string& grad_of) {
  Spec cur = from;
  for (const auto& step : plan) {
    Spec before = cur;
    cur[step.axis] = step.to;
    const int64_t bytes = step_bytes(mesh_, step, locals);
    if (step.kind == StepKind::PartialFromReplicate && step.op == ReduceOp::Sum &&
        step.convention == PartialFromReplicate::Divide && !locals.empty() && locals[0].scalar_type() == at::kLong)
      throw SemanticError(ErrorKind::IllegalRedistribute,
                          "R -> P(sum) of the int64 \"" + value + "\" over \"" + mesh_.axes()[step.axis] +
                              "\" under partial_from_replicate divide: an integer does not divide by the group size "
                              "(PyTorch's Partial._partition_value would give floats); reduce the other operand's "
                              "P(sum) first, or run with partial_from_replicate rank0");
    RedistStep applied = step;
    if (mutant_on(Mutant::PsumFromReplicateNoDivide) && step.kind == StepKind::PartialFromReplicate)
      applied.kind = StepKind::Relabel;  // planted bug: the value stays whole on every rank
    locals = apply_step(mesh_, applied, locals);
    Event e = make_event(step.communicates() ? "collective" : "local", step_kind_name(step.kind), value, locals);
    e.axis = mesh_.axes()[step.axis];
    e.bytes = bytes;
    e.in_specs = {spec_str(before)};
    e.out_spec = spec_str(cur);
    e.note = note;
    if (!grad_of.empty()) e.args = {grad_of};
    recorder_.add(std::move(e));
  }
  return locals;
}

void Runtime::record_grad_spec(const std::string& value, const GradSpec& spec) {
  auto [it, inserted] = grad_specs_.emplace(value, spec);
  if (!inserted && it->second != spec)
    tracking_problems_.push_back("gradient contributions to \"" + value + "\" disagree: " +
                                 spec_str(it->second.spec) + " and " + spec_str(spec.spec));
}

GradSpec Runtime::accumulated_layout(const std::string& value, const GradSpec& layout) const {
  auto it = grad_specs_.find(value);
  return it == grad_specs_.end() ? layout : it->second;
}

Locals Runtime::keep_grad_layout(Locals grads, const GradSpec& layout, const std::string& value, const Spec& primal,
                                 const Shape& global, const Locals& primal_locals, const std::string& note) {
  // Only Partial-or-Replicate labels are kept apart from the cotangent (a P(sum) .grad of a
  // replicated weight, as PyTorch leaves it), with the operand's local shapes (one autograd graph of
  // plain local tensors, where PyTorch's DTensor gradient carries its own layout). A contribution
  // sharded otherwise (below autograd, the operand's redistributed layout; an empty dim whose shards
  // look alike) goes to the cotangent, as the hook would move it, so every later backward rule sees
  // the shards it would see with the hook.
  const Spec cot = cotangent_spec(primal);
  bool keep = true;
  for (size_t a = 0; a < cot.size(); ++a)
    keep &= layout.spec[a].is_shard() || cot[a].is_shard() ? layout.spec[a] == cot[a] : true;
  for (size_t r = 0; r < grads.size() && keep; ++r)
    keep = grads[r].sizes() == primal_locals[r].sizes() &&
           grads[r].sizes().vec() == local_layout(mesh_, layout.spec, global, static_cast<int64_t>(r)).shape;
  if (!keep)
    return to_grad_layout(std::move(grads), layout,
                          accumulated_layout(value, {cot, cotangent_scale_divisor(mesh_, primal)}), value, value, note);
  auto it = grad_specs_.find(value);
  if (it == grad_specs_.end() || it->second == layout) {
    record_grad_spec(value, layout);
    return grads;
  }
  // Contributions add up locally only in one layout: this one moves to the first one's.
  if (mutant_on(Mutant::GradAccumulationMixedLayouts)) return grads;  // planted bug: added as it is
  return to_grad_layout(std::move(grads), layout, it->second, value, value,
                        "gradient contributions to \"" + value + "\" added in " + spec_str(it->second.spec));
}

DTensor Runtime::gradient_boundary(const DTensor& y, const std::string& note) {
  if (!follows(Difference::NoGradientHook) || !y.requires_grad() || !at::GradMode::is_enabled()) return y;
  DTensor out = y;
  out.locals = detached(y.locals);
  Runtime* rt = this;
  const Spec primal = y.spec;
  const std::string name = y.name;
  const LocalShapes like(out.locals);
  const size_t n = y.locals.size();
  const int program_op = recorder_.program_op;
  connect("GradientBoundary", y.locals, out.locals, [=](variable_list&& g) -> variable_list {
    ScopedOverride<int> at(rt->recorder().program_op, program_op);
    return rt->guarded(n, [&] {
      Locals grads = like.defined(std::move(g));
      const GradSpec from = rt->grad_spec(name, primal);
      const GradSpec target{cotangent_spec(primal), cotangent_scale_divisor(rt->mesh(), primal)};
      if (from == target) return grads;
      // The gradient now belongs to the local code's tensor, whose layout nothing tracks: "" records none.
      return rt->to_grad_layout(std::move(grads), from, target, "", name, note);
    });
  });
  return out;
}

DTensor Runtime::grad_placements_boundary(const DTensor& x, const Spec& grad_written) {
  Spec grad;
  try {
    grad = normalize_spec(grad_written, static_cast<int64_t>(x.shape.size()));
  } catch (const std::invalid_argument& e) {
    throw SemanticError(ErrorKind::ShapeMismatch, "grad_placements " + spec_str(grad_written) + " of \"" + x.name +
                                                      "\": " + e.what());
  }
  if (std::string why = check_spec(mesh_, grad, static_cast<int64_t>(x.shape.size())); !why.empty())
    throw SemanticError(ErrorKind::ShapeMismatch, "grad_placements " + spec_str(grad) + " of \"" + x.name + "\": " + why);
  for (size_t a = 0; a < grad.size(); ++a)
    if (grad[a].is_partial() && grad[a].op != ReduceOp::Sum)
      throw SemanticError(ErrorKind::InvalidScenario, "grad_placements " + spec_str(grad) + " of \"" + x.name +
                                                          "\": a gradient's partial is a sum (P(sum)), not " + grad[a].str());
  // The local gradients have the locals' shapes: a layout whose local shapes differ cannot hold them.
  for (size_t r = 0; r < x.locals.size(); ++r) {
    const Shape want = local_layout(mesh_, grad, x.shape, static_cast<int64_t>(r)).shape;
    if (want != x.locals[r].sizes().vec())
      throw SemanticError(ErrorKind::ShapeMismatch,
                          "grad_placements " + spec_str(grad) + " of \"" + x.name + "\" (" + spec_str(x.spec) +
                              "): rank " + std::to_string(r) + "'s local gradient would be " + shape_str(want) +
                              ", its local tensor is " + shape_str(x.locals[r].sizes().vec()));
  }
  if (grad == x.spec || !x.requires_grad() || !at::GradMode::is_enabled()) return x;
  DTensor out = x;
  out.locals = detached(x.locals);
  Runtime* rt = this;
  const DTensor primal{x.name, x.shape, x.spec, detached(x.locals)};
  const size_t n = x.locals.size();
  const int program_op = recorder_.program_op;
  const bool hookless = follows(Difference::NoGradientHook);
  const std::string note = "grad_placements of \"" + x.name + "\": its local gradient is " + spec_str(grad);
  connect("GradPlacements", x.locals, out.locals, [=](variable_list&& g) -> variable_list {
    ScopedOverride<int> at(rt->recorder().program_op, program_op);
    return rt->guarded(n, [&] {
      Locals grads = LocalShapes(primal.locals).defined(std::move(g));
      const GradSpec from{grad, 1};
      if (hookless)
        return rt->keep_grad_layout(std::move(grads), from, primal.name, primal.spec, primal.shape, primal.locals, note);
      return rt->to_cotangent(std::move(grads), from, primal.spec, primal.name, primal.name, note);
    });
  });
  return out;
}

GradSpec Runtime::grad_spec(const std::string& value, const Spec& primal) const {
  auto it = grad_specs_.find(value);
  if (it != grad_specs_.end()) return it->second;
  return {cotangent_spec(primal), cotangent_scale_divisor(mesh_, primal)};
}

std::optional<GradSpec> Runtime::input_grad_spec(const std::string& value, const Spec& primal) const {
  auto it = grad_specs_.find(value);
  if (it != grad_specs_.end()) return it->second;
  if (!has_cotangent(primal)) return std::nullopt;
  return grad_spec(value, primal);
}

Locals Runtime::to_cotangent(Locals grads, const GradSpec& from, const Spec& primal,
                             const std::string& grad_of, const std::string& value, const std::string& note) {
  const GradSpec target{cotangent_spec(primal), cotangent_scale_divisor(mesh_, primal)};
  return to_grad_layout(std::move(grads), from, target, grad_of, value, note);
}

Locals Runtime::to_grad_layout(Locals grads, const GradSpec& from, const GradSpec& target, const std::string& grad_of,
                               const std::string& value, const std::string& note) {
  auto plan = plan_redistribute(mesh_, from.spec, target.spec, {options_.partial_from_replicate, true});
  grads = run_plan(plan, from.spec, std::move(grads), value, note, grad_of);
  if (from.divisor != target.divisor && !mutant_on(Mutant::PavgBackwardUnscaled)) {
    const double factor = static_cast<double>(from.divisor) / static_cast<double>(target.divisor);
    for (auto& g : grads) g = g * factor;
    Event e = make_event("local", "scale", value, grads);
    e.args = {grad_of};
    e.out_spec = spec_str(target.spec);
    e.note = note + ": local cotangent scaled by " + std::to_string(from.divisor) + "/" +
             std::to_string(target.divisor);
    recorder_.add(std::move(e));
  }
  if (!grad_of.empty()) record_grad_spec(grad_of, target);
  return grads;
}

DTensor Runtime::redistribute(const DTensor& x, const Spec& to_written, const std::string& out_name,
                              const MixedPrecision* cast) {
  const Spec to = normalized_target(mesh_, x, to_written);
  auto plan = plan_redistribute(mesh_, x.spec, to, {options_.partial_from_replicate, false});
  Locals source = detached(x.locals);
  std::optional<DType> reduce_dtype, own_dtype;
  if (cast) {
    source = cast_locals(std::move(source), cast->param_dtype);
    reduce_dtype = cast->reduce_dtype;
    if (!x.locals.empty() && x.locals[0].defined()) own_dtype = dtype_of(x.locals[0].scalar_type());
    if (cast->param_dtype) {
      Event e = make_event("local", "to", out_name, source);
      e.args = {x.name};
      e.out_spec = spec_str(x.spec);
      e.note = std::string("mixed precision: \"") + x.name + "\"'s shards cast to " + dtype_name(*cast->param_dtype) +
               " before its collectives (param_dtype)";
      recorder_.add(std::move(e));
    }
  }
  DTensor y{out_name, x.shape, to, detached(run_plan(plan, x.spec, std::move(source), out_name, ""))};
  if (x.requires_grad() && at::GradMode::is_enabled()) {
    Runtime* rt = this;
    const Spec from = x.spec;
    const std::string in_name = x.name;
    const LocalShapes like(y.locals);  // shapes for missing gradients; no cycle
    const size_t n_inputs = x.locals.size();
    // The backward of an implicit redistribution is implicit too, for the same reason.
    const std::string implicit = recorder_.implicit;
    const int program_op = recorder_.program_op;
    connect("Redistribute", x.locals, y.locals, [=](variable_list&& g) -> variable_list {
      ScopedOverride<std::string> why(rt->recorder().implicit, implicit);
      ScopedOverride<int> at(rt->recorder().program_op, program_op);
      return rt->guarded(n_inputs, [&] {
        Locals grads = like.defined(std::move(g));
        if (reduce_dtype) grads = cast_locals(std::move(grads), reduce_dtype);  // reduce_dtype: before the reduction
        const std::string note = "backward of redistribute " + spec_str(from) + " -> " + spec_str(to);
        if (rt->follows(Difference::RedistributeBackward)) {  // PyTorch: to the source's placements, Partial as R
          // A P(max) / P(min) source came from an amax / amin over a sharded dim, whose backward
          // compares each element with the result: PyTorch's formula sees the reduced (global)
          // result, meshsim's per-rank autograd only each rank's own. Passing the gradient on
          // would mark every rank's local extremum (a wrong gradient), so it is refused, as under
          // meshsim's rules (docs/findings.md, section 10, extremum_partial_refused).
          if (!has_cotangent(from))
            throw SemanticError(ErrorKind::NotDifferentiable,
                                spec_str(from) + " is not differentiable in meshsim: a gradient reached the " +
                                    spec_str(from) + " result of an amax/amin over a sharded dim (PyTorch " +
                                    "differentiates it through the reduced result; meshsim would mark each " +
                                    "rank's local extremum); gather the reduced dim before the reduction");
          grads = rt->to_grad_layout(std::move(grads), rt->grad_spec(out_name, to),
                                     rt->accumulated_layout(in_name, {partial_as_replicate(from), 1}), in_name,
                                     out_name, note);
        } else {
          grads = rt->to_cotangent(std::move(grads), rt->grad_spec(out_name, to), from, in_name, out_name, note);
        }
        return cast_locals(std::move(grads), own_dtype);  // the parameter's own dtype
      }, out_name);
    });
  }
  Event e = make_event("op", "redistribute", out_name, y.locals);
  e.args = {x.name};
  e.in_specs = {spec_str(x.spec)};
  e.out_spec = spec_str(to);
  recorder_.add(std::move(e));
  return y;
}

DTensor Runtime::redistribute_locals(const DTensor& x, const Spec& to_written, const std::string& out_name) {
  const Spec to = normalized_target(mesh_, x, to_written);
  auto plan = plan_redistribute(mesh_, x.spec, to, {options_.partial_from_replicate, false});
  Locals locals = run_plan(plan, x.spec, detached(x.locals), out_name, "below autograd: inside the op");
  return DTensor{out_name, x.shape, to, detached(locals)};
}


const ShardingDecision& Runtime::decide(const std::string& op, const OpAttrs& attrs, const std::vector<Spec>& specs,
                                 const std::vector<Shape>& shapes) {
  const std::string key = decision_key(op, attrs, specs, shapes);
  ++stats_.propagation_requests;
  auto it = decisions_.find(key);
  if (it != decisions_.end()) {
    ++stats_.cache_hits;
    return it->second;
  }
  ++stats_.propagations;
  return decisions_.emplace(key, propagate(op, mesh_, specs, shapes, attrs)).first->second;
}

BackwardDecision Runtime::backward_decision(const std::string& op, const std::vector<Spec>& in_specs,
                                            const Spec& out_spec, const std::vector<Shape>& shapes,
                                            const OpAttrs& attrs, const Spec& grad_in, size_t input) {
  std::string key = decision_key(op, attrs, in_specs, shapes);
  append_key_spec(key, out_spec);
  append_key_spec(key, grad_in);
  append_key_word(key, static_cast<int64_t>(input));
  auto it = backward_decisions_.find(key);
  if (it != backward_decisions_.end()) return it->second;
  return backward_decisions_
      .emplace(std::move(key), backward_rule(op, mesh_, in_specs, out_spec, shapes, attrs, grad_in, input))
      .first->second;
}

// Planted bugs in the sharding rules the runtime applies (the checks use the true rules).
const ShardingDecision& Runtime::plant_rule_bugs(const std::string& op, const std::vector<Spec>& given,
                                                 const ShardingDecision& decided, ShardingDecision& d) const {
  if (!mutant_on(Mutant::MmS1S0LabelledR) && !mutant_on(Mutant::PartialPlusReplicateUndivided)) return decided;
  d = decided;
  for (int a = 0; a < mesh_.ndim(); ++a) {
    if (mutant_on(Mutant::MmS1S0LabelledR) && op == "mm" && d.rows[a] == "mm: S(1), S(0) -> P(sum)")
      d.out_spec[a] = Placement::replicate();
    if (mutant_on(Mutant::PartialPlusReplicateUndivided) && (op == "add" || op == "sub"))
      for (size_t i = 0; i < given.size(); ++i)
        if (given[i][a].is_replicate() && d.in_specs[i][a].is_partial()) d.in_specs[i][a] = given[i][a];
  }
  return d;
}

namespace {

// On each axis where an operand moves from `from` to `to`: the op's other legal rows and their
// cost, cheapest first (at most three per axis). Nothing when the explanation cannot be made.
std::vector<ImplicitMove::Alternative> alternatives_of(const std::string& op, const Mesh& mesh,
                                                       const std::vector<Spec>& given, const std::vector<Shape>& shapes,
                                                       const OpAttrs& attrs, const Spec& from, const Spec& to) {
  std::vector<ImplicitMove::Alternative> out;
  try {
    const PropagationExplanation ex = explain_propagation(op, mesh, given, shapes, attrs);
    for (const auto& axis : ex.axes) {
      if (static_cast<size_t>(axis.axis) >= from.size() || from[axis.axis] == to[axis.axis]) continue;
      std::vector<const RowCandidate*> others;
      for (size_t k = 0; k < axis.candidates.size(); ++k)
        if (static_cast<int>(k) != axis.chosen && axis.candidates[k].legal) others.push_back(&axis.candidates[k]);
      std::stable_sort(others.begin(), others.end(),
                       [](const RowCandidate* a, const RowCandidate* b) { return a->bytes < b->bytes; });
      for (size_t k = 0; k < others.size() && k < 3; ++k)
        out.push_back({axis.axis_name, others[k]->row, others[k]->verdict, others[k]->bytes});
    }
  } catch (const std::exception&) {
  }
  return out;
}

// Planted bug (embedding_grad_wrong_rank): each rank's contribution moved to the next rank along
// the mesh axis that shards `dim`: its first rows (as many as the next rank holds) land there.
Locals next_rank_along_shard(const Mesh& mesh, const Spec& spec, int64_t dim, Locals contrib) {
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (!spec[a].is_shard() || spec[a].dim != dim || mesh.axis_size(a) < 2) continue;
    Locals moved(contrib.size());
    for (int64_t r = 0; r < mesh.size(); ++r) {
      auto c = mesh.coords(r);
      c[a] = (c[a] + 1) % mesh.axis_size(a);
      const int64_t to = mesh.rank_of(c);
      const int64_t rows = std::min(contrib[r].size(dim), contrib[to].size(dim));
      moved[to] = at::zeros_like(contrib[to]);
      moved[to].narrow(dim, 0, rows).copy_(contrib[r].narrow(dim, 0, rows));
    }
    return moved;
  }
  return contrib;
}

}  // namespace

DTensor Runtime::apply_op(const std::string& op, const OpAttrs& attrs, const std::vector<DTensor>& args,
                          const std::string& out_name) {
  std::vector<Spec> given;
  std::vector<Shape> shapes;
  for (const auto& a : args) {
    if (a.spec.size() != static_cast<size_t>(mesh_.ndim()))
      throw SemanticError(ErrorKind::MeshMismatch, op + ": operand \"" + a.name + "\" is on another mesh");
    given.push_back(a.spec);
    shapes.push_back(a.shape);
  }
  if (observer_) {
    OpApplication app{op, attrs, {}, given, shapes, out_name};
    for (const auto& a : args) app.args.push_back(a.name);
    observer_(app);
  }
  ShardingDecision planted;
  const ShardingDecision& d = plant_rule_bugs(op, given, decide(op, attrs, given, shapes), planted);
  // Above autograd, an operand that does not fit the rule goes through a Redistribute node, whose
  // backward is Redistribute.backward. Below autograd (PyTorch today), the op's own node
  // redistributes the locals: autograd never sees it, and the op's backward sends its gradient
  // straight to the original operand (the hook moves it to that operand's cotangent).
  const bool below = recorder_.redistribute.value_or(options_.redistribute) == RedistributeMode::BelowAutograd;
  std::vector<DTensor> ready;
  std::vector<std::string> operand_why(args.size());  // the planner's reason where it moved an operand
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string name = out_name + ".arg" + std::to_string(i);
    if (d.in_specs[i] == args[i].spec) {
      ready.push_back(args[i]);
      continue;
    }
    // The planner's own move: its steps (and, above autograd, their backward) say why.
    std::string why;
    if (!recorder_.algorithm) {
      ImplicitMove m{recorder_.program_op, op, out_name, args[i].name, static_cast<int>(i), "forward",
                     args[i].spec, d.in_specs[i], d.rows, "", {}};
      if (result_detail_enabled())
        m.alternatives = alternatives_of(op, mesh_, given, shapes, attrs, args[i].spec, d.in_specs[i]);
      why = implicit_move(std::move(m));
    }
    operand_why[i] = why;
    ScopedOverride<std::string> implicit(recorder_.implicit, why);
    if (below) ready.push_back(redistribute_locals(args[i], d.in_specs[i], name));
    else ready.push_back(redistribute(args[i], d.in_specs[i], name));
  }
  const std::vector<DTensor>& sources = below ? args : ready;  // where gradients go
  const Spec out_spec = restore_reduced(op, mesh_, given, d.out_spec, options_.reduced_propagation);

  const bool track = at::GradMode::is_enabled();
  std::vector<bool> needs(ready.size());
  bool any = false;
  for (size_t i = 0; i < ready.size(); ++i) any |= (needs[i] = track && sources[i].requires_grad());

  const size_t R = static_cast<size_t>(mesh_.size());
  // Per rank, the operands as local leaves and the result with its local graph, for the VJP, kept
  // from the forward: a large op's always (running it again would cost what it cost, and its
  // graph is small beside its data), a small op's until the run keeps kKeptSmallGraphs of them.
  // Past that, a small op runs without autograd and its backward runs each rank's kernel again on
  // the same operands (deterministic kernels: the same result): a long program of small ops would
  // otherwise keep about 1.6 KB of graph per rank and op until its backward (#37 item 10).
  int64_t largest = 0;  // the most elements a rank's operands hold
  for (size_t r = 0; r < R; ++r) {
    int64_t n = 0;
    for (const auto& t : ready) n += t.locals[r].numel();
    largest = std::max(largest, n);
  }
  // An op whose VJP has a closed form (sim/vjps.h) keeps no graphs: its calls, its operands and,
  // where the VJP reads it, its result, and its backward writes each rank's gradient out.
  std::vector<Locals> operand_locals;
  for (const auto& t : ready) operand_locals.push_back(t.locals);
  const OpId id = op_id(op);
  bool closed = false;
  if (any) {  // the ranks' operands share their dtypes: rank 0's decide
    std::vector<at::Tensor> first_rank;
    for (const auto& l : operand_locals) first_rank.push_back(l.at(0));
    closed = has_closed_vjp(id, first_rank);
  }
  const bool small = largest <= kSmallOpElements;
  const bool keep = any && !closed && (!small || kept_small_graphs_ < kKeptSmallGraphs);
  if (keep && small) kept_small_graphs_ += static_cast<int64_t>(R);
  std::shared_ptr<const LocalGraphs> kept;
  std::shared_ptr<const ClosedForms> closed_form;
  Locals outs;
  {
    RankCalls calls = rank_calls(op, attrs, mesh_, d.in_specs, shapes, out_spec, d.out_shape, operand_locals);
    if (keep) {
      kept = std::make_shared<const LocalGraphs>(local_graphs(op, calls, operand_locals, needs));
      outs = detached(kept->results);
    } else {
      outs = local_results(op, calls, operand_locals);
    }
    if (closed) {
      ClosedForms c{id, std::move(calls), {}, {}};
      for (const auto& l : operand_locals) c.operands.push_back(detached(l));
      if (closed_vjp_reads_result(id)) c.results = detached(outs);
      closed_form = std::make_shared<const ClosedForms>(std::move(c));
    }
  }
  DTensor y{out_name, d.out_shape, out_spec, outs};

  if (any) {
    Runtime* rt = this;
    std::vector<Spec> in_specs, source_specs;
    const bool hookless = follows(Difference::NoGradientHook);
    std::vector<Locals> source_locals;  // shapes only (no cycle through the graph)
    std::vector<Shape> source_shapes;
    std::vector<std::string> names;
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < ready.size(); ++i) {
      in_specs.push_back(ready[i].spec);
      source_specs.push_back(sources[i].spec);
      if (hookless) {  // only the PyTorch profile's keep_grad_layout needs them
        source_locals.push_back(detached(sources[i].locals));
        source_shapes.push_back(sources[i].shape);
      }
      names.push_back(sources[i].name);
      inputs.insert(inputs.end(), sources[i].locals.begin(), sources[i].locals.end());
    }
    const LocalShapes like(y.locals);
    // A small op's operands as the kernel took them, for running it again, detached (sharing
    // storage): a node holding the operands themselves would own the node that made them, and
    // freeing a long program's graph would then recurse through every op.
    std::vector<Locals> operands;
    if (!kept && !closed)
      for (const auto& l : operand_locals) operands.push_back(detached(l));
    const Shape out_shape = d.out_shape;
    const size_t n_inputs = inputs.size();
    const int program_op = recorder_.program_op;
    const bool algorithm = recorder_.algorithm;
    auto backward = [=](variable_list&& g) -> variable_list {
      ScopedOverride<int> at(rt->recorder().program_op, program_op);
      ScopedOverride<std::string> explicit_(rt->recorder().implicit, "");
      return rt->guarded(n_inputs, [&] {
        Locals grads = like.defined(std::move(g));
        // A small op's graphs are made again.
        const LocalGraphs made =
            kept || closed_form
                ? LocalGraphs(0)
                : local_graphs(op, rank_calls(op, attrs, rt->mesh(), in_specs, shapes, out_spec, out_shape, operands),
                               operands, needs);
        const LocalGraphs& graphs = kept ? *kept : made;
        const GradSpec gin = rt->grad_spec(out_name, out_spec);
        variable_list result(n_inputs);
        // The operands whose incoming gradient needs no move share one VJP (one pass through each
        // rank's local graph instead of one per operand; one engine run for the ranks: rank_vjps).
        std::vector<BackwardDecision> decisions(in_specs.size());
        std::vector<size_t> shared;
        for (size_t i = 0; i < in_specs.size(); ++i) {
          if (!needs[i]) continue;
          decisions[i] = rt->backward_decision(op, in_specs, out_spec, shapes, attrs, gin.spec, i);
          if (decisions[i].grad_in == gin.spec) shared.push_back(i);
        }
        std::vector<Locals> ready_contrib(in_specs.size());
        // A local result no operand reaches (an empty vocab shard's zeros) contributes zeros.
        auto contributions = [&](const std::vector<size_t>& wrt, const Locals& g, std::vector<Locals>& into) {
          const auto vjps = closed_form ? closed_vjps(*closed_form, wrt, g) : rank_vjps(graphs, wrt, g);
          for (size_t k = 0; k < wrt.size(); ++k) {
            Locals& c = into[wrt[k]];
            c.resize(R);
            for (size_t r = 0; r < R; ++r)
              c[r] = vjps[r][k].defined() ? vjps[r][k] : at::zeros_like(graphs.leaves[r][wrt[k]]);
          }
        };
        if (shared.size() > 1) contributions(shared, grads, ready_contrib);
        for (size_t i = 0; i < in_specs.size(); ++i) {
          if (!needs[i]) continue;
          const BackwardDecision& bd = decisions[i];
          Locals gi = grads;
          if (bd.grad_in != gin.spec) {
            std::string why;
            if (!algorithm)
              why = rt->implicit_move({program_op, op, out_name, "", static_cast<int>(i), "backward", gin.spec,
                                       bd.grad_in, {}, "", {}});
            ScopedOverride<std::string> implicit(rt->recorder().implicit, why);
            gi = rt->run_plan(plan_redistribute(rt->mesh(), gin.spec, bd.grad_in,
                                                {rt->options().partial_from_replicate, true}),
                              gin.spec, gi, out_name, "backward of " + op + ": incoming gradient");
          }
          if (ready_contrib[i].empty()) contributions({i}, gi, ready_contrib);
          Locals contrib = std::move(ready_contrib[i]);
          if (mutant_on(Mutant::EmbeddingGradWrongRank) && op == "embedding" && i == 1)
            contrib = next_rank_along_shard(rt->mesh(), in_specs[1], 0, std::move(contrib));
          Event e = rt->make_event("grad", op, names[i], contrib);
          e.args = {out_name};
          e.in_specs = {spec_str(bd.grad_in)};
          e.out_spec = spec_str(bd.grad_out);
          rt->recorder().add(std::move(e));
          // The gradient of an operand the planner moved goes to the moved layout's cotangent (above
          // autograd) or to the operand's (below): the move's cost, implicit for the same reason.
          ScopedOverride<std::string> implicit(rt->recorder().implicit, operand_why[i]);
          if (below && mutant_on(Mutant::BelowAutogradSkipsBackward)) {
            // Planted bug: the contribution keeps its layout but is labelled the cotangent.
            rt->record_grad_spec(names[i], {cotangent_spec(source_specs[i]), cotangent_scale_divisor(rt->mesh(), source_specs[i])});
            for (size_t r = 0; r < R; ++r) result[i * R + r] = contrib[r];
            continue;
          }
          if (rt->follows(Difference::NoGradientHook)) {  // PyTorch: the contribution keeps its placements
            contrib = rt->keep_grad_layout(std::move(contrib), {bd.grad_out, gin.divisor}, names[i], source_specs[i],
                                           source_shapes[i], source_locals[i],
                                           "grad of " + names[i] + ": to the operand's local shapes");
            for (size_t r = 0; r < R; ++r) result[i * R + r] = contrib[r];
            continue;
          }
          contrib = rt->to_cotangent(std::move(contrib), {bd.grad_out, gin.divisor}, source_specs[i], names[i],
                                     names[i], "grad hook: " + spec_str(bd.grad_out) + " -> cotangent of " +
                                         spec_str(source_specs[i]));
          for (size_t r = 0; r < R; ++r) result[i * R + r] = contrib[r];
        }
        return result;
      }, out_name);
    };
    // The node's name says where it comes from in libtorch's own messages ("Function ... returned an
    // invalid gradient").
    connect("DTensor::" + op + " \"" + out_name + "\"" +
                (program_op >= 0 ? " at /program/" + std::to_string(program_op) : std::string()),
            inputs, y.locals, backward);
  }

  Event e = make_event("op", op, out_name, y.locals);
  for (const auto& t : ready) {
    e.args.push_back(t.name);
    e.in_specs.push_back(spec_str(t.spec));
  }
  e.out_spec = spec_str(out_spec);
  for (const auto& row : d.rows) e.note += (e.note.empty() ? "" : "; ") + row;
  recorder_.add(std::move(e));
  return y;
}

std::vector<Locals> Runtime::backward(const DTensor& loss, const std::vector<DTensor>& inputs,
                                      const std::vector<DTensor>& watched, std::vector<Locals>* watched_grads) {
  phase_ = "backward";
  const GradSpec seed{cotangent_spec(loss.spec), cotangent_scale_divisor(mesh_, loss.spec)};
  at::Tensor ones = at::ones(loss.shape, loss.locals.at(0).options());
  Spec seed_layout = seed.spec;
  if (mutant_on(Mutant::PartialSeedOnEveryRank))  // planted bug: ones on every rank of a Partial
    for (auto& p : seed_layout)
      if (p.is_partial()) p = Placement::replicate();
  Locals seeds = distribute(mesh_, seed_layout, ones / static_cast<double>(seed.divisor), nullptr);
  record_grad_spec(loss.name, seed);
  Event e = make_event("seed", "ones", loss.name, seeds);
  e.out_spec = spec_str(seed.spec);
  recorder_.add(std::move(e));

  std::vector<at::Tensor> leaves;
  for (const auto& in : inputs) leaves.insert(leaves.end(), in.locals.begin(), in.locals.end());
  const size_t n_leaves = leaves.size();
  if (watched_grads)
    for (const auto& w : watched) leaves.insert(leaves.end(), w.locals.begin(), w.locals.end());
  std::vector<Locals> grads(inputs.size());
  variable_list flat(leaves.size());
  if (loss.requires_grad() && !leaves.empty())
    flat = torch::autograd::grad(loss.locals, leaves, seeds, /*retain_graph=*/watched_grads != nullptr,
                                 /*create_graph=*/false, /*allow_unused=*/true);
  if (pending_error_) throw *pending_error_;
  if (watched_grads) {
    watched_grads->assign(watched.size(), {});
    size_t k = n_leaves;
    for (size_t i = 0; i < watched.size(); ++i)
      for (size_t r = 0; r < watched[i].locals.size(); ++r, ++k) (*watched_grads)[i].push_back(flat[k]);
  }
  size_t k = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (size_t r = 0; r < inputs[i].locals.size(); ++r, ++k)
      grads[i].push_back(flat[k].defined() ? flat[k] : at::zeros_like(inputs[i].locals[r]));
    Event g = make_event("input_grad", "grad", inputs[i].name, grads[i]);
    if (auto gs = input_grad_spec(inputs[i].name, inputs[i].spec)) {
      g.out_spec = spec_str(gs->spec);
      g.note = "cotangent " + spec_str(cotangent_spec(inputs[i].spec));
    } else {
      g.out_spec = "none";
      g.note = "no gradient reached it (" + spec_str(inputs[i].spec) + " has no cotangent)";
    }
    recorder_.add(std::move(g));
  }
  return grads;
}

DTensor Runtime::alias(const DTensor& x) {
  if (!x.requires_grad() || !at::GradMode::is_enabled()) return x;
  DTensor out = x;
  out.locals = detached(x.locals);
  const LocalShapes like(out.locals);
  connect("Alias \"" + x.name + "\"", x.locals, out.locals,
          [like](variable_list&& g) -> variable_list { return like.defined(std::move(g)); });
  return out;
}

Locals Runtime::contribution(const std::vector<DTensor>& outs, const std::vector<Locals>& grads, const DTensor& of) {
  ScopedOverride<bool> mute(recorder_.muted, true);
  std::vector<at::Tensor> ys, gs;
  for (size_t i = 0; i < outs.size(); ++i)
    for (size_t r = 0; r < outs[i].locals.size(); ++r) {
      if (!outs[i].locals[r].requires_grad() || r >= grads[i].size() || !grads[i][r].defined()) continue;
      ys.push_back(outs[i].locals[r]);
      gs.push_back(grads[i][r]);
    }
  Locals out(of.locals.size());
  if (ys.empty() || !of.requires_grad()) return out;
  const auto saved_problems = tracking_problems_.size();
  out = torch::autograd::grad(ys, of.locals, gs, /*retain_graph=*/true, /*create_graph=*/false, /*allow_unused=*/true);
  tracking_problems_.resize(saved_problems);
  if (pending_error_) throw *pending_error_;
  return out;
}

}  // namespace meshsim

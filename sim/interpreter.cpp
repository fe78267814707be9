#include "sim/interpreter.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string_view>

#include <ATen/core/grad_mode.h>

#include "core/error.h"
#include "core/ops.h"
#include "core/mutants.h"
#include "core/scoped.h"
#include "sim/data.h"
#include "sim/local_map.h"
#include "sim/local_ops.h"

namespace meshsim {

namespace {

// libtorch refused an op of the user's local code (a local_map body, or code between to_local and
// from_local): the op's place and libtorch's first line, without its backtrace.
struct LocalCodeRefused : std::runtime_error {
  LocalCodeRefused(const std::string& at, const std::string& op, const c10::Error& e)
      : std::runtime_error(at + ": " + op + ": libtorch cannot run it: " + first_line(e.what_without_backtrace())),
        path(at) {}
  std::string path;
};

}  // namespace

std::vector<DTensor> make_inputs(const Scenario& sc, const RunOptions& options,
                                 std::map<std::string, at::Tensor>& globals,
                                 const std::map<std::string, Locals>* given) {
  std::vector<DTensor> out;
  for (size_t i = 0; i < sc.inputs.size(); ++i) {
    const InputDecl& in = sc.inputs[i];
    Rng rng(options.seed, i);
    DTensor t{in.name, in.shape, in.placements, {}};
    auto g = given ? given->find(in.name) : std::map<std::string, Locals>::const_iterator();
    if (given && g != given->end()) {
      t.locals = g->second;
      std::string disagree;  // replicas that disagree: the comparison of the locals names them
      globals[in.name] = assemble(sc.mesh, in.placements, t.locals, &disagree);
    } else if (in.from_local) {
      at::Tensor local = make_input(in, options.dtype, rng);
      t.locals.assign(static_cast<size_t>(sc.mesh.size()), local);
      at::Tensor global = assemble(sc.mesh, in.placements, t.locals);
      t.shape = global.sizes().vec();
      globals[in.name] = global;
    } else {
      at::Tensor global = make_input(in, options.dtype, rng);
      t.locals = distribute(sc.mesh, in.placements, global, &rng);
      globals[in.name] = global;
    }
    for (auto& l : t.locals) l = l.detach().requires_grad_(in.requires_grad);
    out.push_back(std::move(t));
  }
  return out;
}

// check_variance false: plain local code (the default under semantics pytorch, whose local_map
// tracks nothing).
static bool tracked_local_map(const Runtime& rt, const OpDecl& op) {
  return op.attrs.value("check_variance", !rt.follows(Difference::LocalMapUntracked));
}

std::vector<DTensor> run_local_map(Runtime& rt, const OpDecl& op, const std::vector<DTensor>& args,
                                   std::map<std::string, LTensor>* body) {
  BodyContext ctx(rt, tracked_local_map(rt, op));
  if (!op.in_grad_placements.empty() && tracked_local_map(rt, op))
    throw SemanticError(ErrorKind::InvalidScenario,
                        op.path + "/in_grad_placements: a tracked body (check_variance true) gives its arguments' "
                                  "gradients the layout its variance sets say; in_grad_placements is for plain local "
                                  "code (\"check_variance\": false), as PyTorch's local_map");
  std::map<std::string, LTensor> env;
  for (size_t i = 0; i < args.size(); ++i) {
    const DTensor& a = args[i];
    // A negative dim counts from the end of the arg's dims (the runtime reports one out of range).
    Spec want = op.in_placements.empty() ? a.spec : op.in_placements[i];
    if (!op.in_placements.empty()) {
      try {
        want = normalize_spec(want, static_cast<int64_t>(a.shape.size()));
      } catch (const std::invalid_argument&) {
      }
    }
    const bool move = want != a.spec;
    const Spec* grad = op.in_grad_placements.empty() ? nullptr : &op.in_grad_placements[i];
    env[op.args[i]] = ctx.enter(move ? rt.redistribute(a, want, op.out + ".in" + std::to_string(i)) : a, "", grad);
  }
  for (const auto& b : op.body) {
    if (is_split_op(b.op)) {  // one narrow per piece (body values are rank-local: the local shape)
      const LTensor& x = env.at(b.args.at(0));
      const auto pieces = split_as_narrows(b, x.locals.at(0).sizes().vec());
      for (size_t k = 0; k < pieces.size(); ++k)
        env[b.outs[k]] = ctx.op("narrow", {{"dim", *pieces[k].dim}, {"start", pieces[k].start}, {"length", pieces[k].length}},
                                {x}, b.outs[k]);
      continue;
    }
    try {
      std::vector<LTensor> ys = ctx.run_all(b, env);
      const std::vector<std::string> names = result_names(b);
      for (size_t k = 0; k < ys.size(); ++k) env[names.at(k)] = std::move(ys[k]);
    } catch (const SemanticError& e) {
      // An unreduced value's misuse is the body op's: its path leads the message (and is the error's).
      if (e.kind() != ErrorKind::UnreducedMisuse || std::string(e.what()).rfind(b.path, 0) == 0) throw;
      throw SemanticError(e.kind(), b.path + ": " + e.what());
    } catch (const c10::Error& e) {
      throw LocalCodeRefused(b.path, b.op, e);
    }
  }
  std::vector<DTensor> outs;
  for (size_t k = 0; k < op.returns.size(); ++k) outs.push_back(ctx.leave(env.at(op.returns[k]), op.out_placements[k], op.outs[k]));
  if (body) *body = env;
  return outs;
}

namespace {

// A binary op's scalar `value` as an operand: a 0-d tensor replicated on every axis (no gradient).
// A comparison's fractional value against int64 or bool data stays float64 (the comparison
// promotes, as PyTorch's: eq(ids, 0.5) is all false), as kernels.cpp's compared().
DTensor scalar_operand(Runtime& rt, double value, const at::Tensor& like, const std::string& name, bool comparison) {
  const Mesh& mesh = rt.mesh();
  const bool promoted = comparison && !at::isFloatingType(like.scalar_type()) && value != std::trunc(value);
  at::Tensor v = at::scalar_tensor(value, like.options().dtype(promoted ? at::kDouble : like.scalar_type()).requires_grad(false));
  return DTensor{name, {}, Spec(static_cast<size_t>(mesh.ndim()), Placement::replicate()),
                 Locals(static_cast<size_t>(mesh.size()), v)};
}

ElementType element_type(const at::Tensor& t) {
  if (t.scalar_type() == at::kBool) return ElementType::Bool;
  if (t.scalar_type() == at::kLong) return ElementType::Int64;
  return ElementType::Float;
}

// The element type an operand slot needs (nothing: the op's data type, float unless the op moves
// any data).
std::optional<ElementType> slot_type(const std::string& op, size_t i) {
  const auto& operands = op_schema(op).operands;  // the op catalog's (core/ops.h)
  const OperandType t = operands.empty() ? OperandType::Float : operands[std::min(i, operands.size() - 1)].type;
  if (t == OperandType::Int64) return ElementType::Int64;
  if (t == OperandType::Bool) return ElementType::Bool;
  if (t == OperandType::Any || t == OperandType::Number) return std::nullopt;
  return ElementType::Float;
}

// A slot of integer arithmetic's (add, sub, mul): float or int64, not bool.
bool number_slot(const std::string& op, size_t i) {
  const auto& operands = op_schema(op).operands;
  return !operands.empty() && operands[std::min(i, operands.size() - 1)].type == OperandType::Number;
}

// Every operand of the element type its slot needs; the data operands of a moving op (cat, where)
// of one type.
void check_operand_types(const OpDecl& op, const std::vector<DTensor>& args) {
  std::optional<ElementType> data;
  for (size_t i = 0; i < args.size(); ++i) {
    const ElementType got = element_type(args[i].locals.at(0));
    auto fail = [&](const std::string& want) {
      throw SemanticError(ErrorKind::InvalidScenario, op.path + "/args/" + std::to_string(i) + ": " + op.op + ": \"" +
                                                         op.args[i] + "\" is " + element_type_name(got) + ", " + want);
    };
    if (const auto want = slot_type(op.op, i)) {
      if (got != *want) fail(std::string("expected ") + element_type_name(*want));
    } else if (got == ElementType::Bool && number_slot(op.op, i)) {
      fail("expected float or int64");
    } else if (data && got != *data) {
      fail(std::string("the other data operands are ") + element_type_name(*data));
    } else {
      data = got;
    }
  }
}

// Ids (or targets) in [0, high), or ignore_index: a libtorch lookup out of range is an error of the
// scenario, named with the value, where it sits on which rank, and the range.
void check_ids(const OpDecl& op, size_t slot, const DTensor& ids, int64_t high, std::optional<int64_t> ignore,
               const std::string& why = "") {
  std::pair<const void*, int64_t> checked{nullptr, 0};  // replicated ids share one local: checked once
  for (size_t r = 0; r < ids.locals.size(); ++r) {
    at::Tensor t = ids.locals[r];
    int64_t lo = 0, hi = -1;
    if (t.scalar_type() == at::kLong && t.is_contiguous()) {  // one pass over the data, no libtorch calls
      if (t.numel() == 0 || checked == std::pair<const void*, int64_t>{t.data_ptr(), t.numel()}) continue;
      checked = {t.data_ptr(), t.numel()};
      const int64_t* v = t.data_ptr<int64_t>();
      bool any = false;
      for (int64_t i = 0, n = t.numel(); i < n; ++i) {
        if (ignore && v[i] == *ignore) continue;
        lo = any ? std::min(lo, v[i]) : v[i];
        hi = any ? std::max(hi, v[i]) : v[i];
        any = true;
      }
      if (!any) continue;
    } else {
      if (ignore) t = t.masked_select(t.ne(*ignore));
      if (t.numel() == 0) continue;
      lo = t.min().item<int64_t>();
      hi = t.max().item<int64_t>();
    }
    if (lo >= 0 && hi < high) continue;
    throw SemanticError(ErrorKind::InvalidScenario,
                        op.path + "/args/" + std::to_string(slot) + ": " + op.op + ": \"" + op.args[slot] + "\" holds " +
                            std::to_string(lo < 0 ? lo : hi) + " on rank " + std::to_string(r) + ", outside [0, " +
                            std::to_string(high) + ")" + (ignore ? " and not ignore_index " + std::to_string(*ignore) : "") +
                            why);
  }
}

// floor_divide's and remainder's divisor (the second operand, or the scalar value) without a zero:
// libtorch's integer division by zero is an error; named with where it sits, on which rank.
void check_divisor(const OpDecl& op, const OpAttrs& attrs, const std::vector<DTensor>& args) {
  if (attrs.scalar && args.size() == 1) {
    if (attrs.value == 0) throw SemanticError(ErrorKind::InvalidScenario, op.path + "/value: " + op.op + ": divides by zero");
    return;
  }
  const DTensor& y = args.at(1);
  for (size_t r = 0; r < y.locals.size(); ++r) {
    const at::Tensor zeros = y.locals[r].eq(0).nonzero();
    if (zeros.size(0) == 0) continue;
    std::string at_index;
    for (int64_t d = 0; d < zeros.size(1); ++d)
      at_index += (d ? ", " : "") + std::to_string(zeros[0][d].item<int64_t>());
    throw SemanticError(ErrorKind::InvalidScenario, op.path + "/args/1: " + op.op + ": \"" + op.args[1] +
                                                        "\" holds 0 at local [" + at_index + "] on rank " +
                                                        std::to_string(r) + ": integer division by zero");
  }
}

// A creation op: the global value laid out by its placements (no operand, no gradient).
DTensor create(Runtime& rt, const OpDecl& op) {
  const Mesh& mesh = rt.mesh();
  const Shape shape = op.attrs.at("shape").get<Shape>();
  Spec spec;
  for (const auto& p : op.attrs.at("placements")) spec.push_back(parse_placement(p.get<std::string>()));
  spec = normalize_spec(spec, static_cast<int64_t>(shape.size()));
  if (std::string why = check_strided(mesh, spec, shape); !why.empty())
    throw SemanticError(ErrorKind::ShapeMismatch, op.path + "/placements: " + why);
  // rand, randn: each rank draws its local at its global indices (DTensor's offset-based RNG).
  const bool drawn = op_schema(op.op).gen == GenClass::RandomCreation;
  DTensor t{op.out, shape, spec,
            drawn ? drawn_locals(op, mesh, spec, rt.options().seed, rt.options().dtype)
                  : distribute(mesh, spec, created_value(op, rt.options().dtype), nullptr)};
  Event e = rt.make_event("op", op.op, op.out, t.locals);
  e.out_spec = spec_str(spec);
  rt.recorder().add(std::move(e));
  return t;
}

OpAttrs over(int64_t dim, bool keepdim) {
  OpAttrs a;
  a.dim = dim;
  a.keepdim = keepdim;
  return a;
}

// log_softmax over a dim that a mesh axis shards: loss parallel, as PyTorch's loss_parallel
// computes it. The max of the logits is all_reduced (P(max) -> R, outside autograd: the shift
// cancels in the result), the sum of the exponentials is all_reduced (P(sum) -> R before the log),
// and the result keeps the class shard.
DTensor loss_parallel_log_softmax(Runtime& rt, const DTensor& x, int64_t dim, const std::string& out) {
  // Its all_reduces are the algorithm's own (PyTorch's loss_parallel writes them), not the planner's.
  ScopedOverride<bool> algorithm(rt.recorder().algorithm, true);
  DTensor m;
  {
    at::NoGradGuard no_grad;
    m = rt.apply_op("amax", over(dim, true), {x}, out + ".max");
  }
  if (mutant_on(Mutant::LossParallelLocalMax))  // planted bug: each rank keeps its own max
    for (auto& p : m.spec)
      if (p.is_partial()) p = Placement::replicate();
  const DTensor shifted = rt.apply_op("sub", {}, {x, m}, out + ".shifted");
  const DTensor e = rt.apply_op("exp", {}, {shifted}, out + ".exp");
  const DTensor s = rt.apply_op("sum", over(dim, true), {e}, out + ".sumexp");
  const DTensor l = rt.apply_op("log", {}, {s}, out + ".logsumexp");
  return rt.apply_op("sub", {}, {shifted, l}, out);
}

DTensor log_softmax(Runtime& rt, const DTensor& x, int64_t dim, const std::string& out) {
  const auto rank = static_cast<int64_t>(x.shape.size());
  if (dim < -rank || dim >= rank)
    throw SemanticError(ErrorKind::ShapeMismatch, "log_softmax: dim " + std::to_string(dim) + " out of range for " + shape_str(x.shape));
  const int64_t d = dim < 0 ? dim + rank : dim;
  // PyTorch outside loss_parallel(): the softmax rows gather the class dim.
  if (shards_dim(x.spec, d) && !rt.follows(Difference::LossParallelOnlyInContext))
    return loss_parallel_log_softmax(rt, x, d, out);
  return rt.apply_op("log_softmax", over(d, false), {x}, out);
}

// nll_loss(log_probs [N, C], target [N], weight [C]?): the target pick (pick_target: a batch shard
// stays, a class shard is the masked pick, P(sum)), then the sum, or the mean over the targets not
// ignored. The mean is exact over uneven shards: without ignore_index, mean's global count; with
// it, the sum over the count of targets kept, itself summed over the ranks. A class weight is the
// same pick from the weights laid along every row's classes (w[target], 0 where ignored); the rows
// are multiplied by it, and the mean divides by its sum (torch's weighted mean). cross_entropy's
// label smoothing adds, per kept row, -eps / C times the sum of its (weighted) log-probabilities,
// the pick's part scaled by 1 - eps (torch's cross_entropy_loss_label_smoothing). reduction none
// returns the rows.
DTensor nll_loss(Runtime& rt, const OpDecl& op, const OpAttrs& a, const DTensor& logp, const DTensor& target,
                 const DTensor* weight, const std::string& out) {
  if (logp.shape.size() != 2 || target.shape.size() != 1 || target.shape[0] != logp.shape[0])
    throw SemanticError(ErrorKind::ShapeMismatch, op.path + ": " + op.op + " needs [N, C] scores and a target [N], got " +
                                                      shape_str(logp.shape) + " and " + shape_str(target.shape));
  if (weight && (weight->shape.size() != 1 || weight->shape[0] != logp.shape[1]))
    throw SemanticError(ErrorKind::ShapeMismatch, op.path + ": " + op.op + " takes a class weight [C] = [" +
                                                      std::to_string(logp.shape[1]) + "], got " + shape_str(weight->shape));
  if (weight && weight->requires_grad())
    throw SemanticError(ErrorKind::NotDifferentiable,
                        op.path + "/args/2: " + op.op + "'s class weight \"" + op.args.at(2) +
                            "\" requires grad: a loss is not differentiable in its weight (torch: \"the derivative "
                            "for 'weight' is not implemented\"); give the weight without requires_grad");
  check_ids(op, 1, target, logp.shape[1], a.ignore_index);
  const bool weighted = weight != nullptr, smooth = a.label_smoothing > 0, none = a.no_reduction;
  // With reduction none the last per-row value is the result itself.
  auto row_name = [&](const char* suffix, bool last) { return none && last ? out : out + suffix; };
  OpAttrs pick;
  pick.ignore_index = a.ignore_index;
  OpAttrs keep;
  keep.ignore_index = a.ignore_index;
  keep.float32 = rt.options().dtype == DType::Float32;
  DTensor row = rt.apply_op("pick_target", pick, {logp, target}, row_name(".pick", !weighted && !smooth));
  std::optional<DTensor> picked_weight;
  if (weighted) {
    OpAttrs first;
    first.dim = 0;
    OpAttrs rows;
    rows.shape = {logp.shape[0], logp.shape[1]};
    const DTensor neg = rt.apply_op("neg", {}, {*weight}, out + ".weight_neg");
    const DTensor line = rt.apply_op("unsqueeze", first, {neg}, out + ".weight_row");
    const DTensor every = rt.apply_op("expand", rows, {line}, out + ".weight_rows");
    picked_weight = rt.apply_op("pick_target", pick, {every, target}, out + ".weight_pick");
    row = rt.apply_op("mul", {}, {row, *picked_weight}, row_name(".weighted", !smooth));
  }
  if (smooth) {
    const double eps = a.label_smoothing, classes = static_cast<double>(logp.shape[1]);
    const DTensor terms = weighted ? rt.apply_op("mul", {}, {logp, *weight}, out + ".smooth_terms") : logp;
    DTensor smoothed = rt.apply_op("sum", over(1, false), {terms}, out + ".smooth_sum");
    if (a.ignore_index) {
      const DTensor kept = rt.apply_op("count_targets", keep, {target}, out + ".smooth_kept");
      smoothed = rt.apply_op("mul", {}, {smoothed, kept}, out + ".smooth_masked");
    }
    OpAttrs nll_part, smooth_part;
    nll_part.value = 1.0 - eps;
    smooth_part.value = -eps / classes;
    const DTensor a_part = rt.apply_op("scale", nll_part, {row}, out + ".nll_part");
    const DTensor b_part = rt.apply_op("scale", smooth_part, {smoothed}, out + ".smooth_part");
    row = rt.apply_op("add", {}, {a_part, b_part}, row_name(".rows", true));
  }
  if (none) return row;
  if (a.sum_reduction) return rt.apply_op("sum", {}, {row}, out);
  if (!a.ignore_index && !weighted) return rt.apply_op("mean", {}, {row}, out);
  const DTensor total = rt.apply_op("sum", {}, {row}, out + ".total");
  if (weighted) {
    const DTensor weights = rt.apply_op("sum", {}, {*picked_weight}, out + ".weight_total");
    return rt.apply_op("div", {}, {total, weights}, out);
  }
  const DTensor kept = rt.apply_op("count_targets", keep, {target}, out + ".kept");
  const DTensor count = rt.apply_op("sum", {}, {kept}, out + ".count");
  return rt.apply_op("div", {}, {total, count}, out);
}

}  // namespace

// One DTensor op of the program. A binary op with a `value` takes it as a replicated 0-d operand;
// linear runs as transpose, matmul and add (PyTorch decomposes aten.linear likewise), each with
// its own rule row and event ("y.weight_t", "y.matmul").
// A program op's `redistribute_mode`: where the planner moves its operands (unset: the run's).
std::optional<RedistributeMode> op_redistribute_mode(const OpDecl& op) {
  if (!op.attrs.is_object() || !op.attrs.contains("redistribute_mode")) return std::nullopt;
  return op.attrs["redistribute_mode"] == "below_autograd" ? RedistributeMode::BelowAutograd
                                                          : RedistributeMode::AboveAutograd;
}

DTensor apply_program_op(Runtime& rt, const OpDecl& op, const std::vector<DTensor>& args) {
  if (is_creation_op(op.op)) return create(rt, op);
  check_operand_types(op, args);
  // A bool or int64 result (comparisons, indices), and detach's and item's, has no gradient: no
  // autograd node for it.
  std::optional<at::NoGradGuard> no_grad;
  if (op_schema(op.op).result != OperandType::Any || !op_schema(op.op).differentiable) no_grad.emplace();
  OpAttrs attrs = op_attrs(op);
  attrs.local_mean = op.op == "mean" && rt.follows(Difference::MeanPartialAvg);
  if (op.op == "embedding") {
    if (args.at(1).shape.size() != 2)
      throw SemanticError(ErrorKind::ShapeMismatch, op.path + ": embedding: the weight must be 2-D [vocab, dim], got " +
                                                        shape_str(args[1].shape));
    check_ids(op, 0, args[0], args[1].shape[0], std::nullopt);
  }
  if ((op.op == "gather" || op.op == "index_select" || op.op == "scatter" || op.op == "scatter_add" ||
       op.op == "index_add") &&
      attrs.dim) {  // the index within dim's extent
    const auto rank = static_cast<int64_t>(args.at(0).shape.size());
    const int64_t d = *attrs.dim < 0 ? *attrs.dim + rank : *attrs.dim;
    if (d >= 0 && d < rank) check_ids(op, 1, args.at(1), args[0].shape[static_cast<size_t>(d)], std::nullopt);
  }
  if (attrs.scalar && args.size() == 1 && args[0].locals.at(0).scalar_type() == at::kLong &&
      attrs.value != std::trunc(attrs.value) && std::string_view(op_schema(op.op).family) != "compare")
    throw SemanticError(ErrorKind::InvalidScenario,
                        op.path + "/value: " + op.op + ": " + nlohmann::json(attrs.value).dump() + " against the int64 \"" +
                            op.args[0] + "\": integer arithmetic takes a whole value (PyTorch would promote to float)");
  if (op.op == "floor_divide" || op.op == "remainder") check_divisor(op, attrs, args);
  if (op.op == "one_hot") check_ids(op, 0, args.at(0), attrs.num_classes, std::nullopt, " (num_classes)");
  if (op.op == "bincount")
    check_ids(op, 0, args.at(0), attrs.minlength, std::nullopt,
              " (minlength): the counts' length would follow the data, each rank's own max on a shard");
  if (op.op == "clamp" && args.at(0).locals.at(0).scalar_type() == at::kLong)
    for (const auto& [key, bound] : {std::pair{"min", attrs.clamp_min}, std::pair{"max", attrs.clamp_max}})
      if (bound && *bound != std::trunc(*bound))
        throw SemanticError(ErrorKind::InvalidScenario,
                            op.path + "/" + key + ": clamp: " + nlohmann::json(*bound).dump() + " against the int64 \"" +
                                op.args[0] + "\": an integer clamp takes whole bounds (PyTorch would promote to float)");
  if (op.op == "scaled_dot_product_attention" && args.size() > 3 && element_type(args[3].locals.at(0)) == ElementType::Int64)
    throw SemanticError(ErrorKind::InvalidScenario, op.path + "/args/3: " + op.op + ": \"" + op.args[3] +
                                                        "\" is int64, expected bool or float (attn_mask)");
  if (std::string_view(op_schema(op.op).family) == "random") {
    if (op.attrs.contains("generator"))
      throw SemanticError(ErrorKind::InvalidScenario,
                          op.path + "/generator: " + op.op + " of the DTensor \"" + op.args.at(0) +
                              "\" draws the global tensor's values at its shards' global indices (DTensor's RNG "
                              "tracker); a generator is local code's (a local_map body, or between to_local and "
                              "from_local)");
    attrs.draw.seed = rt.options().seed;
  }
  if (op.op == "log_softmax") return log_softmax(rt, args.at(0), attrs.dim.value_or(-1), op.out);
  const DTensor* class_weight = args.size() > 2 ? &args[2] : nullptr;
  if (op.op == "nll_loss") return nll_loss(rt, op, attrs, args.at(0), args.at(1), class_weight, op.out);
  if (op.op == "cross_entropy") {
    if (args.at(0).shape.size() != 2)
      throw SemanticError(ErrorKind::ShapeMismatch, op.path + ": cross_entropy needs [N, C] scores, got " + shape_str(args[0].shape));
    return nll_loss(rt, op, attrs, log_softmax(rt, args[0], 1, op.out + ".log_softmax"), args[1], class_weight, op.out);
  }
  if (attrs.scalar && args.size() == 1) {
    attrs.scalar = false;
    return rt.apply_op(op.op, attrs, {args[0], scalar_operand(rt, attrs.value, args[0].locals.at(0), op.out + ".value",
                                                            std::string_view(op_schema(op.op).family) == "compare")},
                       op.out);
  }
  if (op.op == "linear") {
    OpAttrs t;
    t.dim0 = 0;
    t.dim1 = 1;
    if (args.at(1).shape.size() != 2)
      throw SemanticError(ErrorKind::ShapeMismatch, "linear: the weight must be 2-D, got " + shape_str(args[1].shape));
    const DTensor wt = rt.apply_op("transpose", t, {args[1]}, op.out + ".weight_t");
    if (args.size() == 2) return rt.apply_op("matmul", {}, {args[0], wt}, op.out);
    const DTensor y = rt.apply_op("matmul", {}, {args[0], wt}, op.out + ".matmul");
    return rt.apply_op("add", {}, {y, args[2]}, op.out);
  }
  return rt.apply_op(op.op, attrs, args, op.out);
}

namespace {

// A collective of local code (the catalog's local_code ops but `call`).
bool is_body_collective(const std::string& op) {
  const OpSchema* s = find_op(op);
  return s && s->local_code && op != "call";
}

// from_local {run_check: true}: every replica of an R (or Rd) axis must hold its group's
// coordinate-0 local; the ranks that do not are named with the greatest difference.
void check_replicas(Runtime& rt, const OpDecl& op, const DTensor& y) {
  const Mesh& mesh = rt.mesh();
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (!y.spec[a].is_replicate()) continue;
    std::string ranks;
    double worst = 0.0;
    for (const auto& group : mesh.groups(a))
      for (size_t k = 1; k < group.size(); ++k) {
        const at::Tensor& first = y.locals[group[0]];
        const at::Tensor& mine = y.locals[group[k]];
        const bool same = mine.sizes() == first.sizes() && at::equal(mine, first);
        if (same) continue;
        ranks += (ranks.empty() ? "" : ", ") + std::to_string(group[k]);
        if (mine.sizes() == first.sizes() && mine.numel() > 0)
          worst = std::max(worst, (mine.to(at::kDouble) - first.to(at::kDouble)).abs().max().item<double>());
      }
    if (!ranks.empty()) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.6g", worst);
      rt.flag_check_failure("from_local", op.path + ": from_local \"" + op.out + "\" asserts " + spec_str(y.spec) +
                                              ", but over mesh axis " + mesh.axes()[a] + " ranks " + ranks +
                                              " hold other locals than their group's first rank (greatest difference " +
                                              buf + ")");
    }
  }
}

}  // namespace

bool run_local_code(BodyContext& ctx, const OpDecl& op, SimRun& run, std::map<std::string, LTensor>& locals) {
  // zeros, ones, full, arange without placements: a plain tensor of local code, alike on every rank.
  if (is_creation_op(op.op) && !op.attrs.contains("placements")) {
    if (locals.empty())
      throw SemanticError(ErrorKind::InvalidScenario,
                          op.path + "/placements: " + op.op + " without placements makes a local tensor of local code "
                                    "(after to_local); a DTensor program's " + op.op + " names its placements");
    LTensor t = ctx.created(op);
    locals[op.out] = std::move(t);
    return true;
  }
  bool any_local = false, any_dtensor = false;
  for (const auto& a : op.args) (locals.count(a) ? any_local : any_dtensor) = true;
  if (op.op == "to_local") {
    if (any_local)
      throw SemanticError(ErrorKind::InvalidScenario, op.path + "/args/0: to_local: \"" + op.args[0] + "\" is a local tensor already");
    LTensor t = ctx.enter(run.values.at(op.args[0]), op.out,
                          op.in_grad_placements.empty() ? nullptr : &op.in_grad_placements[0]);
    ctx.runtime().record_body_value(t);
    locals[op.out] = std::move(t);
    return true;
  }
  if (!any_local) {
    if (is_body_collective(op.op) || op.op == "from_local")
      throw SemanticError(ErrorKind::InvalidScenario, op.path + ": " + op.op + " takes a local tensor (to_local gives one), \"" +
                                                         op.args.at(0) + "\" is a DTensor");
    return false;
  }
  if (any_dtensor)
    for (size_t i = 0; i < op.args.size(); ++i)
      if (!locals.count(op.args[i]))
        throw SemanticError(ErrorKind::InvalidScenario,
                            op.path + "/args/" + std::to_string(i) + ": " + op.op + " mixes the DTensor \"" + op.args[i] +
                                "\" with local tensors (PyTorch refuses it too): from_local or to_local first");
  if (op.op == "from_local") {
    Spec spec;
    for (const auto& p : op.attrs.at("placements")) spec.push_back(parse_placement(p.get<std::string>()));
    DTensor y = ctx.leave(locals.at(op.args[0]), spec, op.out);
    if (op.attrs.value("run_check", false)) check_replicas(ctx.runtime(), op, y);
    run.named.push_back(op.out);
    // localize always: a value of its own (it may be to_local's operand's very tensors).
    if (ctx.runtime().options().localize == Localize::Always) y = ctx.runtime().alias(y);
    run.values[op.out] = std::move(y);
    return true;
  }
  if (is_split_op(op.op) || op.op == "local_map" || is_creation_op(op.op))
    throw SemanticError(ErrorKind::InvalidScenario, op.path + ": " + op.op + " is not supported on local tensors");
  std::vector<LTensor> ys = ctx.run_all(op, locals);
  const std::vector<std::string> names = result_names(op);
  for (size_t k = 0; k < ys.size(); ++k) locals[names.at(k)] = std::move(ys[k]);
  return true;
}

namespace {
ProgressHook g_progress = nullptr;
}  // namespace

void set_progress_hook(ProgressHook hook) { g_progress = hook; }
void report_progress(size_t done, size_t total, const std::string& what) {
  if (g_progress) g_progress(done, total, what);
}

SimRun run_distributed(const Scenario& sc, const RunOptions& options,
                       std::function<void(const OpApplication&)> observer,
                       const std::map<std::string, Locals>* given) {
  SimRun run;
  run.runtime = std::make_unique<Runtime>(sc.mesh, options);
  Runtime& rt = *run.runtime;
  if (observer) rt.set_op_observer(std::move(observer));
  std::vector<DTensor> inputs = make_inputs(sc, options, run.input_globals, given);
  std::vector<DTensor> grad_leaves;
  for (const auto& t : inputs) {
    Event e = rt.make_event("input", "input", t.name, t.locals);
    e.out_spec = spec_str(t.spec);
    rt.recorder().add(std::move(e));
    run.named.push_back(t.name);
    run.values[t.name] = t;
    if (sc.find_input(t.name)->requires_grad) {
      run.grad_inputs.push_back(t.name);
      grad_leaves.push_back(t);
    }
  }
  // Local code of the program (to_local ... from_local): plain per-rank tensors, run as an
  // unchecked local_map body runs, with PyTorch's DTensor.to_local / from_local at its ends.
  BodyContext local_code(rt, /*checked=*/false);
  std::map<std::string, LTensor> locals;
  // One program op; what it raises names its place in the scenario.
  // localize always: every op's use of an operand, and every value, is an identity node of its own
  // (sim/interpreter.h, operand_uses), so that gradients can be told apart per use and per value.
  const bool own_nodes = options.localize == Localize::Always;
  auto keep = [&](const std::string& name, DTensor value) {
    run.named.push_back(name);
    run.values[name] = own_nodes ? rt.alias(value) : std::move(value);
  };
  auto run_op = [&](const OpDecl& op) {
    if (run_local_code(local_code, op, run, locals)) return;
    std::vector<DTensor> args;
    for (const auto& a : op.args) args.push_back(run.values.at(a));
    if (own_nodes)
      for (size_t i = 0; i < args.size(); ++i) {
        args[i] = rt.alias(args[i]);
        run.operand_uses[{static_cast<int>(&op - sc.program.data()), static_cast<int>(i)}] = args[i];
      }
    if (op.op == "local_map") {
      std::vector<DTensor> outs =
          run_local_map(rt, op, args, options.localize == Localize::Always ? &run.bodies[op.path] : nullptr);
      for (size_t k = 0; k < outs.size(); ++k) keep(op.outs[k], std::move(outs[k]));
      run.has_local_map |= tracked_local_map(rt, op);
      return;
    }
    if (is_split_op(op.op)) {  // one narrow per piece, each its own value
      const auto pieces = split_as_narrows(op, args.at(0).shape);
      for (size_t k = 0; k < pieces.size(); ++k) keep(op.outs[k], rt.apply_op("narrow", pieces[k], {args[0]}, op.outs[k]));
      return;
    }
    DTensor out;
    if (op.op == "redistribute") {
      Spec to;
      for (const auto& p : op.attrs.at("placements")) to.push_back(parse_placement(p.get<std::string>()));
      const InputDecl* param = sc.find_input(op.args.at(0));  // FSDP2's mixed precision: its all_gather
      out = rt.redistribute(args.at(0), to, op.out,
                            param && param->mixed_precision.present ? &param->mixed_precision : nullptr);
    } else {
      out = apply_program_op(rt, op, args);
    }
    keep(op.out, std::move(out));
  };
  const bool planted = !options.mutant.empty();
  for (const auto& op : sc.program) {
    report_progress(static_cast<size_t>(&op - sc.program.data()), sc.program.size(), op.op);
    ScopedOverride<int> at(rt.recorder().program_op, static_cast<int>(&op - sc.program.data()));
    ScopedOverride<std::optional<RedistributeMode>> mode(rt.recorder().redistribute, op_redistribute_mode(op));
    try {
      run_op(op);
    } catch (SemanticError& e) {
      // A rule's message may lead with a deeper path ("/program/2/body/0/args: ..."): that one.
      const std::string what = e.what();
      const auto colon = what.find(": ");
      if (e.path().empty())
        e.set_path(what.rfind(op.path, 0) == 0 && colon != std::string::npos ? what.substr(0, colon) : op.path);
      throw;
    } catch (const LocalCodeRefused& e) {
      // libtorch refusing the user's local code is a program libtorch cannot run: unusable input,
      // said in one line. Under a planted bug it is the bug's doing: a failed run (check_scenario).
      if (planted) throw std::runtime_error(e.what());
      throw SemanticError(ErrorKind::InvalidScenario, e.what(), e.path);
    } catch (const c10::Error& e) {
      bool local_code = false;  // code between to_local and from_local
      for (const auto& a : op.args) local_code |= locals.count(a) > 0;
      if (planted || !local_code) throw;
      const LocalCodeRefused refused(op.path, op.op, e);
      throw SemanticError(ErrorKind::InvalidScenario, refused.what(), refused.path);
    }
  }
  if (!sc.backward.empty()) {
    report_progress(sc.program.size(), sc.program.size(), "backward");
    std::vector<std::vector<at::Tensor>> grads;
    std::vector<DTensor> watched;
    std::vector<Locals> watched_grads;
    if (options.localize == Localize::Always) {
      std::set<std::string> inputs;
      for (const auto& in : sc.inputs) inputs.insert(in.name);
      for (const auto& name : run.named)
        if (!inputs.count(name) && run.values.at(name).requires_grad()) watched.push_back(run.values.at(name));
    }
    try {
      grads = rt.backward(run.values.at(sc.backward), grad_leaves, watched,
                          options.localize == Localize::Always ? &watched_grads : nullptr);
      for (size_t i = 0; i < watched_grads.size(); ++i) run.value_grads[watched[i].name] = watched_grads[i];
    } catch (SemanticError& e) {
      if (e.path().empty()) e.set_path("/backward");
      throw;
    }
    for (size_t i = 0; i < grad_leaves.size(); ++i) {
      run.grads[grad_leaves[i].name] = grads[i];
      if (auto gs = rt.input_grad_spec(grad_leaves[i].name, grad_leaves[i].spec)) run.grad_specs[grad_leaves[i].name] = *gs;
    }
    run.ran_backward = true;
  }
  return run;
}

}  // namespace meshsim

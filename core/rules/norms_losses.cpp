// The norm and loss families: norm (layer_norm, rms_norm), vector_norm (linalg_vector_norm),
// pick_target, count_targets.
#include <cmath>
#include <string>
#include <vector>

#include "core/mutants.h"
#include "core/rules/common.h"

namespace meshsim::rules {

// layer_norm / rms_norm (x, weight?, bias?): PyTorch's native_layer_norm strategy. The normalized
// (trailing) dims are whole on every rank, a shard there is gathered first; a batch or sequence dim
// keeps its shard; the weight and bias are replicated. Not linear: a Partial x is reduced first.
std::vector<RuleRow> norm_rows(const RowCtx& c) {
  std::vector<RowText> t;
  const auto k = static_cast<int64_t>(c.a.normalized_shape.size());
  const std::vector<std::string> params(c.shapes.size() - 1, "R");
  const std::string rest = params.empty() ? "" : ", " + joined(params);
  for (int64_t d = 0; d + k < c.rank(); ++d)
    t.emplace_back(S(d) + rest + " -> " + S(d), "S(d)" + rest + " -> S(d), d not normalized");
  t.emplace_back("R" + rest + " -> R");
  return parse_rows(t);
}

// linalg_vector_norm {ord, dim, keepdim}: PyTorch's vector_norm strategy (a reduction, linear in
// its own sense: the norm of norms is the norm). A shard of a reduced dim gives the partial of the
// norm: P(normP) for a finite ord other than 0 (its reduction: local^p summed, then the p-th root),
// P(max) for inf and P(min) for -inf (norms are never negative, so the largest local max |x| is the
// global one), P(sum) for 0 (counts of nonzeros add up). A kept dim's shard stays, moved down by
// the reduced dims before it. No Partial operand passes: |x| of a sum is not the sum of |x| (a
// Partial x is reduced first; PyTorch lets P(max) pass an inf norm, wrong where the largest local
// value is negative).
Placement vector_norm_partial(double ord) {
  if (std::isinf(ord)) return Placement::partial(ord > 0 ? ReduceOp::Max : ReduceOp::Min);
  // Planted bug: the ranks' local norms added up as a sum.
  if (ord == 0 || mutant_on(Mutant::NormPartialAsSum)) return Placement::partial(ReduceOp::Sum);
  return Placement::partial_norm(ord);
}

std::vector<RuleRow> vector_norm_rows(const RowCtx& c) {
  std::vector<RowText> t;
  const Placement partial = vector_norm_partial(c.a.ord);
  const std::string form = std::isinf(c.a.ord) ? partial.str() : c.a.ord == 0 ? "P(sum), ord 0" : "P(norm ord)";
  for (int64_t d = 0; d < c.rank(); ++d) {
    if (reduces(c.a, d)) {
      t.emplace_back(S(d) + " -> " + partial.str(), "S(dim) -> " + form);
    } else {
      const int64_t out = d - reduced_before(c.a, d);
      t.emplace_back(S(d) + " -> " + S(out), out == d ? "S(d) -> S(d)" : "S(d) -> S(d-k), k reduced dims before d");
    }
  }
  t.emplace_back("R -> R");
  return parse_rows(t);
}

// pick_target(log_probs [N, C], target [N]) -> [N]: -log_probs[n, target[n]] (0 where the target is
// ignore_index), the pick of nll_loss and cross_entropy. A batch shard stays a shard; a class shard
// (loss parallel) is the masked target pick: each rank picks the targets in its class range and
// writes zeros for the others, P(sum), as PyTorch's loss_parallel does. Linear in log_probs.
std::vector<RuleRow> pick_target_rows(const RowCtx&) {
  return parse_rows({"S(0), S(0) -> S(0)", "S(1), R -> P(sum)", "R, R -> R", "P(sum), R -> P(sum)", "P(avg), R -> P(avg)"});
}

// count_targets(target) -> 1.0 where target != ignore_index, else 0 (the divisor of a mean that
// ignores targets): pointwise.
std::vector<RuleRow> count_targets_rows(const RowCtx& c) { return pointwise_rows(c, {}); }

// ---------------------------------------------------------------------------------------------
// Backward

// layer_norm / rms_norm: the input's gradient needs whole normalized dims, as the forward did, so
// g is laid out as x; the weight's and bias's are sums over the batch dims of g times the
// normalized input: a shard of a batch dim gives P(sum) (the sequence-parallel norm-weight
// all_reduce the cotangent hook performs).
Grad norm_gradient(const AxisGrad& x) {
  const Placement in = x.operand(0);
  const Placement g = in.is_shard() ? in : Placement::replicate();
  if (x.input == 0) return {g, g, nullptr, "x: g laid out as x"};
  if (!g.is_shard()) return {g, g, nullptr, "weight: g replicated, R"};
  // Planted bug: the ranks' partial sums taken for the whole (no all_reduce follows).
  const Placement out = mutant_on(Mutant::NormWeightGradNotReduced) ? Placement::replicate() : Placement::partial(ReduceOp::Sum);
  return {g, out, nullptr, "weight: S(d) of a batch dim, summed over it, P(sum)"};
}

// linalg_vector_norm: the gradient is g (expanded back over the reduced dims) times a function of
// x and the norm, computed where both are: a shard of a kept dim keeps g laid out as the output
// and gives S(d); a replicated x takes g replicated (or P(sum): linear in g) and gives the same.
// A shard of a reduced dim gives a partial without a cotangent (P(normP), P(max), P(min)), but for
// ord 0, whose P(sum) takes g replicated and gives S(dim) (its gradient is zero).
Grad vector_norm_gradient(const AxisGrad& x) {
  const Placement in = x.operand(0);
  if (in.is_shard() && reduces(x.attrs, in.dim))
    return {Placement::replicate(), in, nullptr, "S(dim) reduced (ord 0): g replicated, S(dim)"};
  if (in.is_shard()) return {x.out, in, nullptr, "S(d) kept: g laid out as the output, S(d)"};
  if (x.g.is_partial() && x.g.op == ReduceOp::Sum) return {x.g, x.g, nullptr, "x replicated: g P(sum), P(sum)"};
  return {Placement::replicate(), Placement::replicate(), nullptr, "x replicated: g replicated, R"};
}

// pick_target: -g scattered into the picked column of each row.
Grad pick_target_gradient(const AxisGrad& x) {
  if (x.input == 1) no_gradient(x, "the target");
  const Placement lp = x.operand(0);
  if (lp.is_shard() && lp.dim == 0) return {lp, lp, nullptr, "log_probs S(0): g S(0), scattered, S(0)"};
  if (lp.is_shard()) return {Placement::replicate(), lp, nullptr, "log_probs S(1): g replicated, scattered into the rank's class range, S(1)"};
  return {Placement::replicate(), Placement::replicate(), nullptr, "log_probs not sharded: g replicated, scattered, R"};
}

Grad count_targets_gradient(const AxisGrad& x) { no_gradient(x, "the target"); }

}  // namespace meshsim::rules

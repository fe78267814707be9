// The selection and comparison families: select (max, min, sort, topk: values), select_index
// (argmax, argmin, argsort: int64 indices), compare (eq, ne, lt, le, gt, ge, logical_and,
// logical_not, logical_or: bool results).
#include <string>
#include <vector>

#include "core/mutants.h"
#include "core/rules/common.h"

namespace meshsim::rules {

// max, min, sort, topk, argmax, argmin, argsort along `dim`: which elements are picked, and in which
// order, depends on the whole of `dim`, so every rank needs it whole: a shard of `dim` is gathered
// first (the single-operand fallback to R); a shard of another dim stays, moved down by one when
// the op drops `dim` (max, min, argmax, argmin without keepdim); not linear, so a Partial operand
// is reduced first. PyTorch's topk_strategy (torch/distributed/tensor/_ops/_math_ops.py): all
// replicated, or every dim but the topk dim sharded alike.
// Planted bug (local_topk_sharded_dim): topk over a sharded dim takes each rank's own top k and
// labels them replicated, as if they were the global top k.
std::vector<RuleRow> select_rows(const RowCtx& c) {
  std::vector<RowText> t;
  const int64_t dim = *c.a.dim;
  const bool keeps = c.out.size() == c.shapes.at(0).size();
  for (int64_t d = 0; d < c.rank(); ++d) {
    if (d == dim) continue;
    const int64_t out = keeps || d < dim ? d : d - 1;
    t.emplace_back(S(d) + " -> " + S(out), out == d ? "S(d) -> S(d), d not the dim" : "S(d) -> S(d-1), d after the dropped dim");
  }
  t.emplace_back("R -> R");
  if (c.op == "topk" && mutant_on(Mutant::LocalTopkShardedDim))
    t.emplace_back(S(dim) + " -> R", "S(dim) -> R, each rank's own top k (planted bug)");
  return parse_rows(t);
}

// Comparisons and logic: pointwise (broadcast), not linear (n ranks' comparisons of partial sums
// are not the comparison of their sum), so a Partial operand is reduced first. PyTorch lists
// aten.eq, ne, lt, le, gt, ge and logical_and, logical_not, logical_or among its pointwise ops
// (torch/distributed/tensor/_ops/_pointwise_ops.py), not the linear ones.
std::vector<RuleRow> compare_rows(const RowCtx& c) { return pointwise_rows(c, {}); }

// ---------------------------------------------------------------------------------------------
// Backward

// The values' gradient: g put back at the positions picked (zeros elsewhere), linear in g. A shard
// of a dim other than `dim` stays a shard (g laid out as the output); an operand not sharded gets g
// laid out as g.
Grad select_gradient(const AxisGrad& x) {
  const Placement& in = x.ins.at(0);
  if (!in.is_shard()) return {x.g, x.g, nullptr, "operand not sharded: g put back at the picked positions, laid out as g"};
  return {x.out, in, nullptr, "S(d), d not the dim: g laid out as the output, put back at the picked positions, S(d)"};
}

Grad select_index_gradient(const AxisGrad& x) { no_gradient(x, "an int64 index result"); }

Grad compare_gradient(const AxisGrad& x) { no_gradient(x, "a bool result"); }

}  // namespace meshsim::rules

// The index family: gather and index_select (an int64 index operand picks entries of x along dim);
// the scatter family: scatter, scatter_add and index_add (src written or added into x at the index).
#include <string>
#include <vector>

#include "core/mutants.h"
#include "core/rules/common.h"

namespace meshsim::rules {

// gather(x, dim, index) -> index's shape; index_select(x, dim, index [n]) -> x's shape with n at
// dim. Which entry of x a result entry reads depends on the index's data, so the dim indexed is
// whole on every rank (a shard of x's dim is gathered first: the fallback to R). Per mesh axis:
//   index_select: x S(d), index R -> S(d) for d not the dim (each rank selects from its rows);
//                 x R, index S(0) -> S(dim) (each rank selects its part of the index);
//   gather:       x S(d), index S(d) -> S(d) for d not the dim, where the index is as long as x
//                 on d (the ranks' blocks of x and index are the same rows); x R, index S(dim)
//                 -> S(dim) (each rank gathers its part of the positions from the whole x);
//   both:         R, R -> R; linear in x, so x P(sum) or P(avg) with the index R stays Partial.
// PyTorch (torch/distributed/tensor/_ops/_tensor_ops.py): gather_strategy has all R, the index
// sharded on the gather dim with x R, and x Shard(dim) with a size-1 index dim giving a
// _MaskPartial result; index_select goes through prop_index (x sharded on a dim not indexed keeps
// it, the index's shard lands at dim). meshsim differs: x sharded on the dim indexed is gathered
// first (no masked partial for gather); the Partial rows are meshsim's (PyTorch replicates a
// Partial x). gather's x and index sharded alike on another dim d: newer PyTorch lists it for every
// d, meshsim only where the index is as long as x on d (the blocks are the same rows then, uneven
// shards too; otherwise they are not: the planted bug).
// Planted bug (gather_shard_extents_unchecked): gather's S(d), S(d) -> S(d) without the extents
// compared, as PyTorch's newest gather_strategy lists it: where the index is shorter than x on d,
// a rank's block of the index is other rows than its block of x (x [5, 4] and the index [3, 3]
// S(0) on 2 ranks: rank 1 holds x's rows 3-4 and the index's row 2).
std::vector<RuleRow> index_rows(const RowCtx& c) {
  std::vector<RowText> t;
  const int64_t dim = *c.a.dim;
  const bool gather = c.op == "gather";
  for (int64_t d = 0; d < c.rank(); ++d) {
    if (d == dim) continue;
    if (!gather) {
      t.emplace_back(S(d) + ", R -> " + S(d), "S(d), R -> S(d), d not the dim");
      continue;
    }
    if (c.shapes.at(1).at(static_cast<size_t>(d)) == c.shapes.at(0).at(static_cast<size_t>(d)))
      t.emplace_back(S(d) + ", " + S(d) + " -> " + S(d), "S(d), S(d) -> S(d), d not the dim, the index as long as x on d");
    else if (mutant_on(Mutant::GatherShardExtentsUnchecked))
      t.emplace_back(S(d) + ", " + S(d) + " -> " + S(d), "S(d), S(d) -> S(d), d not the dim, the index shorter (planted bug)");
  }
  if (gather) t.emplace_back("R, " + S(dim) + " -> " + S(dim), "R, S(dim) -> S(dim)");
  else t.emplace_back("R, S(0) -> " + S(dim), "R, S(0) -> S(dim)");
  t.emplace_back("R, R -> R");
  t.emplace_back("P(sum), R -> P(sum)");
  t.emplace_back("P(avg), R -> P(avg)");
  return parse_rows(t);
}

// ---------------------------------------------------------------------------------------------
// Backward

// x's gradient: g added back at the positions the index picked (gather: scatter_add; index_select:
// index_add), linear in g. x S(d): g laid out as the output (S(d)), each rank adds into its block;
// the index sharded (x R): each rank adds its part of g into the whole x, P(sum); neither: g R.
Grad index_gradient(const AxisGrad& x) {
  if (x.input == 1) no_gradient(x, "the index");
  const Placement in = x.operand(0), index = x.operand(1);
  if (in.is_shard()) return {x.out, in, nullptr, "x S(d), d not the dim: g laid out as the output, added back into x's block, S(d)"};
  if (index.is_shard())
    return {x.out, Placement::partial(ReduceOp::Sum), nullptr,
            "index sharded, x not: g laid out as the output, each rank adds its part into the whole x, P(sum)"};
  return {Placement::replicate(), Placement::replicate(), nullptr, "neither sharded: g replicated, added back, R"};
}

// ---------------------------------------------------------------------------------------------
// The scatter family

// scatter(x, dim, index, src), scatter_add(x, dim, index, src) (src of the index's shape) and
// index_add(x, dim, index [n], source) (x's shape with n at dim) -> x's shape. Which entry of the
// result an entry of src reaches depends on the index's data, so x's dim is whole on every rank
// (a shard of it is gathered first: the fallback to R). Per mesh axis:
//   scatter, scatter_add: x, index and src S(d) -> S(d) for d not the dim, where the index is as
//                 long as x on d (the ranks' blocks of x, index and src are the same rows);
//   index_add:    x S(d), index R, source S(d) -> S(d) for d not the dim (source is as long as x
//                 on every dim but the dim);
//   all three:    R, R, R -> R; x and src P(sum) (or P(avg)) with the index R stay Partial: the
//                 result is x with entries of src put in, linear in the two together;
//   scatter_add, index_add: x P(sum) with the index and src sharded alike on the dim (index_add:
//                 the index S(0), source S(dim)) -> P(sum): each rank adds its part of src into
//                 its share of x, and the shares add up to x plus all of src (a replicated x is
//                 divided, or kept on one rank, by the R -> P(sum) step before). Not on another
//                 dim k: there the index's entries keep their position on k, which a rank's block
//                 reads from its first column of the whole x. scatter's writes do not add up, so
//                 it has no such row.
// PyTorch (torch/distributed/tensor/_ops/_tensor_ops.py): scatter_strategy has all R only;
// scatter_add_strategy has all R and all four S(d) for d not the dim where x and the index have
// the same extent on d; aten.index_add has no strategy (PyTorch's DTensor op tests list it as
// "does not have a sharding strategy registered"). The Partial rows, the sharded-index rows,
// scatter's and index_add's shard rows are meshsim's.
// Planted bug (scatter_add_sharded_index_replicated): scatter_add or index_add of an R x with the
// index and src sharded alike -> R: each rank's result (x plus its own part of src) labelled
// replicated, as expert-parallel code that adds its tokens into a replicated buffer and forgets
// the all_reduce.
std::vector<RuleRow> scatter_rows(const RowCtx& c) {
  std::vector<RowText> t;
  const int64_t dim = *c.a.dim;
  const bool index_add = c.op == "index_add", adds = c.op != "scatter";
  const Shape &x = c.shapes.at(0), &index = c.shapes.at(1);
  for (int64_t d = 0; d < c.rank(); ++d) {
    if (d == dim) continue;
    const auto u = static_cast<size_t>(d);
    if (index_add)
      t.emplace_back(S(d) + ", R, " + S(d) + " -> " + S(d), "S(d), R, S(d) -> S(d), d not the dim");
    else if (index.at(u) == x.at(u))
      t.emplace_back(S(d) + ", " + S(d) + ", " + S(d) + " -> " + S(d),
                     "S(d), S(d), S(d) -> S(d), d not the dim, the index as long as x on d");
  }
  t.emplace_back("R, R, R -> R");
  t.emplace_back("P(sum), R, P(sum) -> P(sum)");
  t.emplace_back("P(avg), R, P(avg) -> P(avg)");
  if (adds) {
    const bool bug = mutant_on(Mutant::ScatterAddShardedIndexReplicated);
    if (index_add) {
      t.emplace_back("P(sum), S(0), " + S(dim) + " -> P(sum)", "P(sum), S(0), S(dim) -> P(sum)");
      if (bug) t.emplace_back("R, S(0), " + S(dim) + " -> R", "R, S(0), S(dim) -> R (planted bug)");
    } else {
      t.emplace_back("P(sum), " + S(dim) + ", " + S(dim) + " -> P(sum)", "P(sum), S(dim), S(dim) -> P(sum)");
      if (bug) t.emplace_back("R, " + S(dim) + ", " + S(dim) + " -> R", "R, S(dim), S(dim) -> R (planted bug)");
    }
  }
  return parse_rows(t);
}

// x's gradient is g (scatter: zeroed where src was written), src's is gather(g, dim, index)
// (index_add: index_select(g, dim, index)), both linear in g. g laid out as the output (a
// Partial output's as R): both read the index by position, so g's blocks must be the index's.
// x's contribution is laid out as g; src's as g where the index is R, else as the index's shard
// (index_add: the index's S(0) is source's S(dim)).
Grad scatter_gradient(const AxisGrad& x) {
  if (x.input == 1) no_gradient(x, "the index");
  const Placement g = x.out.is_partial() ? Placement::replicate() : x.out;
  if (x.input == 0) return {g, g, nullptr, "g laid out as the output (Partial: R), to x laid out as g"};
  const Placement index = x.operand(1);
  if (!index.is_shard()) return {g, g, nullptr, "the index R: g laid out as the output (Partial: R), picked back, laid out as g"};
  if (x.op == "index_add")
    return {g, Placement::shard(*x.attrs.dim), nullptr, "the index S(0): g laid out as the output, picked back, S(dim)"};
  return {g, index, nullptr, "the index sharded: g laid out as the output, picked back, laid out as the index"};
}

}  // namespace meshsim::rules

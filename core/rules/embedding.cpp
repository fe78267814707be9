// The embedding family.
#include <vector>

#include "core/rules/common.h"

namespace meshsim::rules {

// embedding(ids, weight [vocab, dim]) -> ids' shape + [dim]: PyTorch's embedding strategy. Ids
// sharded on a dim give the output sharded alike; a weight sharded on its embedding dim gives the
// output's last dim sharded; a vocab-sharded weight S(0) gives the masked partial (_MaskPartial):
// each rank looks up the ids in its vocab range and writes zeros for the others, P(sum). The
// lookup is linear in the weight, so a Partial weight stays Partial.
std::vector<RuleRow> embedding_rows(const RowCtx& c) {
  std::vector<RowText> t;
  for (int64_t d = 0; d < c.rank(); ++d) t.emplace_back(S(d) + ", R -> " + S(d), "S(d), R -> S(d)");
  t.emplace_back("R, S(1) -> " + S(c.rank()), "R, S(1) -> S(last)");
  t.emplace_back("R, S(0) -> P(sum)");
  t.emplace_back("R, R -> R");
  t.emplace_back("R, P(sum) -> P(sum)");
  t.emplace_back("R, P(avg) -> P(avg)");
  return parse_rows(t);
}

// ---------------------------------------------------------------------------------------------
// Backward

// embedding: the weight's gradient is g's rows index_added at the ids.
Grad embedding_gradient(const AxisGrad& x) {
  if (x.input == 0) no_gradient(x, "the ids");
  const Placement ids = x.operand(0), w = x.operand(1);
  if (ids.is_shard()) return {ids, Placement::partial(ReduceOp::Sum), nullptr, "ids S(d): each rank adds its ids' rows, P(sum)"};
  if (w.is_shard() && w.dim == 1) return {Placement::shard(x.rank), w, nullptr, "weight S(1): g S(last), S(1)"};
  if (w.is_shard())
    return {Placement::replicate(), w, nullptr, "weight S(0): g replicated, each rank adds the rows of its vocab range, S(0)"};
  return {Placement::replicate(), Placement::replicate(), nullptr, "weight not sharded: g replicated, R"};
}

}  // namespace meshsim::rules

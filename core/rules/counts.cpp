// The counting families of int64 data: one_hot (a class index as a row of 0s and a 1) and
// bincount (how often each value occurs). Neither has a gradient: their results are int64.
#include <string>
#include <vector>

#include "core/rules/common.h"

namespace meshsim::rules {

// one_hot {num_classes}: each element becomes a row of num_classes along a new trailing dim, so a
// shard of any existing dim stays (each rank's elements give their own rows) and the new dim is
// whole on every rank; replicas stay replicas. Not linear in its operand (int64 data is Partial
// only as bincount's counts, which are reduced first). PyTorch computes it on a DTensor as
// eq(x.unsqueeze(-1), arange(num_classes)) with the arange implicitly replicated (Onehot.cpp,
// the Python-key path), which the pointwise strategy places alike.
std::vector<RuleRow> one_hot_rows(const RowCtx& c) {
  std::vector<RowText> t;
  for (int64_t d = 0; d < c.rank(); ++d) t.emplace_back(S(d) + " -> " + S(d), "S(d) -> S(d)");
  t.emplace_back("R -> R");
  return parse_rows(t);
}

// bincount {minlength} of 1-D values in [0, minlength): the counts of a shard are the rank's
// own values' counts, over the same minlength bins on every rank, and the global counts are their
// sum: S(0) -> P(sum). Replicas count alike. A Partial operand is reduced first (counting is not
// linear). PyTorch's DTensor registers no strategy for aten.bincount (docs/semantics.md).
std::vector<RuleRow> bincount_rows(const RowCtx&) { return parse_rows({"S(0) -> P(sum)", "R -> R"}); }

Grad counts_gradient(const AxisGrad& x) { no_gradient(x, "an int64 result"); }

}  // namespace meshsim::rules

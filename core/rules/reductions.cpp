// The reducing families: reduction (sum, mean), amax, amin, softmax, scan (cumsum).
#include <string>
#include <vector>

#include "core/mutants.h"
#include "core/rules/common.h"

namespace meshsim::rules {

// sum / mean over `dim` (one, a list, or every dim when absent): a shard of a reduced dim becomes
// P(sum), for mean too: its local op divides the local sum by the global count
// (OpAttrs::mean_divisor), so the ranks' results add up to the global mean even when the shards
// are uneven. (PyTorch DTensor makes it P(avg) of local means, which is wrong for uneven shards
// and NaN for empty ones, pytorch/pytorch#162692; its fix, #163241, replicates an unevenly sharded
// operand first.) A kept dim moves down by the reduced dims before it (none with keepdim).
std::vector<RuleRow> reduction_rows(const RowCtx& c) {
  std::vector<RowText> t;
  for (int64_t d = 0; d < c.rank(); ++d) {
    if (reduces(c.a, d) && c.a.local_mean) {  // semantics pytorch: P(avg) of local means
      t.emplace_back(S(d) + " -> P(avg)", "S(dim) -> P(avg), semantics pytorch");
    } else if (reduces(c.a, d)) {
      t.emplace_back(S(d) + " -> P(sum)", "S(dim) -> P(sum)");
    } else {
      const int64_t out = d - reduced_before(c.a, d);
      t.emplace_back(S(d) + " -> " + S(out), out == d ? "S(d) -> S(d)" : "S(d) -> S(d-k), k reduced dims before d");
    }
  }
  t.emplace_back("R -> R");
  t.emplace_back("P(sum) -> P(sum)");
  t.emplace_back("P(avg) -> P(avg)");
  return parse_rows(t);
}

namespace {

// amax / amin over `dim`: a shard of a reduced dim gives P(max) / P(min) (not differentiable until
// replicated); a kept dim as for sum; P(max) passes through amax and P(min) through amin.
std::vector<RuleRow> extremum_rows(const RowCtx& c, const char* partial) {
  std::vector<RowText> t;
  for (int64_t d = 0; d < c.rank(); ++d) {
    if (reduces(c.a, d)) {
      t.emplace_back(S(d) + " -> " + partial, std::string("S(dim) -> ") + partial);
    } else {
      const int64_t out = d - reduced_before(c.a, d);
      t.emplace_back(S(d) + " -> " + S(out), out == d ? "S(d) -> S(d)" : "S(d) -> S(d-k), k reduced dims before d");
    }
  }
  t.emplace_back("R -> R");
  t.emplace_back(std::string(partial) + " -> " + partial);
  return parse_rows(t);
}

}  // namespace

std::vector<RuleRow> amax_rows(const RowCtx& c) { return extremum_rows(c, "P(max)"); }

std::vector<RuleRow> amin_rows(const RowCtx& c) { return extremum_rows(c, "P(min)"); }

// softmax {dim}: every rank needs whole rows along `dim`: a shard of `dim` is gathered (the
// single-operand fallback to R), a Partial operand reduced.
std::vector<RuleRow> softmax_rows(const RowCtx& c) {
  std::vector<RowText> t;
  for (int64_t d = 0; d < c.rank(); ++d)
    if (d != *c.a.dim) t.emplace_back(S(d) + " -> " + S(d), "S(d) -> S(d)");
  t.emplace_back("R -> R");
  return parse_rows(t);
}

// cumsum {dim} (the scan family): each entry sums the entries before it along `dim`, so the dim is
// whole on every rank (a shard of it is gathered first: a rank's running sums would miss the
// ranks before it); another dim's shard is kept; linear, so P(sum) and P(avg) pass through.
// PyTorch 2.15.0 places it alike (tools/crosscheck: an S(1) x along dim 0 stays S(1)); the
// Partial rows are meshsim's.
// Planted bug (cumsum_sharded_dim_local): S(dim) -> S(dim) kept, each rank's running sums of its
// own block taken for the global ones.
std::vector<RuleRow> scan_rows(const RowCtx& c) {
  std::vector<RowText> t;
  for (int64_t d = 0; d < c.rank(); ++d)
    if (d != *c.a.dim) t.emplace_back(S(d) + " -> " + S(d), "S(d) -> S(d), d not the dim");
  if (mutant_on(Mutant::CumsumShardedDimLocal) && c.rank() > 0)
    t.emplace_back(S(*c.a.dim) + " -> " + S(*c.a.dim), "S(dim) -> S(dim) (planted bug)");
  t.emplace_back("R -> R");
  t.emplace_back("P(sum) -> P(sum)");
  t.emplace_back("P(avg) -> P(avg)");
  return parse_rows(t);
}

// item: the number a value of one element holds (PyTorch's Tensor.item, aten._local_scalar_dense),
// a 0-d result without gradient. The value is read whole on every rank: a shard of its one element
// (rank 0 holds it, the others nothing) is gathered first, a Partial reduced first (an all_reduce),
// as PyTorch's fix of DTensor.item() for Partial does (pull request 167598: a redistribution to
// Replicate before the read; before it each rank read its own local, issues 144054 and 166638).
// Planted bug (item_of_partial_unreduced): a Partial passes, each rank reading its own part and
// labelling it replicated.
std::vector<RuleRow> item_rows(const RowCtx&) {
  std::vector<RowText> t = {"R -> R"};
  if (mutant_on(Mutant::ItemOfPartialUnreduced))
    for (const char* op : {"sum", "avg", "max", "min"})
      t.emplace_back(std::string("P(") + op + ") -> R", "P -> R, each rank's own part (planted bug)");
  return parse_rows(t);
}

// ---------------------------------------------------------------------------------------------
// Backward

// cumsum's gradient is the running sums of g from the end along `dim`: linear with cumsum's own
// sharding, so its table read with g in the operand's slot.
Grad scan_gradient(const AxisGrad& x) { return own_table("scan", scan_rows(x.ctx()), x); }

Grad reduction_gradient(const AxisGrad& x) {
  const Placement& in = x.ins.at(0);
  if (!in.is_shard()) return {x.g, x.g, nullptr, "operand not sharded: g expanded, laid out as g"};
  if (reduces(x.attrs, in.dim))
    return {x.g.is_replicate() ? x.g : Placement::replicate(), in, nullptr,
            "S(dim) reduced: g replicated, expanded to S(dim)"};
  return {x.out, in, nullptr, "S(d) kept: g laid out as the output, expanded to S(d)"};
}

}  // namespace meshsim::rules

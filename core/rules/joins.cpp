// The families that join operands: cat, stack; and split and chunk, which run as narrows.
#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/mutants.h"
#include "core/rules/common.h"

namespace meshsim::rules {

namespace {

// cat {dim} and stack {dim} of any number of operands: a shard of another dim passes through when
// every operand is sharded on it alike (stack shifts the dims from `dim` on); a shard of the
// joined dim is gathered first (DTensor's cat strategy replicates it); Partials alike pass.
std::vector<RuleRow> join_rows(const RowCtx& c, bool stack) {
  std::vector<RowText> t;
  const size_t n = c.shapes.size();
  for (int64_t d = 0; d < c.rank(); ++d) {
    if (!stack && d == *c.a.dim && !mutant_on(Mutant::CatShardedDimNotGathered)) continue;  // planted bug: kept
    const int64_t o = stack && d >= *c.a.dim ? d + 1 : d;
    t.emplace_back(joined(std::vector<std::string>(n, S(d))) + " -> " + S(o),
                   stack ? "S(d), ... -> S(d or d+1)" : "S(d), ... -> S(d), another dim than the joined one");
  }
  moved_elements_rows(t, n);
  return parse_rows(t);
}

}  // namespace

std::vector<RuleRow> cat_rows(const RowCtx& c) { return join_rows(c, false); }

std::vector<RuleRow> stack_rows(const RowCtx& c) { return join_rows(c, true); }

// ---------------------------------------------------------------------------------------------
// Backward

namespace {

// cat / stack: operand i's slice of g along the joined dim.
Grad join_gradient(const AxisGrad& x, bool stack) {
  if (!x.g.is_shard()) return {x.g, x.g, nullptr, "g sliced, laid out as g"};
  const int64_t d = *x.attrs.dim;
  if (x.g.dim == d)  // the joined dim (stack: the new one): each rank's chunk is not the slice
    return {Placement::replicate(), Placement::replicate(), nullptr, "S(joined dim): g replicated, sliced"};
  const int64_t k = stack && x.g.dim > d ? x.g.dim - 1 : x.g.dim;
  return {x.g, Placement::shard(k), nullptr, "S(d) of another dim: g sliced, S(d)"};
}

}  // namespace

Grad cat_gradient(const AxisGrad& x) { return join_gradient(x, false); }

Grad stack_gradient(const AxisGrad& x) { return join_gradient(x, true); }

}  // namespace meshsim::rules

namespace meshsim {

using rules::list_str;

std::vector<Chunk> split_pieces(const std::string& op, const OpAttrs& a, int64_t extent) {
  auto fail = [&](const std::string& why) { throw SemanticError(ErrorKind::ShapeMismatch, op + ": " + why); };
  std::vector<Chunk> out;
  if (op == "split" && !a.sizes.empty()) {
    int64_t at = 0;
    for (int64_t s : a.sizes) {
      if (s < 0) fail("negative size in " + list_str(a.sizes));
      out.push_back({at, s});
      at += s;
    }
    if (at != extent) fail("sizes " + list_str(a.sizes) + " add up to " + std::to_string(at) + ", the dim has " + std::to_string(extent));
    return out;
  }
  int64_t piece = 0;
  if (op == "split") {
    if (a.split_size <= 0) fail("needs sizes (a list) or a size > 0");
    piece = a.split_size;
  } else {
    if (a.chunks <= 0) fail("chunks must be > 0, got " + std::to_string(a.chunks));
    piece = (extent + a.chunks - 1) / a.chunks;
  }
  if (extent == 0) return {{0, 0}};
  for (int64_t at = 0; at < extent; at += piece) out.push_back({at, std::min(piece, extent - at)});
  return out;
}

}  // namespace meshsim

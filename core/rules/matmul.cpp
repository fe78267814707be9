// The matmul families: mm, and matmul (bmm, matmul) as einsums.
#include <algorithm>
#include <string>
#include <vector>

#include "core/mutants.h"
#include "core/rules/common.h"

namespace meshsim::rules {

// mm: [m, k] @ [k, n].
std::vector<RuleRow> mm_rows() {
  return parse_rows({
      "S(0), R -> S(0)",
      "R, S(1) -> S(1)",
      "S(1), S(0) -> P(sum)",
      "R, R -> R",
      "P(sum), R -> P(sum)",
      "R, P(sum) -> P(sum)",
      "P(avg), R -> P(avg)",
      "R, P(avg) -> P(avg)",
  });
}

// The registry's form: mm's table is the same for every operand shape.
std::vector<RuleRow> mm_rows(const RowCtx&) { return mm_rows(); }

// ---- batched matmul (bmm, matmul), as einsums: every dim of the operands and the result carries
// a label (a batch dim, m, n or the contracted k); PyTorch's einsum-based strategies.

namespace {

enum : int64_t { kM = 1000, kN = 1001, kK = 1002, kNone = -1 };

std::string label_role(int64_t l) {
  if (l == kM) return "m";
  if (l == kN) return "n";
  if (l == kK) return "k";
  return "b";
}

struct MatmulLabels {
  std::vector<int64_t> a, b, out;  // a label per dim; kNone: a broadcast batch dim of size 1
};

// torch.matmul's dims: a 1-D operand has only k; batch dims (all but the last two) broadcast.
MatmulLabels matmul_labels(const Shape& sa, const Shape& sb, const Shape& out) {
  const auto ra = static_cast<int64_t>(sa.size()), rb = static_cast<int64_t>(sb.size());
  const int64_t ba = std::max<int64_t>(ra - 2, 0), bb = std::max<int64_t>(rb - 2, 0);
  const int64_t B = std::max(ba, bb);
  MatmulLabels l;
  for (int64_t j = 0; j < B; ++j) l.out.push_back(j);
  if (ra >= 2) l.out.push_back(kM);
  if (rb >= 2) l.out.push_back(kN);
  for (int64_t i = 0; i < ba; ++i) l.a.push_back(sa[i] == out[i + (B - ba)] ? i + (B - ba) : kNone);
  if (ra >= 2) l.a.push_back(kM);
  l.a.push_back(kK);
  for (int64_t i = 0; i < bb; ++i) l.b.push_back(sb[i] == out[i + (B - bb)] ? i + (B - bb) : kNone);
  if (rb >= 2) {
    l.b.push_back(kK);
    l.b.push_back(kN);
  } else {
    l.b.push_back(kK);
  }
  return l;
}

int64_t position(const std::vector<int64_t>& labels, int64_t l) {
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] == l) return static_cast<int64_t>(i);
  return -1;
}

// The rows of an einsum x, y -> z over labels: a label z keeps is sharded alike on the operands
// that have it (R on one that does not) and stays sharded; a label z lacks is summed over, so
// shards of it give P(sum); replicas stay replicas and a Partial passes through against a
// replica (the product is linear in each operand). `prefix` names the table in rule texts.
std::vector<RuleRow> einsum_rows(const std::vector<int64_t>& x, const std::vector<int64_t>& y,
                                 const std::vector<int64_t>& z, const std::string& prefix) {
  std::vector<RowText> t;
  std::vector<int64_t> labels;
  for (const auto* v : {&z, &x, &y})
    for (int64_t l : *v)
      if (l != kNone && std::find(labels.begin(), labels.end(), l) == labels.end()) labels.push_back(l);
  for (int64_t l : labels) {
    const int64_t px = position(x, l), py = position(y, l), pz = position(z, l);
    if (px < 0 && py < 0) continue;
    const std::string r = label_role(l);
    const std::string ix = px < 0 ? "R" : S(px), iy = py < 0 ? "R" : S(py);
    const std::string rx = px < 0 ? "R" : "S(" + r + ")", ry = py < 0 ? "R" : "S(" + r + ")";
    const std::string o = pz < 0 ? "P(sum)" : S(pz), ro = pz < 0 ? "P(sum)" : "S(" + r + ")";
    t.emplace_back(ix + ", " + iy + " -> " + o, prefix + r + ": " + rx + ", " + ry + " -> " + ro);
  }
  for (const char* row : {"R, R -> R", "P(sum), R -> P(sum)", "R, P(sum) -> P(sum)", "P(avg), R -> P(avg)",
                          "R, P(avg) -> P(avg)"})
    t.emplace_back(row, prefix + row);
  return parse_rows(t);
}

}  // namespace

std::vector<RuleRow> matmul_rows(const RowCtx& c) {
  const MatmulLabels l = matmul_labels(c.shapes.at(0), c.shapes.at(1), c.out);
  return einsum_rows(l.a, l.b, l.out, "");
}

// ---------------------------------------------------------------------------------------------
// Backward

namespace {

Placement transpose_placement(const Placement& p) {
  if (p.is_shard() && p.dim < 2) return Placement::shard(1 - p.dim);
  return as_rule_input(p);
}

}  // namespace

Grad mm_gradient(const AxisGrad& x) {
  const Placement other = transpose_placement(x.ins.at(1 - x.input));
  return gradient_row("mm", mm_rows(), x.input, &other, x);
}

// bmm / matmul: the einsum g, B -> A for A (input 0) and g, A -> B for B, g in slot 0.
Grad matmul_gradient(const AxisGrad& x) {
  const MatmulLabels l = matmul_labels(x.shapes.at(0), x.shapes.at(1), x.out_shape);
  const auto& mine = x.input == 0 ? l.a : l.b;
  const auto& other = x.input == 0 ? l.b : l.a;
  const Placement fixed = x.operand(1 - x.input);
  static const char* const kTables[] = {"matmul grad a", "matmul grad b"};
  const auto rows = einsum_rows(l.out, other, mine, "");
  Grad g = gradient_row(kTables[x.input], rows, 0, &fixed, x);
  // Planted bug: a gradient sharded on a batch dim labelled R (its shard dropped).
  if (mutant_on(Mutant::BmmBatchShardDroppedBackward) && g.out.is_shard() && g.row.substr(0, 2) == "b:")
    g.out = Placement::replicate();
  return g;
}

}  // namespace meshsim::rules

#include "core/propagation.h"

#include <limits>
#include <sstream>
#include <stdexcept>

#include "core/cost_model.h"
#include "core/error.h"

namespace meshsim {

// ---------------------------------------------------------------------------------------------
// Row text form

std::string RuleRow::str() const {
  std::string out;
  for (size_t i = 0; i < ins.size(); ++i) out += (i ? ", " : "") + ins[i].str();
  return out + " -> " + this->out.str();
}

RuleRow RuleRow::parse(const std::string& text) {
  auto arrow = text.find("->");
  if (arrow == std::string::npos) throw std::invalid_argument("rule row without ->: " + text);
  RuleRow row;
  std::stringstream lhs(text.substr(0, arrow));
  std::string item;
  while (std::getline(lhs, item, ',')) row.ins.push_back(parse_placement(item));
  row.out = parse_placement(text.substr(arrow + 2));
  return row;
}

// ---------------------------------------------------------------------------------------------
// The tables, by op family. Rows are written as text so that they print and parse back.

namespace {

std::vector<RuleRow> parse_rows(const std::vector<std::string>& texts) {
  std::vector<RuleRow> rows;
  rows.reserve(texts.size());
  for (const auto& t : texts) rows.push_back(RuleRow::parse(t));
  return rows;
}

std::string S(int64_t d) { return "S(" + std::to_string(d) + ")"; }

// Pointwise linear binary ops (add, sub): equal placements pass through; Partial sum and avg are
// linear. A Replicate operand meets a Partial one by becoming Partial (divide or rank0).
std::vector<RuleRow> linear_pointwise_rows(int64_t rank) {
  std::vector<std::string> t;
  for (int64_t d = 0; d < rank; ++d) t.push_back(S(d) + ", " + S(d) + " -> " + S(d));
  t.push_back("R, R -> R");
  t.push_back("P(sum), P(sum) -> P(sum)");
  t.push_back("P(avg), P(avg) -> P(avg)");
  return parse_rows(t);
}

// Pointwise multiply: a Partial operand is linear only against a Replicate one.
std::vector<RuleRow> mul_rows(int64_t rank) {
  std::vector<std::string> t;
  for (int64_t d = 0; d < rank; ++d) t.push_back(S(d) + ", " + S(d) + " -> " + S(d));
  t.push_back("R, R -> R");
  t.push_back("P(sum), R -> P(sum)");
  t.push_back("R, P(sum) -> P(sum)");
  t.push_back("P(avg), R -> P(avg)");
  t.push_back("R, P(avg) -> P(avg)");
  return parse_rows(t);
}

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

// sum / mean over `dim` (all dims when absent): a shard of a reduced dim becomes Partial.
std::vector<RuleRow> reduction_rows(const std::string& op, int64_t rank, const OpAttrs& attrs) {
  const std::string partial = op == "mean" ? "P(avg)" : "P(sum)";
  std::vector<std::string> t;
  for (int64_t d = 0; d < rank; ++d) {
    bool reduced = !attrs.dim || *attrs.dim == d;
    if (reduced) {
      t.push_back(S(d) + " -> " + partial);
    } else {
      int64_t out = (attrs.keepdim || d < *attrs.dim) ? d : d - 1;
      t.push_back(S(d) + " -> " + S(out));
    }
  }
  t.push_back("R -> R");
  t.push_back("P(sum) -> P(sum)");
  t.push_back("P(avg) -> P(avg)");
  return parse_rows(t);
}

Placement as_rule_input(const Placement& p) { return p.is_reduced() ? Placement::replicate() : p; }

bool same_for_rule(const Placement& given, const Placement& wanted) {
  return as_rule_input(given) == wanted;
}

// The bytes one rank moves to turn `from` into `to` on one axis, or -1 when illegal.
int64_t axis_cost(const Placement& from, const Placement& to, int64_t n, int64_t bytes, bool gradient) {
  Placement f = as_rule_input(from);
  if (f == to) return 0;
  if (!redistribute_illegal_reason({f}, {to}, gradient).empty()) return -1;
  if (f.is_shard()) return collective_bytes(to.is_shard() ? StepKind::AllToAll : StepKind::AllGather, bytes, n);
  if (f.is_partial())
    return collective_bytes(to.is_shard() ? StepKind::ReduceScatter : StepKind::AllReduce, bytes, n);
  return 0;  // R -> S (local chunk), R -> P (local)
}

Placement transpose_placement(const Placement& p) {
  if (p.is_shard() && p.dim < 2) return Placement::shard(1 - p.dim);
  return as_rule_input(p);
}

int64_t bytes_of(const Shape& s) { return numel(s) * 8; }

}  // namespace

std::vector<RuleRow> rule_rows(const std::string& op, const std::vector<int64_t>& ranks,
                               const OpAttrs& attrs) {
  if (op == "add" || op == "sub") return linear_pointwise_rows(ranks.at(0));
  if (op == "mul") return mul_rows(ranks.at(0));
  if (op == "mm") return mm_rows();
  if (op == "sum" || op == "mean") return reduction_rows(op, ranks.at(0), attrs);
  throw SemanticError(ErrorKind::UnsupportedOp, "no sharding rule for op \"" + op + "\"");
}

// ---------------------------------------------------------------------------------------------
// Shapes

Shape infer_shape(const std::string& op, const std::vector<Shape>& s, const OpAttrs& attrs) {
  auto fail = [&](const std::string& why) {
    throw SemanticError(ErrorKind::ShapeMismatch, op + ": " + why);
  };
  if (op == "add" || op == "sub" || op == "mul") {
    if (s.at(0) != s.at(1))
      fail("operand shapes differ: " + shape_str(s[0]) + " and " + shape_str(s[1]));
    return s[0];
  }
  if (op == "mm") {
    if (s.at(0).size() != 2 || s.at(1).size() != 2)
      fail("needs 2-D operands, got " + shape_str(s[0]) + " and " + shape_str(s[1]));
    if (s[0][1] != s[1][0])
      fail("inner dims differ: " + shape_str(s[0]) + " @ " + shape_str(s[1]));
    return {s[0][0], s[1][1]};
  }
  if (op == "sum" || op == "mean") {
    const Shape& in = s.at(0);
    if (!attrs.dim) return attrs.keepdim ? Shape(in.size(), 1) : Shape{};
    int64_t d = *attrs.dim;
    if (d < 0 || d >= static_cast<int64_t>(in.size()))
      fail("dim " + std::to_string(d) + " out of range for " + shape_str(in));
    Shape out = in;
    if (attrs.keepdim) out[d] = 1; else out.erase(out.begin() + d);
    return out;
  }
  throw SemanticError(ErrorKind::UnsupportedOp, "no shape rule for op \"" + op + "\"");
}

// ---------------------------------------------------------------------------------------------
// Forward propagation

ShardingDecision propagate(const std::string& op, const Mesh& mesh, const std::vector<Spec>& specs,
                           const std::vector<Shape>& shapes, const OpAttrs& attrs) {
  ShardingDecision d;
  d.out_shape = infer_shape(op, shapes, attrs);
  std::vector<int64_t> ranks;
  for (const auto& s : shapes) ranks.push_back(static_cast<int64_t>(s.size()));
  const auto rows = rule_rows(op, ranks, attrs);
  d.in_specs = specs;
  d.out_spec.assign(mesh.ndim(), Placement::replicate());
  for (int a = 0; a < mesh.ndim(); ++a) {
    // Cheapest row by (bytes moved, operands changed); ties go to the earlier row. A row the
    // operands fit as they are costs (0, 0) and always wins.
    const RuleRow* best = nullptr;
    std::pair<int64_t, int64_t> best_cost{std::numeric_limits<int64_t>::max(), 0};
    for (const auto& row : rows) {
      std::pair<int64_t, int64_t> cost{0, 0};
      for (size_t i = 0; i < specs.size() && cost.first >= 0; ++i) {
        int64_t c = axis_cost(specs[i][a], row.ins[i], mesh.axis_size(a), bytes_of(shapes[i]), false);
        cost.first = c < 0 ? -1 : cost.first + c;
        cost.second += same_for_rule(specs[i][a], row.ins[i]) ? 0 : 1;
      }
      if (cost.first >= 0 && cost < best_cost) {
        best = &row;
        best_cost = cost;
      }
    }
    if (!best)
      throw SemanticError(ErrorKind::IllegalRedistribute,
                          op + ": no legal placement for mesh axis " + mesh.axes()[a]);
    for (size_t i = 0; i < specs.size(); ++i)
      if (!same_for_rule(specs[i][a], best->ins[i])) d.in_specs[i][a] = best->ins[i];
    d.out_spec[a] = best->out;
    d.rows.push_back(op + ": " + best->str());
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// Backward

namespace {

// A bilinear op's backward is the op again with the gradient in place of one operand and the
// other operand fixed (transposed for mm): among the rows whose fixed operand matches, the one the
// incoming gradient reaches most cheaply; returns (grad_in, grad_out) for one axis.
std::pair<Placement, Placement> bilinear_backward_axis(const std::vector<RuleRow>& rows,
                                                       const Placement& fixed, size_t fixed_pos,
                                                       const Placement& g, int64_t n, int64_t bytes) {
  const RuleRow* best = nullptr;
  int64_t best_cost = std::numeric_limits<int64_t>::max();
  for (const auto& row : rows) {
    if (row.ins[fixed_pos] != fixed) continue;
    int64_t cost = axis_cost(g, row.ins[1 - fixed_pos], n, bytes, true);
    if (cost >= 0 && cost < best_cost) {
      best = &row;
      best_cost = cost;
    }
  }
  if (!best) throw SemanticError(ErrorKind::IllegalRedistribute, "backward: no rule row for the gradient");
  Placement want = best->ins[1 - fixed_pos];
  return {same_for_rule(g, want) ? g : want, best->out};
}

}  // namespace

BackwardDecision backward_rule(const std::string& op, const Mesh& mesh,
                               const std::vector<Spec>& in_specs, const Spec& out_spec,
                               const std::vector<Shape>& shapes, const OpAttrs& attrs,
                               const Spec& grad_in, size_t input) {
  BackwardDecision d{grad_in, grad_in};
  if (op == "add" || op == "sub") return d;  // the contribution is +-g, laid out as g
  for (int a = 0; a < mesh.ndim(); ++a) {
    const Placement& g = grad_in[a];
    const int64_t n = mesh.axis_size(a);
    if (op == "mm" || op == "mul") {
      // mm: dA = g @ B^T, dB = A^T @ g; mul: dA = g * B, dB = A * g.
      size_t other = 1 - input;
      Placement fixed = op == "mm" ? transpose_placement(in_specs[other][a]) : as_rule_input(in_specs[other][a]);
      auto rows = op == "mm" ? mm_rows() : mul_rows(static_cast<int64_t>(shapes[0].size()));
      auto [gin, gout] = bilinear_backward_axis(rows, fixed, input == 0 ? 1 : 0, g, n, bytes_of(shapes[other]));
      d.grad_in[a] = gin;
      d.grad_out[a] = gout;
    } else if (op == "sum" || op == "mean") {
      // dx = g expanded to x's shape: a shard of x stays a shard of the expanded gradient.
      const Placement& x = in_specs[0][a];
      if (x.is_shard()) {
        bool reduced = !attrs.dim || *attrs.dim == x.dim;
        if (reduced && !g.is_replicate()) d.grad_in[a] = Placement::replicate();
        if (!reduced) d.grad_in[a] = out_spec[a];
        d.grad_out[a] = x;
      } else {
        d.grad_out[a] = d.grad_in[a];
      }
    } else {
      throw SemanticError(ErrorKind::UnsupportedOp, "no backward rule for op \"" + op + "\"");
    }
  }
  return d;
}

}  // namespace meshsim

#include "core/propagation.h"

#include <iomanip>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "core/cost_model.h"
#include "core/coverage.h"
#include "core/error.h"

namespace meshsim {

// ---------------------------------------------------------------------------------------------
// Row text form

namespace {

// The one copy of a rule text, for RuleRow::rule (interned once per text, at parse time).
std::string_view intern_rule(const std::string& text) {
  static std::mutex mutex;
  static std::set<std::string> texts;
  std::lock_guard<std::mutex> lock(mutex);
  return *texts.insert(text).first;
}

}  // namespace

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
  row.rule = intern_rule(row.str());
  return row;
}

// ---------------------------------------------------------------------------------------------
// Attributes

std::string OpAttrs::str() const {
  std::ostringstream o;
  o << std::setprecision(17);  // every double apart: the text is a cache key
  o << "dim=" << (dim ? std::to_string(*dim) : "-") << " keepdim=" << keepdim << " value=" << value
    << " dim0=" << dim0 << " dim1=" << dim1
    << " divisor=" << (mean_divisor ? std::to_string(*mean_divisor) : "-");
  return o.str();
}

namespace {

// `dim` in [-rank, rank) as a dim in [0, rank), or nothing when out of range.
std::optional<int64_t> wrapped(int64_t dim, int64_t rank) {
  if (dim < -rank || dim >= rank) return std::nullopt;
  return dim < 0 ? dim + rank : dim;
}

// `attrs` with every dim the op uses wrapped into [0, rank); out of range is ShapeMismatch naming
// the operand (`operand`: its shape, or its rank when only that is known).
OpAttrs resolved(const std::string& op, const OpAttrs& attrs, int64_t rank, const std::string& operand) {
  auto wrap = [&](int64_t d, const char* what) {
    auto w = wrapped(d, rank);
    if (!w)
      throw SemanticError(ErrorKind::ShapeMismatch, op + ": " + what + " " + std::to_string(d) +
                                                        " out of range for " + operand);
    return *w;
  };
  OpAttrs r = attrs;
  if (op == "sum" || op == "mean" || op == "softmax") {
    if (op == "softmax" && !attrs.dim) throw SemanticError(ErrorKind::ShapeMismatch, op + ": needs a dim");
    if (attrs.dim) r.dim = wrap(*attrs.dim, "dim");
  }
  if (op == "transpose") {
    r.dim0 = wrap(attrs.dim0, "dim0");
    r.dim1 = wrap(attrs.dim1, "dim1");
  }
  return r;
}

bool reduces(const OpAttrs& resolved_attrs, int64_t d) { return !resolved_attrs.dim || *resolved_attrs.dim == d; }

}  // namespace

OpAttrs with_global_shape(const OpAttrs& attrs, const Shape& global_in) {
  OpAttrs r = attrs;
  const auto rank = static_cast<int64_t>(global_in.size());
  std::optional<int64_t> dim;
  if (attrs.dim && !(dim = wrapped(*attrs.dim, rank))) return r;  // propagate() reports it
  int64_t count = 1;
  for (int64_t d = 0; d < rank; ++d)
    if (!dim || *dim == d) count *= global_in[d];
  r.mean_divisor = count;
  return r;
}

// ---------------------------------------------------------------------------------------------
// The tables, by op family, in the order of rule_families(). Rows are written as text so that they
// print and parse back; within a table, earlier rows win ties.

namespace {

// A row's text and, when its table writes it by role (S(d)), that form.
struct RowText {
  std::string text, rule;
  RowText(std::string t) : text(std::move(t)) {}  // NOLINT: a fixed row is its own rule
  RowText(const char* t) : text(t) {}             // NOLINT
  RowText(std::string t, std::string r) : text(std::move(t)), rule(std::move(r)) {}
};

// Rows are parsed once per text: every op's forward and every backward step per axis asks for
// its family's table again.
std::vector<RuleRow> parse_rows(const std::vector<RowText>& texts) {
  thread_local std::unordered_map<std::string, RuleRow> parsed;
  std::vector<RuleRow> rows;
  rows.reserve(texts.size());
  for (const auto& t : texts) {
    const std::string key = t.text + "|" + t.rule;
    auto it = parsed.find(key);
    if (it == parsed.end()) {
      RuleRow row = RuleRow::parse(t.text);
      if (!t.rule.empty()) row.rule = intern_rule(t.rule);
      it = parsed.emplace(key, std::move(row)).first;
    }
    rows.push_back(it->second);
  }
  return rows;
}

std::string S(int64_t d) { return "S(" + std::to_string(d) + ")"; }

// The rows every pointwise op has: each shard passes through when every operand is sharded
// alike, and replicas stay replicas; then the family's own rows.
std::vector<RuleRow> pointwise_rows(int64_t rank, int arity, const std::vector<std::string>& own) {
  auto alike = [arity](const std::string& p) {
    std::string lhs;
    for (int i = 0; i < arity; ++i) lhs += (i ? ", " : "") + p;
    return lhs + " -> " + p;
  };
  std::vector<RowText> t;
  for (int64_t d = 0; d < rank; ++d) t.emplace_back(alike(S(d)), alike("S(d)"));
  t.emplace_back(alike("R"));
  t.insert(t.end(), own.begin(), own.end());
  return parse_rows(t);
}

// Pointwise linear binary ops (add, sub): Partial sum and avg are linear. A Replicate operand
// meets a Partial one by becoming Partial (divide or rank0).
std::vector<RuleRow> linear_binary_rows(int64_t rank) {
  return pointwise_rows(rank, 2, {"P(sum), P(sum) -> P(sum)", "P(avg), P(avg) -> P(avg)"});
}

// Pointwise linear unary ops (neg, scale): every placement but P(max) and P(min) (which neg and a
// negative scale would swap) passes through.
std::vector<RuleRow> linear_unary_rows(int64_t rank) {
  return pointwise_rows(rank, 1, {"P(sum) -> P(sum)", "P(avg) -> P(avg)"});
}

// Pointwise non-linear unary ops (exp, relu, sin, tanh): shards and replicas only; a Partial
// operand is replicated first (an all_reduce).
std::vector<RuleRow> nonlinear_unary_rows(int64_t rank) { return pointwise_rows(rank, 1, {}); }

// Pointwise multiply: a Partial operand is linear only against a Replicate one.
std::vector<RuleRow> mul_rows(int64_t rank) {
  return pointwise_rows(rank, 2,
                        {"P(sum), R -> P(sum)", "R, P(sum) -> P(sum)", "P(avg), R -> P(avg)", "R, P(avg) -> P(avg)"});
}

// Pointwise divide x / y: linear in the numerator only, so Partial only there.
std::vector<RuleRow> div_rows(int64_t rank) {
  return pointwise_rows(rank, 2, {"P(sum), R -> P(sum)", "P(avg), R -> P(avg)"});
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

// transpose {dim0, dim1}: a shard follows its dim; a permutation keeps every Partial.
std::vector<RuleRow> transpose_rows(int64_t rank, const OpAttrs& a) {
  std::vector<RowText> t;
  for (int64_t d = 0; d < rank; ++d) {
    if (d == a.dim0) t.emplace_back(S(d) + " -> " + S(a.dim1), "S(dim0) -> S(dim1)");
    else if (d == a.dim1) t.emplace_back(S(d) + " -> " + S(a.dim0), "S(dim1) -> S(dim0)");
    else t.emplace_back(S(d) + " -> " + S(d), "S(d) -> S(d)");
  }
  for (const char* p : {"R", "P(sum)", "P(avg)", "P(max)", "P(min)"}) t.emplace_back(std::string(p) + " -> " + p);
  return parse_rows(t);
}

// sum / mean over `dim` (every dim when absent): a shard of a reduced dim becomes P(sum), for mean
// too: its local op divides the local sum by the global count (OpAttrs::mean_divisor), so the
// ranks' results add up to the global mean even when the shards are uneven. (PyTorch DTensor
// makes it P(avg) of local means, which is wrong for uneven shards and NaN for empty ones,
// pytorch/pytorch#162692; its fix, #163241, replicates an unevenly sharded operand first.)
std::vector<RuleRow> reduction_rows(int64_t rank, const OpAttrs& a) {
  std::vector<RowText> t;
  for (int64_t d = 0; d < rank; ++d) {
    if (reduces(a, d)) {
      t.emplace_back(S(d) + " -> P(sum)", a.dim ? "S(dim) -> P(sum)" : "S(d) -> P(sum), every dim reduced");
    } else {
      int64_t out = (a.keepdim || d < *a.dim) ? d : d - 1;
      t.emplace_back(S(d) + " -> " + S(out), out == d ? "S(d) -> S(d)" : "S(d) -> S(d-1)");
    }
  }
  t.emplace_back("R -> R");
  t.emplace_back("P(sum) -> P(sum)");
  t.emplace_back("P(avg) -> P(avg)");
  return parse_rows(t);
}

// softmax {dim}: every rank needs whole rows along `dim`: a shard of `dim` is gathered (the
// single-operand fallback to R), a Partial operand reduced.
std::vector<RuleRow> softmax_rows(int64_t rank, const OpAttrs& a) {
  std::vector<RowText> t;
  for (int64_t d = 0; d < rank; ++d)
    if (d != *a.dim) t.emplace_back(S(d) + " -> " + S(d), "S(d) -> S(d)");
  t.emplace_back("R -> R");
  return parse_rows(t);
}

}  // namespace

namespace {

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

// (bytes moved, operands changed) to bring the operands `given` to a row's operands `want`; bytes
// is -1 when a transition is illegal. A row the operands fit as they are costs (0, 0).
std::pair<int64_t, int64_t> row_cost(const std::vector<Placement>& given, const std::vector<Placement>& want,
                                     int64_t n, const std::vector<int64_t>& bytes, bool gradient) {
  std::pair<int64_t, int64_t> cost{0, 0};
  for (size_t i = 0; i < given.size() && cost.first >= 0; ++i) {
    int64_t c = axis_cost(given[i], want[i], n, bytes[i], gradient);
    cost.first = c < 0 ? -1 : cost.first + c;
    cost.second += same_for_rule(given[i], want[i]) ? 0 : 1;
  }
  return cost;
}

Placement transpose_placement(const Placement& p) {
  if (p.is_shard() && p.dim < 2) return Placement::shard(1 - p.dim);
  return as_rule_input(p);
}

int64_t bytes_of(const Shape& s) { return numel(s) * 8; }

// ---------------------------------------------------------------------------------------------
// Backward, per family and mesh axis
//
// Every contribution is linear in the incoming gradient g, so each family's backward is a table
// again, with g in one operand slot:
//   linear binary (add, sub):   +-g, laid out as g.
//   linear unary (neg, scale), transpose: the op's own table applied to g (each is its own
//                               adjoint up to a constant; transpose swaps back).
//   non-linear unary, softmax:  f'(x) * g and y * (g - sum(g * y, dim)) are pointwise products
//                               with the forward operand: the mul table, x fixed, g the other.
//   mul:                        dA = g * B, dB = A * g: the mul table, the other operand fixed.
//   div:                        dx = g / y: the div table, y fixed; dy = -g * x / y^2: the mul
//                               table, x fixed (y is R or sharded like x in every div row).
//   mm:                         dA = g @ B^T, dB = A^T @ g: the mm table, the other transposed.
//   reduction (sum, mean):      g expanded back to x's shape: a shard of x stays a shard.

// One mesh axis of a backward step.
struct AxisGrad {
  std::vector<Placement> ins;  // the operands' forward placements (after redistribution)
  Placement out;               // the output's placement (Rd restored)
  Placement g;                 // the incoming gradient's
  size_t input = 0;            // the operand whose contribution is asked for
  int64_t n = 1, bytes = 0, rank = 0;
  OpAttrs attrs;               // dims resolved

  Placement operand(size_t i) const { return as_rule_input(ins.at(i)); }
};
// A backward step on one axis: what the incoming gradient must be, the contribution's placement,
// and the rule read (the table and its row, "mul S(d), S(d) -> S(d)"; or a branch), for coverage.
struct Grad {
  Placement in, out;
  const char* table = nullptr;  // null for a branch of a family without a table
  std::string_view row;

  std::string rule() const { return (table ? std::string(table) + " " : std::string()) + std::string(row); }
};

// Among the rows of `table` whose operand `1 - g_pos` is `fixed` (any row when `fixed` is null),
// the one the incoming gradient reaches most cheaply in slot `g_pos`; ties go to the earlier row.
Grad gradient_row(const char* table, const std::vector<RuleRow>& rows, size_t g_pos, const Placement* fixed,
                  const AxisGrad& x) {
  const RuleRow* best = nullptr;
  std::pair<int64_t, int64_t> best_cost{std::numeric_limits<int64_t>::max(), 0};
  for (const auto& row : rows) {
    if (fixed && row.ins.at(1 - g_pos) != *fixed) continue;
    auto cost = row_cost({x.g}, {row.ins[g_pos]}, x.n, {x.bytes}, true);
    if (cost.first >= 0 && cost < best_cost) {
      best = &row;
      best_cost = cost;
    }
  }
  if (!best) throw SemanticError(ErrorKind::IllegalRedistribute, "backward: no rule row for the gradient");
  const Placement& want = best->ins[g_pos];
  return {same_for_rule(x.g, want) ? x.g : want, best->out, table, best->rule};
}

Grad as_gradient(const AxisGrad& x) { return {x.g, x.g, nullptr, "+-g, laid out as g"}; }

Grad own_table(const char* table, const std::vector<RuleRow>& rows, const AxisGrad& x) {
  return gradient_row(table, rows, 0, nullptr, x);
}

Grad times_operand(const AxisGrad& x) {
  const Placement fixed = x.operand(0);
  return gradient_row("mul", mul_rows(x.rank), 1, &fixed, x);
}

Grad mul_gradient(const AxisGrad& x) {
  const Placement other = x.operand(1 - x.input);
  return gradient_row("mul", mul_rows(x.rank), x.input, &other, x);
}

Grad div_gradient(const AxisGrad& x) {
  const Placement fixed = x.operand(1 - x.input);
  return x.input == 0 ? gradient_row("div", div_rows(x.rank), 0, &fixed, x)
                      : gradient_row("mul", mul_rows(x.rank), 1, &fixed, x);
}

Grad mm_gradient(const AxisGrad& x) {
  const Placement other = transpose_placement(x.ins.at(1 - x.input));
  return gradient_row("mm", mm_rows(), x.input, &other, x);
}

Grad reduction_gradient(const AxisGrad& x) {
  const Placement& in = x.ins.at(0);
  if (!in.is_shard()) return {x.g, x.g, nullptr, "operand not sharded: g expanded, laid out as g"};
  if (reduces(x.attrs, in.dim))
    return {x.g.is_replicate() ? x.g : Placement::replicate(), in, nullptr,
            "S(dim) reduced: g replicated, expanded to S(dim)"};
  return {x.out, in, nullptr, "S(d) kept: g laid out as the output, expanded to S(d)"};
}

// ---------------------------------------------------------------------------------------------
// The registry: one entry per family, in the order of the tables above.

struct Family {
  RuleFamily names;
  size_t arity;
  std::vector<RuleRow> (*rows)(int64_t rank, const OpAttrs& resolved_attrs);
  Grad (*backward)(const AxisGrad&);
};

const std::vector<Family>& registry() {
  using A = const OpAttrs&;
  static const std::vector<Family> families = {
      {{"linear_binary", {"add", "sub"}}, 2, [](int64_t r, A) { return linear_binary_rows(r); }, as_gradient},
      {{"linear_unary", {"neg", "scale"}}, 1, [](int64_t r, A) { return linear_unary_rows(r); },
       [](const AxisGrad& x) { return own_table("linear_unary", linear_unary_rows(x.rank), x); }},
      {{"nonlinear_unary", {"exp", "relu", "sin", "tanh"}}, 1, [](int64_t r, A) { return nonlinear_unary_rows(r); },
       times_operand},
      {{"mul", {"mul"}}, 2, [](int64_t r, A) { return mul_rows(r); }, mul_gradient},
      {{"div", {"div"}}, 2, [](int64_t r, A) { return div_rows(r); }, div_gradient},
      {{"mm", {"mm"}}, 2, [](int64_t, A) { return mm_rows(); }, mm_gradient},
      {{"transpose", {"transpose"}}, 1, transpose_rows,
       [](const AxisGrad& x) { return own_table("transpose", transpose_rows(x.rank, x.attrs), x); }},
      {{"reduction", {"mean", "sum"}}, 1, reduction_rows, reduction_gradient},
      {{"softmax", {"softmax"}}, 1, softmax_rows, times_operand},
  };
  return families;
}

const Family& family_of(const std::string& op) {
  for (const auto& f : registry())
    for (const auto& o : f.names.ops)
      if (o == op) return f;
  throw SemanticError(ErrorKind::UnsupportedOp, "no sharding rule for op \"" + op + "\"");
}

}  // namespace

const std::vector<RuleFamily>& rule_families() {
  static const std::vector<RuleFamily> names = [] {
    std::vector<RuleFamily> out;
    for (const auto& f : registry()) {
      out.push_back(f.names);
      out.back().arity = f.arity;
    }
    return out;
  }();
  return names;
}

std::vector<RuleRow> rule_rows(const std::string& op, const std::vector<int64_t>& ranks,
                               const OpAttrs& attrs) {
  const Family& family = family_of(op);
  const int64_t rank = ranks.at(0);
  return family.rows(rank, resolved(op, attrs, rank, "an operand of rank " + std::to_string(rank)));
}

// ---------------------------------------------------------------------------------------------
// Shapes

Shape infer_shape(const std::string& op, const std::vector<Shape>& s, const OpAttrs& attrs) {
  auto fail = [&](const std::string& why) {
    throw SemanticError(ErrorKind::ShapeMismatch, op + ": " + why);
  };
  const Family& f = family_of(op);
  const std::string& family = f.names.name;
  if (s.size() != f.arity)
    fail("takes " + std::to_string(f.arity) + " operand(s), got " + std::to_string(s.size()));
  const OpAttrs a = resolved(op, attrs, static_cast<int64_t>(s[0].size()), shape_str(s[0]));
  if (family == "mm") {
    if (s[0].size() != 2 || s[1].size() != 2)
      fail("needs 2-D operands, got " + shape_str(s[0]) + " and " + shape_str(s[1]));
    if (s[0][1] != s[1][0]) fail("inner dims differ: " + shape_str(s[0]) + " @ " + shape_str(s[1]));
    return {s[0][0], s[1][1]};
  }
  if (f.arity == 2) {  // pointwise: no broadcasting
    if (s[0] != s[1]) fail("operand shapes differ: " + shape_str(s[0]) + " and " + shape_str(s[1]));
    return s[0];
  }
  if (family == "transpose") {
    Shape out = s[0];
    std::swap(out[a.dim0], out[a.dim1]);
    return out;
  }
  if (family == "reduction") {
    if (!a.dim) return a.keepdim ? Shape(s[0].size(), 1) : Shape{};
    Shape out = s[0];
    if (a.keepdim) out[*a.dim] = 1; else out.erase(out.begin() + *a.dim);
    return out;
  }
  return s[0];  // pointwise unary, softmax
}

// ---------------------------------------------------------------------------------------------
// Forward propagation

namespace {

// The row of one mesh axis for operands `given`, by the order stated in propagation.h.
const RuleRow* choose_row(const std::vector<RuleRow>& rows, const std::vector<Placement>& given, int64_t n,
                          const std::vector<int64_t>& bytes) {
  for (const auto& row : rows)
    if (row_cost(given, row.ins, n, bytes, false) == std::pair<int64_t, int64_t>{0, 0}) return &row;
  if (given.size() == 1)
    for (const auto& row : rows)
      if (row.ins[0] == Placement::replicate()) return &row;
  const RuleRow* best = nullptr;
  std::pair<int64_t, int64_t> best_cost{std::numeric_limits<int64_t>::max(), 0};
  for (const auto& row : rows) {
    auto cost = row_cost(given, row.ins, n, bytes, false);
    if (cost.first >= 0 && cost < best_cost) {
      best = &row;
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace

ShardingDecision propagate(const std::string& op, const Mesh& mesh, const std::vector<Spec>& specs,
                           const std::vector<Shape>& shapes, const OpAttrs& attrs) {
  ShardingDecision d;
  d.out_shape = infer_shape(op, shapes, attrs);
  std::vector<int64_t> ranks, bytes;
  for (const auto& s : shapes) {
    ranks.push_back(static_cast<int64_t>(s.size()));
    bytes.push_back(bytes_of(s));
  }
  const auto rows = rule_rows(op, ranks, attrs);
  d.in_specs = specs;
  d.out_spec.assign(mesh.ndim(), Placement::replicate());
  for (int a = 0; a < mesh.ndim(); ++a) {
    std::vector<Placement> given;
    for (const auto& s : specs) given.push_back(s[a]);
    const RuleRow* best = choose_row(rows, given, mesh.axis_size(a), bytes);
    if (!best)
      throw SemanticError(ErrorKind::IllegalRedistribute,
                          op + ": no legal placement for mesh axis " + mesh.axes()[a]);
    for (size_t i = 0; i < specs.size(); ++i)
      if (!same_for_rule(specs[i][a], best->ins[i])) d.in_specs[i][a] = best->ins[i];
    d.out_spec[a] = best->out;
    d.rows.push_back(op + ": " + best->str());
    if (coverage_sink()) cover("forward " + op + ": " + std::string(best->rule));
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// Backward (the per-family functions are above, with the registry)

BackwardDecision backward_rule(const std::string& op, const Mesh& mesh,
                               const std::vector<Spec>& in_specs, const Spec& out_spec,
                               const std::vector<Shape>& shapes, const OpAttrs& attrs,
                               const Spec& grad_in, size_t input) {
  const Family& family = family_of(op);
  AxisGrad x;
  x.input = input;
  x.rank = static_cast<int64_t>(shapes.at(0).size());
  x.attrs = resolved(op, attrs, x.rank, shape_str(shapes[0]));
  x.bytes = bytes_of(infer_shape(op, shapes, attrs));
  BackwardDecision d{grad_in, grad_in};
  for (int a = 0; a < mesh.ndim(); ++a) {
    x.ins.clear();
    for (const auto& s : in_specs) x.ins.push_back(s.at(a));
    x.out = out_spec[a];
    x.g = grad_in[a];
    x.n = mesh.axis_size(a);
    Grad g = family.backward(x);
    d.grad_in[a] = g.in;
    d.grad_out[a] = g.out;
    if (coverage_sink()) cover("backward " + op + " d" + std::to_string(input) + ": " + g.rule());
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// Rule coverage: every key the tables can give, by running their own functions over every
// placement, rank and attribute variant (so a row added to a table is a key at once). A backward
// key is reachable when some forward row gives the operands and the output it reads, with the
// incoming gradient the cotangent of that output (the gradient hook makes it so).

namespace {

// Attribute variants that reach every row of a table: every dim or none, keepdim or not, every
// pair of transpose dims.
std::vector<OpAttrs> attr_variants(int64_t rank) {
  std::vector<OpAttrs> out;
  for (int64_t dim = -1; dim < rank; ++dim)
    for (bool keepdim : {false, true})
      for (int64_t d0 = 0; d0 < rank; ++d0)
        for (int64_t d1 = 0; d1 < rank; ++d1) {
          OpAttrs a;
          if (dim >= 0) a.dim = dim;
          a.keepdim = keepdim;
          a.dim0 = d0;
          a.dim1 = d1;
          out.push_back(a);
        }
  return out;
}

// Whether a forward row of `rows` places the operands as `ins` and the output as `out` (Rd read
// as R, as the rows read it; an R output may carry the Rd label the policy restores).
bool forward_gives(const std::vector<RuleRow>& rows, const std::vector<Placement>& ins, const Placement& out) {
  for (const auto& row : rows) {
    bool fits = as_rule_input(out) == row.out;
    for (size_t i = 0; i < ins.size() && fits; ++i) fits = as_rule_input(ins[i]) == row.ins[i];
    if (fits) return true;
  }
  return false;
}

// The cotangent placement kind of a primal (SEMANTICS.md section 2), or nothing for P(max)/P(min).
std::optional<Placement> cotangent_kind(const Placement& p) {
  if (p.is_shard() || p.is_plain_replicate()) return p;
  if (p.is_reduced()) return Placement::partial(ReduceOp::Sum);
  if (is_linear(p.op)) return Placement::reduced();
  return std::nullopt;
}

}  // namespace

std::vector<CoverageRow> propagation_coverage() {
  std::vector<CoverageRow> forward, backward;
  std::map<std::string, size_t> index;  // backward key -> position
  std::set<std::string> seen;
  const std::vector<Placement> placements = all_placements(2);
  for (const auto& f : registry())
    for (const auto& op : f.names.ops) {
      for (int64_t rank = 1; rank <= 3; ++rank)
        for (const auto& a : attr_variants(rank)) {
          if (op == "softmax" && !a.dim) continue;
          for (const auto& row : f.rows(rank, a))
            if (seen.insert("forward " + op + ": " + std::string(row.rule)).second)
              forward.push_back({"forward " + op + ": " + std::string(row.rule), ""});
        }
      // Backward: every operand, forward placements, output placement and incoming gradient, on
      // rank-2 operands (attributes matter to the unary families only).
      AxisGrad x;
      x.n = 2;
      x.bytes = 64;
      x.rank = 2;
      const auto attrs = f.arity == 1 ? attr_variants(2) : std::vector<OpAttrs>{OpAttrs{}};
      const size_t combos = (f.arity == 1 ? 1 : placements.size()) * placements.size();
      for (size_t input = 0; input < f.arity; ++input)
        for (const auto& a : attrs) {
          if (op == "softmax" && !a.dim) continue;
          const auto rows = f.rows(2, a);
          x.attrs = a;
          x.input = input;
          for (size_t combo = 0; combo < combos; ++combo) {
            x.ins = {placements[combo % placements.size()]};
            if (f.arity == 2) x.ins.push_back(placements[combo / placements.size()]);
            for (const auto& out : placements)
              for (const auto& g : placements) {
                x.out = out;
                x.g = g;
                std::string key;
                try {
                  key = "backward " + op + " d" + std::to_string(input) + ": " + f.backward(x).rule();
                } catch (const SemanticError&) {
                  continue;
                }
                auto it = index.find(key);
                if (it == index.end()) {
                  it = index.emplace(key, backward.size()).first;
                  backward.push_back({key, "no forward row gives the operands and output it reads"});
                }
                std::string& why = backward[it->second].unreachable;
                if (why.empty() || !forward_gives(rows, x.ins, out)) continue;
                const auto cot = cotangent_kind(out);
                if (cot && *cot == g) why.clear();
                else
                  why = "the incoming gradient would have to be " + g.str() +
                        "; it is the cotangent of the output: S(d), R, P(sum) or Rd, never P(avg), P(max) or P(min)";
              }
          }
        }
    }
  forward.insert(forward.end(), backward.begin(), backward.end());
  return forward;
}

}  // namespace meshsim

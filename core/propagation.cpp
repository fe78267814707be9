#include "core/propagation.h"

#include <algorithm>
#include <cmath>
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
#include "core/mutants.h"

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

namespace {

std::string list_str(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

}  // namespace

std::string OpAttrs::str() const {
  std::ostringstream o;
  o << std::setprecision(17);  // every double apart: the text is a cache key
  o << "dim=" << (dim ? std::to_string(*dim) : "-") << " dims=" << list_str(dims) << " dims_given=" << dims_given
    << " keepdim=" << keepdim << " value=" << value << " scalar=" << scalar << " dim0=" << dim0 << " dim1=" << dim1
    << " shape=" << list_str(shape) << " sizes=" << list_str(sizes) << " start_dim=" << start_dim
    << " end_dim=" << end_dim << " start=" << start << " length=" << length << " split_size=" << split_size
    << " chunks=" << chunks << " tanh=" << tanh << " exponent=" << exponent << " diagonal=" << diagonal
    << " normalized_shape=" << list_str(normalized_shape) << " eps=" << (eps ? std::to_string(*eps) : "-")
    << " sum_reduction=" << sum_reduction << " ignore_index=" << (ignore_index ? std::to_string(*ignore_index) : "-")
    << " fill=" << fill << " float32=" << float32
    << " range=" << (range ? std::to_string(range->offset) + "+" + std::to_string(range->size) : "-")
    << " divisor=" << (mean_divisor ? std::to_string(*mean_divisor) : "-") << " local_mean=" << local_mean
    << " local_shape=" << (local_shape ? list_str(*local_shape) : "-");
  return o.str();
}

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

bool is_view_op(const std::string& op) {
  return op == "view" || op == "reshape" || op == "flatten" || op == "unflatten" || op == "squeeze" ||
         op == "unsqueeze" || op == "expand";
}

namespace {

// `dim` in [-rank, rank) as a dim in [0, rank), or nothing when out of range.
std::optional<int64_t> wrapped(int64_t dim, int64_t rank) {
  if (dim < -rank || dim >= rank) return std::nullopt;
  return dim < 0 ? dim + rank : dim;
}

bool is_reduction(const std::string& op) { return op == "sum" || op == "mean" || op == "amax" || op == "amin"; }

// `attrs` with every dim the op uses wrapped into [0, rank) (rank + 1 for unsqueeze and stack,
// which name a dim of the result); out of range is ShapeMismatch naming the operand (`operand`:
// its shape, or its rank when only that is known). A reduction's dims end up in `dims`
// (dims_given), sorted and distinct, whether one dim or a list was given.
OpAttrs resolved(const std::string& op, const OpAttrs& attrs, int64_t rank, const std::string& operand) {
  auto wrap_in = [&](int64_t d, const char* what, int64_t r) {
    auto w = wrapped(d, r);
    if (!w)
      throw SemanticError(ErrorKind::ShapeMismatch, op + ": " + what + " " + std::to_string(d) +
                                                        " out of range for " + operand);
    return *w;
  };
  auto wrap = [&](int64_t d, const char* what) { return wrap_in(d, what, rank); };
  OpAttrs r = attrs;
  auto need_dim = [&] {
    if (!attrs.dim) throw SemanticError(ErrorKind::ShapeMismatch, op + ": needs a dim");
  };
  if (is_reduction(op)) {
    std::set<int64_t> dims;
    if (attrs.dims_given && !attrs.dims.empty()) {
      for (int64_t d : attrs.dims)
        if (!dims.insert(wrap(d, "dim")).second)
          throw SemanticError(ErrorKind::ShapeMismatch, op + ": dim " + std::to_string(d) + " appears twice");
    } else if (attrs.dim) {
      dims.insert(wrap(*attrs.dim, "dim"));
    } else {
      for (int64_t d = 0; d < rank; ++d) dims.insert(d);
    }
    r.dims.assign(dims.begin(), dims.end());
    r.dims_given = true;
    r.dim.reset();
  }
  if (op == "softmax" || op == "log_softmax" || op == "cat" || op == "narrow" || op == "unflatten") {
    need_dim();
    r.dim = wrap(*attrs.dim, "dim");
  }
  if (op == "stack" || op == "unsqueeze") {
    need_dim();
    r.dim = wrap_in(*attrs.dim, "dim", rank + 1);
  }
  if (op == "squeeze" && attrs.dim) r.dim = wrap(*attrs.dim, "dim");
  if (op == "transpose") {
    r.dim0 = wrap(attrs.dim0, "dim0");
    r.dim1 = wrap(attrs.dim1, "dim1");
  }
  if (op == "flatten") {
    r.start_dim = rank == 0 ? 0 : wrap(attrs.start_dim, "start_dim");
    r.end_dim = rank == 0 ? 0 : wrap(attrs.end_dim, "end_dim");
    if (r.start_dim > r.end_dim)
      throw SemanticError(ErrorKind::ShapeMismatch, op + ": start_dim " + std::to_string(attrs.start_dim) +
                                                        " comes after end_dim " + std::to_string(attrs.end_dim));
  }
  if (op == "permute") {
    if (static_cast<int64_t>(attrs.dims.size()) != rank)
      throw SemanticError(ErrorKind::ShapeMismatch, op + ": dims " + list_str(attrs.dims) + " must name each of the " +
                                                        std::to_string(rank) + " dims of " + operand + " once");
    std::set<int64_t> seen;
    r.dims.clear();
    for (int64_t d : attrs.dims) {
      r.dims.push_back(wrap(d, "dim"));
      if (!seen.insert(r.dims.back()).second)
        throw SemanticError(ErrorKind::ShapeMismatch, op + ": dims " + list_str(attrs.dims) + " name a dim twice");
    }
  }
  return r;
}

bool reduces(const OpAttrs& resolved_attrs, int64_t d) {
  const auto& v = resolved_attrs.dims;
  return std::find(v.begin(), v.end(), d) != v.end();
}

// The number of reduced dims before `d` (what a kept dim moves down by without keepdim).
int64_t reduced_before(const OpAttrs& resolved_attrs, int64_t d) {
  if (resolved_attrs.keepdim) return 0;
  int64_t k = 0;
  for (int64_t r : resolved_attrs.dims) k += r < d ? 1 : 0;
  return k;
}

}  // namespace

OpAttrs with_global_shape(const std::string& op, const OpAttrs& attrs, const Shape& global_in) {
  if (op != "mean") return attrs;
  OpAttrs r = attrs;
  const auto rank = static_cast<int64_t>(global_in.size());
  OpAttrs a;
  try {
    a = resolved("mean", attrs, rank, shape_str(global_in));
  } catch (const SemanticError&) {
    return r;  // propagate() reports it
  }
  int64_t count = 1;
  for (int64_t d = 0; d < rank; ++d)
    if (reduces(a, d)) count *= global_in[d];
  r.mean_divisor = count;
  return r;
}

// ---------------------------------------------------------------------------------------------
// The tables, by op family, in the order of rule_families(). Rows are written as text so that they
// print and parse back; within a table, earlier rows win ties. A table is built for the operands'
// shapes and the result's (broadcasting, views and matmuls map dims by shape).

namespace {

// What a table is built for: the operands' shapes, the result's, and the attributes (resolved).
struct RowCtx {
  const std::vector<Shape>& shapes;
  const Shape& out;
  const OpAttrs& a;
  std::string_view op = {};  // the view tables map squeeze's and unsqueeze's dims by the op
  int64_t rank() const { return static_cast<int64_t>(shapes.at(0).size()); }
};

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

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out;
}

// The dim of operand `s` aligned with dim `d` of the broadcast result `out` (PyTorch's trailing
// alignment), or -1 where the operand is broadcast: it lacks the dim, or has size 1 against a
// larger extent.
int64_t aligned(const Shape& s, const Shape& out, int64_t d) {
  const int64_t k = d - static_cast<int64_t>(out.size() - s.size());
  if (k < 0 || s[k] != out[d]) return -1;
  return k;
}

// The rows every pointwise op has: a shard of a result dim passes through when every operand that
// has the dim is sharded on it alike, an operand broadcast over it being replicated (PyTorch's
// pointwise strategy); replicas stay replicas; then the family's own rows (`own`, one per
// Partial pattern; any number of operands alike).
std::vector<RuleRow> pointwise_rows(const RowCtx& c, const std::vector<std::string>& own) {
  std::vector<RowText> t;
  const auto n = c.shapes.size();
  for (int64_t d = 0; d < static_cast<int64_t>(c.out.size()); ++d) {
    std::vector<std::string> ins, roles;
    for (const auto& s : c.shapes) {
      const int64_t k = aligned(s, c.out, d);
      ins.push_back(k < 0 ? "R" : S(k));
      roles.push_back(k < 0 ? "R" : "S(d)");
    }
    t.emplace_back(joined(ins) + " -> " + S(d), joined(roles) + " -> S(d)");
  }
  t.emplace_back(joined(std::vector<std::string>(n, "R")) + " -> R");
  t.insert(t.end(), own.begin(), own.end());
  return parse_rows(t);
}

// Pointwise linear binary ops (add, sub): Partial sum and avg are linear. A Replicate operand
// meets a Partial one by becoming Partial (divide or rank0).
std::vector<RuleRow> linear_binary_rows(const RowCtx& c) {
  return pointwise_rows(c, {"P(sum), P(sum) -> P(sum)", "P(avg), P(avg) -> P(avg)"});
}

// Pointwise linear unary ops (neg, scale): every placement but P(max) and P(min) (which neg and a
// negative scale would swap) passes through.
std::vector<RuleRow> linear_unary_rows(const RowCtx& c) {
  return pointwise_rows(c, {"P(sum) -> P(sum)", "P(avg) -> P(avg)"});
}

// Pointwise non-linear unary ops (exp, relu, sin, tanh): shards and replicas only; a Partial
// operand is replicated first (an all_reduce).
std::vector<RuleRow> nonlinear_unary_rows(const RowCtx& c) { return pointwise_rows(c, {}); }

// Pointwise multiply: a Partial operand is linear only against a Replicate one.
std::vector<RuleRow> mul_rows(const RowCtx& c) {
  return pointwise_rows(c, {"P(sum), R -> P(sum)", "R, P(sum) -> P(sum)", "P(avg), R -> P(avg)", "R, P(avg) -> P(avg)"});
}

// Pointwise divide x / y: linear in the numerator only, so Partial only there.
std::vector<RuleRow> div_rows(const RowCtx& c) { return pointwise_rows(c, {"P(sum), R -> P(sum)", "P(avg), R -> P(avg)"}); }

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

// ---- batched matmul (bmm, matmul), as einsums: every dim of the operands and the result carries
// a label (a batch dim, m, n or the contracted k); PyTorch's einsum-based strategies.

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

std::vector<RuleRow> matmul_rows(const RowCtx& c) {
  const MatmulLabels l = matmul_labels(c.shapes.at(0), c.shapes.at(1), c.out);
  return einsum_rows(l.a, l.b, l.out, "");
}

// transpose {dim0, dim1}: a shard follows its dim; a permutation keeps every Partial.
std::vector<RuleRow> transpose_rows(const RowCtx& c) {
  const OpAttrs& a = c.a;
  std::vector<RowText> t;
  for (int64_t d = 0; d < c.rank(); ++d) {
    if (d == a.dim0) t.emplace_back(S(d) + " -> " + S(a.dim1), "S(dim0) -> S(dim1)");
    else if (d == a.dim1) t.emplace_back(S(d) + " -> " + S(a.dim0), "S(dim1) -> S(dim0)");
    else t.emplace_back(S(d) + " -> " + S(d), "S(d) -> S(d)");
  }
  for (const char* p : {"R", "P(sum)", "P(avg)", "P(max)", "P(min)"}) t.emplace_back(std::string(p) + " -> " + p);
  return parse_rows(t);
}

// Every Partial passes through an op that only moves or copies elements (views, permute, cat,
// narrow), as replicas do.
void moved_elements_rows(std::vector<RowText>& t, size_t arity = 1) {
  for (const char* p : {"R", "P(sum)", "P(avg)", "P(max)", "P(min)"})
    t.emplace_back(joined(std::vector<std::string>(arity, p)) + " -> " + p);
}

// permute {dims}: output dim j is input dim dims[j]; a shard follows its dim.
std::vector<RuleRow> permute_rows(const RowCtx& c) {
  std::vector<RowText> t;
  for (int64_t j = 0; j < static_cast<int64_t>(c.a.dims.size()); ++j)
    t.emplace_back(S(c.a.dims[j]) + " -> " + S(j), "S(d) -> S(position of d)");
  moved_elements_rows(t);
  return parse_rows(t);
}

// A view's dims in groups, as PyTorch's view rules group them: each group is input dims and
// output dims with the same number of elements (a merge, a split, or both); a size-1 dim that the
// other side lacks is a group of its own.
struct ViewGroup {
  std::vector<int64_t> in, out;
};

std::vector<ViewGroup> view_groups(const Shape& in, const Shape& out) {
  std::vector<ViewGroup> groups;
  if (numel(in) == 0) return groups;  // no element: no shard survives
  size_t i = 0, j = 0;
  while (i < in.size() || j < out.size()) {
    if (i < in.size() && in[i] == 1 && (j >= out.size() || out[j] != 1)) {
      groups.push_back({{static_cast<int64_t>(i++)}, {}});
      continue;
    }
    if (j < out.size() && out[j] == 1 && (i >= in.size() || in[i] != 1)) {
      groups.push_back({{}, {static_cast<int64_t>(j++)}});
      continue;
    }
    if (i >= in.size() || j >= out.size()) break;  // shapes of different sizes: infer_shape refused
    ViewGroup g{{static_cast<int64_t>(i)}, {static_cast<int64_t>(j)}};
    int64_t pi = in[i++], pj = out[j++];
    while (pi != pj) {
      if (pi < pj && i < in.size()) {
        pi *= in[i];
        g.in.push_back(static_cast<int64_t>(i++));
      } else if (j < out.size()) {
        pj *= out[j];
        g.out.push_back(static_cast<int64_t>(j++));
      } else {
        break;
      }
    }
    groups.push_back(g);
  }
  return groups;
}

// The groups of a view op: unsqueeze and squeeze by their dim maps (a size-1 dim is inserted or
// dropped at `dim`, so every other dim keeps its shard, shifted), the others by view_groups.
std::vector<ViewGroup> view_groups_for(std::string_view op, const OpAttrs& a, const Shape& in, const Shape& out) {
  const auto ri = static_cast<int64_t>(in.size()), ro = static_cast<int64_t>(out.size());
  std::vector<ViewGroup> groups;
  if (op == "unsqueeze" && a.dim && ro == ri + 1) {
    for (int64_t d = 0; d < ri; ++d) groups.push_back({{d}, {d < *a.dim ? d : d + 1}});
    groups.push_back({{}, {*a.dim}});
    return groups;
  }
  if (op == "squeeze" && ro <= ri) {
    int64_t j = 0;
    for (int64_t d = 0; d < ri; ++d) {
      const bool dropped = in[d] == 1 && (!a.dim || *a.dim == d);
      if (dropped) groups.push_back({{d}, {}});
      else groups.push_back({{d}, {j++}});
    }
    return groups;
  }
  return view_groups(in, out);
}

// view, reshape, flatten, unflatten, squeeze, unsqueeze: a shard of the leading (outermost) input
// dim of a group stays a shard of the group's leading output dim (a merged dim keeps the shard of
// its outermost part; a split dim gives it to its outermost piece); a shard of any other dim of a
// group is redistributed first. propagate() keeps such a row only where each rank's chunk is the
// same elements on both sides (always for even shards; see view_layout_agrees).
// The rows of a view's groups; `inverse` reads them from the result back to the operand (the
// gradient's view).
std::vector<RuleRow> view_rows_of(const std::vector<ViewGroup>& groups, bool inverse) {
  std::vector<RowText> t;
  for (const auto& g : groups) {
    if (g.in.empty() || g.out.empty()) continue;
    const bool one = g.in.size() == 1 && g.out.size() == 1;
    const int64_t from = inverse ? g.out[0] : g.in[0], to = inverse ? g.in[0] : g.out[0];
    t.emplace_back(S(from) + " -> " + S(to),
                   one ? "S(d) -> S(d'), a dim the view keeps" : "S(d) -> S(d'), the leading dim of a merged or split group");
    if (mutant_on(Mutant::FlattenKeepsInnerShard) && !inverse)  // planted bug: an inner dim of a merge keeps its shard
      for (size_t k = 1; k < g.in.size() && g.out.size() == 1; ++k)
        t.emplace_back(S(g.in[k]) + " -> " + S(g.out[0]), "S(d) -> S(d'), the leading dim of a merged or split group");
  }
  moved_elements_rows(t);
  return parse_rows(t);
}

std::vector<RuleRow> view_rows(const RowCtx& c) {
  return view_rows_of(view_groups_for(c.op, c.a, c.shapes.at(0), c.out), false);
}

// expand {shape}: a dim expand keeps (same extent) keeps its shard; an expanded size-1 dim or a new
// leading dim is replicated.
std::vector<RuleRow> expand_rows(const RowCtx& c) {
  std::vector<RowText> t;
  const Shape& in = c.shapes.at(0);
  for (int64_t d = 0; d < static_cast<int64_t>(c.out.size()); ++d) {
    const int64_t k = aligned(in, c.out, d);
    if (k >= 0) t.emplace_back(S(k) + " -> " + S(d), "S(d) -> S(d), a dim expand keeps");
  }
  moved_elements_rows(t);
  return parse_rows(t);
}

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

// narrow {dim, start, length}: a shard of another dim passes through; the narrowed dim is
// gathered first (a rank's chunk is not the slice); Partials pass.
std::vector<RuleRow> narrow_rows(const RowCtx& c) {
  std::vector<RowText> t;
  for (int64_t d = 0; d < c.rank(); ++d)
    if (d != *c.a.dim) t.emplace_back(S(d) + " -> " + S(d), "S(d) -> S(d), another dim than the narrowed one");
  moved_elements_rows(t);
  return parse_rows(t);
}

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

// softmax {dim}: every rank needs whole rows along `dim`: a shard of `dim` is gathered (the
// single-operand fallback to R), a Partial operand reduced.
std::vector<RuleRow> softmax_rows(const RowCtx& c) {
  std::vector<RowText> t;
  for (int64_t d = 0; d < c.rank(); ++d)
    if (d != *c.a.dim) t.emplace_back(S(d) + " -> " + S(d), "S(d) -> S(d)");
  t.emplace_back("R -> R");
  return parse_rows(t);
}

// where(cond, x, y): pointwise over three operands (broadcast); linear in x and y together, so
// Partial x and y of one kind stay Partial against a replicated condition.
std::vector<RuleRow> where_rows(const RowCtx& c) {
  return pointwise_rows(c, {"R, P(sum), P(sum) -> P(sum)", "R, P(avg), P(avg) -> P(avg)"});
}

// masked_fill(x, mask) {value}: pointwise, the mask broadcast to x; not linear (n ranks' fills add
// up to n times the value), so a Partial x is reduced first.
std::vector<RuleRow> masked_fill_rows(const RowCtx& c) { return pointwise_rows(c, {}); }

// tril / triu {diagonal}: which elements are kept depends on their global row and column, so the
// last two dims are whole on every rank (a shard there is gathered first); a leading (batch) dim
// keeps its shard; linear, so Partial passes through.
std::vector<RuleRow> triangle_rows(const RowCtx& c) {
  std::vector<RowText> t;
  for (int64_t d = 0; d + 2 < c.rank(); ++d) t.emplace_back(S(d) + " -> " + S(d), "S(d) -> S(d), d a batch dim");
  t.emplace_back("R -> R");
  t.emplace_back("P(sum) -> P(sum)");
  t.emplace_back("P(avg) -> P(avg)");
  return parse_rows(t);
}

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
//   linear binary (add, sub):   +-g, laid out as g; summed over the dims the operand is broadcast
//                               over, where a shard of such a dim gives P(sum).
//   linear unary (neg, scale), transpose, permute, views, narrow: the op's own table (a view's
//                               and permute's inverse) applied to g.
//   non-linear unary, softmax:  f'(x) * g and y * (g - sum(g * y, dim)) are pointwise products
//                               with the forward operand: the mul table, x fixed, g the other.
//   mul:                        dA = g * B, dB = A * g: the mul table (for the result's shape and
//                               the other operand's), the other operand fixed; then summed over
//                               the operand's broadcast dims.
//   div:                        dx = g / y: the div table, y fixed; dy = -g * x / y^2: the mul
//                               table, x fixed (y is R or sharded like x in every div row).
//   mm:                         dA = g @ B^T, dB = A^T @ g: the mm table, the other transposed.
//   bmm, matmul:                the einsum g, B -> A (and A, g -> B): a label A lacks (n, and a
//                               batch dim A is broadcast over) is summed, so its shards give P(sum).
//   reduction, amax, amin:      g expanded back to x's shape: a shard of x stays a shard.
//   expand:                     g summed over the expanded dims: a shard of one gives P(sum).
//   cat, stack:                 each operand's slice of g: a shard of another dim stays.

// One mesh axis of a backward step.
struct AxisGrad {
  std::vector<Placement> ins;  // the operands' forward placements (after redistribution)
  Placement out;               // the output's placement (Rd restored)
  Placement g;                 // the incoming gradient's
  size_t input = 0;            // the operand whose contribution is asked for
  int64_t n = 1, bytes = 0, rank = 0;
  OpAttrs attrs;               // dims resolved
  std::vector<Shape> shapes;   // the operands'
  Shape out_shape;
  std::string op;

  Placement operand(size_t i) const { return as_rule_input(ins.at(i)); }
  RowCtx ctx() const { return {shapes, out_shape, attrs, op}; }
};
// A backward step on one axis: what the incoming gradient must be, the contribution's placement,
// and the rule read (the table and its row, "mul S(d), S(d) -> S(d)"; or a branch), for coverage.
struct Grad {
  Placement in, out;
  const char* table = nullptr;  // null for a branch of a family without a table
  std::string_view row;
  std::string suffix = {};      // a step after the row: " then summed over a broadcast dim"

  std::string rule() const {
    return (table ? std::string(table) + " " : std::string()) + std::string(row) + suffix;
  }
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

// A result-shaped contribution summed to the shape of operand `input` (broadcast dims summed):
// a shard of a dim the operand is broadcast over becomes P(sum).
Grad summed_to_operand(Grad g, const AxisGrad& x) {
  if (!g.out.is_shard()) return g;
  const int64_t k = aligned(x.shapes.at(x.input), x.out_shape, g.out.dim);
  if (k >= 0) {
    g.out = Placement::shard(k);
  } else {
    // Planted bug: the ranks' partial sums are taken for the whole (no all_reduce follows).
    g.out = mutant_on(Mutant::BroadcastGradNotSummed) ? Placement::replicate() : Placement::partial(ReduceOp::Sum);
    g.suffix = " then summed over a broadcast dim";
  }
  return g;
}

Grad add_gradient(const AxisGrad& x) {
  return summed_to_operand({x.g, x.g, nullptr, "+-g, laid out as g"}, x);
}

Grad own_table(const char* table, const std::vector<RuleRow>& rows, const AxisGrad& x) {
  return gradient_row(table, rows, 0, nullptr, x);
}

Grad times_operand(const AxisGrad& x) {
  const Placement fixed = x.operand(0);
  const std::vector<Shape> shapes{x.shapes.at(0), x.shapes.at(0)};
  return gradient_row("mul", mul_rows({shapes, x.shapes.at(0), x.attrs}), 1, &fixed, x);
}

// The product of g (the result's shape) and the other operand (its own shape) in a binary
// pointwise table, g in the slot of `input`, then summed to the operand's shape.
Grad product_gradient(const char* table, std::vector<RuleRow> (*rows)(const RowCtx&), size_t g_pos,
                      const AxisGrad& x) {
  std::vector<Shape> shapes = x.shapes;
  shapes.at(g_pos) = x.out_shape;
  const Placement other = x.operand(1 - g_pos);
  return summed_to_operand(gradient_row(table, rows({shapes, x.out_shape, x.attrs}), g_pos, &other, x), x);
}

Grad mul_gradient(const AxisGrad& x) { return product_gradient("mul", mul_rows, x.input, x); }

Grad div_gradient(const AxisGrad& x) {
  return x.input == 0 ? product_gradient("div", div_rows, 0, x) : product_gradient("mul", mul_rows, 1, x);
}

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

Grad reduction_gradient(const AxisGrad& x) {
  const Placement& in = x.ins.at(0);
  if (!in.is_shard()) return {x.g, x.g, nullptr, "operand not sharded: g expanded, laid out as g"};
  if (reduces(x.attrs, in.dim))
    return {x.g.is_replicate() ? x.g : Placement::replicate(), in, nullptr,
            "S(dim) reduced: g replicated, expanded to S(dim)"};
  return {x.out, in, nullptr, "S(d) kept: g laid out as the output, expanded to S(d)"};
}

// A view's gradient is g viewed back: the view table from the result's shape to the operand's.
Grad view_gradient(const AxisGrad& x) {
  return own_table("view back", view_rows_of(view_groups_for(x.op, x.attrs, x.shapes.at(0), x.out_shape), true), x);
}

Grad permute_gradient(const AxisGrad& x) {
  OpAttrs inverse = x.attrs;
  for (size_t j = 0; j < x.attrs.dims.size(); ++j) inverse.dims[x.attrs.dims[j]] = static_cast<int64_t>(j);
  const std::vector<Shape> shapes{x.out_shape};
  return own_table("permute back", permute_rows({shapes, x.shapes.at(0), inverse}), x);
}

// expand: g summed over the expanded dims (new leading dims and expanded size-1 dims).
Grad expand_gradient(const AxisGrad& x) {
  if (!x.g.is_shard()) return {x.g, x.g, nullptr, "g summed over the expanded dims, laid out as g"};
  const int64_t k = aligned(x.shapes.at(0), x.out_shape, x.g.dim);
  if (k >= 0) return {x.g, Placement::shard(k), nullptr, "S(d) of a kept dim: g summed over the expanded dims, S(d)"};
  return {x.g, Placement::partial(ReduceOp::Sum), nullptr, "S(d) of an expanded dim: g summed over it, P(sum)"};
}

// cat / stack: operand i's slice of g along the joined dim.
Grad join_gradient(const AxisGrad& x, bool stack) {
  if (!x.g.is_shard()) return {x.g, x.g, nullptr, "g sliced, laid out as g"};
  const int64_t d = *x.attrs.dim;
  if (x.g.dim == d)  // the joined dim (stack: the new one): each rank's chunk is not the slice
    return {Placement::replicate(), Placement::replicate(), nullptr, "S(joined dim): g replicated, sliced"};
  const int64_t k = stack && x.g.dim > d ? x.g.dim - 1 : x.g.dim;
  return {x.g, Placement::shard(k), nullptr, "S(d) of another dim: g sliced, S(d)"};
}

Grad narrow_gradient(const AxisGrad& x) {
  const std::vector<Shape> shapes{x.out_shape};
  return own_table("narrow", narrow_rows({shapes, x.shapes.at(0), x.attrs}), x);
}

// An operand without a gradient (a condition, a mask, ids, targets): never asked for one.
[[noreturn]] void no_gradient(const AxisGrad& x, const char* what) {
  throw SemanticError(ErrorKind::NotDifferentiable, x.op + ": " + what + " has no gradient");
}

// where: the incoming gradient where the condition picks the operand, zeros elsewhere (linear in
// g, laid out as g), then summed over the operand's broadcast dims.
Grad where_gradient(const AxisGrad& x) {
  if (x.input == 0) no_gradient(x, "the condition");
  return summed_to_operand({x.g, x.g, nullptr, "g where picked, laid out as g"}, x);
}

Grad masked_fill_gradient(const AxisGrad& x) {
  if (x.input == 1) no_gradient(x, "the mask");
  return {x.g, x.g, nullptr, "g zeroed where filled, laid out as g"};
}

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

// pick_target: -g scattered into the picked column of each row.
Grad pick_target_gradient(const AxisGrad& x) {
  if (x.input == 1) no_gradient(x, "the target");
  const Placement lp = x.operand(0);
  if (lp.is_shard() && lp.dim == 0) return {lp, lp, nullptr, "log_probs S(0): g S(0), scattered, S(0)"};
  if (lp.is_shard()) return {Placement::replicate(), lp, nullptr, "log_probs S(1): g replicated, scattered into the rank's class range, S(1)"};
  return {Placement::replicate(), Placement::replicate(), nullptr, "log_probs not sharded: g replicated, scattered, R"};
}

// ---------------------------------------------------------------------------------------------
// The registry: one entry per family, in the order of the tables above.

struct Family {
  RuleFamily names;
  size_t arity;  // 0: any number
  std::vector<RuleRow> (*rows)(const RowCtx&);
  Grad (*backward)(const AxisGrad&);
};

const std::vector<Family>& registry() {
  using C = const RowCtx&;
  using X = const AxisGrad&;
  static const std::vector<Family> families = {
      {{"linear_binary", {"add", "sub"}}, 2, linear_binary_rows, add_gradient},
      {{"linear_unary", {"neg", "scale"}}, 1, linear_unary_rows,
       [](X x) { return own_table("linear_unary", linear_unary_rows(x.ctx()), x); }},
      {{"nonlinear_unary", {"abs", "exp", "gelu", "log", "pow", "relu", "rsqrt", "sigmoid", "silu", "sin", "sqrt", "tanh"}},
       1, nonlinear_unary_rows, times_operand},
      {{"mul", {"mul"}}, 2, mul_rows, mul_gradient},
      {{"div", {"div"}}, 2, div_rows, div_gradient},
      {{"mm", {"mm"}}, 2, [](C) { return mm_rows(); }, mm_gradient},
      {{"matmul", {"bmm", "matmul"}}, 2, matmul_rows, matmul_gradient},
      {{"transpose", {"transpose"}}, 1, transpose_rows,
       [](X x) { return own_table("transpose", transpose_rows(x.ctx()), x); }},
      {{"permute", {"permute"}}, 1, permute_rows, permute_gradient},
      {{"view", {"flatten", "reshape", "squeeze", "unflatten", "unsqueeze", "view"}}, 1, view_rows, view_gradient},
      {{"expand", {"expand"}}, 1, expand_rows, expand_gradient},
      {{"cat", {"cat"}}, 0, [](C c) { return join_rows(c, false); }, [](X x) { return join_gradient(x, false); }},
      {{"stack", {"stack"}}, 0, [](C c) { return join_rows(c, true); }, [](X x) { return join_gradient(x, true); }},
      {{"narrow", {"narrow"}}, 1, narrow_rows, narrow_gradient},
      {{"reduction", {"mean", "sum"}}, 1, reduction_rows, reduction_gradient},
      {{"amax", {"amax"}}, 1, [](C c) { return extremum_rows(c, "P(max)"); }, reduction_gradient},
      {{"amin", {"amin"}}, 1, [](C c) { return extremum_rows(c, "P(min)"); }, reduction_gradient},
      {{"softmax", {"log_softmax", "softmax"}}, 1, softmax_rows, times_operand},
      {{"where", {"where"}}, 3, where_rows, where_gradient},
      {{"masked_fill", {"masked_fill"}}, 2, masked_fill_rows, masked_fill_gradient},
      {{"triangle", {"tril", "triu"}}, 1, triangle_rows,
       [](X x) { return own_table("triangle", triangle_rows(x.ctx()), x); }},
      {{"norm", {"layer_norm", "rms_norm"}}, 0, norm_rows, norm_gradient},
      {{"embedding", {"embedding"}}, 2, embedding_rows, embedding_gradient},
      {{"pick_target", {"pick_target"}}, 2, pick_target_rows, pick_target_gradient},
      {{"count_targets", {"count_targets"}}, 1, count_targets_rows, [](X x) -> Grad { no_gradient(x, "the target"); }},
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

std::vector<RuleRow> rule_rows_for(const std::string& op, const std::vector<Shape>& shapes, const OpAttrs& attrs) {
  const Family& family = family_of(op);
  const Shape out = infer_shape(op, shapes, attrs);
  const OpAttrs a = resolved(op, attrs, static_cast<int64_t>(shapes.at(0).size()), shape_str(shapes.at(0)));
  return family.rows({shapes, out, a, op});
}

std::vector<RuleRow> rule_rows(const std::string& op, const std::vector<int64_t>& ranks, const OpAttrs& attrs) {
  // Operands of the given ranks, every extent 2 (no broadcasting); view ops keep their shape.
  const size_t arity = family_of(op).arity;
  std::vector<Shape> shapes;
  for (int64_t r : ranks)
    if (arity == 0 || shapes.size() < arity) shapes.push_back(Shape(static_cast<size_t>(r), 2));
  while (shapes.size() < arity) shapes.push_back(shapes.back());
  return rule_rows_for(op, shapes, attrs);
}

// ---------------------------------------------------------------------------------------------
// Shapes

namespace {

Shape broadcast_shapes(const std::string& op, const std::vector<Shape>& s) {
  size_t rank = 0;
  for (const auto& x : s) rank = std::max(rank, x.size());
  Shape out(rank, 1);
  for (const auto& x : s)
    for (size_t i = 0; i < x.size(); ++i) {
      int64_t& o = out[out.size() - x.size() + i];
      if (x[i] == o || x[i] == 1) continue;
      if (o != 1)
        throw SemanticError(ErrorKind::ShapeMismatch, op + ": operand shapes " + shape_str(s[0]) + " and " +
                                                          shape_str(s[1]) + (s.size() > 2 ? " and " + shape_str(s[2]) : "") +
                                                          " do not broadcast (dim " + std::to_string(i) + " of " +
                                                          shape_str(x) + ")");
      o = x[i];
    }
  return out;
}

// A shape with one -1 filled in so that it holds `count` elements; ShapeMismatch otherwise.
Shape filled(const std::string& op, Shape shape, int64_t count, const Shape& from) {
  int64_t known = 1, unknown = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (unknown >= 0) throw SemanticError(ErrorKind::ShapeMismatch, op + ": only one dim may be -1 in " + shape_str(shape));
      unknown = static_cast<int64_t>(i);
    } else if (shape[i] < 0) {
      throw SemanticError(ErrorKind::ShapeMismatch, op + ": negative extent in " + shape_str(shape));
    } else {
      known *= shape[i];
    }
  }
  if (unknown >= 0) {
    if (known == 0 || count % known != 0)
      throw SemanticError(ErrorKind::ShapeMismatch,
                          op + ": " + shape_str(shape) + " cannot hold the " + std::to_string(count) +
                              " elements of " + shape_str(from));
    shape[unknown] = count / known;
  }
  if (numel(shape) != count)
    throw SemanticError(ErrorKind::ShapeMismatch, op + ": " + shape_str(shape) + " holds " +
                                                      std::to_string(numel(shape)) + " elements, " + shape_str(from) +
                                                      " holds " + std::to_string(count));
  return shape;
}

Shape matmul_shape(const std::string& op, const Shape& a, const Shape& b) {
  auto fail = [&](const std::string& why) {
    throw SemanticError(ErrorKind::ShapeMismatch, op + ": " + why + ": " + shape_str(a) + " @ " + shape_str(b));
  };
  if (a.empty() || b.empty()) fail("needs operands of at least 1 dim");
  if (op == "bmm") {
    if (a.size() != 3 || b.size() != 3) fail("needs 3-D operands");
    if (a[0] != b[0]) fail("batch dims differ");
  }
  const int64_t ka = a.back(), kb = b.size() == 1 ? b[0] : b[b.size() - 2];
  if (ka != kb) fail("inner dims differ");
  const Shape ba(a.begin(), a.end() - std::min<size_t>(a.size(), 2)), bb(b.begin(), b.end() - std::min<size_t>(b.size(), 2));
  Shape out = ba.size() || bb.size() ? broadcast_shapes(op, {ba.empty() ? Shape{} : ba, bb.empty() ? Shape{} : bb}) : Shape{};
  if (a.size() >= 2) out.push_back(a[a.size() - 2]);
  if (b.size() >= 2) out.push_back(b.back());
  return out;
}

}  // namespace

Shape infer_shape(const std::string& op, const std::vector<Shape>& s, const OpAttrs& attrs) {
  auto fail = [&](const std::string& why) {
    throw SemanticError(ErrorKind::ShapeMismatch, op + ": " + why);
  };
  const Family& f = family_of(op);
  const std::string& family = f.names.name;
  if (f.arity == 0 ? s.empty() : s.size() != f.arity)
    fail("takes " + (f.arity ? std::to_string(f.arity) : std::string("one or more")) + " operand(s), got " +
         std::to_string(s.size()));
  const auto rank = static_cast<int64_t>(s[0].size());
  const OpAttrs a = resolved(op, attrs, rank, shape_str(s[0]));
  if (family == "mm") {
    if (s[0].size() != 2 || s[1].size() != 2)
      fail("needs 2-D operands, got " + shape_str(s[0]) + " and " + shape_str(s[1]));
    if (s[0][1] != s[1][0]) fail("inner dims differ: " + shape_str(s[0]) + " @ " + shape_str(s[1]));
    return {s[0][0], s[1][1]};
  }
  if (family == "matmul") return matmul_shape(op, s[0], s[1]);
  if (family == "masked_fill") {
    if (broadcast_shapes(op, s) != s[0]) fail("the mask " + shape_str(s[1]) + " does not broadcast to " + shape_str(s[0]));
    return s[0];
  }
  if (family == "embedding") {
    if (s[1].size() != 2) fail("the weight must be 2-D [vocab, dim], got " + shape_str(s[1]));
    Shape out = s[0];
    out.push_back(s[1][1]);
    return out;
  }
  if (family == "pick_target") {
    if (s[0].size() != 2 || s[1].size() != 1 || s[1][0] != s[0][0])
      fail("needs log_probs [N, C] and a target [N], got " + shape_str(s[0]) + " and " + shape_str(s[1]));
    return {s[0][0]};
  }
  if (family == "norm") {
    const auto& ns = a.normalized_shape;
    const auto k = static_cast<int64_t>(ns.size());
    if (s.size() > 3) fail("takes x, weight and bias, got " + std::to_string(s.size()) + " operands");
    if (k == 0 || k > rank || !std::equal(ns.begin(), ns.end(), s[0].end() - k))
      fail("normalized_shape " + shape_str(ns) + " is not the trailing dims of " + shape_str(s[0]));
    for (size_t i = 1; i < s.size(); ++i)
      if (s[i] != ns) fail((i == 1 ? "the weight " : "the bias ") + shape_str(s[i]) + " is not normalized_shape " + shape_str(ns));
    return s[0];
  }
  if (family == "triangle" && rank < 2) fail("needs at least 2 dims, got " + shape_str(s[0]));
  if (f.arity >= 2) return broadcast_shapes(op, s);  // pointwise
  if (family == "transpose") {
    Shape out = s[0];
    std::swap(out[a.dim0], out[a.dim1]);
    return out;
  }
  if (family == "permute") {
    Shape out;
    for (int64_t d : a.dims) out.push_back(s[0][d]);
    return out;
  }
  if (family == "reduction" || family == "amax" || family == "amin") {
    Shape out;
    for (int64_t d = 0; d < rank; ++d) {
      if (!reduces(a, d)) out.push_back(s[0][d]);
      else if (a.keepdim) out.push_back(1);
    }
    return out;
  }
  if (family == "cat" || family == "stack") {
    Shape out = s[0];
    for (size_t i = 1; i < s.size(); ++i) {
      bool fits = s[i].size() == s[0].size();
      for (int64_t d = 0; fits && d < rank; ++d) fits = family == "stack" || d == *a.dim ? true : s[i][d] == s[0][d];
      if (family == "stack") fits = fits && s[i] == s[0];
      if (!fits) fail("operand shapes differ: " + shape_str(s[0]) + " and " + shape_str(s[i]));
      if (family == "cat") out[*a.dim] += s[i][*a.dim];
    }
    if (family == "stack") out.insert(out.begin() + *a.dim, static_cast<int64_t>(s.size()));
    return out;
  }
  if (family == "narrow") {
    const int64_t n = s[0][*a.dim];
    const int64_t start = a.start < 0 ? a.start + n : a.start;
    if (start < 0 || start > n || a.length < 0 || start + a.length > n)
      fail("start " + std::to_string(a.start) + " and length " + std::to_string(a.length) + " out of range for dim " +
           std::to_string(*a.dim) + " of " + shape_str(s[0]));
    Shape out = s[0];
    out[*a.dim] = a.length;
    return out;
  }
  if (family == "expand") {
    if (a.shape.size() < s[0].size()) fail("shape " + shape_str(a.shape) + " has fewer dims than " + shape_str(s[0]));
    Shape out = a.shape;
    const size_t lead = out.size() - s[0].size();
    for (size_t i = 0; i < out.size(); ++i) {
      const int64_t have = i < lead ? -2 : s[0][i - lead];
      if (out[i] == -1) {
        if (i < lead) fail("-1 in a new leading dim of " + shape_str(a.shape));
        out[i] = have;
      } else if (out[i] < 0) {
        fail("negative extent in " + shape_str(a.shape));
      } else if (i >= lead && have != out[i] && have != 1) {
        fail("cannot expand " + shape_str(s[0]) + " to " + shape_str(a.shape) + " (dim " + std::to_string(i - lead) + ")");
      }
    }
    return out;
  }
  if (family == "view") {
    const int64_t count = numel(s[0]);
    if (op == "view" || op == "reshape") return filled(op, a.shape, count, s[0]);
    if (op == "flatten") {
      if (rank == 0) return {1};
      Shape out(s[0].begin(), s[0].begin() + a.start_dim);
      int64_t merged = 1;
      for (int64_t d = a.start_dim; d <= a.end_dim; ++d) merged *= s[0][d];
      out.push_back(merged);
      out.insert(out.end(), s[0].begin() + a.end_dim + 1, s[0].end());
      return out;
    }
    if (op == "unflatten") {
      Shape sizes = filled(op, a.sizes, s[0][*a.dim], s[0]);
      Shape out(s[0].begin(), s[0].begin() + *a.dim);
      out.insert(out.end(), sizes.begin(), sizes.end());
      out.insert(out.end(), s[0].begin() + *a.dim + 1, s[0].end());
      return out;
    }
    if (op == "unsqueeze") {
      Shape out = s[0];
      out.insert(out.begin() + *a.dim, 1);
      return out;
    }
    if (op == "squeeze") {
      Shape out;
      for (int64_t d = 0; d < rank; ++d)
        if (s[0][d] != 1 || (a.dim && *a.dim != d)) out.push_back(s[0][d]);
      return out;
    }
  }
  return s[0];  // pointwise unary, softmax
}

// ---------------------------------------------------------------------------------------------
// Forward propagation

namespace {

// The row of one mesh axis for operands `given`, by the order stated in propagation.h.
const RuleRow* choose_row(const std::vector<RuleRow>& rows, const std::vector<Placement>& given, int64_t n,
                          const std::vector<int64_t>& bytes, bool replicate_first = false) {
  for (const auto& row : rows)
    if (row_cost(given, row.ins, n, bytes, false) == std::pair<int64_t, int64_t>{0, 0}) return &row;
  if (given.size() == 1)
    for (const auto& row : rows)
      if (row.ins[0] == Placement::replicate()) return &row;
  // The norms replace the input's placement by R, the others staying as they are (PyTorch's
  // native_layer_norm strategy), rather than moving a shard to another dim.
  if (replicate_first)
    for (const auto& row : rows) {
      if (row.ins[0] != Placement::replicate()) continue;
      std::vector<Placement> rest(given.begin() + 1, given.end()), want(row.ins.begin() + 1, row.ins.end());
      if (row_cost(rest, want, n, std::vector<int64_t>(bytes.begin() + 1, bytes.end()), false).first == 0) return &row;
    }
  // A row giving P(max) or P(min) is taken only by operands already there: making a replica
  // P(max) to fit it would cut the gradient path (P(max) has no cotangent).
  const RuleRow* best = nullptr;
  std::pair<int64_t, int64_t> best_cost{std::numeric_limits<int64_t>::max(), 0};
  for (const auto& row : rows) {
    if (row.out.is_partial() && !is_linear(row.out.op)) continue;
    auto cost = row_cost(given, row.ins, n, bytes, false);
    if (cost.first >= 0 && cost < best_cost) {
      best = &row;
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace

namespace {

// The input dims of `in_shape` whose view group (view_groups) holds different elements on some
// rank under `in_spec` and `out_spec`: a kept shard of a group's leading dim is the same elements
// on both sides only where the chunks line up (always for even shards; for uneven ones, where the
// inner extent times the chunk boundaries agree).
std::set<int64_t> view_layout_mismatches(const Mesh& mesh, const Spec& in_spec, const Spec& out_spec,
                                         const Shape& in_shape, const Shape& out_shape, std::string_view op,
                                         const OpAttrs& attrs) {
  std::set<int64_t> bad;
  const auto groups = view_groups_for(op, attrs, in_shape, out_shape);
  for (int64_t r = 0; r < mesh.size(); ++r) {
    const LocalLayout li = local_layout(mesh, in_spec, in_shape, r), lo = local_layout(mesh, out_spec, out_shape, r);
    for (const auto& g : groups) {
      if (g.in.empty() || g.out.empty()) continue;
      int64_t qi = 1, qo = 1;
      for (size_t k = 1; k < g.in.size(); ++k) qi *= in_shape[g.in[k]];
      for (size_t k = 1; k < g.out.size(); ++k) qo *= out_shape[g.out[k]];
      if (li.offset[g.in[0]] * qi != lo.offset[g.out[0]] * qo || li.shape[g.in[0]] * qi != lo.shape[g.out[0]] * qo)
        bad.insert(g.in[0]);
    }
  }
  return bad;
}

}  // namespace

ShardingDecision propagate(const std::string& op, const Mesh& mesh, const std::vector<Spec>& specs,
                           const std::vector<Shape>& shapes, const OpAttrs& attrs) {
  ShardingDecision d;
  d.out_shape = infer_shape(op, shapes, attrs);
  std::vector<int64_t> bytes;
  for (const auto& s : shapes) bytes.push_back(bytes_of(s));
  const OpAttrs a_res = resolved(op, attrs, static_cast<int64_t>(shapes.at(0).size()), shape_str(shapes.at(0)));
  const auto rows = family_of(op).rows({shapes, d.out_shape, a_res, op});
  d.in_specs = specs;
  d.out_spec.assign(mesh.ndim(), Placement::replicate());
  std::vector<const RuleRow*> chosen;
  for (int a = 0; a < mesh.ndim(); ++a) {
    std::vector<Placement> given;
    for (const auto& s : specs) given.push_back(s[a]);
    const RuleRow* best = choose_row(rows, given, mesh.axis_size(a), bytes, family_of(op).names.name == "norm");
    if (!best)
      throw SemanticError(ErrorKind::IllegalRedistribute,
                          op + ": no legal placement for mesh axis " + mesh.axes()[a]);
    for (size_t i = 0; i < specs.size(); ++i)
      if (!same_for_rule(specs[i][a], best->ins[i])) d.in_specs[i][a] = best->ins[i];
    d.out_spec[a] = best->out;
    chosen.push_back(best);
  }
  // A view keeps a shard only where each rank's chunk is the same elements before and after;
  // elsewhere (uneven chunks that do not line up) the operand is gathered on that axis first.
  if (family_of(op).names.name == "view") {
    const RuleRow* replicate = nullptr;
    for (const auto& row : rows)
      if (row.ins[0] == Placement::replicate()) replicate = &row;
    for (bool changed = true; changed;) {
      changed = false;
      const auto bad = view_layout_mismatches(mesh, d.in_specs[0], d.out_spec, shapes[0], d.out_shape, op, a_res);
      for (int a = 0; a < mesh.ndim(); ++a)
        if (d.in_specs[0][a].is_shard() && bad.count(d.in_specs[0][a].dim)) {
          d.in_specs[0][a] = Placement::replicate();
          d.out_spec[a] = Placement::replicate();
          chosen[a] = replicate;
          changed = true;
        }
    }
  }
  for (int a = 0; a < mesh.ndim(); ++a) {
    d.rows.push_back(op + ": " + chosen[a]->str());
    if (coverage_sink()) cover("forward " + op + ": " + std::string(chosen[a]->rule));
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
  x.shapes = shapes;
  x.out_shape = infer_shape(op, shapes, attrs);
  x.op = op;
  x.bytes = bytes_of(x.out_shape);
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

namespace {

// The operands and attributes the coverage enumeration builds each op's tables for: enough
// shapes (broadcast pairs, matmul ranks, view groups) and attributes to reach every row.
struct CoverageCase {
  std::vector<Shape> shapes;
  OpAttrs attrs;
};

std::vector<CoverageCase> coverage_cases(const std::string& family, const std::string& op) {
  std::vector<CoverageCase> out;
  auto add = [&](std::vector<Shape> shapes, OpAttrs a = {}) { out.push_back({std::move(shapes), std::move(a)}); };
  auto cube = [](int64_t r) { return Shape(static_cast<size_t>(r), 2); };
  auto with = [](auto f) {
    OpAttrs a;
    f(a);
    return a;
  };
  if (family == "linear_binary" || family == "mul" || family == "div") {
    for (int64_t r = 1; r <= 3; ++r) add({cube(r), cube(r)});
    for (const auto& p : std::vector<std::pair<Shape, Shape>>{
             {{2, 2}, {2}}, {{2}, {2, 2}}, {{2, 2}, {1, 2}}, {{1, 2}, {2, 2}}, {{2, 2}, {}}, {{}, {2, 2}}})
      add({p.first, p.second});
  } else if (family == "where") {
    for (int64_t r = 1; r <= 2; ++r) add({cube(r), cube(r), cube(r)});
    add({{2}, {2, 2}, {2, 2}});
    add({{2, 2}, {2}, {1, 2}});
    add({{2, 2}, {2, 2}, {}});
    // Each of the three operands whole or broadcast over the leading dim: every mix of S(d) and R.
    for (int mix = 0; mix < 8; ++mix) {
      std::vector<Shape> shapes;
      for (int i = 0; i < 3; ++i) shapes.push_back((mix >> i) & 1 ? Shape{1, 2} : cube(2));
      add(shapes);
    }
  } else if (family == "masked_fill") {
    for (int64_t r = 1; r <= 2; ++r) add({cube(r), cube(r)});
    add({{2, 2}, {2}});
    add({{2, 2}, {1, 2}});
  } else if (family == "norm") {
    for (int64_t r = 1; r <= 2; ++r)
      for (int64_t k = 1; k <= r; ++k)
        for (size_t params = 0; params <= 2 && (op == "layer_norm" || params < 2); ++params) {
          std::vector<Shape> shapes{cube(r)};
          for (size_t p = 0; p < params; ++p) shapes.push_back(cube(k));
          add(shapes, with([&](OpAttrs& a) { a.normalized_shape = cube(k); }));
        }
  } else if (family == "embedding") {
    for (int64_t r = 1; r <= 2; ++r) add({cube(r), cube(2)});
  } else if (family == "pick_target") {
    add({cube(2), cube(1)});
  } else if (family == "mm") {
    add({cube(2), cube(2)});
  } else if (family == "matmul") {
    if (op == "bmm") add({cube(3), cube(3)});
    else
      for (const auto& p : std::vector<std::pair<Shape, Shape>>{{{2}, {2}},
                                                                  {{2, 2}, {2}},
                                                                  {{2}, {2, 2}},
                                                                  {{2, 2}, {2, 2}},
                                                                  {{2, 2, 2}, {2, 2, 2}},
                                                                  {{2, 2, 2}, {2, 2}},
                                                                  {{2, 2}, {2, 2, 2}},
                                                                  {{1, 2, 2}, {2, 2, 2}},
                                                                  {{2, 2, 2}, {1, 2, 2}},
                                                                  {{2, 2, 2}, {2}},
                                                                  {{2}, {2, 2, 2}}})
        add({p.first, p.second});
  } else if (family == "permute") {
    for (int64_t r = 1; r <= 3; ++r) {
      std::vector<int64_t> dims(static_cast<size_t>(r));
      for (int64_t i = 0; i < r; ++i) dims[i] = i;
      do add({cube(r)}, with([&](OpAttrs& a) { a.dims = dims; }));
      while (std::next_permutation(dims.begin(), dims.end()));
    }
  } else if (family == "view") {
    if (op == "view" || op == "reshape")
      for (const auto& p : std::vector<std::pair<Shape, Shape>>{
               {{2, 2}, {4}}, {{4}, {2, 2}}, {{2, 3}, {3, 2}}, {{2, 2, 2}, {4, 2}}, {{2, 2, 2}, {2, 4}}, {{2, 2}, {2, 2}}, {{2}, {1, 2}}})
        add({p.first}, with([&](OpAttrs& a) { a.shape = p.second; }));
    if (op == "flatten")
      for (const auto& se : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}, {0, 2}, {1, 1}})
        add({cube(3)}, with([&](OpAttrs& a) {
              a.start_dim = se.first;
              a.end_dim = se.second;
            }));
    if (op == "unflatten") {
      add({{4}}, with([](OpAttrs& a) { a.dim = 0; a.sizes = {2, 2}; }));
      add({{2, 4}}, with([](OpAttrs& a) { a.dim = 1; a.sizes = {2, 2}; }));
    }
    if (op == "squeeze") {
      add({{1, 2}}, with([](OpAttrs& a) { a.dim = 0; }));
      add({{2, 1}});
    }
    if (op == "unsqueeze")
      for (int64_t d = 0; d <= 2; ++d) add({cube(2)}, with([&](OpAttrs& a) { a.dim = d; }));
  } else if (family == "expand") {
    for (const auto& p : std::vector<std::pair<Shape, Shape>>{{{2}, {2, 2}}, {{1, 2}, {2, 2}}, {{2, 1}, {2, 2}}, {{2, 2}, {2, 2}}})
      add({p.first}, with([&](OpAttrs& a) { a.shape = p.second; }));
  } else if (family == "cat" || family == "stack") {
    for (int64_t r = 1; r <= 3; ++r)
      for (int64_t d = 0; d < r + (family == "stack" ? 1 : 0); ++d)
        add({cube(r), cube(r)}, with([&](OpAttrs& a) { a.dim = d; }));
  } else if (family == "narrow") {
    for (int64_t r = 1; r <= 3; ++r)
      for (int64_t d = 0; d < r; ++d) add({cube(r)}, with([&](OpAttrs& a) { a.dim = d; a.length = 1; }));
  } else {
    // Unary families: every dim or none, keepdim or not, every pair of transpose dims; reductions
    // over lists of dims too.
    for (int64_t r = 1; r <= 3; ++r) {
      for (const auto& a : attr_variants(r)) {
        if ((op == "softmax" || op == "log_softmax") && !a.dim) continue;
        if (family == "triangle" && r < 2) continue;
        add({cube(r)}, a);
      }
      if (family == "reduction" || family == "amax" || family == "amin")
        for (bool keepdim : {false, true})
          for (const auto& dims : std::vector<std::vector<int64_t>>{{0, 1}, {0, 2}, {1, 2}, {}})
            if (r == 3 || (dims.size() < 2 || dims[1] < r))
              add({cube(r)}, with([&](OpAttrs& a) {
                    a.dims = dims;
                    a.dims_given = true;
                    a.keepdim = keepdim;
                  }));
    }
  }
  return out;
}

bool fits(const Placement& p, size_t rank) { return !p.is_shard() || p.dim < static_cast<int64_t>(rank); }

}  // namespace

std::vector<CoverageRow> propagation_coverage() {
  std::vector<CoverageRow> forward, backward;
  std::map<std::string, size_t> index;  // backward key -> position
  std::set<std::string> seen;
  for (const auto& f : registry())
    for (const auto& op : f.names.ops)
      for (const auto& c : coverage_cases(f.names.name, op)) {
        Shape out_shape;
        OpAttrs a;
        try {
          out_shape = infer_shape(op, c.shapes, c.attrs);
          a = resolved(op, c.attrs, static_cast<int64_t>(c.shapes[0].size()), shape_str(c.shapes[0]));
        } catch (const SemanticError&) {
          continue;
        }
        const auto rows = f.rows({c.shapes, out_shape, a, op});
        for (const auto& row : rows)
          if (seen.insert("forward " + op + ": " + std::string(row.rule)).second)
            forward.push_back({"forward " + op + ": " + std::string(row.rule), ""});
        // Backward: every operand, forward placements, output placement and incoming gradient, on
        // operands of at most 2 dims for the families whose rows do not need 3.
        size_t most = out_shape.size();
        for (const auto& sh : c.shapes) most = std::max(most, sh.size());
        // (triangle: a shard of a batch dim needs a third dim before the two it keeps whole.)
        const bool needs_three = f.names.name == "matmul" || f.names.name == "view" || f.names.name == "permute" ||
                                 f.names.name == "stack" || f.names.name == "expand" || f.names.name == "triangle";
        if (most > 2 && !needs_three) continue;
        const std::vector<Placement> placements = all_placements(static_cast<int64_t>(std::max<size_t>(most, 1)));
        AxisGrad x;
        x.n = 2;
        x.bytes = 64;
        x.rank = static_cast<int64_t>(c.shapes[0].size());
        x.attrs = a;
        x.shapes = c.shapes;
        x.out_shape = out_shape;
        x.op = op;
        const size_t arity = c.shapes.size();
        size_t combos = 1;
        for (size_t i = 0; i < arity; ++i) combos *= placements.size();
        for (size_t input = 0; input < arity; ++input) {
          x.input = input;
          for (size_t combo = 0; combo < combos; ++combo) {
            x.ins.clear();
            bool ok = true;
            for (size_t i = 0, k = combo; i < arity; ++i, k /= placements.size()) {
              x.ins.push_back(placements[k % placements.size()]);
              ok = ok && fits(x.ins.back(), c.shapes[i].size());
            }
            if (!ok) continue;
            for (const auto& out : placements)
              for (const auto& g : placements) {
                if (!fits(out, out_shape.size()) || !fits(g, out_shape.size())) continue;
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

OpAttrs op_attrs(const OpDecl& decl) {
  OpAttrs a;
  static const nlohmann::json kNone = nlohmann::json::object();
  const auto& j = decl.attrs.is_object() ? decl.attrs : kNone;
  auto integer = [&](const char* key) { return j.contains(key) && j[key].is_number_integer(); };
  auto ints = [&](const char* key) {
    std::vector<int64_t> out;
    if (j.contains(key) && j[key].is_array())
      for (const auto& v : j[key])
        if (v.is_number_integer()) out.push_back(v.get<int64_t>());
    return out;
  };
  if (integer("dim")) a.dim = j["dim"].get<int64_t>();
  if (j.contains("dim") && j["dim"].is_array()) {
    a.dims = ints("dim");
    a.dims_given = true;
  }
  if (j.contains("dims")) a.dims = ints("dims");  // permute
  if (j.contains("keepdim") && j["keepdim"].is_boolean()) a.keepdim = j["keepdim"].get<bool>();
  const bool binary = decl.op == "add" || decl.op == "sub" || decl.op == "mul" || decl.op == "div";
  if (j.contains("value") && j["value"].is_number()) {
    a.value = j["value"].get<double>();
    a.scalar = binary;
  }
  if (decl.op == "masked_fill" || decl.op == "full") {
    if (j.contains("value") && j["value"].is_number()) a.fill = j["value"].get<double>();
    if (j.contains("value") && j["value"].is_string()) a.fill = j["value"] == "-inf" ? -INFINITY : INFINITY;
  }
  a.tanh = j.value("approximate", "none") == "tanh";
  if (j.contains("exponent") && j["exponent"].is_number()) a.exponent = j["exponent"].get<double>();
  if (integer("diagonal")) a.diagonal = j["diagonal"].get<int64_t>();
  a.normalized_shape = ints("normalized_shape");
  if (j.contains("eps") && j["eps"].is_number()) a.eps = j["eps"].get<double>();
  a.sum_reduction = j.value("reduction", "mean") == "sum";
  if (integer("ignore_index")) a.ignore_index = j["ignore_index"].get<int64_t>();
  if (integer("dim0")) a.dim0 = j["dim0"].get<int64_t>();
  if (integer("dim1")) a.dim1 = j["dim1"].get<int64_t>();
  a.shape = ints("shape");
  a.sizes = ints("sizes");
  if (integer("start_dim")) a.start_dim = j["start_dim"].get<int64_t>();
  if (integer("end_dim")) a.end_dim = j["end_dim"].get<int64_t>();
  if (integer("start")) a.start = j["start"].get<int64_t>();
  if (integer("length")) a.length = j["length"].get<int64_t>();
  if (integer("size")) a.split_size = j["size"].get<int64_t>();
  if (integer("chunks")) a.chunks = j["chunks"].get<int64_t>();
  return a;
}

}  // namespace meshsim

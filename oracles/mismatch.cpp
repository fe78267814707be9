#include "oracles/mismatch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/layout.h"
#include "sim/data.h"

namespace meshsim {

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// NaN and infinity have no JSON spelling: null.
nlohmann::json number_json(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

std::vector<int64_t> unravel(int64_t flat, at::IntArrayRef sizes) {
  std::vector<int64_t> index(sizes.size());
  for (size_t d = sizes.size(); d-- > 0;) {
    index[d] = flat % sizes[d];
    flat /= sizes[d];
  }
  return index;
}

double at_flat(const at::Tensor& flat, int64_t k) { return flat[k].item<double>(); }

// |a - e| elementwise: 0 where they agree (equal, both NaN, the same infinity), NaN where a NaN
// stands on one side only; as max_abs_diff (sim/data.h), element by element.
at::Tensor differences(const at::Tensor& a, const at::Tensor& e) {
  const at::Tensor agree = at::eq(a, e).logical_or(at::isnan(a).logical_and(at::isnan(e)));
  return at::where(agree, at::zeros_like(a), (a - e).abs());
}

// The elements outside tolerance: a NaN difference always, otherwise more than `allowed` (for
// tolerance 0, any difference: within() asks for none).
at::Tensor outside(const at::Tensor& diff, double allowed) { return at::isnan(diff).logical_or(at::gt(diff, allowed)); }

MismatchPoint point(const at::Tensor& a, const at::Tensor& e, at::IntArrayRef sizes, int64_t k, double diff) {
  return {true, unravel(k, sizes), at_flat(e, k), at_flat(a, k), diff};
}

// Exact equality with NaN equal to NaN, as assemble() asks of replicas.
bool same_local(const at::Tensor& x, const at::Tensor& y) {
  if (x.sizes() != y.sizes()) return false;
  if (x.is_same(y) || at::equal(x, y)) return true;
  if (!x.is_floating_point() || !y.is_floating_point()) return false;
  return at::eq(x, y).logical_or(at::isnan(x).logical_and(at::isnan(y))).all().item<bool>();
}

std::vector<ReplicaPair> disagreeing_replicas(const Mesh& mesh, const Spec& spec, const Locals& locals) {
  std::vector<ReplicaPair> out;
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (!spec[a].is_replicate()) continue;
    for (const auto& g : mesh.groups(a))
      for (size_t k = 1; k < g.size(); ++k)
        if (!same_local(locals[g[k]], locals[g[0]])) {
          ReplicaPair p{g[0], g[k], mesh.axes()[a], {}, 0, 0};
          const at::Tensor& x = locals[g[0]];
          const at::Tensor& y = locals[g[k]];
          if (x.sizes() == y.sizes() && x.numel() > 0) {
            const at::Tensor xd = x.detach().to(at::kDouble).reshape({-1}), yd = y.detach().to(at::kDouble).reshape({-1});
            const at::Tensor differ = xd.ne(yd).logical_and(at::isnan(xd).logical_and(at::isnan(yd)).logical_not());
            const int64_t at_k = differ.to(at::kByte).argmax().item<int64_t>();
            p.index = unravel(at_k, x.sizes());
            p.first_value = xd[at_k].item<double>();
            p.other_value = yd[at_k].item<double>();
          }
          out.push_back(p);
        }
  }
  return out;
}

// The ranks whose locals differ from `expected` laid out by `spec`. A Partial axis's parts are
// reduced over its groups first (in rank order, as assemble() does): one part alone is no part of
// the oracle's value, the group's reduction is.
std::vector<int64_t> wrong_ranks(const Mesh& mesh, const Spec& spec, const Locals& locals, const at::Tensor& expected,
                                 double allowed) {
  std::vector<int64_t> out;
  Locals cur;
  for (const auto& t : locals) cur.push_back(t.detach().to(at::kDouble));
  Spec whole = spec;
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (!spec[a].is_partial()) continue;
    whole[a] = Placement::replicate();
    for (const auto& g : mesh.groups(a)) {
      Locals group;
      for (auto r : g) group.push_back(cur[r]);
      const at::Tensor reduced = all_reduce(group, spec[a].op)[0];
      for (auto r : g) cur[r] = reduced;
    }
  }
  const Locals want = distribute(mesh, whole, expected, nullptr);
  for (int64_t r = 0; r < mesh.size(); ++r)
    if (cur[r].sizes() != want[r].sizes() || outside(differences(cur[r], want[r]), allowed).any().item<bool>())
      out.push_back(r);
  return out;
}

// The sets of mesh axes (of size > 1) whose sizes multiply to n, fewest axes first, then in mesh order.
std::vector<std::vector<std::string>> axes_with_product(const Mesh& mesh, int64_t n) {
  std::vector<int> axes;
  for (int a = 0; a < mesh.ndim(); ++a)
    if (mesh.axis_size(a) > 1) axes.push_back(a);
  std::vector<std::pair<int, uint32_t>> found;  // (count, mask)
  if (axes.size() > 20) return {};
  for (uint32_t mask = 1; mask < (1u << axes.size()); ++mask) {
    int64_t product = 1;
    int count = 0;
    for (size_t i = 0; i < axes.size() && product <= n; ++i)
      if (mask & (1u << i)) {
        product *= mesh.axis_size(axes[i]);
        ++count;
      }
    if (product == n) found.push_back({count, mask});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::vector<std::string>> out;
  for (const auto& [count, mask] : found) {
    std::vector<std::string> names;
    for (size_t i = 0; i < axes.size(); ++i)
      if (mask & (1u << i)) names.push_back(mesh.axes()[axes[i]]);
    out.push_back(names);
  }
  return out;
}

// Whether x is the integer n up to a relative 1e-9 (a ratio of rounded values).
bool near_integer(double x, int64_t n) { return std::abs(x - static_cast<double>(n)) <= 1e-9 * std::abs(x); }

// actual = c * expected everywhere (0 where expected is 0), every element finite; c from the
// largest |expected|, checked with a slack loose enough for the rounding of a division by c.
std::optional<MismatchFactor> constant_factor(const Mesh& mesh, const at::Tensor& a, const at::Tensor& e,
                                              double allowed) {
  if (!at::isfinite(a).all().item<bool>() || !at::isfinite(e).all().item<bool>()) return std::nullopt;
  if (!at::ne(e, 0).any().item<bool>()) return std::nullopt;
  const int64_t k = e.abs().argmax().item<int64_t>();
  const double c = at_flat(a, k) / at_flat(e, k);
  if (c == 1.0 || !std::isfinite(c)) return std::nullopt;
  const double slack = std::max(allowed, 1e-9 * std::max(1.0, a.abs().max().item<double>()));
  if ((a - e * c).abs().max().item<double>() > slack) return std::nullopt;

  MismatchFactor f;
  f.ratio = c;
  f.direction = "actual = " + num(c) + " x expected";
  int64_t product = 0;
  const int64_t n = std::llround(c);
  if (c > 1.5 && near_integer(c, n)) {
    f.ratio = static_cast<double>(n);
    f.direction = "actual = " + std::to_string(n) + " x expected";
    product = n;
  } else if (c > 0 && c < 1) {
    const int64_t m = std::llround(1.0 / c);
    if (m > 1 && near_integer(1.0 / c, m)) {
      f.ratio = 1.0 / static_cast<double>(m);
      f.direction = "actual = expected / " + std::to_string(m);
      product = m;
    }
  }
  if (product > 1) {
    auto sets = axes_with_product(mesh, product);
    if (!sets.empty()) {
      f.axes = sets.front();
      f.alternatives.assign(sets.begin() + 1, sets.end());
    }
  }
  // Not a product of axis sizes: the forms a wrong normalization takes (a variance's n - 1, a
  // std's sqrt(n), a mean's 1/n applied twice), over one axis, in mesh order.
  // One axis at a time (a normalization is over one group), and only where more than one element
  // says so (a single element is a multiple of anything).
  if (f.axes.empty() && c > 0 && at::ne(e, 0).sum().item<int64_t>() >= 2) {
    std::vector<int> axes;
    for (int a = 0; a < mesh.ndim(); ++a)
      if (mesh.axis_size(a) > 1) axes.push_back(a);
    bool found = false;
    for (size_t count = 1; count <= axes.size() && count <= 1 && !found; ++count)
      for (uint32_t mask = 1; mask < (1u << axes.size()) && !found; ++mask) {
        if (static_cast<size_t>(__builtin_popcount(mask)) != count) continue;
        double p = 1.0;
        std::vector<std::string> names;
        for (size_t i = 0; i < axes.size(); ++i)
          if (mask & (1u << i)) {
            p *= static_cast<double>(mesh.axis_size(axes[i]));
            names.push_back(mesh.axes()[axes[i]]);
          }
        const std::pair<double, const char*> forms[] = {
            {std::sqrt(p), "sqrt(n)"},   {1.0 / std::sqrt(p), "1/sqrt(n)"}, {p - 1, "n-1"},
            {1.0 / (p - 1), "1/(n-1)"},  {(p - 1) / p, "(n-1)/n"},       {p / (p - 1), "n/(n-1)"},
            {1.0 / (p * p), "1/n^2"},    {p * p, "n^2"}};
        for (const auto& [value, form] : forms) {
          if (value == 1.0 || std::abs(c - value) > 1e-9 * std::abs(value)) continue;
          f.axes = names;
          f.form = form;
          f.ratio = value;
          f.direction = "actual = " + num(value) + " x expected";
          found = true;
          break;
        }
      }
  }
  // One non-zero element is a multiple of anything: only a mesh product says something then.
  if (f.axes.empty() && at::ne(e, 0).sum().item<int64_t>() < 2) return std::nullopt;
  return f;
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string factor_text(const MismatchFactor& f) {
  std::string out = f.direction + " everywhere";
  if (f.axes.empty()) return out;
  if (!f.form.empty()) {  // n is the size of the axes named
    const std::string n = f.axes.size() == 1 ? "the size of mesh axis " + f.axes[0]
                                             : "the product of the sizes of mesh axes " + join(f.axes, ", ");
    return out + ": " + f.form + " where n is " + n;
  }
  out += f.axes.size() == 1 ? ": the size of mesh axis " + f.axes[0]
                            : ": the product of the sizes of mesh axes " + join(f.axes, ", ");
  std::vector<std::string> others;
  for (const auto& alt : f.alternatives) others.push_back(join(alt, ", "));
  if (!others.empty()) out += " (or of " + join(others, "; ") + ")";
  return out;
}

std::string ranks_text(const std::vector<int64_t>& ranks) {
  const size_t shown = std::min<size_t>(ranks.size(), 8);
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > shown) out += " and " + std::to_string(ranks.size() - shown) + " more";
  return out;
}

bool empty_shard(const at::Tensor& t) { return t.defined() && t.dim() > 0 && t.numel() == 0; }

// Where a NaN stands on one side only: the first such element, and an empty shard that explains
// it (torch.chunk leaves the last ranks nothing when a dim is shorter than the mesh axis, and a
// mean or a division over nothing is 0/0).
std::string nan_text(const at::Tensor& a, const at::Tensor& e, at::IntArrayRef sizes, const Locals& locals,
                     const std::vector<const DTensor*>& context) {
  const at::Tensor only_actual = at::isnan(a).logical_and(at::isnan(e).logical_not());
  if (only_actual.any().item<bool>()) {
    const int64_t k = only_actual.to(at::kByte).argmax().item<int64_t>();
    const std::string where = "NaN at " + shape_str(unravel(k, sizes));
    for (size_t r = 0; r < locals.size(); ++r)
      if (empty_shard(locals[r]))
        return where + ": rank " + std::to_string(r) + " holds an empty shard (shape " +
               shape_str(locals[r].sizes().vec()) + "); a mean or a division over it is 0/0";
    for (const DTensor* v : context)
      for (size_t r = 0; v && r < v->locals.size(); ++r)
        if (empty_shard(v->locals[r]))
          return where + ": rank " + std::to_string(r) + " holds an empty shard of " + v->name + " (shape " +
                 shape_str(v->locals[r].sizes().vec()) + "); a mean or a division over it is 0/0";
    return where + " (expected " + num(at_flat(e, k)) + ")";
  }
  const at::Tensor only_expected = at::isnan(e).logical_and(at::isnan(a).logical_not());
  if (only_expected.any().item<bool>()) {
    const int64_t k = only_expected.to(at::kByte).argmax().item<int64_t>();
    return "expected NaN at " + shape_str(unravel(k, sizes)) + ", actual " + num(at_flat(a, k));
  }
  return {};
}

std::string replicas_text(const std::vector<ReplicaPair>& pairs, const Spec& spec, const Mesh& mesh) {
  const ReplicaPair& p = pairs.front();
  std::string out = "ranks " + std::to_string(p.first) + " and " + std::to_string(p.other) +
                    " hold different locals across mesh axis \"" + p.axis + "\" where " +
                    spec[mesh.axis_index(p.axis)].str() + " says they are equal";
  if (!p.index.empty() || (p.first_value != p.other_value))
    out += " (first at local " + shape_str(p.index) + ": " + num(p.first_value) + " on rank " + std::to_string(p.first) +
           ", " + num(p.other_value) + " on rank " + std::to_string(p.other) + ")";
  if (pairs.size() > 1) out += " (and " + std::to_string(pairs.size() - 1) + " more pairs)";
  return out;
}

// Where the shards are uneven, said: per mesh axis that shards a dim unevenly, "dp=3 shards dim 0
// of 16 unevenly: ranks hold [6, 8], [5, 8], [5, 8]" (the first group along the axis); "" for an
// even layout.
std::string uneven_text(const Mesh& mesh, const Spec& spec, const Locals& locals, const at::Tensor& global) {
  if (static_cast<int>(spec.size()) != mesh.ndim() || static_cast<int64_t>(locals.size()) != mesh.size() ||
      !global.defined())
    return "";
  std::vector<std::string> parts;
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (!spec[a].is_shard() || spec[a].dim < 0 || spec[a].dim >= global.dim()) continue;
    const int64_t n = mesh.axis_size(a), extent = global.size(spec[a].dim);
    if (n < 2) continue;
    const auto groups = mesh.groups(a);
    const auto& group = groups.front();
    bool uneven = false;
    std::string held;
    for (size_t k = 0; k < group.size(); ++k) {
      const auto& t = locals[static_cast<size_t>(group[k])];
      if (!t.defined()) return "";
      uneven |= t.sizes() != locals[static_cast<size_t>(group[0])].sizes();
      if (k < 8) held += (k ? ", " : "") + shape_str(t.sizes().vec());
    }
    if (group.size() > 8) held += ", ...";
    uneven |= extent % n != 0;
    if (!uneven) continue;
    parts.push_back(mesh.axes()[a] + "=" + std::to_string(n) + " shards dim " + std::to_string(spec[a].dim) + " of " +
                    std::to_string(extent) + " unevenly: ranks " + [&] {
                      std::string r;
                      for (size_t k = 0; k < group.size() && k < 8; ++k) r += (k ? ", " : "") + std::to_string(group[k]);
                      return r;
                    }() + " hold " + held);
  }
  return join(parts, "; ");
}

std::string message_of(const Mismatch& m, const Spec& spec, const Mesh& mesh) {
  std::vector<std::string> parts;
  if (m.mismatched > 0) {
    std::string head = std::to_string(m.mismatched) + " of " + std::to_string(m.total) + " elements differ";
    if (m.allowed > 0) head += " (up to " + num(m.allowed) + " allowed)";
    if (m.max_abs.defined) {
      head += "; greatest difference " + num(m.max_abs.diff) + " at " + shape_str(m.max_abs.index) + ": expected " +
              num(m.max_abs.expected) + ", actual " + num(m.max_abs.actual);
    }
    if (!m.ranks.empty()) head += " (" + ranks_text(m.ranks) + ")";
    parts.push_back(head);
    if (m.max_rel.defined && m.max_abs.defined && m.max_rel.index != m.max_abs.index)
      parts.push_back("greatest relative difference " + num(m.max_rel.diff) + " at " + shape_str(m.max_rel.index));
    if (m.factor) parts.push_back(factor_text(*m.factor));
    if (!m.nan.empty()) parts.push_back(m.nan);
  } else if (!m.ranks.empty()) {
    parts.push_back(ranks_text(m.ranks) +
                    (m.ranks.size() == 1 ? " holds a local that differs" : " hold locals that differ") +
                    " from the oracle's");
  }
  if (!m.replicas.empty()) parts.push_back(replicas_text(m.replicas, spec, mesh));
  if (!parts.empty() && !m.uneven.empty()) parts.push_back(m.uneven);
  if (parts.empty()) return "agrees with the oracle";
  return join(parts, "; ");
}

nlohmann::json point_json(const MismatchPoint& p) {
  if (!p.defined) return nullptr;
  return {{"index", p.index},
          {"expected", number_json(p.expected)},
          {"actual", number_json(p.actual)},
          {"diff", number_json(p.diff)}};
}

}  // namespace

nlohmann::json Mismatch::to_json() const {
  nlohmann::json pairs = nlohmann::json::array();
  for (const auto& p : replicas) {
    nlohmann::json pair = {{"ranks", {p.first, p.other}}, {"axis", p.axis}};
    if (!p.index.empty() || p.first_value != p.other_value)
      pair["first_difference"] = {{"index", p.index}, {"values", {number_json(p.first_value), number_json(p.other_value)}}};
    pairs.push_back(pair);
  }
  nlohmann::json f = nullptr;
  if (factor) {
    f = {{"ratio", number_json(factor->ratio)},
         {"axes", factor->axes},
         {"form", factor->axes.empty() ? nlohmann::json(nullptr)
                                       : nlohmann::json(!factor->form.empty() ? factor->form
                                                                              : factor->ratio >= 1 ? "n" : "1/n")},
         {"alternatives", factor->alternatives},
         {"direction", factor->direction}};
  }
  return {{"mismatched", mismatched},
          {"total", total},
          {"allowed", number_json(allowed)},
          {"max_abs", point_json(max_abs)},
          {"max_rel", point_json(max_rel)},
          {"ranks", ranks},
          {"replicas_disagree", replicas_disagree()},
          {"replica_pairs", pairs},
          {"factor", f},
          {"uneven", uneven.empty() ? nlohmann::json(nullptr) : nlohmann::json(uneven)},
          {"nan", nan.empty() ? nlohmann::json(nullptr) : nlohmann::json(nan)},
          {"message", message}};
}

Mismatch describe_mismatch(const Mesh& mesh, const Spec& spec, const Locals& locals, const at::Tensor& actual,
                           const at::Tensor& expected, double tol, const std::vector<const DTensor*>& context) {
  Mismatch m;
  m.total = expected.numel();
  if (!actual.defined() || actual.sizes() != expected.sizes()) {
    // Not comparable element by element: every element differs.
    m.mismatched = m.total;
    m.message = actual.defined() ? "has shape " + shape_str(actual.sizes().vec()) + " where the oracle's is " +
                                       shape_str(expected.sizes().vec())
                                 : "its locals do not form a tensor";
    return m;
  }
  const at::IntArrayRef sizes = expected.sizes();
  const at::Tensor a = actual.detach().to(at::kDouble).reshape(-1);
  const at::Tensor e = expected.detach().to(at::kDouble).reshape(-1);
  const at::Tensor finite = e.masked_select(at::isfinite(e));
  const double scale = finite.numel() ? std::max(1.0, finite.abs().max().item<double>()) : 1.0;
  m.allowed = tol * scale;
  const at::Tensor diff = differences(a, e);
  m.mismatched = outside(diff, m.allowed).sum().item<int64_t>();

  if (m.total > 0) {
    // A difference of 0 is no greatest difference where the mismatches are all NaN.
    const at::Tensor numeric = at::where(at::isnan(diff), at::full_like(diff, -1.0), diff);
    const int64_t k = numeric.argmax().item<int64_t>();
    const double greatest = at_flat(numeric, k);
    if (greatest > 0 || (greatest == 0 && m.mismatched == 0)) m.max_abs = point(a, e, sizes, k, greatest);
    // Relative to a finite, non-zero expected value; where every expected value is 0, the greatest
    // absolute difference is infinitely relative.
    const at::Tensor counts = at::isnan(diff).logical_not().logical_and(at::ne(e, 0)).logical_and(at::isfinite(e));
    if (m.max_abs.defined && counts.any().item<bool>()) {
      const at::Tensor rel = at::where(counts, diff / e.abs(), at::full_like(diff, -1.0));
      const int64_t j = rel.argmax().item<int64_t>();
      m.max_rel = point(a, e, sizes, j, at_flat(rel, j));
    } else if (m.max_abs.defined) {
      m.max_rel = m.max_abs;
      m.max_rel.diff = m.max_abs.diff > 0 ? std::numeric_limits<double>::infinity() : 0.0;
    }
  }
  if (m.mismatched > 0) {
    m.factor = constant_factor(mesh, a, e, m.allowed);
    m.nan = nan_text(a, e, sizes, locals, context);
  }
  try {
    // Per rank only for locals laid out over this mesh (no locals: a gradient that never arrived).
    if (static_cast<int>(spec.size()) == mesh.ndim() && static_cast<int64_t>(locals.size()) == mesh.size()) {
      m.ranks = wrong_ranks(mesh, spec, locals, expected.detach().to(at::kDouble), m.allowed);
      m.replicas = disagreeing_replicas(mesh, spec, locals);
    }
  } catch (const std::exception&) {
    // Locals that libtorch cannot reduce or compare, or a layout it cannot make: no rank is named.
    m.ranks.clear();
    m.replicas.clear();
  }
  try {
    m.uneven = uneven_text(mesh, spec, locals, expected);
  } catch (const std::exception&) {
    m.uneven.clear();
  }
  m.message = message_of(m, spec, mesh);
  return m;
}

}  // namespace meshsim

// The families that move elements: transpose, permute, view (flatten, reshape, squeeze, unflatten,
// unsqueeze, view), expand, narrow.
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/layout.h"
#include "core/mutants.h"
#include "core/rules/common.h"

namespace meshsim {

bool is_view_op(const std::string& op) {
  return op == "view" || op == "reshape" || op == "flatten" || op == "unflatten" || op == "squeeze" ||
         op == "unsqueeze" || op == "expand";
}

}  // namespace meshsim

namespace meshsim::rules {

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

// permute {dims}: output dim j is input dim dims[j]; a shard follows its dim.
std::vector<RuleRow> permute_rows(const RowCtx& c) {
  std::vector<RowText> t;
  for (int64_t j = 0; j < static_cast<int64_t>(c.a.dims.size()); ++j)
    t.emplace_back(S(c.a.dims[j]) + " -> " + S(j), "S(d) -> S(position of d)");
  moved_elements_rows(t);
  return parse_rows(t);
}

namespace {

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

}  // namespace

std::vector<RuleRow> view_rows(const RowCtx& c) {
  return view_rows_of(view_groups_for(c.op, c.a, c.shapes.at(0), c.out), false);
}

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

// narrow {dim, start, length}: a shard of another dim passes through; the narrowed dim is
// gathered first (a rank's chunk is not the slice); Partials pass.
std::vector<RuleRow> narrow_rows(const RowCtx& c) {
  std::vector<RowText> t;
  for (int64_t d = 0; d < c.rank(); ++d)
    if (d != *c.a.dim) t.emplace_back(S(d) + " -> " + S(d), "S(d) -> S(d), another dim than the narrowed one");
  moved_elements_rows(t);
  return parse_rows(t);
}

// ---------------------------------------------------------------------------------------------
// Backward

Grad transpose_gradient(const AxisGrad& x) { return own_table("transpose", transpose_rows(x.ctx()), x); }

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

Grad narrow_gradient(const AxisGrad& x) {
  const std::vector<Shape> shapes{x.out_shape};
  return own_table("narrow", narrow_rows({shapes, x.shapes.at(0), x.attrs}), x);
}

}  // namespace meshsim::rules

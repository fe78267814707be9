// propagation_coverage(): the rule coverage keys of the tables (core/coverage.h).
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/coverage.h"
#include "core/error.h"
#include "core/rules/common.h"

namespace meshsim {

using namespace rules;

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
  if (family == "linear_binary" || family == "mul" || family == "div" || family == "integer_binary") {
    for (int64_t r = 1; r <= 3; ++r) add({cube(r), cube(r)});
    for (const auto& p : std::vector<std::pair<Shape, Shape>>{
             {{2, 2}, {2}}, {{2}, {2, 2}}, {{2, 2}, {1, 2}}, {{1, 2}, {2, 2}}, {{2, 2}, {}}, {{}, {2, 2}}})
      add({p.first, p.second});
  } else if (family == "compare") {
    // logical_not takes one operand; the others two, whole or one broadcast, or the scalar value.
    for (int64_t r = 1; r <= 2; ++r) add(op == "logical_not" ? std::vector<Shape>{cube(r)} : std::vector<Shape>{cube(r), cube(r)});
    if (op != "logical_not")
      for (const auto& p : std::vector<std::pair<Shape, Shape>>{{{2, 2}, {2}}, {{2}, {2, 2}}, {{2, 2}, {}}})
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
  } else if (family == "index") {
    // x of 1-3 dims along each dim; gather's index as long as x (its S(d), S(d) rows) or shorter on
    // the other dims, index_select's 1-D.
    for (int64_t r = 1; r <= 3; ++r)
      for (int64_t d = 0; d < r; ++d) {
        const OpAttrs a = with([&](OpAttrs& at) { at.dim = d; });
        if (op == "index_select") {
          add({cube(r), {3}}, a);
          continue;
        }
        add({cube(r), cube(r)}, a);
        Shape shorter(static_cast<size_t>(r), 1);
        shorter[static_cast<size_t>(d)] = 3;
        add({cube(r), shorter}, a);
      }
  } else if (family == "scatter") {
    // x of 1-3 dims along each dim; scatter's and scatter_add's index (and src) as long as x (their
    // S(d), S(d), S(d) rows) or shorter on the other dims, index_add's 1-D with source alike.
    for (int64_t r = 1; r <= 3; ++r)
      for (int64_t d = 0; d < r; ++d) {
        const OpAttrs a = with([&](OpAttrs& at) { at.dim = d; });
        if (op == "index_add") {
          Shape source = cube(r);
          source[static_cast<size_t>(d)] = 3;
          add({cube(r), {3}, source}, a);
          continue;
        }
        add({cube(r), cube(r), cube(r)}, a);
        Shape shorter(static_cast<size_t>(r), 1);
        shorter[static_cast<size_t>(d)] = 3;
        add({cube(r), shorter, shorter}, a);
      }
  } else if (family == "vector_norm") {
    // As the reductions (one dim or none, keepdim or not, a list), for each kind of norm partial.
    for (double ord : {2.0, double(INFINITY), -double(INFINITY), 0.0})
      for (int64_t r = 1; r <= 3; ++r) {
        for (auto a : attr_variants(r)) {
          a.ord = ord;
          add({cube(r)}, a);
        }
        for (bool keepdim : {false, true})
          add({cube(r)}, with([&](OpAttrs& a) {
                a.dims = {0, r - 1};
                a.dims_given = r > 1;
                a.keepdim = keepdim;
                a.ord = ord;
              }));
      }
  } else if (family == "item") {  // a value of one element: 0-d, [1] (a shard of it: rank 0's), [1, 1]
    add({Shape{}});
    add({{1}});
    add({{1, 1}});
  } else if (family == "repeat") {
    // Each dim repeated once or twice, with a new leading dim or not.
    for (int64_t r = 1; r <= 3; ++r)
      for (int mix = 0; mix < (1 << r); ++mix)
        for (int64_t lead = 0; lead <= 1; ++lead)
          add({cube(r)}, with([&](OpAttrs& a) {
                a.sizes.assign(static_cast<size_t>(lead), 2);
                for (int64_t d = 0; d < r; ++d) a.sizes.push_back((mix >> d) & 1 ? 2 : 1);
              }));
  } else if (family == "repeat_interleave") {
    for (int64_t r = 1; r <= 3; ++r)
      for (int64_t d = 0; d < r; ++d) add({cube(r)}, with([&](OpAttrs& a) { a.dim = d; a.repeats = 2; }));
  } else if (family == "attention") {
    // q, k, v of one shape, grouped k and v heads, and a mask of the scores' shape or broadcast.
    const Shape q = {2, 2, 2, 2};
    add({q, q, q});
    add({{2, 4, 2, 2}, q, q}, with([](OpAttrs& a) { a.enable_gqa = true; }));
    for (const Shape& m : std::vector<Shape>{q, {2, 2}, {2, 1, 2, 2}, {1, 2, 1, 2}}) add({q, q, q, m});
  } else if (family == "one_hot") {
    for (int64_t r = 1; r <= 2; ++r) add({cube(r)}, with([](OpAttrs& a) { a.num_classes = 3; }));
  } else if (family == "bincount") {
    add({{4}}, with([](OpAttrs& a) { a.minlength = 3; }));
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
        if ((op == "softmax" || op == "log_softmax" || family == "select" || family == "select_index" || family == "scan") &&
            !a.dim)
          continue;
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
                                 f.names.name == "stack" || f.names.name == "expand" || f.names.name == "triangle" ||
                                 f.names.name == "repeat" || f.names.name == "repeat_interleave" ||
                                 f.names.name == "attention";
        // attention's mask has no gradient, and its keys are those of q, k and v alone.
        if (f.names.name == "attention" && c.shapes.size() > 3) continue;
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

}  // namespace meshsim

#include "properties/programs.h"

#include <cmath>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/layout.h"
#include "core/placement.h"
#include "core/propagation.h"
#include "core/redistribute.h"
#include "core/reduced_policy.h"
#include "core/scenario.h"
#include "properties/generators.h"
#include "properties/program_parts.h"
#include "sim/local_ops.h"

namespace meshsim::gen {

using namespace parts;

// ---------------------------------------------------------------------------------------------
// DTensor programs

namespace {

struct DValue {
  std::string name;
  Shape shape;
  Spec spec;          // as the runtime lays it out (the rows and the run's Reduced policy)
  bool grad = false;  // depends on an input that requires grad
  double bound = kInputBound;
  double floor = 0;
  bool rounded = false;  // an op that rounds made it or its operands
};

// The spec an op gives, by the rows and the Reduced policy (the runtime's own decision), or
// nothing when no row is legal for the operands.
std::optional<Spec> spec_after(const std::string& name, const OpAttrs& attrs, const Mesh& mesh,
                               const std::vector<const DValue*>& xs, ReducedPropagation policy) {
  std::vector<Spec> specs;
  std::vector<Shape> shapes;
  for (const auto* x : xs) {
    specs.push_back(x->spec);
    shapes.push_back(x->shape);
  }
  try {
    const ShardingDecision d = propagate(name, mesh, specs, shapes, attrs);
    return restore_reduced(name, mesh, specs, d.out_spec, policy);
  } catch (const SemanticError&) {
    return std::nullopt;
  }
}

// Per mesh axis, the redistribution targets legal from `from`: S(d), R and Rd always; a Partial
// from a replica or the same Partial; P(max) and P(min) only off the backward path.
std::vector<Placement> targets(const Placement& from, int64_t rank, bool grad) {
  std::vector<Placement> out = {Placement::replicate(), Placement::reduced()};
  for (int64_t d = 0; d < rank; ++d) out.push_back(Placement::shard(d));
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    if (grad && !is_linear(op)) continue;
    const Placement p = Placement::partial(op);
    if (redistribute_illegal_reason({from}, {p}).empty()) out.push_back(p);
  }
  return out;
}

struct DTensorBuilder {
  Mesh mesh;
  ReducedPropagation policy;
  std::vector<DValue> pool;
  json program = json::array();
  uint64_t seed = 0;                   // the run's: the data of an int64 input are known from it
  json extra_inputs = json::array();   // inputs the ops draw (ids, targets, masks, tables, norm weights)
  static constexpr size_t kFirstInputs = 4;  // a, b, c, d

  // The latest value half of the time (programs form chains that reach the loss), now and then a
  // value off the backward path (c and what is made of it alone: P(max) and P(min) live there),
  // any value otherwise.
  const DValue& any() {
    const int pick = *rc::gen::inRange(0, 8);
    if (pick < 3) return pool.back();
    if (pick < 5)
      if (const DValue* v = partner([](const DValue& v) { return !v.grad; })) return *v;
    return pool.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(pool.size()))));
  }
  template <class P>
  const DValue* partner(P&& fits) {
    std::vector<const DValue*> vs;
    for (const auto& v : pool)
      if (fits(v)) vs.push_back(&v);
    if (vs.empty()) return nullptr;
    return vs.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(vs.size()))));
  }
  int64_t dim_of(const DValue& x) {  // a dim of x, negative half of the time
    const auto r = static_cast<int64_t>(x.shape.size());
    const int64_t d = *rc::gen::inRange<int64_t>(0, r);
    return *rc::gen::arbitrary<bool>() ? d : d - r;
  }

  // Appends `name` of `xs` when its rows take them and its result stays within the bound.
  bool add(const std::string& name, std::vector<const DValue*> xs, json extra, double bound, double floor = 0) {
    std::vector<Operand> operands;
    for (const auto* x : xs) operands.push_back({x->bound, x->rounded});
    bool rounded = false;
    if (!within_bounds(name, extra, operands, bound, rounded)) return false;
    OpDecl decl;
    decl.op = name;
    decl.attrs = extra;
    const OpAttrs attrs = op_attrs(decl);
    std::vector<Shape> shapes;
    for (const auto* x : xs) shapes.push_back(x->shape);
    Shape shape;
    std::optional<Spec> spec;
    try {
      if (name == "linear") {  // the runtime's parts: transpose, matmul, add
        OpAttrs t;
        t.dim1 = 1;
        DValue wt = *xs[1];
        wt.shape = infer_shape("transpose", {xs[1]->shape}, t);
        auto s1 = spec_after("transpose", t, mesh, {xs[1]}, policy);
        if (!s1) return false;
        wt.spec = *s1;
        DValue mm = *xs[0];
        mm.shape = infer_shape("matmul", {xs[0]->shape, wt.shape}, {});
        auto s2 = spec_after("matmul", {}, mesh, {xs[0], &wt}, policy);
        if (!s2) return false;
        mm.spec = *s2;
        shape = mm.shape;
        spec = s2;
        if (xs.size() > 2) {
          shape = infer_shape("add", {mm.shape, xs[2]->shape}, {});
          spec = spec_after("add", {}, mesh, {&mm, xs[2]}, policy);
        }
      } else if (name == "log_softmax" || name == "nll_loss" || name == "cross_entropy") {
        shape = name == "log_softmax" ? xs[0]->shape : Shape{};
        spec = decomposed(name, attrs, xs);
      } else {
        shape = infer_shape(name, shapes, attrs);
        spec = spec_after(name, attrs, mesh, xs, policy);
      }
    } catch (const SemanticError&) {
      return false;
    }
    if (!spec) return false;
    DValue y{"v" + std::to_string(program.size()), shape, *spec, false, bound, floor, rounded};
    if (name == "nll_loss" || name == "cross_entropy") y.shape = {};
    std::vector<std::string> args;
    for (const auto* x : xs) {
      args.push_back(x->name);
      y.grad |= x->grad;
    }
    program.push_back(op(y.name, name, args, extra));
    pool.push_back(y);
    return true;
  }

  // The spec of an op the runtime runs as a decomposition (sim/interpreter.cpp), by the rows of
  // its parts: log_softmax over a sharded dim is loss parallel (amax, sub, exp, sum, log, sub);
  // nll_loss is the target pick, then sum, mean, or sum over the count of the targets kept;
  // cross_entropy is log_softmax over the classes, then nll_loss.
  std::optional<Spec> decomposed(const std::string& name, const OpAttrs& attrs, const std::vector<const DValue*>& xs) {
    auto part = [&](const std::string& op, const OpAttrs& a, std::vector<const DValue*> in) -> std::optional<DValue> {
      std::vector<Shape> shapes;
      for (const auto* x : in) shapes.push_back(x->shape);
      DValue y = *in[0];
      try {
        y.shape = infer_shape(op, shapes, a);
      } catch (const SemanticError&) {
        return std::nullopt;
      }
      const auto spec = spec_after(op, a, mesh, in, policy);
      if (!spec) return std::nullopt;
      y.spec = *spec;
      return y;
    };
    auto over = [](int64_t dim, bool keepdim) {
      OpAttrs a;
      a.dim = dim;
      a.keepdim = keepdim;
      return a;
    };
    auto log_softmax = [&](const DValue& x, int64_t dim) -> std::optional<DValue> {
      const int64_t d = dim < 0 ? dim + static_cast<int64_t>(x.shape.size()) : dim;
      bool sharded = false;
      for (const auto& p : x.spec) sharded |= p.is_shard() && p.dim == d;
      if (!sharded) return part("log_softmax", over(d, false), {&x});
      const auto m = part("amax", over(d, true), {&x});
      if (!m) return std::nullopt;
      const auto shifted = part("sub", {}, {&x, &*m});
      if (!shifted) return std::nullopt;
      const auto e = part("exp", {}, {&*shifted});
      if (!e) return std::nullopt;
      const auto total = part("sum", over(d, true), {&*e});
      if (!total) return std::nullopt;
      const auto l = part("log", {}, {&*total});
      if (!l) return std::nullopt;
      return part("sub", {}, {&*shifted, &*l});
    };
    if (name == "log_softmax") {
      const auto y = log_softmax(*xs[0], *attrs.dim);
      return y ? std::optional<Spec>(y->spec) : std::nullopt;
    }
    std::optional<DValue> logp = *xs[0];
    if (name == "cross_entropy") logp = log_softmax(*xs[0], 1);
    if (!logp) return std::nullopt;
    OpAttrs pick;
    pick.ignore_index = attrs.ignore_index;
    const auto picked = part("pick_target", pick, {&*logp, xs[1]});
    if (!picked) return std::nullopt;
    if (attrs.sum_reduction || !attrs.ignore_index) {
      const auto y = part(attrs.sum_reduction ? "sum" : "mean", {}, {&*picked});
      return y ? std::optional<Spec>(y->spec) : std::nullopt;
    }
    const auto total = part("sum", {}, {&*picked});
    const auto kept = part("count_targets", pick, {xs[1]});
    if (!total || !kept) return std::nullopt;
    const auto count = part("sum", {}, {&*kept});
    if (!count) return std::nullopt;
    const auto y = part("div", {}, {&*total, &*count});
    return y ? std::optional<Spec>(y->spec) : std::nullopt;
  }

  // A new input of the program (its data stream is its position among the inputs).
  std::string new_input(json decl) {
    decl["name"] = "i" + std::to_string(extra_inputs.size());
    extra_inputs.push_back(decl);
    return decl["name"];
  }
  size_t next_input_index() const { return kFirstInputs + extra_inputs.size(); }
  // A float input with a gradient, in any differentiable placement, in the pool.
  DValue float_input(const Shape& shape) {
    const Spec spec = *gen::spec(mesh, differentiable_placement(static_cast<int64_t>(shape.size())));
    DValue v{"", shape, spec, true, kInputBound, 0, mesh_rounds(mesh)};
    v.name = new_input(input("", shape, spec, true, false));
    pool.push_back(v);
    return v;
  }
  // A bool (mask, condition) or int64 (ids in [0, high)) input: S, R or Rd per axis; not in the pool.
  DValue typed(const Shape& shape, const std::string& dtype, int64_t high = 0) {
    const Spec spec = without_partial(*gen::spec(mesh, any_placement(static_cast<int64_t>(shape.size()))));
    DValue v{"", shape, spec, false, dtype == "bool" ? 1.0 : static_cast<double>(high), 0, false};
    v.name = new_input(typed_input("", shape, spec, dtype, high));
    return v;
  }
  // A creation op (zeros, ones, full, arange) of a shape, in random S, R or Rd placements; not in the pool.
  DValue create(const std::string& name, const Shape& shape, const std::string& dtype, json extra = json::object()) {
    const Spec spec = without_partial(*gen::spec(mesh, any_placement(static_cast<int64_t>(shape.size()))));
    extra.update({{"shape", shape}, {"placements", spec_json(spec)}, {"dtype", dtype}});
    const double fill = extra.contains("value") && extra["value"].is_number() ? extra["value"].get<double>() : 0.0;
    const double bound = name == "ones" ? 1.0 : name == "full" ? std::abs(fill) : name == "arange" ? static_cast<double>(numel(shape)) : 0.0;
    DValue v{"v" + std::to_string(program.size()), shape, spec, false, bound, name == "ones" ? 1.0 : fill > 0 ? fill : 0.0, false};
    program.push_back(op(v.name, name, {}, extra));
    return v;
  }
  // The latest op's result out of the pool (a bool or int64 value, or one only its next op may read).
  DValue take() {
    DValue v = pool.back();
    pool.pop_back();
    return v;
  }

  // Appends exp of x (a value known positive) when its bounds allow.
  bool exp_of(const DValue& x) {
    const ValueRange y = result_range("exp", {}, {x.bound, x.floor});
    return add("exp", {&x}, {}, y.bound, y.floor);
  }
  // A value of x's shape known positive: x, a value of its shape with a positive floor, or exp of x.
  std::optional<DValue> positive(const DValue& x) {
    if (x.floor > 0) return x;
    if (const DValue* v = partner([&](const DValue& v) { return v.shape == x.shape && v.floor > 0; })) return *v;
    if (!exp_of(x)) return std::nullopt;
    return pool.back();
  }
  // A pointwise op of class c (the catalog's, with its drawn attributes) of x, or of a positive
  // value of x's shape for an op that needs one; its range by the catalog's ValueRules.
  bool pointwise(GenClass c, const DValue& x) {
    const std::string name = op_of(c);
    const json extra = drawn_attrs(name);
    const auto v = needs_positive(name) ? positive(x) : std::optional<DValue>(x);
    if (!v) return false;
    const ValueRange y = result_range(name, extra, {v->bound, v->floor});
    const DValue operand = *v;
    return add(name, {&operand}, extra, y.bound, y.floor);
  }

  // The transformer-layer ops (kinds 14-19), comparisons (20) and selection (21).
  bool try_layer_kind(int kind, const DValue& x) {
    const auto rank = static_cast<int64_t>(x.shape.size());
    switch (kind) {
      case 14:  // the transformer layers' non-linear pointwise ops (log, sqrt, rsqrt, pow of a positive operand)
        return pointwise(GenClass::UnaryLayer, x);
      case 15: {  // masks: where, masked_fill (a finite value, or -inf then softmax), tril, triu
        const int pick = *rc::gen::inRange(0, 4);
        if (pick == 0) {  // where(cond, x, y): a bool input, whole or broadcast
          const DValue* y = partner([&](const DValue& v) { return v.shape == x.shape; });
          if (!y) return false;
          const DValue other = *y;
          const DValue cond = typed(rank > 0 && *rc::gen::arbitrary<bool>() ? Shape{x.shape.back()} : x.shape, "bool");
          return add("where", {&cond, &x, &other}, {}, std::max(x.bound, other.bound));
        }
        if (pick == 1) {  // masked_fill with a finite value
          const DValue mask = typed(rank > 0 && *rc::gen::arbitrary<bool>() ? Shape{x.shape.back()} : x.shape, "bool");
          const double value = *rc::gen::element(-2.0, 0.0, 3.5);
          return add("masked_fill", {&x, &mask}, {{"value", value}}, std::max(x.bound, std::abs(value)));
        }
        if (rank < 2) return false;
        if (pick == 2) return add(op_of(GenClass::Triangle), {&x}, {{"diagonal", *rc::gen::inRange<int64_t>(-2, 3)}}, x.bound);
        // A causal mask: every row keeps its first column, so the softmax has a term. Either the
        // positions above the diagonal (triu of ones, diagonal >= 1) filled with -inf, or x where
        // tril of ones (diagonal >= 0) keeps it and full(-inf) elsewhere.
        if (x.bound > operand_limit("softmax")) return false;
        const Shape square(x.shape.end() - 2, x.shape.end());
        const DValue ones = create("ones", square, "bool");
        const bool fill = *rc::gen::arbitrary<bool>();
        if (!add(fill ? "triu" : "tril", {&ones}, {{"diagonal", fill ? *rc::gen::inRange<int64_t>(1, 3) : *rc::gen::inRange<int64_t>(0, 2)}}, 1.0))
          return false;
        const DValue mask = take();
        if (fill) {
          if (!add("masked_fill", {&x, &mask}, {{"value", "-inf"}}, x.bound)) return false;
        } else {
          const DValue minus_inf = create("full", x.shape, "float", {{"value", "-inf"}});
          if (!add("where", {&mask, &x, &minus_inf}, {}, x.bound)) return false;
        }
        const DValue filled = take();  // only the softmax reads the -inf
        return add("softmax", {&filled}, {{"dim", -1}}, 1.0);
      }
      case 16: {  // layer_norm, rms_norm over the last 1-2 dims, with and without weight and bias
        if (rank == 0) return false;
        const std::string name = op_of(GenClass::Norm);
        const auto k = static_cast<size_t>(*rc::gen::inRange<int64_t>(1, std::min<int64_t>(rank, 2) + 1));
        const Shape ns(x.shape.end() - static_cast<std::ptrdiff_t>(k), x.shape.end());
        if (numel(ns) == 0) return false;  // normalized_shape takes extents >= 1
        json extra = {{"normalized_shape", ns}};
        // rms_norm's default eps is the dtype's: a rounded zero row would be scaled by 1e8. A rounded
        // operand takes the large eps: a row of values equal but for rounding (one element, always)
        // has its rounding scaled by 1 / sqrt(eps), 316 for 1e-5, past the comparison's 1e-12
        // (`meshsim check --seed 6 --cases 10000`, docs/findings.md section 11).
        if (x.rounded) extra["eps"] = 0.25;
        else if (name == "rms_norm" ? *rc::gen::inRange(0, 3) != 0 : *rc::gen::arbitrary<bool>())
          extra["eps"] = *rc::gen::element(1e-5, 0.25);
        std::vector<DValue> params;
        for (int p = *rc::gen::inRange(0, optional_operands(name) + 1); p > 0; --p) params.push_back(float_input(ns));
        std::vector<const DValue*> xs = {&x};
        double bound = std::sqrt(static_cast<double>(std::max<int64_t>(1, numel(ns))));
        for (size_t p = 0; p < params.size(); ++p) {
          xs.push_back(&params[p]);
          bound = p == 0 ? bound * params[p].bound : bound + params[p].bound;
        }
        return add(name, xs, extra, bound);
      }
      case 17: {  // embedding: ids (an input, or zeros / arange of int64) into a table x or a new one
        const bool own = rank == 2 && *rc::gen::arbitrary<bool>();
        // A vocab of 12 rows (even on every axis size) or of 1-8 (uneven splits).
        const int64_t rows = *rc::gen::arbitrary<bool>() ? 12 : *rc::gen::inRange<int64_t>(1, 9);
        DValue table = own ? x : float_input({rows, *rc::gen::inRange<int64_t>(1, 7)});
        if (!own && *rc::gen::arbitrary<bool>()) {  // vocab-parallel (the masked partial) on one axis, half the time
          table.spec[static_cast<size_t>(*rc::gen::inRange(0, mesh.ndim()))] = Placement::shard(0);
          pool.back().spec = table.spec;
          extra_inputs.back()["placements"] = spec_json(table.spec);
        }
        const int64_t vocab = table.shape[0];
        if (vocab == 0) return false;
        const Shape ids_shape = *rc::gen::arbitrary<bool>() ? Shape{*rc::gen::inRange<int64_t>(1, 7)}
                                                            : Shape{*rc::gen::inRange<int64_t>(1, 4), *rc::gen::inRange<int64_t>(1, 4)};
        DValue ids;
        const int source = *rc::gen::inRange(0, 6);
        if (source == 0) ids = create("zeros", ids_shape, "int64");
        else if (source == 1 && numel(ids_shape) <= vocab) ids = create("arange", ids_shape, "int64");
        else ids = typed(ids_shape, "int64", vocab);
        return add("embedding", {&ids, &table}, {}, table.bound);
      }
      case 18: {  // log_softmax; cross_entropy, nll_loss of 2-D scores against an int64 target
        if (rank == 0) return false;
        if (*rc::gen::inRange(0, 3) == 0) {
          const int64_t d = dim_of(x);
          const double extent = static_cast<double>(x.shape[static_cast<size_t>(d < 0 ? d + rank : d)]);
          return add("log_softmax", {&x}, {{"dim", d}}, 2 * x.bound + std::log(std::max(1.0, extent)));
        }
        if (rank != 2 || x.shape[0] == 0 || x.shape[1] == 0) return false;
        const std::string name = op_of(GenClass::Loss);
        const int64_t n = x.shape[0], classes = x.shape[1];
        json extra = {{"reduction", *rc::gen::element<std::string>("mean", "sum")}};
        const size_t index = next_input_index();
        const DValue target = typed({n}, "int64", classes);
        if (*rc::gen::arbitrary<bool>())
          if (const auto ignore = ignore_index_for(drawn_ids(seed, index, {n}, classes), *rc::gen::inRange<int64_t>(0, 8)))
            extra["ignore_index"] = *ignore;
        const double each = name == "cross_entropy" ? 2 * x.bound + std::log(static_cast<double>(classes)) : x.bound;
        return add(name, {&x, &target}, extra, extra["reduction"] == "sum" ? each * static_cast<double>(n) : each);
      }
      case 19: {  // zeros, ones, full, arange of x's shape in random placements, added to or multiplying x
        const std::string name = op_of(GenClass::Creation);
        json extra = json::object();
        if (op_schema(name).attr("value")) extra["value"] = *rc::gen::element(-2.0, 0.5, 3.0);  // full's
        const DValue made = create(name, x.shape, "float", extra);
        pool.push_back(made);
        const DValue c = made;
        const bool mul = *rc::gen::arbitrary<bool>();
        return add(mul ? "mul" : "add", {&x, &c}, {}, mul ? x.bound * c.bound : x.bound + c.bound);
      }
      case 20:  // comparisons and logic: a mask of x, picking x or a value of its shape by where
        return compare_kind(x);
      case 21:  // selection along a dim: values, and their indices compared into a mask now and then
        return select_kind(x);
      default:
        return false;
    }
  }

  // A comparison of x (not rounded: a value the mesh rounds otherwise than the oracle could compare
  // otherwise) against a value, a value of its shape or one broadcast over its last dim (either
  // side); logical_not of it, or logical_and / or with another comparison, now and then; where picks
  // x or a value of its shape by it.
  // Whether a binary op's scalar `value` (a replicated 0-d operand at run time, which add() does
  // not see) may meet v: not an Rd operand under the strict Reduced policy (operands disagree).
  bool scalar_fits(const DValue& v) const {
    if (policy != ReducedPropagation::Strict) return true;
    for (const auto& p : v.spec)
      if (p.is_reduced()) return false;
    return true;
  }

  bool compare_kind(const DValue& x) {
    if (x.rounded || !scalar_fits(x)) return false;
    const std::string name = op_of(GenClass::Compare);
    const int form = x.shape.empty() ? 0 : *rc::gen::inRange(0, 3);
    auto value = [] { return *rc::gen::element(-1.0, 0.0, 0.5, 1.0, 2.0); };
    if (form == 0) {
      if (!add(name, {&x}, {{"value", value()}}, 1.0)) return false;
    } else {
      const Shape s = form == 1 ? x.shape : Shape{x.shape.back()};
      const DValue* y = partner([&](const DValue& v) { return v.shape == s && !v.rounded; });
      if (!y) return false;
      const DValue other = *y;
      const bool swap = *rc::gen::arbitrary<bool>();
      if (!add(name, swap ? std::vector<const DValue*>{&other, &x} : std::vector<const DValue*>{&x, &other}, {}, 1.0))
        return false;
    }
    DValue mask = take();
    const int logic = *rc::gen::inRange(0, 3);
    if (logic == 0) {
      if (!add("logical_not", {&mask}, {}, 1.0)) return false;
      mask = take();
    } else if (logic == 1) {
      if (!add(op_of(GenClass::Compare), {&x}, {{"value", value()}}, 1.0)) return false;
      const DValue second = take();
      if (!add(*rc::gen::element<std::string>("logical_and", "logical_or"), {&mask, &second}, {}, 1.0)) return false;
      mask = take();
    }
    const DValue* y = partner([&](const DValue& v) { return v.shape == x.shape; });
    if (!y) return false;
    const DValue other = *y;
    return add("where", {&mask, &x, &other}, {}, std::max(x.bound, other.bound));
  }

  // max, min, sort or topk of x (not rounded: ties must break alike) along a dim; now and then the
  // indices of the same pick (argmax, argmin, argsort; topk's as argsort's first k) compared
  // against an index, the mask picking the values or a value of their shape.
  bool select_kind(const DValue& x) {
    if (x.rounded || x.shape.empty()) return false;
    const auto rank = static_cast<int64_t>(x.shape.size());
    const int64_t d = dim_of(x), n = x.shape[static_cast<size_t>(d < 0 ? d + rank : d)];
    if (n == 0) return false;
    const std::string name = op_of(GenClass::Select);
    json extra = {{"dim", d}}, by_index = {{"dim", d}};
    const int64_t k = *rc::gen::inRange<int64_t>(0, n + 1);
    const bool flag = *rc::gen::arbitrary<bool>();
    if (name == "topk") {
      extra.update({{"k", k}, {"largest", flag}});
      by_index["descending"] = flag;
    } else if (name == "sort") {
      extra["descending"] = flag;
      by_index["descending"] = flag;
    } else {
      extra["keepdim"] = flag;
      by_index["keepdim"] = flag;
    }
    if (!add(name, {&x}, extra, x.bound)) return false;
    if (*rc::gen::arbitrary<bool>()) return true;
    const DValue values = pool.back();
    const std::string index = name == "max" ? "argmax" : name == "min" ? "argmin" : "argsort";
    if (!add(index, {&x}, by_index, static_cast<double>(n))) return false;
    DValue at = take();
    if (name == "topk") {
      if (!add("narrow", {&at}, {{"dim", d}, {"start", 0}, {"length", k}}, static_cast<double>(n))) return false;
      at = take();
    }
    if (!scalar_fits(at) ||
        !add(op_of(GenClass::Compare), {&at}, {{"value", *rc::gen::inRange<int64_t>(0, n)}}, 1.0))
      return false;
    const DValue mask = take();
    const DValue* y = partner([&](const DValue& v) { return v.shape == values.shape; });
    if (!y) return false;
    const DValue other = *y;
    return add("where", {&mask, &values, &other}, {}, std::max(values.bound, other.bound));
  }

  // split {sizes | size} or chunk {chunks} of x along a dim: every piece joins the pool.
  bool split_or_chunk(const DValue& x) {
    const auto rank = static_cast<int64_t>(x.shape.size());
    const int64_t d = dim_of(x), dd = d < 0 ? d + rank : d, n = x.shape[static_cast<size_t>(dd)];
    OpDecl decl;
    decl.op = op_of(GenClass::Split);
    decl.attrs = {{"dim", d}};
    if (op_schema(decl.op).attr("chunks")) decl.attrs["chunks"] = *rc::gen::inRange<int64_t>(1, 4);
    else if (*rc::gen::arbitrary<bool>()) decl.attrs["size"] = *rc::gen::inRange<int64_t>(1, 4);
    else {
      const int64_t first = *rc::gen::inRange<int64_t>(0, n + 1);
      decl.attrs["sizes"] = n == first ? Shape{first} : Shape{first, n - first};
    }
    std::vector<Chunk> pieces;
    try {
      pieces = split_pieces(decl.op, op_attrs(decl), n);
    } catch (const SemanticError&) {
      return false;
    }
    json outs = json::array();
    std::vector<DValue> made;
    for (const auto& p : pieces) {
      const json narrow = {{"dim", d}, {"start", p.offset}, {"length", p.size}};
      OpDecl nd;
      nd.op = "narrow";
      nd.attrs = narrow;
      const auto spec = spec_after("narrow", op_attrs(nd), mesh, {&x}, policy);
      if (!spec) return false;
      DValue y = x;
      y.name = "v" + std::to_string(program.size()) + "_" + std::to_string(made.size());
      y.shape[static_cast<size_t>(dd)] = p.size;
      y.spec = *spec;
      outs.push_back(y.name);
      made.push_back(y);
    }
    json o = {{"outs", outs}, {"op", decl.op}, {"args", {x.name}}};
    o.update(decl.attrs);
    program.push_back(o);
    for (auto& y : made) pool.push_back(y);
    return true;
  }

  // One op: the drawn kind if it applies to the drawn operand, else the next kind that does.
  void step() {
    constexpr int kKinds = 22;
    const int first = *rc::gen::inRange(0, kKinds);
    const DValue x = any();
    for (int i = 0; i < kKinds; ++i)
      if (try_kind((first + i) % kKinds, x)) return;
  }

  bool try_kind(int kind, const DValue& x) {
    const int64_t rank = static_cast<int64_t>(x.shape.size());
    if (kind >= 14) return try_layer_kind(kind, x);
    switch (kind) {
      case 0: {  // mm
        if (rank != 2) return false;
        const DValue* y = partner([&](const DValue& v) { return v.shape.size() == 2 && v.shape[0] == x.shape[1]; });
        return y && add("mm", {&x, y}, {}, x.bound * y->bound * static_cast<double>(x.shape[1]));
      }
      case 1: {  // add, sub, mul with a value of the same shape
        const DValue* y = partner([&](const DValue& v) { return v.shape == x.shape; });
        const std::string name = op_of(GenClass::Binary);
        return add(name, {&x, y}, {}, name == "mul" ? x.bound * y->bound : x.bound + y->bound);
      }
      case 2: {  // div by a positive value of the same shape, made by exp when there is none
        const DValue* y = partner([&](const DValue& v) { return v.shape == x.shape && v.floor > 0; });
        if (!y) {
          const DValue* e = partner([&](const DValue& v) { return v.shape == x.shape && v.bound <= operand_limit("exp"); });
          if (!e || !exp_of(*e)) return false;
          y = &pool.back();
        }
        const DValue divisor = *y;  // `add` grows the pool
        return add("div", {&x, &divisor}, {}, x.bound / divisor.floor);
      }
      case 3: {  // neg, scale (negative and zero values too)
        if (*rc::gen::arbitrary<bool>()) return add("neg", {&x}, {}, x.bound);
        const double value = *rc::gen::element(-2.0, -1.0, -0.5, 0.0, 0.5, 1.5, 3.0);
        return add("scale", {&x}, {{"value", value}}, x.bound * std::abs(value));
      }
      case 4:  // the other pointwise ops: exp, relu, sin, tanh
        return pointwise(GenClass::Unary, x);
      case 5: {  // transpose, sharded dims included (dim0 == dim1 now and then)
        if (rank == 0) return false;
        return add("transpose", {&x}, {{"dim0", dim_of(x)}, {"dim1", dim_of(x)}}, x.bound);
      }
      case 6: {  // sum, mean over one dim or every dim, keepdim or not
        const std::string name = op_of(GenClass::Reduction);
        json extra = {{"keepdim", *rc::gen::arbitrary<bool>()}};
        double count = static_cast<double>(numel(x.shape));
        if (rank > 0 && *rc::gen::inRange(0, 4) != 0) {
          extra["dim"] = dim_of(x);
          const int64_t d = extra["dim"].get<int64_t>();
          count = static_cast<double>(x.shape[static_cast<size_t>(d < 0 ? d + rank : d)]);
        }
        return add(name, {&x}, extra, name == "sum" ? x.bound * std::max(1.0, count) : x.bound);
      }
      case 7: {  // softmax
        if (rank == 0) return false;
        const int64_t d = dim_of(x);
        const double extent = static_cast<double>(x.shape[static_cast<size_t>(d < 0 ? d + rank : d)]);
        return add("softmax", {&x}, {{"dim", d}}, 1.0, std::exp(-2 * x.bound) / std::max(1.0, extent));
      }
      case 9: {  // a binary op against a broadcast operand (a reduction of x keeps it small), or a scalar
        const std::string name = op_of(GenClass::Binary);
        if (rank == 0 || *rc::gen::inRange(0, 4) == 0) {
          const double value = *rc::gen::element(-2.0, 0.5, 3.0);
          return add(name, {&x}, {{"value", value}}, name == "mul" ? x.bound * std::abs(value) : x.bound + std::abs(value));
        }
        const bool keepdim = *rc::gen::arbitrary<bool>();
        const int64_t d = keepdim ? dim_of(x) : 0;  // without keepdim only a leading dim may go
        const double extent = static_cast<double>(x.shape[static_cast<size_t>(d < 0 ? d + rank : d)]);
        if (!add("sum", {&x}, {{"dim", d}, {"keepdim", keepdim}}, x.bound * std::max(1.0, extent))) return false;
        const DValue y = pool.back();
        const bool first = *rc::gen::arbitrary<bool>();
        const double bound = name == "mul" ? x.bound * y.bound : x.bound + y.bound;
        return first ? add(name, {&x, &y}, {}, bound) : add(name, {&y, &x}, {}, bound);
      }
      case 10: {  // a view: flatten, unsqueeze, squeeze, unflatten, reshape, permute or expand
        const int pick = *rc::gen::inRange(0, 7);
        if (pick == 0 && rank >= 2) return add("flatten", {&x}, {{"start_dim", 0}, {"end_dim", *rc::gen::element<int64_t>(1, -1)}}, x.bound);
        if (pick == 1 && rank < 3) return add("unsqueeze", {&x}, {{"dim", *rc::gen::inRange<int64_t>(-rank - 1, rank + 1)}}, x.bound);
        if (pick == 2) {
          for (int64_t d = 0; d < rank; ++d)
            if (x.shape[static_cast<size_t>(d)] == 1) return add("squeeze", {&x}, {{"dim", d}}, x.bound);
          return false;
        }
        if (pick == 3 && rank >= 1 && rank < 3) {  // split a dim: [a*b] -> [a, b] where it factors, else [1, n]
          const int64_t d = dim_of(x), n = x.shape[static_cast<size_t>(d < 0 ? d + rank : d)];
          int64_t a = 1;
          for (int64_t f = 2; f < n; ++f)
            if (n % f == 0) a = f;
          return add("unflatten", {&x}, {{"dim", d}, {"sizes", *rc::gen::arbitrary<bool>() ? Shape{a, -1} : Shape{n / a, a}}}, x.bound);
        }
        if (pick == 4 && rank >= 2) {  // merge the first two dims by view or reshape
          Shape target = {x.shape[0] * x.shape[1]};
          target.insert(target.end(), x.shape.begin() + 2, x.shape.end());
          return add(op_of(GenClass::Reshape), {&x}, {{"shape", target}}, x.bound);
        }
        if (pick == 5 && rank >= 1) {
          std::vector<int64_t> dims(static_cast<size_t>(rank));
          std::iota(dims.begin(), dims.end(), 0);
          for (int64_t i = rank - 1; i > 0; --i) std::swap(dims[i], dims[*rc::gen::inRange<int64_t>(0, i + 1)]);
          return add("permute", {&x}, {{"dims", dims}}, x.bound);
        }
        if (pick == 6 && rank < 3) {  // expand: a new leading dim, or a size-1 dim to an extent
          Shape target = x.shape;
          bool grew = false;
          for (auto& e : target)
            if (e == 1 && !grew) e = *rc::gen::inRange<int64_t>(1, 4), grew = true;
          if (!grew) target.insert(target.begin(), *rc::gen::inRange<int64_t>(1, 4));
          return add("expand", {&x}, {{"shape", target}}, x.bound);
        }
        return false;
      }
      case 11: {  // batched matmul: matmul (1-D to 3-D), bmm, linear (with a bias now and then)
        if (rank == 0) return false;
        const int64_t kx = x.shape.back();
        const int pick = *rc::gen::inRange(0, 3);
        if (pick == 0) {
          const DValue* y = partner([&](const DValue& v) {
            return !v.shape.empty() && v.shape[v.shape.size() == 1 ? 0 : v.shape.size() - 2] == kx && v.shape.size() <= 3;
          });
          return y && add("matmul", {&x, y}, {}, x.bound * y->bound * static_cast<double>(kx));
        }
        if (pick == 1) {
          if (rank != 3) return false;
          const DValue* y = partner([&](const DValue& v) { return v.shape.size() == 3 && v.shape[0] == x.shape[0] && v.shape[1] == kx; });
          return y && add("bmm", {&x, y}, {}, x.bound * y->bound * static_cast<double>(kx));
        }
        const DValue* w = partner([&](const DValue& v) { return v.shape.size() == 2 && v.shape[1] == kx; });
        if (!w) return false;
        const DValue weight = *w;
        const DValue* bias = partner([&](const DValue& v) { return v.shape == Shape{weight.shape[0]}; });
        const double bound = x.bound * weight.bound * static_cast<double>(kx) + (bias ? bias->bound : 0.0);
        if (bias) {
          const DValue b = *bias;
          return add("linear", {&x, &weight, &b}, {}, bound);
        }
        return add("linear", {&x, &weight}, {}, bound);
      }
      case 12: {  // cat, stack, narrow, split, chunk
        if (rank == 0) return false;
        const int pick = *rc::gen::inRange(0, 4);
        if (pick == 3) return split_or_chunk(x);
        const int64_t d = dim_of(x), dd = d < 0 ? d + rank : d;
        if (pick == 0) {
          const DValue* y = partner([&](const DValue& v) {
            if (v.shape.size() != x.shape.size()) return false;
            for (int64_t e = 0; e < rank; ++e)
              if (e != dd && v.shape[static_cast<size_t>(e)] != x.shape[static_cast<size_t>(e)]) return false;
            return true;
          });
          return y && add("cat", {&x, y}, {{"dim", d}}, std::max(x.bound, y->bound));
        }
        if (pick == 1) {
          if (rank >= 3) return false;
          const DValue* y = partner([&](const DValue& v) { return v.shape == x.shape; });
          return y && add("stack", {&x, y}, {{"dim", *rc::gen::inRange<int64_t>(-rank - 1, rank + 1)}}, std::max(x.bound, y->bound));
        }
        const int64_t n = x.shape[static_cast<size_t>(dd)];
        const int64_t start = *rc::gen::inRange<int64_t>(0, n + 1), length = *rc::gen::inRange<int64_t>(0, n - start + 1);
        return add("narrow", {&x}, {{"dim", d}, {"start", start}, {"length", length}}, x.bound);
      }
      case 13: {  // amax, amin (off the backward path: a shard of a reduced dim gives P(max)); a
                  // sum or mean over a list of dims
        json extra = {{"keepdim", *rc::gen::arbitrary<bool>()}};
        if (rank >= 2 && *rc::gen::arbitrary<bool>()) extra["dim"] = json::array({0, -1});
        else if (rank >= 1) extra["dim"] = dim_of(x);
        if (numel(x.shape) > 0 && *rc::gen::arbitrary<bool>()) {
          // On the backward path only where no reduced dim is sharded (P(max) has no gradient).
          const std::string name = op_of(GenClass::Extremum);
          OpDecl decl;
          decl.op = name;
          decl.attrs = extra;
          const auto spec = spec_after(name, op_attrs(decl), mesh, {&x}, policy);
          if (!spec) return false;
          for (const auto& p : *spec)
            if (x.grad && p.is_partial()) return false;
          return add(name, {&x}, extra, x.bound);
        }
        const std::string name = op_of(GenClass::Reduction);
        return add(name, {&x}, extra, name == "sum" ? x.bound * std::max(1.0, static_cast<double>(numel(x.shape))) : x.bound);
      }
      default: {  // redistribute, per axis to a target legal from where the value is
        Spec to;
        for (const auto& p : x.spec) to.push_back(*rc::gen::elementOf(targets(p, rank, x.grad)));
        to = strided_now_and_then(mesh, to, x.shape);
        DValue y = x;
        y.name = "v" + std::to_string(program.size());
        y.spec = to;
        program.push_back(op(y.name, "redistribute", {x.name}, {{"placements", spec_json(to)}}));
        pool.push_back(y);
        return true;
      }
    }
  }
};

}  // namespace

json dtensor_program(const ProgramOptions& o) {
  const Mesh mesh = small_mesh();
  json options = draw_options({});
  if (o.float32_randn) options["dtype"] = "float32";
  // strict too (JAX's rule): the generator draws no op whose operands it refuses.
  if (*rc::gen::inRange(0, 3) == 0) options["reduced_propagation"] = "strict";
  int64_t unit = 1;  // with `even`, extents are multiples of every axis size
  if (o.even)
    for (auto size : mesh.shape()) unit = std::lcm(unit, size);
  auto extent = [&] { return o.even ? unit * *rc::gen::inRange<int64_t>(1, 3) : *rc::gen::inRange<int64_t>(1, 7); };
  const int64_t m = extent(), k = extent(), n = extent();
  auto spec = [&](bool grad) {
    return *gen::spec(mesh, grad ? differentiable_placement(2) : any_placement(2));
  };
  const std::string policy = options["reduced_propagation"];
  DTensorBuilder b{mesh,
                   policy == "union"    ? ReducedPropagation::Union
                   : policy == "strict" ? ReducedPropagation::Strict
                                        : ReducedPropagation::Intersection,
                   {},
                   json::array()};
  b.seed = options["seed"].get<uint64_t>();
  b.pool = {{"a", {m, k}, spec(true), true}, {"b", {k, n}, spec(true), true},
            {"c", {m, n}, spec(false), false}, {"d", {m, k}, spec(true), true}};
  for (auto& v : b.pool) v.rounded = mesh_rounds(mesh);
  if (o.reduced) b.pool[0].spec[static_cast<size_t>(*rc::gen::inRange(0, mesh.ndim()))] = Placement::reduced();
  json inputs = json::array();
  for (const auto& v : b.pool) inputs.push_back(input(v.name, v.shape, v.spec, v.grad, o.float32_randn));
  const int count = *rc::gen::inRange(1, o.max_ops + 1);
  for (int i = 0; i < count; ++i) b.step();
  const DValue& last = b.pool.back();
  std::string loss_of = last.name;
  json program = b.program;
  if (last.shape == Shape{m, n} && spec_after("mul", {}, mesh, {&last, &b.pool[2]}, b.policy)) {
    program.push_back(op("weighted", "mul", {last.name, "c"}));
    loss_of = "weighted";
  }
  program = live_ops(program, {loss_of});
  // Seed 003's per-op opt-out, now and then: one op moves its operands the other way than the run
  // (values and gradients alike; only where the backward's collectives run differs). Drawn last,
  // so that every program drawn before keeps its ops.
  if (*rc::gen::inRange(0, 4) == 0) {
    std::vector<size_t> eligible;
    for (size_t i = 0; i < program.size(); ++i)
      if (program[i]["op"] != "redistribute" && !is_creation_op(program[i]["op"].get<std::string>())) eligible.push_back(i);
    if (!eligible.empty())
      program[*rc::gen::elementOf(eligible)]["redistribute_mode"] =
          options["redistribute"] == "above_autograd" ? "below_autograd" : "above_autograd";
  }
  program.push_back(op("loss", "sum", {loss_of}));
  for (const auto& in : b.extra_inputs) inputs.push_back(in);
  return {{"format", "meshsim.scenario/1"}, {"name", "dtensor_program"}, {"mesh", mesh_json(mesh)},
          {"options", options}, {"inputs", inputs}, {"program", program}, {"backward", "loss"}};
}

}  // namespace meshsim::gen

#include "properties/programs.h"

#include <cmath>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/layout.h"
#include "core/placement.h"
#include "core/propagation.h"
#include "core/redistribute.h"
#include "core/reduced_policy.h"
#include "core/scenario.h"
#include "properties/generators.h"
#include "sim/local_ops.h"

namespace meshsim::gen {

namespace {

using json = nlohmann::json;

json op(const std::string& out, const std::string& name, std::vector<std::string> args, json extra = json::object()) {
  json d = {{"out", out}, {"op", name}, {"args", args}};
  if (extra.is_object()) d.update(extra);  // `{}` makes a null
  return d;
}

json input(const std::string& name, const Shape& shape, const Spec& spec, bool grad, bool randn) {
  json d = {{"name", name}, {"shape", shape}, {"placements", spec_json(spec)}};
  if (grad) d["requires_grad"] = true;
  if (randn) d["init"] = "randn";
  return d;
}

// A small mesh: 1-2 axes of sizes 1-4, and now and then 3 axes of sizes 1-2 (the ops' cost grows
// with ranks; larger 3-axis meshes are exercised by the redistribution properties).
Mesh small_mesh() {
  const int ndim = *rc::gen::weightedElement<int>({{8, 1}, {8, 2}, {1, 3}});
  std::vector<std::string> axes;
  std::vector<int64_t> sizes;
  for (int a = 0; a < ndim; ++a) {
    axes.push_back(std::string(1, static_cast<char>('a' + a)));
    sizes.push_back(*rc::gen::inRange<int64_t>(1, ndim == 3 ? 3 : 5));
  }
  return Mesh(axes, sizes);
}

json draw_options(json base) {
  base["redistribute"] = *rc::gen::element<std::string>("above_autograd", "below_autograd");
  base["reduced_propagation"] = *rc::gen::element<std::string>("intersection", "union");
  base["partial_from_replicate"] = *rc::gen::element<std::string>("divide", "rank0");
  base["seed"] = *rc::gen::inRange<int>(0, 1000);
  return base;
}

// Drops the ops of `ops` whose results do not reach `roots` (dead code), so that a
// counterexample shows only the ops that matter.
json live_ops(const json& ops, std::set<std::string> live) {
  std::vector<json> kept;
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    if (!live.count((*it)["out"].get<std::string>())) continue;
    for (const auto& a : (*it)["args"]) live.insert(a.get<std::string>());
    kept.push_back(*it);
  }
  return json(std::vector<json>(kept.rbegin(), kept.rend()));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// DTensor programs

namespace {

// Generated data are small integers (|x| <= 4); every value carries a bound on its magnitude so
// that no drawn op overflows or loses the exactness the comparisons rely on: an op whose result
// could exceed kMaxBound is not drawn. `floor` > 0 marks a value known positive with that lower
// bound (exp, softmax): the only ones drawn as divisors.
constexpr double kInputBound = 4.0;
constexpr double kMaxBound = 1e6;
// A value that has been rounded (an op of `rounds`) stays within kMaxRoundedBound, and the
// transcendental ops take small operands only: the mesh and the oracle round in different orders,
// and the comparisons allow 1e-12 relative to the result, so rounding errors of large intermediate
// values (or sin of a large one) would be reported as a wrong rule.
constexpr double kMaxRoundedBound = 1e3;

// Whether an op rounds on integer data (the oracle's exact_op, oracles/check.cpp, says the same).
bool rounds(const std::string& name, const json& extra) {
  if (name == "scale") {
    const double v = std::abs(extra.value("value", 1.0));
    int exponent = 0;
    return !(v == std::trunc(v) || std::frexp(v, &exponent) == 0.5);
  }
  return name == "div" || name == "exp" || name == "mean" || name == "sin" || name == "softmax" || name == "tanh";
}

// The largest operand bound the transcendental ops take.
double operand_limit(const std::string& name) {
  if (name == "exp") return 6;
  if (name == "softmax") return 8;
  if (name == "sin" || name == "tanh") return 64;
  return kMaxBound;
}

// Whether an op may be drawn on operands of these bounds (and whether they were rounded) with a
// result of bound `bound`; `rounded` receives whether the result is.
struct Operand {
  double bound;
  bool rounded;
};
bool within_bounds(const std::string& name, const json& extra, const std::vector<Operand>& xs, double bound,
                   bool& rounded) {
  rounded = rounds(name, extra);
  for (const auto& x : xs) {
    rounded |= x.rounded;
    if (x.bound > operand_limit(name)) return false;
    // relu has a kink at 0: a rounded value the oracle has at exactly 0 may be 1e-17 on the mesh.
    if (name == "relu" && x.rounded) return false;
  }
  return std::isfinite(bound) && bound <= (rounded ? kMaxRoundedBound : kMaxBound);
}

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
    try {
      shape = infer_shape(name, shapes, attrs);
    } catch (const SemanticError&) {
      return false;
    }
    const auto spec = spec_after(name, attrs, mesh, xs, policy);
    if (!spec) return false;
    DValue y{"v" + std::to_string(program.size()), shape, *spec, false, bound, floor, rounded};
    std::vector<std::string> args;
    for (const auto* x : xs) {
      args.push_back(x->name);
      y.grad |= x->grad;
    }
    program.push_back(op(y.name, name, args, extra));
    pool.push_back(y);
    return true;
  }

  // One op: the drawn kind if it applies to the drawn operand, else the next kind that does.
  void step() {
    constexpr int kKinds = 9;
    const int first = *rc::gen::inRange(0, kKinds);
    const DValue x = any();
    for (int i = 0; i < kKinds; ++i)
      if (try_kind((first + i) % kKinds, x)) return;
  }

  bool try_kind(int kind, const DValue& x) {
    const int64_t rank = static_cast<int64_t>(x.shape.size());
    switch (kind) {
      case 0: {  // mm
        if (rank != 2) return false;
        const DValue* y = partner([&](const DValue& v) { return v.shape.size() == 2 && v.shape[0] == x.shape[1]; });
        return y && add("mm", {&x, y}, {}, x.bound * y->bound * static_cast<double>(x.shape[1]));
      }
      case 1: {  // add, sub, mul with a value of the same shape
        const DValue* y = partner([&](const DValue& v) { return v.shape == x.shape; });
        const std::string name = *rc::gen::element<std::string>("add", "sub", "mul");
        return add(name, {&x, y}, {}, name == "mul" ? x.bound * y->bound : x.bound + y->bound);
      }
      case 2: {  // div by a positive value of the same shape, made by exp when there is none
        const DValue* y = partner([&](const DValue& v) { return v.shape == x.shape && v.floor > 0; });
        if (!y) {
          const DValue* e = partner([&](const DValue& v) { return v.shape == x.shape && v.bound <= operand_limit("exp"); });
          if (!e || !add("exp", {e}, {}, std::exp(e->bound), std::exp(-e->bound))) return false;
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
      case 4: {  // exp, tanh, relu, sin
        const std::string name = *rc::gen::element<std::string>("exp", "tanh", "relu", "sin");
        if (name == "exp") return add(name, {&x}, {}, std::exp(x.bound), std::exp(-x.bound));
        return add(name, {&x}, {}, name == "relu" ? x.bound : std::min(1.0, x.bound));
      }
      case 5: {  // transpose, sharded dims included (dim0 == dim1 now and then)
        if (rank == 0) return false;
        return add("transpose", {&x}, {{"dim0", dim_of(x)}, {"dim1", dim_of(x)}}, x.bound);
      }
      case 6: {  // sum, mean over one dim or every dim, keepdim or not
        const std::string name = *rc::gen::element<std::string>("sum", "mean");
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
      default: {  // redistribute, per axis to a target legal from where the value is
        Spec to;
        for (const auto& p : x.spec) to.push_back(*rc::gen::elementOf(targets(p, rank, x.grad)));
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
  b.pool = {{"a", {m, k}, spec(true), true}, {"b", {k, n}, spec(true), true},
            {"c", {m, n}, spec(false), false}, {"d", {m, k}, spec(true), true}};
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
  program.push_back(op("loss", "sum", {loss_of}));
  return {{"format", "meshsim.scenario/1"}, {"name", "dtensor_program"}, {"mesh", mesh_json(mesh)},
          {"options", options}, {"inputs", inputs}, {"program", program}, {"backward", "loss"}};
}

// ---------------------------------------------------------------------------------------------
// One op on operands of every placement

json single_op_program() {
  const Mesh mesh = small_mesh();
  std::vector<std::pair<std::string, size_t>> ops;  // (op, arity)
  for (const auto& f : rule_families())
    for (const auto& o : f.ops) ops.emplace_back(o, f.arity);
  const auto [name, arity] = *rc::gen::elementOf(ops);
  const int64_t m = *rc::gen::inRange<int64_t>(1, 7), k = *rc::gen::inRange<int64_t>(1, 7),
                n = *rc::gen::inRange<int64_t>(1, 7);
  OpDecl decl;
  decl.op = name;
  decl.attrs = json::object();
  auto dim = [] { return *rc::gen::inRange<int64_t>(-2, 2); };
  if (name == "scale") decl.attrs["value"] = *rc::gen::element(-2.0, -1.0, -0.5, 0.0, 0.5, 1.5, 3.0);
  if (name == "transpose") decl.attrs.update({{"dim0", dim()}, {"dim1", dim()}});
  if (name == "softmax") decl.attrs["dim"] = dim();
  if (name == "sum" || name == "mean") {
    decl.attrs["keepdim"] = *rc::gen::arbitrary<bool>();
    if (*rc::gen::inRange(0, 4) != 0) decl.attrs["dim"] = dim();
  }
  std::vector<Shape> shapes = {{m, k}};
  if (name == "mm") shapes.push_back({k, n});
  else if (arity == 2) shapes.push_back({m, k});
  // Every placement per axis; an operand with P(max) or P(min) on an axis has no gradient.
  json inputs = json::array(), program = json::array();
  std::vector<std::string> args;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Spec spec = *gen::spec(mesh, any_placement(2));
    bool grad = true;
    for (const auto& p : spec) grad &= !p.is_partial() || is_linear(p.op);
    const std::string arg = std::string(1, static_cast<char>('a' + i));
    json in = input(arg, shapes[i], spec, grad, false);
    if (name == "div" && i == 1) in["init"] = "ones";  // a divisor with no zero, split over Partial axes
    inputs.push_back(in);
    args.push_back(arg);
  }
  program.push_back(op("y", name, args, decl.attrs));
  // A weight of the result's shape in any differentiable placement, so that gradients are not uniform.
  Shape out;
  try {
    out = infer_shape(name, shapes, op_attrs(decl));
  } catch (const SemanticError&) {
    out = shapes[0];
  }
  inputs.push_back(input("c", out, *gen::spec(mesh, differentiable_placement(static_cast<int64_t>(out.size()))), false, false));
  program.push_back(op("weighted", "mul", {"y", "c"}));
  program.push_back(op("loss", "sum", {"weighted"}));
  return {{"format", "meshsim.scenario/1"}, {"name", "single_op"}, {"mesh", mesh_json(mesh)},
          {"options", draw_options({})}, {"inputs", inputs}, {"program", program}, {"backward", "loss"}};
}

// ---------------------------------------------------------------------------------------------
// local_map programs

namespace {

// Per mesh axis, a body value's DTensor reading and its LTensor label.
enum class Reading { Shard, Partial, Replicated };
enum class Label { Variant, Reduced, None };

struct BodyValue {
  std::string name;      // in the body
  std::string ref;       // its value in the reference (collectives are the identity there)
  std::string twin;      // its value in the DTensor twin
  Shape shape;
  std::vector<Reading> reading;
  std::vector<int64_t> shard_dim;  // per axis, when Shard
  std::vector<Label> label;
  double bound = kInputBound;  // as DValue's: a bound on the global magnitude
  double floor = 0;            // > 0: known positive, with that lower bound
  bool rounded = false;

  bool has_partial() const {
    for (auto r : reading) if (r == Reading::Partial) return true;
    return false;
  }
  // The out placement it can leave the region with, when its label agrees with its reading.
  std::optional<Spec> out_spec() const {
    Spec s;
    for (size_t a = 0; a < reading.size(); ++a) {
      if (reading[a] == Reading::Replicated) {
        if (label[a] == Label::Variant) return std::nullopt;
        s.push_back(label[a] == Label::Reduced ? Placement::reduced() : Placement::replicate());
      } else {
        if (label[a] != Label::Variant) return std::nullopt;
        s.push_back(reading[a] == Reading::Shard ? Placement::shard(shard_dim[a]) : Placement::partial());
      }
    }
    return s;
  }
  Spec spec() const {  // the DTensor reading, with Rd where the label is reduced
    Spec s;
    for (size_t a = 0; a < reading.size(); ++a)
      s.push_back(reading[a] == Reading::Shard     ? Placement::shard(shard_dim[a])
                  : reading[a] == Reading::Partial ? Placement::partial()
                  : label[a] == Label::Reduced     ? Placement::reduced()
                                                   : Placement::replicate());
    return s;
  }
};

BodyValue entered(const std::string& name, const Shape& shape, const Spec& spec) {
  BodyValue v{name, name, name, shape, {}, {}, {}, kInputBound, 0, false};
  for (const auto& p : spec) {
    v.reading.push_back(p.is_shard() ? Reading::Shard : p.is_partial() ? Reading::Partial : Reading::Replicated);
    v.shard_dim.push_back(p.is_shard() ? p.dim : -1);
    v.label.push_back(p.is_shard() || p.is_partial() ? Label::Variant : p.is_reduced() ? Label::Reduced : Label::None);
  }
  return v;
}

// The label of a rank-local op's output: variant by union, reduced by intersection.
std::vector<Label> local_label(const std::vector<const BodyValue*>& xs) {
  std::vector<Label> out;
  for (size_t a = 0; a < xs[0]->label.size(); ++a) {
    bool variant = false, reduced = true;
    for (const auto* x : xs) {
      variant |= x->label[a] == Label::Variant;
      reduced &= x->label[a] == Label::Reduced;
    }
    out.push_back(variant ? Label::Variant : reduced ? Label::Reduced : Label::None);
  }
  return out;
}

bool same_reading(const BodyValue& x, const BodyValue& y, size_t a) {
  return x.reading[a] == y.reading[a] && x.shard_dim[a] == y.shard_dim[a];
}

// Whether another axis than `a` shards dim d of the value.
bool other_axis_shards(const BodyValue& x, size_t a, int64_t d) {
  for (size_t b = 0; b < x.reading.size(); ++b)
    if (b != a && x.reading[b] == Reading::Shard && x.shard_dim[b] == d) return true;
  return false;
}

// mm per axis, the rows that need no redistribution.
std::optional<std::pair<Reading, int64_t>> mm_reading(const BodyValue& x, const BodyValue& y, size_t a) {
  const Reading rx = x.reading[a], ry = y.reading[a];
  const int64_t dx = x.shard_dim[a], dy = y.shard_dim[a];
  if (rx == Reading::Shard && dx == 0 && ry == Reading::Replicated) return std::make_pair(Reading::Shard, int64_t{0});
  if (rx == Reading::Replicated && ry == Reading::Shard && dy == 1) return std::make_pair(Reading::Shard, int64_t{1});
  if (rx == Reading::Shard && dx == 1 && ry == Reading::Shard && dy == 0) return std::make_pair(Reading::Partial, int64_t{-1});
  if (rx == Reading::Replicated && ry == Reading::Replicated) return std::make_pair(Reading::Replicated, int64_t{-1});
  if ((rx == Reading::Partial && ry == Reading::Replicated) || (rx == Reading::Replicated && ry == Reading::Partial))
    return std::make_pair(Reading::Partial, int64_t{-1});
  return std::nullopt;
}

// Elementwise per axis: equal readings (add; mul but for two Partials, which is not linear), or
// a Partial times a Replicated one (mul).
bool elementwise_fits(const BodyValue& x, const BodyValue& y, size_t a, bool is_mul) {
  if (same_reading(x, y, a)) return !(is_mul && x.reading[a] == Reading::Partial);
  return is_mul && ((x.reading[a] == Reading::Partial && y.reading[a] == Reading::Replicated) ||
                    (x.reading[a] == Reading::Replicated && y.reading[a] == Reading::Partial));
}

struct LocalMapBuilder {
  Mesh mesh;
  std::vector<BodyValue> pool;
  json body = json::array(), reference = json::array(), twin_ops = json::array();
  int counter = 0;

  std::string fresh() { return "t" + std::to_string(counter++); }

  // The latest value half of the time (programs form chains), any value otherwise.
  const BodyValue& any() {
    if (*rc::gen::arbitrary<bool>()) return pool.back();
    return pool.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(pool.size()))));
  }

  // One body op: the drawn kind if it applies to the drawn operand, else the next kind that does.
  void step() {
    constexpr int kKinds = 16;
    // The collectives (kinds 3-6) three times as often as each other kind: they apply to fewer
    // operands, and the variance rules are what local_map programs exist to test.
    const int first = *rc::gen::weightedElement<int>({{1, 0}, {1, 1}, {1, 2}, {3, 3}, {3, 4}, {3, 5}, {3, 6}, {1, 7},
                                                      {1, 8}, {1, 9}, {1, 10}, {1, 11}, {1, 12}, {1, 13}, {1, 14}, {1, 15}});
    const BodyValue x = any();
    const size_t a = static_cast<size_t>(*rc::gen::inRange<int>(0, mesh.ndim()));
    for (int i = 0; i < kKinds; ++i)
      if (try_kind((first + i) % kKinds, x, a) || try_local_kind((first + i) % kKinds, x, a)) return;
  }

  // Whether some mesh axis shards dim d of the value.
  static bool sharded(const BodyValue& x, int64_t d) {
    for (size_t b = 0; b < x.reading.size(); ++b)
      if (x.reading[b] == Reading::Shard && x.shard_dim[b] == d) return true;
    return false;
  }
  static int64_t wrap(int64_t d, size_t rank) { return d < 0 ? d + static_cast<int64_t>(rank) : d; }
  int64_t dim_of(const BodyValue& x) {  // a dim of x, negative half of the time
    const auto r = static_cast<int64_t>(x.shape.size());
    const int64_t d = *rc::gen::inRange<int64_t>(0, r);
    return *rc::gen::arbitrary<bool>() ? d : d - r;
  }

  // The rank-local ops beyond mul, add and mm (kinds 8-15), each where the body's local result is
  // the global op's result under the value's reading: the non-linear ones of values with no
  // Partial axis, mean and softmax over dims no axis shards, division by a positive value.
  bool try_local_kind(int kind, const BodyValue& x, size_t a) {
    const size_t rank = x.shape.size();
    BodyValue y = x;
    y.name = fresh();
    if (kind == 8) {  // sub
      const BodyValue* z = elementwise_partner(x, false);
      if (!z) return false;
      return local_binary(y, "sub", x, *z, x.bound + z->bound);
    }
    if (kind == 9) {  // div by a positive value read alike or replicated on every axis, made by exp if none
      auto divisors = [&](bool positive) {
        std::vector<const BodyValue*> out;
        for (const auto& v : pool) {
          bool fits = v.shape == x.shape && (positive ? v.floor > 0 : !v.has_partial());
          for (size_t b = 0; b < x.reading.size() && fits; ++b)
            fits = x.reading[b] == Reading::Shard ? same_reading(x, v, b) : v.reading[b] == Reading::Replicated;
          if (fits) out.push_back(&v);
        }
        return out;
      };
      auto partners = divisors(true);
      if (partners.empty()) {
        const auto bases = divisors(false);
        if (bases.empty()) return false;
        const BodyValue& e = *bases.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(bases.size()))));
        BodyValue ye = e;
        ye.name = fresh();
        ye.floor = std::exp(-e.bound);
        if (!local_unary(ye, "exp", e, {}, std::exp(e.bound))) return false;
        partners = {&pool.back()};
      }
      const BodyValue z = *partners.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(partners.size()))));
      return local_binary(y, "div", x, z, x.bound / z.floor);
    }
    if (kind == 10) {  // neg, scale: linear, every reading passes
      if (*rc::gen::arbitrary<bool>()) return local_unary(y, "neg", x, {}, x.bound);
      const double value = *rc::gen::element(-2.0, -1.0, -0.5, 0.0, 0.5, 1.5, 3.0);
      return local_unary(y, "scale", x, {{"value", value}}, x.bound * std::abs(value));
    }
    if (kind == 11) {  // exp, tanh, relu, sin of a value with no Partial axis
      if (x.has_partial()) return false;
      const std::string name = *rc::gen::element<std::string>("exp", "tanh", "relu", "sin");
      if (name == "exp") {
        y.floor = std::exp(-x.bound);
        return local_unary(y, name, x, {}, std::exp(x.bound));
      }
      return local_unary(y, name, x, {}, name == "relu" ? x.bound : std::min(1.0, x.bound));
    }
    if (kind == 12) {  // transpose: a shard follows its dim
      if (rank == 0) return false;
      const int64_t d0 = dim_of(x), d1 = dim_of(x);
      const int64_t w0 = wrap(d0, rank), w1 = wrap(d1, rank);
      for (size_t b = 0; b < x.reading.size(); ++b)
        if (x.reading[b] == Reading::Shard)
          y.shard_dim[b] = x.shard_dim[b] == w0 ? w1 : x.shard_dim[b] == w1 ? w0 : x.shard_dim[b];
      std::swap(y.shape[static_cast<size_t>(w0)], y.shape[static_cast<size_t>(w1)]);
      return local_unary(y, "transpose", x, {{"dim0", d0}, {"dim1", d1}}, x.bound);
    }
    if (kind == 13) {  // sum (a shard of a summed dim becomes Partial) or mean (of unsharded dims)
      const bool mean = *rc::gen::arbitrary<bool>();
      const bool keepdim = *rc::gen::arbitrary<bool>();
      json extra = {{"keepdim", keepdim}};
      std::optional<int64_t> dim;
      if (rank > 0 && *rc::gen::inRange(0, 4) != 0) extra["dim"] = *(dim = dim_of(x));
      const auto summed = [&](int64_t d) { return !dim || wrap(*dim, rank) == d; };
      double count = 1;
      for (size_t d = 0; d < rank; ++d)
        if (summed(static_cast<int64_t>(d))) {
          count *= static_cast<double>(x.shape[d]);
          if (mean && sharded(x, static_cast<int64_t>(d))) return false;
        }
      Shape shape;
      for (size_t d = 0; d < rank; ++d)
        if (!summed(static_cast<int64_t>(d)) || keepdim) shape.push_back(summed(static_cast<int64_t>(d)) ? 1 : x.shape[d]);
      y.shape = shape;
      for (size_t b = 0; b < x.reading.size(); ++b) {
        if (x.reading[b] != Reading::Shard) continue;
        const int64_t d = x.shard_dim[b];
        if (summed(d)) {
          y.reading[b] = Reading::Partial;
          y.shard_dim[b] = -1;
        } else if (!keepdim && dim && d > wrap(*dim, rank)) {
          y.shard_dim[b] = d - 1;
        }
      }
      return local_unary(y, mean ? "mean" : "sum", x, extra, mean ? x.bound : x.bound * std::max(1.0, count));
    }
    if (kind == 14) {  // softmax along a dim no axis shards, of a value with no Partial axis
      if (rank == 0 || x.has_partial()) return false;
      const int64_t d = dim_of(x);
      if (sharded(x, wrap(d, rank))) return false;
      y.floor = std::exp(-2 * x.bound) / std::max<double>(1, static_cast<double>(x.shape[static_cast<size_t>(wrap(d, rank))]));
      return local_unary(y, "softmax", x, {{"dim", d}}, 1.0);
    }
    if (kind == 15) {  // mark_varying of an invariant axis (an identity on global values)
      if (x.label[a] != Label::None || x.reading[a] != Reading::Replicated) return false;
      y.label[a] = Label::Variant;
      body.push_back(op(y.name, "mark_varying", {x.name}, {{"axis", mesh.axes()[a]}}));
      add_collective(y, x);
      return true;
    }
    return false;
  }

  // A partner of the same shape for an elementwise op on every axis.
  const BodyValue* elementwise_partner(const BodyValue& x, bool is_mul) {
    std::vector<const BodyValue*> partners;
    for (const auto& v : pool) {
      bool fits = v.shape == x.shape;
      for (size_t b = 0; b < x.reading.size() && fits; ++b) fits = elementwise_fits(x, v, b, is_mul);
      if (fits) partners.push_back(&v);
    }
    if (partners.empty()) return nullptr;
    return partners.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(partners.size()))));
  }

  bool local_binary(BodyValue y, const std::string& name, const BodyValue& x, const BodyValue& z, double bound) {
    if (!within_bounds(name, {}, {{x.bound, x.rounded}, {z.bound, z.rounded}}, bound, y.rounded)) return false;
    for (size_t b = 0; b < x.reading.size(); ++b)
      if (x.reading[b] == Reading::Replicated) {
        y.reading[b] = z.reading[b];
        y.shard_dim[b] = z.shard_dim[b];
      }
    y.label = local_label({&x, &z});
    y.bound = bound;
    y.floor = 0;
    add_local(y, name, {x, z});
    return true;
  }

  bool local_unary(BodyValue y, const std::string& name, const BodyValue& x, json extra, double bound) {
    if (!within_bounds(name, extra, {{x.bound, x.rounded}}, bound, y.rounded)) return false;
    if (name != "exp" && name != "softmax") y.floor = 0;
    y.bound = bound;
    add_local(y, name, {x}, std::move(extra));
    return true;
  }

  bool try_kind(int kind, const BodyValue& x, size_t a) {
    const size_t axes = static_cast<size_t>(mesh.ndim());
    const std::string axis = mesh.axes()[a];
    BodyValue y = x;
    y.name = fresh();
    if (kind > 7) return false;  // try_local_kind's
    if (kind <= 1) {  // mul or add with a value it fits
      const BodyValue* z = elementwise_partner(x, kind == 0);
      if (!z) return false;
      return kind == 0 ? local_binary(y, "mul", x, *z, x.bound * z->bound)
                       : local_binary(y, "add", x, *z, x.bound + z->bound);
    } else if (kind == 2) {  // mm with a direct row on every axis
      if (x.shape.size() != 2) return false;
      std::vector<const BodyValue*> partners;
      for (const auto& v : pool) {
        bool fits = v.shape.size() == 2 && v.shape[0] == x.shape[1];
        for (size_t b = 0; b < axes && fits; ++b) fits = mm_reading(x, v, b).has_value();
        if (fits) partners.push_back(&v);
      }
      if (partners.empty()) return false;
      const BodyValue& z = *partners.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(partners.size()))));
      y.shape = {x.shape[0], z.shape[1]};
      for (size_t b = 0; b < axes; ++b) std::tie(y.reading[b], y.shard_dim[b]) = *mm_reading(x, z, b);
      y.label = local_label({&x, &z});
      y.bound = x.bound * z.bound * static_cast<double>(x.shape[1]);
      y.floor = 0;
      if (!within_bounds("mm", {}, {{x.bound, x.rounded}, {z.bound, z.rounded}}, y.bound, y.rounded)) return false;
      add_local(y, "mm", {x, z});
    } else if (kind == 3) {  // all_reduce, or the opaque all_reduce Function, of a Partial axis
      if (x.reading[a] != Reading::Partial) return false;
      y.reading[a] = Reading::Replicated;
      y.label[a] = Label::None;
      const bool opaque = *rc::gen::arbitrary<bool>();
      body.push_back(opaque ? op(y.name, "call", {x.name}, {{"function", "opaque_all_reduce"}, {"axis", axis}})
                            : op(y.name, "all_reduce", {x.name}, {{"axis", axis}, {"reduce", "sum"}}));
      add_collective(y, x);
    } else if (kind == 4) {  // all_gather of a shard, to reduced or to varying
      const int64_t d = x.shard_dim[a];
      if (x.reading[a] != Reading::Shard || other_axis_shards(x, a, d)) return false;
      const bool to_reduced = *rc::gen::arbitrary<bool>();
      y.reading[a] = Reading::Replicated;
      y.shard_dim[a] = -1;
      y.label[a] = to_reduced ? Label::Reduced : Label::Variant;
      body.push_back(op(y.name, "all_gather", {x.name}, {{"axis", axis}, {"dim", d}, {"to", to_reduced ? "reduced" : "varying"}}));
      add_collective(y, x);
    } else if (kind == 5) {  // reduce_scatter of a Partial axis
      if (x.reading[a] != Reading::Partial || x.shape.empty()) return false;
      const int64_t d = *rc::gen::inRange<int64_t>(0, static_cast<int64_t>(x.shape.size()));
      if (other_axis_shards(x, a, d)) return false;
      y.reading[a] = Reading::Shard;
      y.shard_dim[a] = d;
      body.push_back(op(y.name, "reduce_scatter", {x.name}, {{"axis", axis}, {"dim", d}}));
      add_collective(y, x);
    } else if (kind == 6) {  // all_to_all between shards
      const int64_t i = x.shard_dim[a];
      if (x.reading[a] != Reading::Shard || x.shape.size() < 2) return false;
      const int64_t j = 1 - i;
      if (other_axis_shards(x, a, i) || other_axis_shards(x, a, j)) return false;
      y.shard_dim[a] = j;
      body.push_back(op(y.name, "all_to_all", {x.name}, {{"axis", axis}, {"split_dim", j}, {"concat_dim", i}}));
      add_collective(y, x);
    } else {  // the rank-local Function local_square: not of a Partial
      if (x.has_partial() || !within_bounds("mul", {}, {{x.bound, x.rounded}}, x.bound * x.bound, y.rounded)) return false;
      y.bound = x.bound * x.bound;
      y.floor = 0;
      body.push_back(op(y.name, "call", {x.name}, {{"function", "local_square"}}));
      reference.push_back(op(y.name, "mul", {x.ref, x.ref}));
      twin_ops.push_back(op("d_" + y.name, "mul", {x.twin, x.twin}));
      y.ref = y.name;
      y.twin = "d_" + y.name;
      pool.push_back(y);
    }
    return true;
  }

  void add_local(BodyValue y, const std::string& name, const std::vector<BodyValue>& xs, json extra = json::object()) {
    std::vector<std::string> args, refs, twins;
    for (const auto& x : xs) {
      args.push_back(x.name);
      refs.push_back(x.ref);
      twins.push_back(x.twin);
    }
    body.push_back(op(y.name, name, args, extra));
    reference.push_back(op(y.name, name, refs, extra));
    twin_ops.push_back(op("d_" + y.name, name, twins, extra));
    y.ref = y.name;
    y.twin = "d_" + y.name;
    pool.push_back(y);
  }

  // A collective is the identity on global values: the reference reuses the input, the twin
  // redistributes to the new reading.
  void add_collective(BodyValue y, const BodyValue& x) {
    y.ref = x.ref;
    twin_ops.push_back(op("d_" + y.name, "redistribute", {x.twin}, {{"placements", spec_json(y.spec())}}));
    y.twin = "d_" + y.name;
    pool.push_back(y);
  }
};

}  // namespace

json local_map_program(const ProgramOptions& o, json* twin, std::map<std::string, BodyLabels>* labels) {
  LocalMapBuilder b{small_mesh(), {}, json::array(), json::array(), json::array(), 0};
  const int64_t m = *rc::gen::inRange<int64_t>(1, 7), k = *rc::gen::inRange<int64_t>(1, 7),
                n = *rc::gen::inRange<int64_t>(1, 7);
  auto placement = rc::gen::elementOf(std::vector<Placement>{
      Placement::shard(0), Placement::shard(1), Placement::replicate(), Placement::partial(), Placement::reduced()});
  const Spec sx = *gen::spec(b.mesh, placement), sw = *gen::spec(b.mesh, placement), sz = *gen::spec(b.mesh, placement);
  json inputs = {input("x", {m, k}, sx, true, o.float32_randn), input("w", {k, n}, sw, true, o.float32_randn),
                 input("z", {m, k}, sz, true, o.float32_randn)};
  b.pool = {entered("x", {m, k}, sx), entered("w", {k, n}, sw), entered("z", {m, k}, sz)};
  const int count = *rc::gen::inRange(1, o.max_ops + 1);
  for (int i = 0; i < count; ++i) b.step();
  // Return the latest value whose label agrees with its reading.
  const BodyValue* ret = nullptr;
  for (const auto& v : b.pool)
    if (v.out_spec()) ret = &v;
  const Spec out = *ret->out_spec();
  inputs.push_back(input("c", ret->shape, Spec(static_cast<size_t>(b.mesh.ndim()), Placement::replicate()), false, o.float32_randn));
  json lm = op("y", "local_map", {"x", "w", "z"});
  lm["out_placements"] = json::array({spec_json(out)});
  lm["body"] = b.body;  // dead ops too: their labels are checked (counterexamples shrink them away)
  lm["returns"] = {ret->name};
  json reference = b.reference;
  if (ret->ref != ret->name && ret->name != "x" && ret->name != "w" && ret->name != "z")
    reference.push_back(op(ret->name, "redistribute", {ret->ref}, {{"placements", spec_json(out)}}));
  lm["reference"] = live_ops(reference, {ret->name});
  json program = {lm, op("weighted", "mul", {"y", "c"}), op("loss", "sum", {"weighted"})};
  json options = draw_options({});
  if (o.float32_randn) options["dtype"] = "float32";
  json doc = {{"format", "meshsim.scenario/1"}, {"name", "local_map_program"}, {"mesh", mesh_json(b.mesh)},
              {"options", options}, {"inputs", inputs}, {"program", program}, {"backward", "loss"}};
  if (labels) {
    labels->clear();
    for (const auto& v : b.pool) {
      if (v.name == "x" || v.name == "w" || v.name == "z") continue;  // the region's inputs
      BodyLabels& l = (*labels)[v.name];
      for (size_t a = 0; a < v.label.size(); ++a) {
        if (v.label[a] == Label::Variant) l.variant.push_back(b.mesh.axes()[a]);
        if (v.label[a] == Label::Reduced) l.reduced.push_back(b.mesh.axes()[a]);
      }
    }
  }
  if (twin) {
    json tp = live_ops(b.twin_ops, {ret->twin});
    tp.push_back(op("y", "redistribute", {ret->twin}, {{"placements", spec_json(out)}}));
    tp.push_back(op("weighted", "mul", {"y", "c"}));
    tp.push_back(op("loss", "sum", {"weighted"}));
    *twin = doc;
    (*twin)["name"] = "local_map_program_twin";
    (*twin)["program"] = tp;
  }
  return doc;
}

}  // namespace meshsim::gen

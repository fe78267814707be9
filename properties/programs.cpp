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
    // relu's kink at 0: on randn data no value sits there (a mesh that rounds would move it off).
    json in = input(arg, shapes[i], spec, grad, name == "relu");
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

}  // namespace meshsim::gen

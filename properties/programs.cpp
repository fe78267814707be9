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
      } else {
        shape = infer_shape(name, shapes, attrs);
        spec = spec_after(name, attrs, mesh, xs, policy);
      }
    } catch (const SemanticError&) {
      return false;
    }
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

  // split {sizes | size} or chunk {chunks} of x along a dim: every piece joins the pool.
  bool split_or_chunk(const DValue& x) {
    const auto rank = static_cast<int64_t>(x.shape.size());
    const int64_t d = dim_of(x), dd = d < 0 ? d + rank : d, n = x.shape[static_cast<size_t>(dd)];
    OpDecl decl;
    decl.op = *rc::gen::element<std::string>("split", "chunk");
    decl.attrs = {{"dim", d}};
    if (decl.op == "chunk") decl.attrs["chunks"] = *rc::gen::inRange<int64_t>(1, 4);
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
    constexpr int kKinds = 14;
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
      case 9: {  // a binary op against a broadcast operand (a reduction of x keeps it small), or a scalar
        const std::string name = *rc::gen::element<std::string>("add", "sub", "mul");
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
          return add(*rc::gen::element<std::string>("view", "reshape"), {&x}, {{"shape", target}}, x.bound);
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
          const std::string name = *rc::gen::element<std::string>("amax", "amin");
          OpDecl decl;
          decl.op = name;
          decl.attrs = extra;
          const auto spec = spec_after(name, op_attrs(decl), mesh, {&x}, policy);
          if (!spec) return false;
          for (const auto& p : *spec)
            if (x.grad && p.is_partial()) return false;
          return add(name, {&x}, extra, x.bound);
        }
        const std::string name = *rc::gen::element<std::string>("sum", "mean");
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

namespace {

// A random order of 0..n-1, each dim negative half of the time.
std::vector<int64_t> permutation(int64_t n) {
  std::vector<int64_t> dims(static_cast<size_t>(n));
  std::iota(dims.begin(), dims.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) std::swap(dims[i], dims[*rc::gen::inRange<int64_t>(0, i + 1)]);
  for (auto& d : dims)
    if (*rc::gen::arbitrary<bool>()) d -= n;
  return dims;
}

// The operand shapes and attributes of one op: every attribute form the op takes (dims as one
// dim, a list or none; broadcast pairs and the scalar form of binary ops; matmul's ranks; view
// targets with -1), on extents m, k, n and a batch b.
std::vector<Shape> draw_case(const std::string& name, size_t arity, json& attrs) {
  const int64_t m = *rc::gen::inRange<int64_t>(1, 7), k = *rc::gen::inRange<int64_t>(1, 7),
                n = *rc::gen::inRange<int64_t>(1, 7), b = *rc::gen::inRange<int64_t>(1, 4);
  const int64_t m_drawn = m;
  auto dim = [](int64_t rank) { return *rc::gen::inRange<int64_t>(-rank, rank); };
  if (name == "scale") attrs["value"] = *rc::gen::element(-2.0, -1.0, -0.5, 0.0, 0.5, 1.5, 3.0);
  if (name == "transpose") attrs.update({{"dim0", dim(2)}, {"dim1", dim(2)}});
  if (name == "softmax") attrs["dim"] = dim(2);
  if (name == "sum" || name == "mean" || name == "amax" || name == "amin") {
    attrs["keepdim"] = *rc::gen::arbitrary<bool>();
    const int form = *rc::gen::inRange(0, 4);
    if (form == 1) attrs["dim"] = dim(3);
    if (form == 2) attrs["dim"] = json::array({0, -1});
    if (form == 3) attrs["dim"] = json::array({dim(3)});
    return {{m, k, n}};
  }
  if (name == "mm") return {{m, k}, {k, n}};
  if (name == "bmm") return {{b + 1, m, k}, {b + 1, k, n}};
  if (name == "matmul")
    return *rc::gen::elementOf(std::vector<std::vector<Shape>>{{{m, k}, {k, n}},
                                                               {{k}, {k, n}},
                                                               {{m, k}, {k}},
                                                               {{b, m, k}, {k, n}},
                                                               {{1, m, k}, {b, k, n}},
                                                               {{k}, {k}},
                                                               {{b, m, k}, {k}},
                                                               {{m, k}, {b + 1, k, n}},
                                                               {{b + 1, m, k}, {b + 1, k, n}},
                                                               {{k}, {b + 1, k, n}}});
  if (name == "permute") {
    attrs["dims"] = permutation(3);
    return {{m, k, n}};
  }
  if (name == "view" || name == "reshape") {
    // A leading extent of 12 half the time: even on every axis size drawn, so a shard of a merged
    // group's leading dim stays a shard (uneven ones are gathered, view_layout_mismatches).
    const int64_t m = *rc::gen::arbitrary<bool>() ? int64_t{12} : m_drawn;
    Shape target = *rc::gen::elementOf(std::vector<Shape>{{m * k, n}, {m, k * n}, {m * k * n}, {m, k, n}, {m, k, n, 1}, {1, m * k, n}});
    if (*rc::gen::arbitrary<bool>()) target[*rc::gen::inRange<size_t>(0, target.size())] = -1;
    attrs["shape"] = target;
    return {{m, k, n}};
  }
  if (name == "flatten") {
    const int64_t start = *rc::gen::inRange<int64_t>(0, 3), end = *rc::gen::inRange<int64_t>(start, 3);
    attrs.update({{"start_dim", start}, {"end_dim", *rc::gen::arbitrary<bool>() ? end : end - 3}});
    return {{m, k, n}};
  }
  if (name == "unflatten") {
    attrs.update({{"dim", *rc::gen::element<int64_t>(1, -1)}, {"sizes", *rc::gen::arbitrary<bool>() ? Shape{k, n} : Shape{-1, n}}});
    return {{m, k * n}};
  }
  if (name == "squeeze") {
    if (*rc::gen::arbitrary<bool>()) attrs["dim"] = *rc::gen::element<int64_t>(1, -2);
    return {{m, 1, k}};
  }
  if (name == "unsqueeze") {
    attrs["dim"] = dim(3);
    return {{m, k}};
  }
  if (name == "expand") {
    const int form = *rc::gen::inRange(0, 3);
    attrs["shape"] = form == 0 ? Shape{m, k} : form == 1 ? Shape{m, -1} : Shape{b, m, k};
    return {form == 0 ? Shape{1, k} : form == 1 ? Shape{1, k} : Shape{m, 1}};
  }
  if (name == "cat") {
    const bool rows = *rc::gen::arbitrary<bool>();
    attrs["dim"] = rows ? *rc::gen::element<int64_t>(0, -2) : *rc::gen::element<int64_t>(1, -1);
    return rows ? std::vector<Shape>{{m, k}, {n, k}} : std::vector<Shape>{{m, k}, {m, n}};
  }
  if (name == "stack") {
    attrs["dim"] = dim(3);
    return {{m, k}, {m, k}};
  }
  if (name == "narrow") {
    const int64_t d = *rc::gen::inRange<int64_t>(0, 2), size = d == 0 ? m : k;
    const int64_t start = *rc::gen::inRange<int64_t>(0, size + 1), length = *rc::gen::inRange<int64_t>(0, size - start + 1);
    attrs.update({{"dim", *rc::gen::arbitrary<bool>() ? d : d - 2}, {"start", start}, {"length", length}});
    return {{m, k}};
  }
  if (arity == 2) {  // binary pointwise: the same shape, a broadcast operand, or a scalar value
    const int form = *rc::gen::inRange(0, 6);
    if (form == 5) {
      attrs["value"] = name == "div" ? *rc::gen::element(0.5, 2.0, -4.0) : *rc::gen::element(-2.0, 0.0, 1.5, 3.0);
      return {{m, k}};
    }
    const Shape other = std::vector<Shape>{{m, k}, {k}, {1, k}, {m, 1}, {}}[static_cast<size_t>(form)];
    return *rc::gen::arbitrary<bool>() ? std::vector<Shape>{{m, k}, other} : std::vector<Shape>{other, {m, k}};
  }
  return {{m, k}};
}

}  // namespace

json single_op_program() {
  const Mesh mesh = small_mesh();
  std::vector<std::pair<std::string, size_t>> ops;  // (op, arity)
  for (const auto& f : rule_families())
    for (const auto& o : f.ops)  // matmul more often: its ranks and batch broadcasting have the most rules
      for (int copies = o == "matmul" ? 4 : o == "bmm" || o == "div" || f.name == "view" || f.name == "amax" || f.name == "amin" ||
                                                    f.name == "expand" || f.name == "cat" || f.name == "stack"
                                                ? 2
                                                : 1;
           copies > 0; --copies)
        ops.emplace_back(o, f.arity);
  const auto [name, arity] = *rc::gen::elementOf(ops);
  OpDecl decl;
  decl.op = name;
  decl.attrs = json::object();
  const std::vector<Shape> shapes = draw_case(name, arity, decl.attrs);
  // Every placement per axis, or (3 times in 4) per axis the operands of a random row of the
  // op's table, so that every row and every backward rule is drawn often (a rule of a rare shape
  // would wait long for random placements to fit it). An operand with P(max) or P(min) on an axis
  // has no gradient, nor have the operands of amax or amin when the result is P(max) or P(min).
  std::vector<Spec> specs;
  for (const auto& sh : shapes) specs.push_back(*gen::spec(mesh, any_placement(static_cast<int64_t>(sh.size()))));
  // Views take random placements half the time: which shards a view may keep is the rule under
  // test, and its table lists only the ones it keeps.
  if (*rc::gen::inRange(0, 4) >= (is_view_op(name) ? 2 : 1)) {
    std::vector<Shape> row_shapes = shapes;
    OpAttrs row_attrs = op_attrs(decl);
    if (row_attrs.scalar && shapes.size() == 1) {  // the scalar is a replicated 0-d operand
      row_shapes.push_back({});
      row_attrs.scalar = false;
    }
    const auto rows = rule_rows_for(name, row_shapes, row_attrs);
    std::vector<RuleRow> shard_rows;  // rows that shard an operand: drawn two times in three
    for (const auto& row : rows)
      for (const auto& p : row.ins)
        if (p.is_shard()) {
          shard_rows.push_back(row);
          break;
        }
    for (int a = 0; a < mesh.ndim(); ++a) {
      const RuleRow& row = !shard_rows.empty() && *rc::gen::inRange(0, 3) != 0 ? *rc::gen::elementOf(shard_rows)
                                                                              : *rc::gen::elementOf(rows);
      for (size_t i = 0; i < shapes.size(); ++i)
        specs[i][static_cast<size_t>(a)] =
            row.ins[i].is_plain_replicate() && *rc::gen::arbitrary<bool>() ? Placement::reduced() : row.ins[i];
    }
  }
  else if (is_view_op(name) && !shapes[0].empty()) {  // a shard of any dim, on every axis now and then
    for (int a = 0; a < mesh.ndim(); ++a)
      if (*rc::gen::arbitrary<bool>())
        specs[0][static_cast<size_t>(a)] =
            Placement::shard(*rc::gen::inRange<int64_t>(0, static_cast<int64_t>(shapes[0].size())));
  }
  bool result_differentiable = true;
  if (name == "amax" || name == "amin") {
    try {
      for (const auto& p : propagate(name, mesh, specs, shapes, op_attrs(decl)).out_spec)
        result_differentiable &= !p.is_partial();
    } catch (const SemanticError&) {
      result_differentiable = false;
    }
  }
  json inputs = json::array(), program = json::array();
  std::vector<std::string> args;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Spec& spec = specs[i];
    bool grad = result_differentiable;
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

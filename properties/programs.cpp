#include "properties/programs.h"

#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/layout.h"
#include "core/placement.h"
#include "core/propagation.h"
#include "properties/generators.h"

namespace meshsim::gen {

namespace {

using json = nlohmann::json;

json op(const std::string& out, const std::string& name, std::vector<std::string> args, json extra = json::object()) {
  json d = {{"out", out}, {"op", name}, {"args", args}};
  d.update(extra);
  return d;
}

json input(const std::string& name, const Shape& shape, const Spec& spec, bool grad, bool randn) {
  json d = {{"name", name}, {"shape", shape}, {"placements", spec_json(spec)}};
  if (grad) d["requires_grad"] = true;
  if (randn) d["init"] = "randn";
  return d;
}

// A small mesh: 1-2 axes of sizes 1-4 (the ops' cost grows with ranks; 3-axis meshes are
// exercised by the redistribution properties).
Mesh small_mesh() {
  const int ndim = *rc::gen::inRange(1, 3);
  std::vector<std::string> axes;
  std::vector<int64_t> sizes;
  for (int a = 0; a < ndim; ++a) {
    axes.push_back(std::string(1, static_cast<char>('a' + a)));
    sizes.push_back(*rc::gen::inRange<int64_t>(1, 5));
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

struct Value {
  std::string name;
  Shape shape;
};

// The values of `pool` whose shape is `shape`.
std::vector<const Value*> of_shape(const std::vector<Value>& pool, const Shape& shape) {
  std::vector<const Value*> out;
  for (const auto& v : pool)
    if (v.shape == shape) out.push_back(&v);
  return out;
}

// The 2-D values of `pool` with `rows` rows (right operands of an mm).
std::vector<const Value*> of_shape_rows(const std::vector<Value>& pool, int64_t rows) {
  std::vector<const Value*> out;
  for (const auto& v : pool)
    if (v.shape.size() == 2 && v.shape[0] == rows) out.push_back(&v);
  return out;
}

const Value& pick(const std::vector<const Value*>& vs) {
  return *vs.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(vs.size()))));
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

json dtensor_program(const ProgramOptions& o) {
  const Mesh mesh = small_mesh();
  const int64_t m = *rc::gen::inRange<int64_t>(1, 7), k = *rc::gen::inRange<int64_t>(1, 7),
                n = *rc::gen::inRange<int64_t>(1, 7);
  auto spec = [&] { return *gen::spec(mesh, differentiable_placement(2)); };
  json inputs = {input("a", {m, k}, spec(), true, o.float32_randn), input("b", {k, n}, spec(), true, o.float32_randn),
                 input("c", {m, n}, spec(), false, o.float32_randn), input("d", {m, k}, spec(), true, o.float32_randn)};
  std::vector<Value> pool = {{"a", {m, k}}, {"b", {k, n}}, {"c", {m, n}}, {"d", {m, k}}};
  json program = json::array();
  const int count = *rc::gen::inRange(1, o.max_ops + 1);
  for (int i = 0; i < count; ++i) {
    const std::string out = "v" + std::to_string(i);
    // The latest value half of the time (programs form chains that reach the loss).
    const Value& x = *rc::gen::arbitrary<bool>()
                         ? pool.back()
                         : pool.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(pool.size()))));
    const int kind = *rc::gen::inRange(0, 5);
    if (kind == 0 && x.shape.size() == 2 && !of_shape_rows(pool, x.shape[1]).empty()) {
      const Value& y = pick(of_shape_rows(pool, x.shape[1]));
      program.push_back(op(out, "mm", {x.name, y.name}));
      pool.push_back({out, {x.shape[0], y.shape[1]}});
    } else if (kind == 1) {
      const Value& y = pick(of_shape(pool, x.shape));
      program.push_back(op(out, *rc::gen::element<std::string>("add", "sub", "mul"), {x.name, y.name}));
      pool.push_back({out, x.shape});
    } else if (kind == 2 && !x.shape.empty()) {
      const int64_t dim = *rc::gen::inRange<int64_t>(0, static_cast<int64_t>(x.shape.size()));
      const bool keepdim = *rc::gen::arbitrary<bool>();
      program.push_back(op(out, "sum", {x.name}, {{"dim", dim}, {"keepdim", keepdim}}));
      Shape s = x.shape;
      if (keepdim) s[static_cast<size_t>(dim)] = 1; else s.erase(s.begin() + dim);
      pool.push_back({out, s});
    } else {
      // To S(d), R or Rd: legal from any placement.
      std::vector<Placement> targets = {Placement::replicate(), Placement::reduced()};
      for (int64_t d = 0; d < static_cast<int64_t>(x.shape.size()); ++d) targets.push_back(Placement::shard(d));
      program.push_back(op(out, "redistribute", {x.name}, {{"placements", spec_json(*rc::gen::container<Spec>(static_cast<size_t>(mesh.ndim()), rc::gen::elementOf(targets)))}}));
      pool.push_back({out, x.shape});
    }
  }
  const Value& last = pool.back();
  std::string loss_of = last.name;
  if (last.shape == Shape{m, n}) {
    program.push_back(op("weighted", "mul", {last.name, "c"}));
    loss_of = "weighted";
  }
  program = live_ops(program, {loss_of});
  program.push_back(op("loss", "sum", {loss_of}));
  json options = draw_options({});
  if (o.float32_randn) options["dtype"] = "float32";
  return {{"format", "meshsim.scenario/1"}, {"name", "dtensor_program"}, {"mesh", mesh_json(mesh)},
          {"options", options}, {"inputs", inputs}, {"program", program}, {"backward", "loss"}};
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
  BodyValue v{name, name, name, shape, {}, {}, {}};
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
    const int first = *rc::gen::inRange(0, 8);
    const BodyValue x = any();
    const size_t a = static_cast<size_t>(*rc::gen::inRange<int>(0, mesh.ndim()));
    for (int i = 0; i < 8; ++i)
      if (try_kind((first + i) % 8, x, a)) return;
  }

  bool try_kind(int kind, const BodyValue& x, size_t a) {
    const size_t axes = static_cast<size_t>(mesh.ndim());
    const std::string axis = mesh.axes()[a];
    BodyValue y = x;
    y.name = fresh();
    if (kind <= 1) {  // mul or add with a value it fits
      const bool is_mul = kind == 0;
      std::vector<const BodyValue*> partners;
      for (const auto& v : pool) {
        bool fits = v.shape == x.shape;
        for (size_t b = 0; b < axes && fits; ++b) fits = elementwise_fits(x, v, b, is_mul);
        if (fits) partners.push_back(&v);
      }
      if (partners.empty()) return false;
      const BodyValue& z = *partners.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(partners.size()))));
      for (size_t b = 0; b < axes; ++b)
        if (x.reading[b] == Reading::Replicated) {
          y.reading[b] = z.reading[b];
          y.shard_dim[b] = z.shard_dim[b];
        }
      y.label = local_label({&x, &z});
      const std::string name = is_mul ? "mul" : "add";
      add_local(y, name, {x, z});
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
      if (x.has_partial()) return false;
      body.push_back(op(y.name, "call", {x.name}, {{"function", "local_square"}}));
      reference.push_back(op(y.name, "mul", {x.ref, x.ref}));
      twin_ops.push_back(op("d_" + y.name, "mul", {x.twin, x.twin}));
      y.ref = y.name;
      y.twin = "d_" + y.name;
      pool.push_back(y);
    }
  return true;
  }

  void add_local(BodyValue y, const std::string& name, const std::vector<BodyValue>& xs) {
    std::vector<std::string> args, refs, twins;
    for (const auto& x : xs) {
      args.push_back(x.name);
      refs.push_back(x.ref);
      twins.push_back(x.twin);
    }
    body.push_back(op(y.name, name, args));
    reference.push_back(op(y.name, name, refs));
    twin_ops.push_back(op("d_" + y.name, name, twins));
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

json local_map_program(const ProgramOptions& o, json* twin) {
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
  lm["body"] = live_ops(b.body, {ret->name});
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

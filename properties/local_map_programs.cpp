// local_map programs: bodies drawn with a DTensor reading of every value, so that the reference is
// the same program on global tensors (properties/programs.h). Here the builder's collectives and
// rank-local ops and the program around the body; its layer and transformer-layer ops are in
// local_map_body.cpp (the model: local_map_body.h).
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <rapidcheck.h>

#include "core/layout.h"
#include "core/placement.h"
#include "properties/generators.h"
#include "properties/local_map_body.h"
#include "properties/program_parts.h"
#include "properties/programs.h"

namespace meshsim::gen {

using namespace parts;

namespace body {

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


namespace {

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

}  // namespace

void LocalMapBuilder::step() {
  constexpr int kKinds = 19;
  // The collectives (kinds 3-6) three times as often as each other kind: they apply to fewer
  // operands, and the variance rules are what local_map programs exist to test.
  const int first = *rc::gen::weightedElement<int>({{1, 0}, {1, 1}, {1, 2}, {3, 3}, {3, 4}, {3, 5}, {3, 6}, {1, 7},
                                                    {1, 8}, {1, 9}, {1, 10}, {1, 11}, {1, 12}, {1, 13}, {1, 14}, {1, 15}, {1, 16}, {2, 17}, {3, 18}});
  const BodyValue x = any();
  const size_t a = static_cast<size_t>(*rc::gen::inRange<int>(0, mesh.ndim()));
  for (int i = 0; i < kKinds; ++i)
    if (try_kind((first + i) % kKinds, x, a) || try_local_kind((first + i) % kKinds, x, a)) return;
}

bool LocalMapBuilder::try_local_kind(int kind, const BodyValue& x, size_t a) {
  const size_t rank = x.shape.size();
  BodyValue y = renamed(x);
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
      if (!local_exp(e)) return false;
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
  if (kind == 11) return local_pointwise(y, GenClass::Unary, x);  // exp, relu, sin, tanh
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
    const std::string name = op_of(GenClass::Reduction);
    const bool mean = name != "sum";
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
    return local_unary(y, name, x, extra, mean ? x.bound : x.bound * std::max(1.0, count));
  }
  if (kind == 14) {  // softmax along a dim no axis shards, of a value with no Partial axis
    if (rank == 0 || x.has_partial()) return false;
    const int64_t d = dim_of(x);
    if (sharded(x, wrap(d, rank))) return false;
    const double floor = std::exp(-2 * x.bound) / std::max<double>(1, static_cast<double>(x.shape[static_cast<size_t>(wrap(d, rank))]));
    return local_unary(y, "softmax", x, {{"dim", d}}, 1.0, floor);
  }
  if (kind == 16) return try_layer_kind(x);
  if (kind == 17) return try_nn_kind(x);
  if (kind == 18) return try_select_kind(x);
  if (kind == 15) {  // mark_varying of an invariant axis (an identity on global values)
    if (x.label[a] != Label::None || x.reading[a] != Reading::Replicated) return false;
    y.label[a] = Label::Variant;
    body.push_back(op(y.name, "mark_varying", {x.name}, {{"axis", mesh.axes()[a]}}));
    add_collective(y, x);
    return true;
  }
  return false;
}

const BodyValue* LocalMapBuilder::mm_product(BodyValue& y, const BodyValue& x, const char* name) {
  const BodyValue* z = mm_partner(x);
  if (!z) return nullptr;
  y.shape = {x.shape[0], z->shape[1]};
  for (size_t b = 0; b < x.reading.size(); ++b) std::tie(y.reading[b], y.shard_dim[b]) = *mm_reading(x, *z, b);
  y.label = local_label({&x, z});
  y.bound = x.bound * z->bound * static_cast<double>(x.shape[1]);
  y.floor = 0;
  if (!within_bounds(name, {}, {{x.bound, x.rounded}, {z->bound, z->rounded}}, y.bound, y.rounded)) return nullptr;
  return z;
}

const BodyValue* LocalMapBuilder::mm_partner(const BodyValue& x) {
  std::vector<const BodyValue*> partners;
  for (const auto& v : pool) {
    bool fits = v.shape.size() == 2 && x.shape.size() == 2 && v.shape[0] == x.shape[1];
    for (size_t b = 0; b < x.reading.size() && fits; ++b) fits = mm_reading(x, v, b).has_value();
    if (fits) partners.push_back(&v);
  }
  if (partners.empty()) return nullptr;
  return partners.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(partners.size()))));
}

const BodyValue* LocalMapBuilder::elementwise_partner(const BodyValue& x, bool is_mul) {
  std::vector<const BodyValue*> partners;
  for (const auto& v : pool) {
    bool fits = v.shape == x.shape;
    for (size_t b = 0; b < x.reading.size() && fits; ++b) fits = elementwise_fits(x, v, b, is_mul);
    if (fits) partners.push_back(&v);
  }
  if (partners.empty()) return nullptr;
  return partners.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(partners.size()))));
}

bool LocalMapBuilder::local_binary(BodyValue y, const std::string& name, const BodyValue& x, const BodyValue& z, double bound) {
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

bool LocalMapBuilder::local_unary(BodyValue y, const std::string& name, const BodyValue& x, json extra, double bound, double floor) {
  if (!within_bounds(name, extra, {{x.bound, x.rounded}}, bound, y.rounded)) return false;
  y.floor = floor;
  y.bound = bound;
  add_local(y, name, {x}, std::move(extra));
  return true;
}

bool LocalMapBuilder::local_exp(const BodyValue& x) {
  BodyValue y = renamed(x);
  const ValueRange r = result_range("exp", {}, {x.bound, x.floor});
  return local_unary(y, "exp", x, {}, r.bound, r.floor);
}

bool LocalMapBuilder::local_pointwise(BodyValue y, GenClass c, const BodyValue& x) {
  if (x.has_partial()) return false;
  const std::string name = op_of(c);
  const json extra = drawn_attrs(name);
  BodyValue v = x;
  if (needs_positive(name) && !(x.floor > 0)) {
    if (!local_exp(x)) return false;
    v = pool.back();
  }
  const ValueRange r = result_range(name, extra, {v.bound, v.floor});
  return local_unary(y, name, v, extra, r.bound, r.floor);
}

bool LocalMapBuilder::try_kind(int kind, const BodyValue& x, size_t a) {
  const std::string axis = mesh.axes()[a];
  BodyValue y = renamed(x);
  if (kind > 7) return false;  // try_local_kind's
  // The reductions of a Partial axis take any axis the value is Partial on, not just the drawn one.
  if ((kind == 3 || kind == 5) && x.reading[a] != Reading::Partial)
    for (size_t b = 0; b < x.reading.size(); ++b)
      if (x.reading[b] == Reading::Partial) return try_kind(kind, x, b);
  if (kind <= 1) {  // mul or add with a value it fits
    const BodyValue* z = elementwise_partner(x, kind == 0);
    if (!z) return false;
    return kind == 0 ? local_binary(y, "mul", x, *z, x.bound * z->bound)
                     : local_binary(y, "add", x, *z, x.bound + z->bound);
  } else if (kind == 2) {  // mm with a direct row on every axis
    if (x.shape.size() != 2) return false;
    const BodyValue* z = mm_product(y, x, "mm");
    if (!z) return false;
    add_local(y, "mm", {x, *z});
  } else if (kind == 3) {  // all_reduce, or an opaque all_reduce Function, of a Partial axis
    if (x.reading[a] != Reading::Partial) return false;
    y.reading[a] = Reading::Replicated;
    y.label[a] = Label::None;
    // The Function a third of the time, the one of two outputs (the sum and the kept local) a sixth.
    const int which = *rc::gen::inRange(0, 6);
    if (which == 2) {
      BodyValue kept = renamed(x);
      json call = op(y.name, "call", {x.name}, {{"function", "all_reduce_keep_local"}, {"axis", axis}});
      call["out"] = {y.name, kept.name};
      body.push_back(call);
      add_collective(y, x);
      add_collective(kept, x);
      return true;
    }
    body.push_back(which < 2 ? op(y.name, "call", {x.name}, {{"function", "opaque_all_reduce"}, {"axis", axis}})
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
  } else if (kind == 6) {  // all_to_all between shards, or with split sizes there and back
    const int64_t i = x.shard_dim[a];
    // The split sizes' rows: dim 0 sharded there, so every member's rows have one shape.
    if (x.reading[a] == Reading::Shard && i == 0 && *rc::gen::inRange(0, 3) == 0) {
      split_round_trip(y, x, a);
      return true;
    }
    if (x.reading[a] != Reading::Shard || x.shape.size() < 2) return false;
    // Another dim than i (values of 3 dims come from the layer ops).
    const auto r = static_cast<int64_t>(x.shape.size());
    const int64_t j = (i + *rc::gen::inRange<int64_t>(1, r)) % r;
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

void LocalMapBuilder::add_local(BodyValue y, const std::string& name, const std::vector<BodyValue>& xs, json extra) {
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

void LocalMapBuilder::split_round_trip(BodyValue y, const BodyValue& x, size_t a) {
  const std::string axis = mesh.axes()[a];
  const auto n = static_cast<int64_t>(mesh.shape()[a]);
  // A destination per row of dim 0, laid out as x's rows (sharded where x's dim 0 is).
  std::vector<std::pair<Reading, int64_t>> rows;
  for (size_t b = 0; b < x.reading.size(); ++b)
    rows.emplace_back(x.reading[b] == Reading::Shard && x.shard_dim[b] == 0 ? Reading::Shard : Reading::Replicated, 0);
  const BodyValue dest = region_arg({x.shape[0]}, rows, "int64", n);
  const BodyValue members = region_arg({n}, std::vector<std::pair<Reading, int64_t>>(x.reading.size(), {Reading::Replicated, -1}),
                                       "int64", n);
  const std::string zero_rows = fresh(), one = fresh(), zero_n = fresh(), counts = fresh(), recv = fresh(), there = fresh();
  body.push_back(op(zero_rows, "mul", {dest.name}, {{"value", 0}}));
  body.push_back(op(one, "add", {zero_rows}, {{"value", 1}}));
  body.push_back(op(zero_n, "mul", {members.name}, {{"value", 0}}));
  body.push_back(op(counts, "scatter_add", {zero_n, dest.name, one}, {{"dim", 0}}));  // rows per destination
  body.push_back(op(recv, "all_to_all", {counts}, {{"axis", axis}}));
  body.push_back(op(there, "all_to_all", {x.name, counts, recv}, {{"axis", axis}}));
  body.push_back(op(y.name, "all_to_all", {there, recv, counts}, {{"axis", axis}}));
  add_collective(y, x);
}

void LocalMapBuilder::add_collective(BodyValue y, const BodyValue& x) {
  y.ref = x.ref;
  twin_ops.push_back(op("d_" + y.name, "redistribute", {x.twin}, {{"placements", spec_json(y.spec())}}));
  y.twin = "d_" + y.name;
  pool.push_back(y);
}

}  // namespace body

using body::BodyValue;
using body::entered;
using body::Label;
using body::LocalMapBuilder;

json local_map_program(const ProgramOptions& o, json* twin, std::map<std::string, BodyLabels>* labels) {
  LocalMapBuilder b{small_mesh(), {}, json::array(), json::array(), json::array(), 0, 0, json::array(), {}};
  json options = draw_options({});
  b.seed = options["seed"].get<uint64_t>();
  if (o.float32_randn) b.float_dtype = "float32";
  // With `even`, every extent is a multiple of the mesh's size, so that any shard of it, over one
  // axis or several, is even (JAX's shard_map needs even blocks: tools/crosscheck).
  int64_t unit = 1;
  if (o.even)
    for (auto size : b.mesh.shape()) unit *= size;
  auto extent = [&] { return o.even ? unit * *rc::gen::inRange<int64_t>(1, 3) : *rc::gen::inRange<int64_t>(1, 7); };
  const int64_t m = extent(), k = extent(), n = extent();
  auto placement = rc::gen::elementOf(std::vector<Placement>{
      Placement::shard(0), Placement::shard(1), Placement::replicate(), Placement::partial(), Placement::reduced()});
  const Spec sx = *gen::spec(b.mesh, placement), sw = *gen::spec(b.mesh, placement), sz = *gen::spec(b.mesh, placement);
  json inputs = {input("x", {m, k}, sx, true, o.float32_randn), input("w", {k, n}, sw, true, o.float32_randn),
                 input("z", {m, k}, sz, true, o.float32_randn)};
  b.pool = {entered("x", {m, k}, sx), entered("w", {k, n}, sw), entered("z", {m, k}, sz)};
  for (auto& v : b.pool) v.rounded = mesh_rounds(b.mesh);
  const int count = *rc::gen::inRange(1, o.max_ops + 1);
  for (int i = 0; i < count; ++i) b.step();
  // Return the latest value whose label agrees with its reading.
  const BodyValue* ret = nullptr;
  for (const auto& v : b.pool)
    if (v.out_spec()) ret = &v;
  const Spec out = *ret->out_spec();
  for (const auto& in : b.extra_inputs) inputs.push_back(in);  // after x, w, z: their data streams
  inputs.push_back(input("c", ret->shape, Spec(static_cast<size_t>(b.mesh.ndim()), Placement::replicate()), false, o.float32_randn));
  std::vector<std::string> args = {"x", "w", "z"};
  args.insert(args.end(), b.extra_args.begin(), b.extra_args.end());
  json lm = op("y", "local_map", args);
  lm["out_placements"] = json::array({spec_json(out)});
  lm["body"] = b.body;  // dead ops too: their labels are checked (counterexamples shrink them away)
  lm["returns"] = {ret->name};
  json reference = b.reference;
  if (ret->ref != ret->name && ret->name != "x" && ret->name != "w" && ret->name != "z")
    reference.push_back(op(ret->name, "redistribute", {ret->ref}, {{"placements", spec_json(out)}}));
  lm["reference"] = live_ops(reference, {ret->name});
  json program = {lm, op("weighted", "mul", {"y", "c"}), op("loss", "sum", {"weighted"})};
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

// The local_map program generator's layer ops and transformer-layer ops of a body
// (properties/local_map_body.h).
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "core/layout.h"
#include "core/placement.h"
#include "properties/generators.h"
#include "properties/local_map_body.h"
#include "properties/program_parts.h"

namespace meshsim::gen::body {

using namespace parts;

bool LocalMapBuilder::no_gradient_kind(int pick, const BodyValue& x) {
  const size_t rank = x.shape.size();
  const auto r = static_cast<int64_t>(rank);
  if (pick == 12) {  // detach(x), then x times its detached copy (plus, for a Partial axis: linear)
    BodyValue d = renamed(x);
    if (!local_unary(d, "detach", x, {}, x.bound)) return false;
    const BodyValue dv = pool.back();
    BodyValue y = renamed(x);
    return x.has_partial() ? local_binary(y, "add", x, dv, 2 * x.bound) : local_binary(y, "mul", x, dv, x.bound * x.bound);
  }
  if (pick == 13) {  // item of x's sum (0-d) where every axis reads x whole, scaling a value of the pool
    for (auto reading : x.reading)
      if (reading != Reading::Replicated) return false;
    BodyValue s = renamed(x);
    s.shape = {};
    double count = 1;
    for (int64_t e : x.shape) count *= static_cast<double>(e);
    if (!local_unary(s, "sum", x, {}, x.bound * std::max(1.0, count))) return false;
    const BodyValue sv = pool.back();
    BodyValue i = renamed(sv);
    if (!local_unary(i, "item", sv, {}, sv.bound)) return false;
    const BodyValue iv = pool.back();
    const BodyValue z = any();
    BodyValue y = renamed(z);
    return local_binary(y, "mul", z, iv, z.bound * iv.bound);
  }
  // zeros, ones, full or arange (picks 14-17) of a local shape (x's where no axis shards it, else
  // its last dim where none shards that, else 0-d): the same on every rank, invariant; then x times it.
  const std::string name = std::vector<std::string>{"zeros", "ones", "full", "arange"}.at(static_cast<size_t>(pick - 14));
  Shape shape;
  if (unsharded(x) && *rc::gen::arbitrary<bool>()) shape = x.shape;
  else if (rank >= 1 && !sharded(x, r - 1)) shape = {x.shape.back()};
  json extra = {{"shape", shape}};
  BodyValue c = renamed(x);
  c.shape = shape;
  c.reading.assign(x.reading.size(), Reading::Replicated);
  c.shard_dim.assign(x.reading.size(), -1);
  c.label.assign(x.reading.size(), Label::None);
  c.rounded = false;
  double value = 0;
  if (name == "full") extra["value"] = value = *rc::gen::element(-2.0, 0.5, 3.0);
  double count = 1;
  for (int64_t e : shape) count *= static_cast<double>(e);
  c.bound = name == "ones" ? 1.0 : name == "full" ? std::abs(value) : name == "arange" ? std::max(0.0, count - 1) : 0.0;
  c.floor = name == "ones" ? 1.0 : name == "full" && value > 0 ? value : 0.0;
  body.push_back(op(c.name, name, {}, extra));
  reference.push_back(op(c.name, name, {}, extra));
  json placed = extra;
  placed["placements"] = spec_json(Spec(static_cast<size_t>(mesh.ndim()), Placement::replicate()));
  twin_ops.push_back(op("d_" + c.name, name, {}, placed));
  c.ref = c.name;
  c.twin = "d_" + c.name;
  pool.push_back(c);
  BodyValue y = renamed(x);
  return local_binary(y, "mul", x, c, x.bound * std::max(1.0, c.bound));
}

bool LocalMapBuilder::try_layer_kind(const BodyValue& x) {
  const size_t rank = x.shape.size();
  const auto r = static_cast<int64_t>(rank);
  BodyValue y = renamed(x);
  const int pick = *rc::gen::inRange(0, 18);
  if (pick >= 12) return no_gradient_kind(pick, x);
  if (pick == 11 && rank >= 1) {  // chunk in two along a dim no axis shards; the first piece goes on
    const int64_t d = *rc::gen::inRange<int64_t>(0, r);
    if (sharded(x, d)) return false;
    const int64_t n = x.shape[static_cast<size_t>(d)];
    const int64_t first = n == 0 ? 0 : (n + 1) / 2;
    const int pieces = n <= 1 ? 1 : 2;
    y.shape[static_cast<size_t>(d)] = first;
    if (!within_bounds("narrow", {}, {{x.bound, x.rounded}}, x.bound, y.rounded)) return false;
    y.bound = x.bound;
    const std::string rest = fresh();
    json outs = pieces == 1 ? json::array({y.name}) : json::array({y.name, rest});
    json refs = pieces == 1 ? json::array({y.name}) : json::array({y.name, rest});
    json twins = pieces == 1 ? json::array({"d_" + y.name}) : json::array({"d_" + y.name, "d_" + rest});
    body.push_back({{"outs", outs}, {"op", "chunk"}, {"args", {x.name}}, {"chunks", pieces}, {"dim", d}});
    reference.push_back({{"outs", refs}, {"op", "chunk"}, {"args", {x.ref}}, {"chunks", pieces}, {"dim", d}});
    twin_ops.push_back({{"outs", twins}, {"op", "chunk"}, {"args", {x.twin}}, {"chunks", pieces}, {"dim", d}});
    y.ref = y.name;
    y.twin = "d_" + y.name;
    pool.push_back(y);
    return true;
  }
  auto move_shards = [&](const std::function<int64_t(int64_t)>& to) {
    for (size_t b = 0; b < y.reading.size(); ++b)
      if (y.reading[b] == Reading::Shard) y.shard_dim[b] = to(y.shard_dim[b]);
  };
  if (pick == 0 && rank >= 1) {  // permute
    std::vector<int64_t> dims(rank);
    std::iota(dims.begin(), dims.end(), 0);
    for (int64_t i = r - 1; i > 0; --i) std::swap(dims[i], dims[*rc::gen::inRange<int64_t>(0, i + 1)]);
    for (size_t j = 0; j < rank; ++j) y.shape[j] = x.shape[static_cast<size_t>(dims[j])];
    move_shards([&](int64_t d) { return std::find(dims.begin(), dims.end(), d) - dims.begin(); });
    return local_unary(y, "permute", x, {{"dims", dims}}, x.bound);
  }
  if (pick == 1 && rank < 3) {  // unsqueeze
    const int64_t d = *rc::gen::inRange<int64_t>(0, r + 1);
    y.shape.insert(y.shape.begin() + d, 1);
    move_shards([&](int64_t e) { return e >= d ? e + 1 : e; });
    return local_unary(y, "unsqueeze", x, {{"dim", *rc::gen::arbitrary<bool>() ? d : d - r - 1}}, x.bound);
  }
  if (pick == 2) {  // squeeze a size-1 dim no axis shards
    for (int64_t d = 0; d < r; ++d)
      if (x.shape[static_cast<size_t>(d)] == 1 && !sharded(x, d)) {
        y.shape.erase(y.shape.begin() + d);
        move_shards([&](int64_t e) { return e > d ? e - 1 : e; });
        return local_unary(y, "squeeze", x, {{"dim", d}}, x.bound);
      }
    return false;
  }
  if (pick == 3 && rank >= 2 && unsharded(x)) {  // flatten, or a view or reshape merging the first two dims
    y.shape = {x.shape[0] * x.shape[1]};
    y.shape.insert(y.shape.end(), x.shape.begin() + 2, x.shape.end());
    if (*rc::gen::arbitrary<bool>()) return local_unary(y, "flatten", x, {{"start_dim", 0}, {"end_dim", 1}}, x.bound);
    return local_unary(y, op_of(GenClass::Reshape), x, {{"shape", y.shape}}, x.bound);
  }
  if (pick == 4 && rank >= 1 && rank < 3 && unsharded(x)) {  // unflatten the last dim into [n, 1]
    const int64_t n = x.shape.back();
    y.shape.back() = n;
    y.shape.push_back(1);
    return local_unary(y, "unflatten", x, {{"dim", -1}, {"sizes", Shape{-1, 1}}}, x.bound);
  }
  if (pick == 5 && rank < 3 && unsharded(x)) {  // expand with a new leading dim
    y.shape.insert(y.shape.begin(), 2);
    Shape target = y.shape;
    return local_unary(y, "expand", x, {{"shape", target}}, x.bound);
  }
  if (pick == 6 && rank >= 1) {  // narrow a dim no axis shards
    const int64_t d = *rc::gen::inRange<int64_t>(0, r);
    if (sharded(x, d)) return false;
    const int64_t n = x.shape[static_cast<size_t>(d)], start = *rc::gen::inRange<int64_t>(0, n + 1);
    const int64_t length = *rc::gen::inRange<int64_t>(0, n - start + 1);
    y.shape[static_cast<size_t>(d)] = length;
    return local_unary(y, "narrow", x, {{"dim", d}, {"start", start}, {"length", length}}, x.bound);
  }
  if ((pick == 7 || pick == 8) && rank >= 1 && rank < 3) {  // cat along a dim no axis shards, or stack
    std::vector<const BodyValue*> partners;
    for (const auto& v : pool) {
      bool fits = v.shape == x.shape;
      for (size_t b = 0; b < x.reading.size() && fits; ++b) fits = same_reading(x, v, b);
      if (fits) partners.push_back(&v);
    }
    if (partners.empty()) return false;
    const BodyValue z = *partners.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(partners.size()))));
    if (!within_bounds("cat", {}, {{x.bound, x.rounded}, {z.bound, z.rounded}}, std::max(x.bound, z.bound), y.rounded))
      return false;
    y.label = local_label({&x, &z});
    y.bound = std::max(x.bound, z.bound);
    y.floor = std::min(x.floor, z.floor);
    if (pick == 7) {
      const int64_t d = *rc::gen::inRange<int64_t>(0, r);
      if (sharded(x, d)) return false;
      y.shape[static_cast<size_t>(d)] *= 2;
      add_local(y, "cat", {x, z}, {{"dim", d}});
      return true;
    }
    const int64_t d = *rc::gen::inRange<int64_t>(0, r + 1);
    y.shape.insert(y.shape.begin() + d, 2);
    move_shards([&](int64_t e) { return e >= d ? e + 1 : e; });
    add_local(y, "stack", {x, z}, {{"dim", d}});
    return true;
  }
  if (pick == 9 && rank == 2) {  // matmul, or bmm of the two unsqueezed, by mm's rows
    const size_t axes = x.reading.size();
    const BodyValue* z_ptr = mm_product(y, x, "matmul");
    if (!z_ptr) return false;
    const BodyValue z = *z_ptr;
    if (*rc::gen::arbitrary<bool>()) {
      add_local(y, "matmul", {x, z});
      return true;
    }
    BodyValue ux = x, uz = z;
    ux.name = fresh();
    uz.name = fresh();
    ux.shape.insert(ux.shape.begin(), 1);
    uz.shape.insert(uz.shape.begin(), 1);
    for (auto* v : {&ux, &uz})
      for (size_t b = 0; b < axes; ++b)
        if (v->reading[b] == Reading::Shard) ++v->shard_dim[b];
    add_local(ux, "unsqueeze", {x}, {{"dim", 0}});
    add_local(uz, "unsqueeze", {z}, {{"dim", 0}});
    y.shape.insert(y.shape.begin(), 1);
    for (size_t b = 0; b < axes; ++b)
      if (y.reading[b] == Reading::Shard) ++y.shard_dim[b];
    add_local(y, "bmm", {pool[pool.size() - 2], pool.back()});
    return true;
  }
  if (pick == 10 && rank >= 1 && !x.has_partial() && numel(x.shape) > 0) {  // amax, amin over a dim no axis shards
    const int64_t d = *rc::gen::inRange<int64_t>(0, r);
    if (sharded(x, d)) return false;
    const bool keepdim = *rc::gen::arbitrary<bool>();
    if (keepdim) y.shape[static_cast<size_t>(d)] = 1;
    else y.shape.erase(y.shape.begin() + d);
    if (!keepdim) move_shards([&](int64_t e) { return e > d ? e - 1 : e; });
    if (*rc::gen::inRange(0, 3) == 0) {  // a vector norm of a local's whole dim: at most bound * extent
      const json ord = *rc::gen::elementOf(std::vector<json>{1, 2, 3, "inf"});
      return local_unary(y, "linalg_vector_norm", x, {{"dim", d}, {"keepdim", keepdim}, {"ord", ord}},
                         x.bound * static_cast<double>(std::max<int64_t>(1, x.shape[static_cast<size_t>(d)])));
    }
    return local_unary(y, op_of(GenClass::Extremum), x, {{"dim", d}, {"keepdim", keepdim}}, x.bound);
  }
  return false;
}

BodyValue LocalMapBuilder::region_arg(const Shape& shape, const std::vector<std::pair<Reading, int64_t>>& reading, const std::string& dtype,
                     int64_t high) {
  Spec spec;
  for (const auto& [r, d] : reading)
    spec.push_back(r == Reading::Shard ? Placement::shard(d) : *rc::gen::inRange(0, 4) == 0 ? Placement::reduced() : Placement::replicate());
  const std::string name = "q" + std::to_string(extra_args.size());
  json decl = typed_input(name, shape, spec, dtype, high);
  extra_inputs.push_back(decl);
  extra_args.push_back(name);
  return entered(name, shape, spec);
}

// y = where(mask, x, u), u a value of the pool read as x is (itself, at least): within bounds.
bool LocalMapBuilder::where_of(const BodyValue& mask, const BodyValue& x, BodyValue& y) {
  std::vector<const BodyValue*> partners;
  for (const auto& v : pool) {
    bool fits = v.shape == x.shape;
    for (size_t b = 0; b < x.reading.size() && fits; ++b) fits = same_reading(x, v, b);
    if (fits) partners.push_back(&v);
  }
  const BodyValue u = *partners.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(partners.size()))));
  if (!within_bounds("where", {}, {{x.bound, x.rounded}, {u.bound, u.rounded}}, std::max(x.bound, u.bound), y.rounded)) return false;
  y.label = local_label({&mask, &x, &u});
  y.bound = std::max(x.bound, u.bound);
  y.floor = std::min(x.floor, u.floor);
  add_local(y, "where", {mask, x, u});
  return true;
}

// to a drawn dtype and back to the run's (the later ops see one dtype, as matmul needs): the value
// rounded on the mesh, kept whole in the oracle's float64 reference. The rounded value leaves the
// pool; its ops stay in the body.
bool LocalMapBuilder::local_cast(const BodyValue& x) {
  BodyValue t = renamed(x);
  t.rounded = true;
  if (!local_unary(t, "to", x, drawn_attrs("to"), x.bound)) return false;
  const BodyValue cast = pool.back();
  BodyValue y = renamed(cast);
  if (!local_unary(y, "to", cast, {{"dtype", float_dtype}}, x.bound)) return false;
  pool.erase(pool.end() - 2);
  return true;
}

bool LocalMapBuilder::try_nn_kind(const BodyValue& x) {
  const size_t rank = x.shape.size();
  const auto r = static_cast<int64_t>(rank);
  BodyValue y = renamed(x);
  const int pick = *rc::gen::inRange(0, 8);
  if (pick == 0) {  // the non-linear pointwise ops; dropout of a value every rank holds whole now and then
    // (the rank's generator, seeded alike, draws the global tensor's mask there: the reference's
    // and the twin's dropout of the same stream)
    const bool whole = std::all_of(x.reading.begin(), x.reading.end(), [](Reading r) { return r == Reading::Replicated; });
    if (whole && *rc::gen::inRange(0, 4) == 0) return local_unary(y, "dropout", x, {{"p", 0.5}, {"stream", y.name}}, 2 * x.bound);
    return local_pointwise(y, GenClass::UnaryLayer, x);
  }
  if (pick == 1) {  // log_softmax along a dim no axis shards
    if (rank == 0 || x.has_partial()) return false;
    const int64_t d = dim_of(x);
    if (sharded(x, wrap(d, rank))) return false;
    return local_unary(y, "log_softmax", x, {{"dim", d}}, 2 * x.bound + std::log(std::max<double>(1, static_cast<double>(x.shape[static_cast<size_t>(wrap(d, rank))]))));
  }
  if (pick == 2) {  // tril, triu: the last two dims whole on every rank (Partial passes: linear); a cast (to)
    // now and then, whatever the layout (every placement passes)
    if (*rc::gen::inRange(0, 4) == 0) return local_cast(x);
    if (rank < 2 || sharded(x, r - 1) || sharded(x, r - 2)) return false;
    return local_unary(y, op_of(GenClass::Triangle), x, {{"diagonal", *rc::gen::inRange<int64_t>(-2, 3)}}, x.bound);
  }
  if (pick == 3) {  // where(mask, x, u) with u read alike (Partial x and u of one kind: linear), masked_fill
    const BodyValue mask = region_arg(x.shape, alike(x), "bool");
    if (*rc::gen::arbitrary<bool>()) {
      if (x.has_partial()) return false;
      const double value = *rc::gen::element(-2.0, 0.0, 3.5);
      if (!within_bounds("masked_fill", {}, {{x.bound, x.rounded}}, std::max(x.bound, std::abs(value)), y.rounded)) return false;
      y.label = local_label({&x, &mask});
      y.bound = std::max(x.bound, std::abs(value));
      y.floor = 0;
      add_local(y, "masked_fill", {x, mask}, {{"value", value}});
      return true;
    }
    return where_of(mask, x, y);
  }
  if (pick == 4) {  // layer_norm, rms_norm over the last 1-2 dims no axis shards, a replicated weight now and then
    if (rank == 0 || x.has_partial()) return false;
    const auto k = static_cast<size_t>(*rc::gen::inRange<int64_t>(1, std::min<int64_t>(r, 2) + 1));
    for (size_t d = rank - k; d < rank; ++d)
      if (sharded(x, static_cast<int64_t>(d))) return false;
    const Shape ns(x.shape.end() - static_cast<std::ptrdiff_t>(k), x.shape.end());
    if (numel(ns) == 0) return false;  // normalized_shape takes extents >= 1
    const std::string name = op_of(GenClass::Norm);
    json extra = {{"normalized_shape", ns}};
    // A rounded operand takes the large eps (programs.cpp says why).
    if (x.rounded) extra["eps"] = 0.25;
    else if (*rc::gen::inRange(0, 3) != 0) extra["eps"] = *rc::gen::element(1e-5, 0.25);
    std::vector<BodyValue> xs = {x};
    double bound = std::sqrt(static_cast<double>(std::max<int64_t>(1, numel(ns))));
    for (const auto& v : pool) {
      bool replicated = v.shape == ns && !(v.name == x.name);
      for (auto rd : v.reading) replicated &= rd == Reading::Replicated;
      if (replicated && *rc::gen::arbitrary<bool>()) {
        xs.push_back(v);
        bound *= v.bound;
        break;
      }
    }
    std::vector<const BodyValue*> ptrs;
    for (const auto& v : xs) ptrs.push_back(&v);
    if (!within_bounds(name, extra, {{x.bound, x.rounded}}, bound, y.rounded)) return false;
    y.label = local_label(ptrs);
    y.bound = bound;
    y.floor = 0;
    add_local(y, name, xs, extra);
    return true;
  }
  if (pick == 5) return embedding(x, y);
  return loss(x, y);
}

bool LocalMapBuilder::embedding(const BodyValue& x, BodyValue& y) {
  if (x.shape.size() != 2 || x.shape[0] == 0) return false;
  const Shape ids_shape = *rc::gen::arbitrary<bool>() ? Shape{*rc::gen::inRange<int64_t>(1, 7)}
                                                      : Shape{*rc::gen::inRange<int64_t>(1, 4), *rc::gen::inRange<int64_t>(1, 4)};
  std::vector<std::pair<Reading, int64_t>> ids_reading;
  std::optional<size_t> vocab_axis;
  const auto out_rank = static_cast<int64_t>(ids_shape.size());
  y.shape = ids_shape;
  y.shape.push_back(x.shape[1]);
  for (size_t b = 0; b < x.reading.size(); ++b) {
    const bool shard_ids = x.reading[b] == Reading::Replicated && *rc::gen::arbitrary<bool>();
    ids_reading.emplace_back(shard_ids ? Reading::Shard : Reading::Replicated, shard_ids ? 0 : -1);
    if (x.reading[b] == Reading::Shard && x.shard_dim[b] == 0) {
      if (vocab_axis) return false;
      vocab_axis = b;
      y.reading[b] = Reading::Partial;
      y.shard_dim[b] = -1;
    } else if (x.reading[b] == Reading::Shard) {
      y.shard_dim[b] = out_rank;
    } else if (shard_ids) {
      y.reading[b] = Reading::Shard;
      y.shard_dim[b] = 0;
    }
  }
  const BodyValue ids = region_arg(ids_shape, ids_reading, "int64", x.shape[0]);
  if (!within_bounds("embedding", {}, {{x.bound, x.rounded}}, x.bound, y.rounded)) return false;
  y.label = local_label({&ids, &x});
  y.floor = 0;
  json extra = json::object();
  if (vocab_axis) extra = {{"axis", mesh.axes()[*vocab_axis]}, {"vocab", x.shape[0]}};
  add_local(y, "embedding", {ids, x}, extra);
  // The reference and the twin look up the whole table.
  reference.back().erase("axis");
  reference.back().erase("vocab");
  twin_ops.back().erase("axis");
  twin_ops.back().erase("vocab");
  return true;
}

bool LocalMapBuilder::loss(const BodyValue& x, BodyValue& y) {
  if (x.shape.size() != 2 || x.shape[0] == 0 || x.shape[1] == 0) return false;
  const std::string name = op_of(GenClass::Loss);
  std::vector<std::pair<Reading, int64_t>> target_reading;
  std::optional<size_t> class_axis;
  bool batch_sharded = false;
  y.shape = {};
  for (size_t b = 0; b < x.reading.size(); ++b) {
    target_reading.emplace_back(Reading::Replicated, -1);
    if (x.reading[b] == Reading::Replicated) continue;
    if (x.reading[b] == Reading::Partial && name == "cross_entropy") return false;
    if (x.reading[b] == Reading::Shard && x.shard_dim[b] == 1) {
      if (name == "cross_entropy" || class_axis) return false;
      class_axis = b;
    }
    if (x.reading[b] == Reading::Shard && x.shard_dim[b] == 0) {
      batch_sharded = true;
      target_reading.back() = {Reading::Shard, 0};
    }
    y.reading[b] = Reading::Partial;
    y.shard_dim[b] = -1;
  }
  const int64_t n = x.shape[0], classes = x.shape[1];
  json extra = {{"reduction", batch_sharded || *rc::gen::arbitrary<bool>() ? "sum" : "mean"}};
  const size_t index = next_input_index();
  const BodyValue target = region_arg({n}, target_reading, "int64", classes);
  if (*rc::gen::arbitrary<bool>())
    if (const auto ignore = ignore_index_for(drawn_ids(seed, index, {n}, classes), *rc::gen::inRange<int64_t>(0, 8)))
      extra["ignore_index"] = *ignore;
  const double each = name == "cross_entropy" ? 2 * x.bound + std::log(static_cast<double>(classes)) : x.bound;
  const double bound = extra["reduction"] == "sum" ? each * static_cast<double>(n) : each;
  if (name == "cross_entropy" && x.bound > operand_limit("cross_entropy")) return false;
  if (!within_bounds(name, extra, {{x.bound, x.rounded}}, bound, y.rounded)) return false;
  y.label = local_label({&x, &target});
  y.bound = bound;
  y.floor = 0;
  json body_extra = extra;
  if (class_axis) body_extra.update({{"axis", mesh.axes()[*class_axis]}, {"classes", classes}});
  add_local(y, name, {x, target}, body_extra);
  reference.back() = op(y.name, name, {x.ref, target.ref}, extra);
  twin_ops.back() = op("d_" + y.name, name, {x.twin, target.twin}, extra);
  return true;
}

bool LocalMapBuilder::try_select_kind(const BodyValue& x) {
  const size_t rank = x.shape.size();
  const auto r = static_cast<int64_t>(rank);
  if (rank == 0 || x.has_partial() || x.rounded || numel(x.shape) == 0) return false;
  const int64_t d = *rc::gen::inRange<int64_t>(0, r);
  if (sharded(x, d)) return false;
  const int64_t n = x.shape[static_cast<size_t>(d)];
  BodyValue y = renamed(x);
  if (*rc::gen::inRange(0, 4) == 0) return indexed(x, d, y);
  auto move_shards = [&](int64_t removed) {
    for (size_t b = 0; b < y.reading.size(); ++b)
      if (y.reading[b] == Reading::Shard && y.shard_dim[b] > removed) --y.shard_dim[b];
  };
  if (*rc::gen::arbitrary<bool>()) {  // the values: max, min (keepdim or not), sort, topk
    const std::string name = op_of(GenClass::Select);
    json extra = {{"dim", *rc::gen::arbitrary<bool>() ? d : d - r}};
    if (name == "topk") {
      const int64_t k = *rc::gen::inRange<int64_t>(0, n + 1);
      extra.update({{"k", k}, {"largest", *rc::gen::arbitrary<bool>()}});
      y.shape[static_cast<size_t>(d)] = k;
    } else if (name == "sort") {
      extra["descending"] = *rc::gen::arbitrary<bool>();
    } else {
      const bool keepdim = *rc::gen::arbitrary<bool>();
      extra["keepdim"] = keepdim;
      if (keepdim) y.shape[static_cast<size_t>(d)] = 1;
      else {
        y.shape.erase(y.shape.begin() + d);
        move_shards(d);
      }
    }
    return local_unary(y, name, x, extra, x.bound);
  }
  // A bool mask of x's shape (an index along d kept as a size-1 dim broadcasts): made, then taken
  // out of the pool (only where reads it).
  auto made = [&](BodyValue v, const std::string& name, const std::vector<BodyValue>& xs, json extra) {
    v.label = local_label([&] {
      std::vector<const BodyValue*> ps;
      for (const auto& e : xs) ps.push_back(&e);
      return ps;
    }());
    v.bound = 1;
    v.floor = 0;
    add_local(v, name, xs, std::move(extra));
    BodyValue out = pool.back();
    pool.pop_back();
    return out;
  };
  BodyValue subject = x;
  const double value = *rc::gen::element(-1.0, 0.0, 0.5, 1.0, 2.0);
  if (*rc::gen::arbitrary<bool>()) {  // an index along d: argmax, argmin (kept as size 1) or argsort
    const std::string index = op_of(GenClass::SelectIndex);
    BodyValue i = renamed(x);
    json extra = {{"dim", d}};
    if (index == "argsort") extra["descending"] = *rc::gen::arbitrary<bool>();
    else {
      extra["keepdim"] = true;
      i.shape[static_cast<size_t>(d)] = 1;
    }
    subject = made(i, index, {x}, extra);
  }
  BodyValue mask = made(renamed(subject), op_of(GenClass::Compare), {subject}, {{"value", value}});
  const int logic = *rc::gen::inRange(0, 3);
  if (logic == 0) mask = made(renamed(mask), "logical_not", {mask}, json::object());
  if (logic == 1 && mask.shape == x.shape) {
    const BodyValue other = made(renamed(x), op_of(GenClass::Compare), {x}, {{"value", *rc::gen::element(-0.5, 1.5)}});
    mask = made(renamed(x), *rc::gen::element<std::string>("logical_and", "logical_or"), {mask, other}, json::object());
  }
  return where_of(mask, x, y);
}

// gather(x, d, index) with an int64 index of x's shape read as x (each rank's block of the index
// is its block of x's rows), or index_select(x, d, index [k]) with a replicated index; scatter or
// scatter_add(x, d, index, src) with the index and src of x's shape read as x, index_add(x, d,
// index [n] replicated, source of x's shape read as x); cumsum(x, d): all along a dim no axis
// shards, so the local result is the global op's under x's reading. The index is now and then
// computed in the body from wider int64 ids, ids % n (remainder) or ids // 3 (floor_divide), as
// routing code computes an expert from a token's id.
bool LocalMapBuilder::indexed(const BodyValue& x, int64_t d, BodyValue& y) {
  const int64_t n = x.shape[static_cast<size_t>(d)];
  if (n == 0) return false;
  const std::vector<const char*> ops = {"gather", "index_select", "scatter", "scatter_add", "index_add", "cumsum"};
  // The copies and attention a quarter of the time, uniformly (inRange alone narrows to the list's
  // first ops in the early, small cases).
  const std::vector<const char*> copying = {"repeat", "repeat_interleave", "scaled_dot_product_attention"};
  const std::string name = *rc::gen::resize(100, rc::gen::inRange(0, 4)) == 0
                               ? copying.at(static_cast<size_t>(*rc::gen::resize(100, rc::gen::inRange(0, 3))))
                               : ops.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(ops.size()))));
  const json dim = *rc::gen::arbitrary<bool>() ? d : d - static_cast<int64_t>(x.shape.size());
  if (name == "repeat" || name == "repeat_interleave") {  // 1-2 copies of each entry along d, or of d whole
    const int64_t copies = *rc::gen::inRange<int64_t>(1, 3);
    y.label = local_label({&x});
    y.shape[static_cast<size_t>(d)] *= copies;
    Shape sizes(x.shape.size(), 1);
    sizes[static_cast<size_t>(d)] = copies;
    add_local(y, name, {x}, name == "repeat" ? json{{"sizes", sizes}} : json{{"repeats", copies}, {"dim", dim}});
    return true;
  }
  if (name == "scaled_dot_product_attention") {  // x [s, e] whole on every rank as q = k = v [1, 1, s, e]
    if (x.shape.size() != 2 || sharded(x, 0) || sharded(x, 1)) return false;
    BodyValue q = renamed(x);
    q.label = local_label({&x});
    q.shape = {1, 1, x.shape[0], x.shape[1]};
    add_local(q, "reshape", {x}, {{"shape", q.shape}});
    const BodyValue qkv = pool.back();
    y = renamed(qkv);
    y.label = local_label({&qkv});
    y.floor = 0;  // each row a convex combination of v's rows: |y| <= x's bound
    y.rounded = true;
    add_local(y, name, {qkv, qkv, qkv}, {{"is_causal", *rc::gen::arbitrary<bool>()}});
    return true;
  }
  if (name == "cumsum") {  // running sums of up to n entries
    const double bound = x.bound * static_cast<double>(n);
    if (!within_bounds(name, {}, {{x.bound, x.rounded}}, bound, y.rounded)) return false;
    y.label = local_label({&x});
    y.bound = bound;
    y.floor = 0;
    add_local(y, name, {x}, {{"dim", dim}});
    return true;
  }
  const auto replicated = std::vector<std::pair<Reading, int64_t>>(x.reading.size(), {Reading::Replicated, -1});
  const bool one_d = name == "index_select" || name == "index_add";
  int64_t k = name == "index_select" ? *rc::gen::inRange<int64_t>(0, 6) : n;
  const Shape index_shape = one_d ? Shape{k} : x.shape;
  const auto reading = one_d ? replicated : alike(x);
  BodyValue index;
  const int computed = *rc::gen::inRange(0, 4);  // 1: ids % n, 2: ids // 3, 3: counted (1-D), else the ids
  if (computed == 1 || computed == 2) {
    const BodyValue ids = region_arg(index_shape, reading, "int64", 3 * n);
    const char* op_name = computed == 1 ? "remainder" : "floor_divide";
    const json value = computed == 1 ? n : 3;
    index = ids;
    index.name = y.name + "_index";
    body.push_back(op(index.name, op_name, {ids.name}, {{"value", value}}));
    reference.push_back(op(index.name, op_name, {ids.ref}, {{"value", value}}));
    twin_ops.push_back(op("d_" + index.name, op_name, {ids.twin}, {{"value", value}}));
    index.ref = index.name;
    index.twin = "d_" + index.name;
  } else if (one_d && (computed == 3 || (computed == 0 && *rc::gen::resize(100, rc::gen::arbitrary<bool>())))) {
    // A 1-D index computed from replicated ids as routing code counts tokens (a quarter of the 1-D
    // draws, and half of those that take the ids as they are; drawn at full size, as the early
    // cases' small sizes would leave index_select no positions): bincount's counts per position
    // (minlength k, index_select's 1-5) clamped into [0, n), or (index_select, n >= 2, half the
    // time) one_hot of ids into 2 classes, flattened: positions 0 and 1, twice as many.
    if (name == "index_select") k = *rc::gen::resize(100, rc::gen::inRange<int64_t>(1, 6));
    auto then = [&](BodyValue v, const std::string& suffix, const char* op_name, const json& attrs, Shape shape) {
      const std::string out = y.name + suffix;
      body.push_back(op(out, op_name, {v.name}, attrs));
      reference.push_back(op(out, op_name, {v.ref}, attrs));
      twin_ops.push_back(op("d_" + out, op_name, {v.twin}, attrs));
      v.name = v.ref = out;
      v.twin = "d_" + out;
      v.shape = std::move(shape);
      return v;
    };
    if (name == "index_select" && n >= 2 && *rc::gen::resize(100, rc::gen::arbitrary<bool>())) {
      const BodyValue hot = then(region_arg({k}, replicated, "int64", 2), "_hot", "one_hot", {{"num_classes", 2}}, {k, 2});
      index = then(hot, "_index", "flatten", json::object(), {2 * k});
      k *= 2;
    } else {
      const BodyValue ids = region_arg({*rc::gen::inRange<int64_t>(0, 7)}, replicated, "int64", k);
      index = then(then(ids, "_counts", "bincount", {{"minlength", k}}, {k}), "_index", "clamp", {{"max", n - 1}}, {k});
    }
  } else {
    index = region_arg(index_shape, reading, "int64", n);
  }
  if (name == "gather" || name == "index_select") {
    if (name == "index_select") y.shape[static_cast<size_t>(d)] = k;
    if (!within_bounds(name, {}, {{x.bound, x.rounded}}, x.bound, y.rounded)) return false;
    y.label = local_label({&x, &index});
    y.bound = x.bound;
    y.floor = x.floor;
    add_local(y, name, {x, index}, {{"dim", dim}});
    return true;
  }
  // src (index_add's source) a value of the pool of x's shape read as x (x itself, at least); the
  // sums of scatter_add and index_add reach x plus n of its entries.
  std::vector<const BodyValue*> partners;
  for (const auto& v : pool) {
    bool fits = v.shape == x.shape;
    for (size_t b = 0; b < x.reading.size() && fits; ++b) fits = same_reading(x, v, b) && !v.has_partial();
    if (fits) partners.push_back(&v);
  }
  if (partners.empty()) return false;
  const BodyValue src = *partners.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(partners.size()))));
  const double bound = name == "scatter" ? std::max(x.bound, src.bound) : x.bound + static_cast<double>(n) * src.bound;
  if (!within_bounds(name, {}, {{x.bound, x.rounded}, {src.bound, src.rounded}}, bound, y.rounded)) return false;
  y.label = local_label({&x, &index, &src});
  y.bound = bound;
  y.floor = 0;
  add_local(y, name, {x, index, src}, {{"dim", dim}});
  return true;
}

}  // namespace meshsim::gen::body

// local_map programs: bodies drawn with a DTensor reading of every value, so that the reference is
// the same program on global tensors (properties/programs.h).
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <rapidcheck.h>

#include "core/layout.h"
#include "core/placement.h"
#include "properties/generators.h"
#include "properties/program_parts.h"
#include "properties/programs.h"

namespace meshsim::gen {

using namespace parts;

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
  uint64_t seed = 0;                  // the run's: the data of an int64 input are known from it
  json extra_inputs = json::array();  // region args the ops draw: masks, ids, targets (no gradient)
  std::vector<std::string> extra_args;
  static constexpr size_t kFirstInputs = 3;  // x, w, z

  std::string fresh() { return "t" + std::to_string(counter++); }

  // The latest value half of the time (programs form chains), any value otherwise.
  const BodyValue& any() {
    if (*rc::gen::arbitrary<bool>()) return pool.back();
    return pool.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(pool.size()))));
  }

  // One body op: the drawn kind if it applies to the drawn operand, else the next kind that does.
  void step() {
    constexpr int kKinds = 18;
    // The collectives (kinds 3-6) three times as often as each other kind: they apply to fewer
    // operands, and the variance rules are what local_map programs exist to test.
    const int first = *rc::gen::weightedElement<int>({{1, 0}, {1, 1}, {1, 2}, {3, 3}, {3, 4}, {3, 5}, {3, 6}, {1, 7},
                                                      {1, 8}, {1, 9}, {1, 10}, {1, 11}, {1, 12}, {1, 13}, {1, 14}, {1, 15}, {1, 16}, {2, 17}});
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
    if (kind == 16) return try_layer_kind(x);
    if (kind == 17) return try_nn_kind(x);
    if (kind == 15) {  // mark_varying of an invariant axis (an identity on global values)
      if (x.label[a] != Label::None || x.reading[a] != Reading::Replicated) return false;
      y.label[a] = Label::Variant;
      body.push_back(op(y.name, "mark_varying", {x.name}, {{"axis", mesh.axes()[a]}}));
      add_collective(y, x);
      return true;
    }
    return false;
  }

  // Whether no axis shards the value (its locals have the global shape, so an op whose attributes
  // name extents, a view or expand, means the same on the locals and on the global value).
  static bool unsharded(const BodyValue& x) {
    for (auto r : x.reading)
      if (r == Reading::Shard) return false;
    return true;
  }

  // The layer ops (kind 16), each where the local result is the global op's result under the
  // value's reading: permute, unsqueeze and squeeze move shards with their dims; views and
  // expand of values no axis shards; narrow of a dim no axis shards; cat and stack of values read
  // alike; matmul and bmm by mm's rows; amax and amin (like mean) over dims no axis shards, of a
  // value with no Partial axis.
  bool try_layer_kind(const BodyValue& x) {
    const size_t rank = x.shape.size();
    const auto r = static_cast<int64_t>(rank);
    BodyValue y = x;
    y.name = fresh();
    const int pick = *rc::gen::inRange(0, 12);
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
      return local_unary(y, *rc::gen::element<std::string>("view", "reshape"), x, {{"shape", y.shape}}, x.bound);
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
      return local_unary(y, *rc::gen::element<std::string>("amax", "amin"), x, {{"dim", d}, {"keepdim", keepdim}}, x.bound);
    }
    return false;
  }

  // A region arg without a gradient (a bool mask, int64 ids or targets), laid out per axis as
  // `reading` gives it (Shard of a dim, or Replicated: R, or Rd now and then); entered, not pooled.
  BodyValue region_arg(const Shape& shape, const std::vector<std::pair<Reading, int64_t>>& reading, const std::string& dtype,
                       int64_t high = 0) {
    Spec spec;
    for (const auto& [r, d] : reading)
      spec.push_back(r == Reading::Shard ? Placement::shard(d) : *rc::gen::inRange(0, 4) == 0 ? Placement::reduced() : Placement::replicate());
    const std::string name = "q" + std::to_string(extra_args.size());
    json decl = typed_input(name, shape, spec, dtype, high);
    extra_inputs.push_back(decl);
    extra_args.push_back(name);
    return entered(name, shape, spec);
  }
  size_t next_input_index() const { return kFirstInputs + extra_args.size(); }
  // x's readings per axis, a Partial one read as Replicated (for an arg read alike).
  static std::vector<std::pair<Reading, int64_t>> alike(const BodyValue& x) {
    std::vector<std::pair<Reading, int64_t>> r;
    for (size_t b = 0; b < x.reading.size(); ++b)
      r.emplace_back(x.reading[b] == Reading::Shard ? Reading::Shard : Reading::Replicated, x.shard_dim[b]);
    return r;
  }

  // The transformer-layer ops in a body (kind 17), each where the local result is the global op's
  // under the value's reading: the non-linear pointwise ops, log_softmax and the norms of values
  // with no Partial axis (over dims no axis shards); tril and triu where no axis shards the last two
  // dims; where and masked_fill with a bool arg read alike; embedding {axis, vocab} (a table
  // sharded on its vocab along one axis: the masked lookup, Partial there); nll_loss {axis,
  // classes} (scores sharded on the classes along one axis: the masked pick, Partial there) and
  // cross_entropy, summed over a sharded batch.
  bool try_nn_kind(const BodyValue& x) {
    const size_t rank = x.shape.size();
    const auto r = static_cast<int64_t>(rank);
    BodyValue y = x;
    y.name = fresh();
    const int pick = *rc::gen::inRange(0, 8);
    if (pick == 0) {  // non-linear pointwise
      if (x.has_partial()) return false;
      const std::string name = *rc::gen::element<std::string>("abs", "gelu", "log", "pow", "rsqrt", "sigmoid", "silu", "sqrt");
      json extra = json::object();
      if (name == "gelu" && *rc::gen::arbitrary<bool>()) extra["approximate"] = *rc::gen::element<std::string>("none", "tanh");
      if (name == "pow") extra["exponent"] = *rc::gen::element(-1.0, -0.5, 0.5, 1.5, 2.0, 3.0);
      BodyValue v = x;  // log, sqrt, rsqrt, pow: of a positive value, exp of x where x is not
      if (needs_positive(name) && !(x.floor > 0)) {
        BodyValue e = x;
        e.name = fresh();
        e.floor = std::exp(-x.bound);
        if (!local_unary(e, "exp", x, {}, std::exp(x.bound))) return false;
        v = pool.back();
      }
      const double bound = unary_bound(name, extra, v.bound, v.floor);
      if (name == "sqrt") y.floor = std::sqrt(v.floor);
      if (name == "rsqrt") y.floor = 1 / std::sqrt(v.bound);
      if (!local_unary(y, name, v, extra, bound)) return false;
      pool.back().floor = y.floor;
      return true;
    }
    if (pick == 1) {  // log_softmax along a dim no axis shards
      if (rank == 0 || x.has_partial()) return false;
      const int64_t d = dim_of(x);
      if (sharded(x, wrap(d, rank))) return false;
      return local_unary(y, "log_softmax", x, {{"dim", d}}, 2 * x.bound + std::log(std::max<double>(1, static_cast<double>(x.shape[static_cast<size_t>(wrap(d, rank))]))));
    }
    if (pick == 2) {  // tril, triu: the last two dims whole on every rank (Partial passes: linear)
      if (rank < 2 || sharded(x, r - 1) || sharded(x, r - 2)) return false;
      return local_unary(y, *rc::gen::element<std::string>("tril", "triu"), x, {{"diagonal", *rc::gen::inRange<int64_t>(-2, 3)}}, x.bound);
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
    if (pick == 4) {  // layer_norm, rms_norm over the last 1-2 dims no axis shards, a replicated weight now and then
      if (rank == 0 || x.has_partial()) return false;
      const auto k = static_cast<size_t>(*rc::gen::inRange<int64_t>(1, std::min<int64_t>(r, 2) + 1));
      for (size_t d = rank - k; d < rank; ++d)
        if (sharded(x, static_cast<int64_t>(d))) return false;
      const Shape ns(x.shape.end() - static_cast<std::ptrdiff_t>(k), x.shape.end());
      if (numel(ns) == 0) return false;  // normalized_shape takes extents >= 1
      const std::string name = *rc::gen::element<std::string>("layer_norm", "rms_norm");
      json extra = {{"normalized_shape", ns}};
      if (x.rounded || *rc::gen::inRange(0, 3) != 0) extra["eps"] = *rc::gen::element(1e-5, 0.25);
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

  // embedding(ids, table x): per axis, a table sharded on its vocab (one axis at most: the
  // lookup's `axis`) gives Partial with replicated ids; on its embedding dim, the result's last
  // dim sharded; a replicated table, the ids' reading (Shard of dim 0 or Replicated); a Partial
  // table, Partial with replicated ids.
  bool embedding(const BodyValue& x, BodyValue& y) {
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

  // nll_loss or cross_entropy of scores x [N, C] against an int64 target read as x's batch: per
  // axis, scores sharded on the classes (nll_loss, one axis at most: the pick's `axis`) or on the
  // batch (the target alike; summed, Partial), Partial scores (nll_loss: linear), or replicated.
  bool loss(const BodyValue& x, BodyValue& y) {
    if (x.shape.size() != 2 || x.shape[0] == 0 || x.shape[1] == 0) return false;
    const std::string name = *rc::gen::element<std::string>("nll_loss", "cross_entropy");
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

  // x @ z for a partner z with a direct mm row on every axis: y (x's copy, named) gets the
  // product's shape, readings, label and bound; z, or null when there is none or the bound fails.
  const BodyValue* mm_product(BodyValue& y, const BodyValue& x, const char* name) {
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

  // A 2-D value x @ which has a direct mm row on every axis, or null.
  const BodyValue* mm_partner(const BodyValue& x) {
    std::vector<const BodyValue*> partners;
    for (const auto& v : pool) {
      bool fits = v.shape.size() == 2 && x.shape.size() == 2 && v.shape[0] == x.shape[1];
      for (size_t b = 0; b < x.reading.size() && fits; ++b) fits = mm_reading(x, v, b).has_value();
      if (fits) partners.push_back(&v);
    }
    if (partners.empty()) return nullptr;
    return partners.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(partners.size()))));
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
    const std::string axis = mesh.axes()[a];
    BodyValue y = x;
    y.name = fresh();
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
    } else if (kind == 3) {  // all_reduce, or the opaque all_reduce Function, of a Partial axis
      if (x.reading[a] != Reading::Partial) return false;
      y.reading[a] = Reading::Replicated;
      y.label[a] = Label::None;
      const bool opaque = *rc::gen::inRange(0, 3) == 0;  // the Function a third of the time
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
  LocalMapBuilder b{small_mesh(), {}, json::array(), json::array(), json::array(), 0, 0, json::array(), {}};
  json options = draw_options({});
  b.seed = options["seed"].get<uint64_t>();
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

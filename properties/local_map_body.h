// The local_map program generator's model of a body (properties/programs.h): per mesh axis, each
// body value's DTensor reading and LTensor label, and the builder that draws body ops by them, so
// that the reference is the same program on global tensors. local_map_programs.cpp draws the
// collectives and the rank-local ops; local_map_body.cpp the layer ops (views, joins, matmuls,
// extremes) and the transformer-layer ops.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <rapidcheck.h>

#include "core/layout.h"
#include "core/mesh.h"
#include "core/ops.h"
#include "core/placement.h"
#include "properties/program_parts.h"

namespace meshsim::gen::body {

using json = nlohmann::json;

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
  double bound = parts::kInputBound;  // as DValue's: a bound on the global magnitude
  double floor = 0;                   // > 0: known positive, with that lower bound
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

// A region input (x, w, z, or a region arg) entered with its placements.
BodyValue entered(const std::string& name, const Shape& shape, const Spec& spec);
// The label of a rank-local op's output: variant by union, reduced by intersection.
std::vector<Label> local_label(const std::vector<const BodyValue*>& xs);
// Whether x and y are read alike on axis a.
bool same_reading(const BodyValue& x, const BodyValue& y, size_t a);

struct LocalMapBuilder {
  Mesh mesh;
  std::vector<BodyValue> pool;
  json body = json::array(), reference = json::array(), twin_ops = json::array();
  int counter = 0;
  uint64_t seed = 0;                  // the run's: the data of an int64 input are known from it
  json extra_inputs = json::array();  // region args the ops draw: masks, ids, targets (no gradient)
  std::vector<std::string> extra_args;
  std::string float_dtype = "float64";  // the run's, which a cast (to) returns to
  static constexpr size_t kFirstInputs = 3;  // x, w, z

  std::string fresh() { return "t" + std::to_string(counter++); }
  // x's copy under a fresh name (an op's result before the op sets what it changes).
  BodyValue renamed(const BodyValue& x) {
    BodyValue y = x;
    y.name = fresh();
    return y;
  }

  // The latest value half of the time (programs form chains), any value otherwise.
  const BodyValue& any() {
    if (*rc::gen::arbitrary<bool>()) return pool.back();
    return pool.at(static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(pool.size()))));
  }

  // One body op: the drawn kind if it applies to the drawn operand, else the next kind that does.
  void step();

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
  bool try_local_kind(int kind, const BodyValue& x, size_t a);

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
  bool try_layer_kind(const BodyValue& x);
  // Values without gradient (try_layer_kind's picks 12-17): detach of x, then x times (or plus)
  // it; item of the sum of an x every axis reads whole, scaling a value of the pool; zeros, ones,
  // full or arange of a local shape (invariant), then x times it.
  bool no_gradient_kind(int pick, const BodyValue& x);
  // Selection and comparisons (kind 18), where the local result is the global op's: max, min,
  // sort, topk along a dim no axis shards; a mask of a comparison (of x, or of argmax, argmin or
  // argsort along such a dim), combined by logical_not, _and or _or now and then, picking x or a
  // value read alike by where; of a value with no Partial axis that no rounding made.
  bool try_select_kind(const BodyValue& x);
  // Along d, a dim no axis shards (a quarter of the select kind's draws): gather, index_select,
  // scatter, scatter_add, index_add or cumsum of x by an int64 index arg (or one computed from
  // wider ids by remainder or floor_divide, or a 1-D one by bincount and clamp, or one_hot and
  // flatten, of replicated ids): of x's shape read as x, or 1-D replicated; repeat or
  // repeat_interleave of x; or scaled_dot_product_attention of x [s, e] (both dims whole) as q, k, v.
  bool indexed(const BodyValue& x, int64_t d, BodyValue& y);
  // y = where(mask, x, u) with u a value of the pool that reads as x does; false out of bounds.
  bool where_of(const BodyValue& mask, const BodyValue& x, BodyValue& y);

  // A region arg without a gradient (a bool mask, int64 ids or targets), laid out per axis as
  // `reading` gives it (Shard of a dim, or Replicated: R, or Rd now and then); entered, not pooled.
  BodyValue region_arg(const Shape& shape, const std::vector<std::pair<Reading, int64_t>>& reading, const std::string& dtype,
                       int64_t high = 0);
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
  bool try_nn_kind(const BodyValue& x);

  // embedding(ids, table x): per axis, a table sharded on its vocab (one axis at most: the
  // lookup's `axis`) gives Partial with replicated ids; on its embedding dim, the result's last
  // dim sharded; a replicated table, the ids' reading (Shard of dim 0 or Replicated); a Partial
  // table, Partial with replicated ids.
  bool embedding(const BodyValue& x, BodyValue& y);

  // nll_loss or cross_entropy of scores x [N, C] against an int64 target read as x's batch: per
  // axis, scores sharded on the classes (nll_loss, one axis at most: the pick's `axis`) or on the
  // batch (the target alike; summed, Partial), Partial scores (nll_loss: linear), or replicated.
  bool loss(const BodyValue& x, BodyValue& y);

  // x @ z for a partner z with a direct mm row on every axis: y (x's copy, named) gets the
  // product's shape, readings, label and bound; z, or null when there is none or the bound fails.
  const BodyValue* mm_product(BodyValue& y, const BodyValue& x, const char* name);

  // A 2-D value x @ which has a direct mm row on every axis, or null.
  const BodyValue* mm_partner(const BodyValue& x);

  // A partner of the same shape for an elementwise op on every axis.
  const BodyValue* elementwise_partner(const BodyValue& x, bool is_mul);

  // y (x's copy, named) as name(x, z) of a partner z read alike (or Replicated where x is: y takes z's reading there).
  bool local_binary(BodyValue y, const std::string& name, const BodyValue& x, const BodyValue& z, double bound);

  // y (x's copy, named, with its shape and readings) as name(x), of bound `bound` and positive
  // floor `floor` (0: any sign).
  bool local_unary(BodyValue y, const std::string& name, const BodyValue& x, json extra, double bound, double floor = 0);
  bool local_cast(const BodyValue& x);

  // exp of x (a value known positive).
  bool local_exp(const BodyValue& x);

  // A pointwise op of class c (the catalog's, with its drawn attributes) of x, a value with no
  // Partial axis (of exp of x for an op that needs a positive operand where x is not known
  // positive); its range by the catalog's ValueRules. y: x's copy, named.
  bool local_pointwise(BodyValue y, GenClass c, const BodyValue& x);

  // The collectives and the ops of kinds 0-7 (mul, add, mm, all_reduce, all_gather, reduce_scatter,
  // all_to_all, local_square) of x over mesh axis a.
  bool try_kind(int kind, const BodyValue& x, size_t a);

  // A rank-local op: the same op in the body, the reference and the twin.
  void add_local(BodyValue y, const std::string& name, const std::vector<BodyValue>& xs, json extra = json::object());

  // all_to_all with split sizes over axis a (x sharded there) and back by the transposed sizes:
  // the sizes count the rows of x's dim 0 per destination drawn per row (an int64 region arg, a
  // scatter_add of ones), exchanged by an equal all_to_all of the counts. y (x's copy, named) is
  // x again, read alike; the backward moves the gradient both ways by the transposed sizes.
  void split_round_trip(BodyValue y, const BodyValue& x, size_t a);

  // A collective is the identity on global values: the reference reuses the input, the twin
  // redistributes to the new reading.
  void add_collective(BodyValue y, const BodyValue& x);
};

}  // namespace meshsim::gen::body

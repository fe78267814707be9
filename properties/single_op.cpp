// single_op_equivalence's programs: one op of the file format on operands laid out, three times in
// four, as a random row of the op's own table per mesh axis (properties/programs.h).
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
#include "core/scenario.h"
#include "properties/generators.h"
#include "properties/program_parts.h"
#include "properties/programs.h"
#include "sim/local_ops.h"

namespace meshsim::gen {

using namespace parts;

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
  const GenClass gen = op_schema(name).gen;
  const int64_t m = *rc::gen::inRange<int64_t>(1, 7), k = *rc::gen::inRange<int64_t>(1, 7),
                n = *rc::gen::inRange<int64_t>(1, 7), b = *rc::gen::inRange<int64_t>(1, 4);
  const int64_t m_drawn = m;
  auto dim = [](int64_t rank) { return *rc::gen::inRange<int64_t>(-rank, rank); };
  if (name == "scale") attrs["value"] = *rc::gen::element(-2.0, -1.0, -0.5, 0.0, 0.5, 1.5, 3.0);
  if (name == "transpose") attrs.update({{"dim0", dim(2)}, {"dim1", dim(2)}});
  if (name == "softmax") attrs["dim"] = dim(2);
  if (name == "dropout") {  // a factor of 2 or 4 (exact on the small integers drawn), training most of the time
    attrs["p"] = *rc::gen::element(0.5, 0.75);
    if (*rc::gen::resize(100, rc::gen::inRange(0, 4)) == 0) attrs["training"] = false;
    // Extents at full size from the first case: over one element a shard's mask and the global
    // mask's piece agree as often as not, and a mask drawn from the wrong offsets may not show.
    auto extent = [] { return *rc::gen::resize(100, rc::gen::inRange<int64_t>(2, 9)); };
    return {{extent(), extent()}};
  }
  if (gen == GenClass::VectorNorm)  // each kind of norm partial: P(normP) (twice as often), P(max), P(min), P(sum)
    attrs["ord"] = *rc::gen::elementOf(std::vector<json>{2, 3, 1.5, 1, 2, 3, 1.5, 1, 0, "inf", "-inf"});
  if (gen == GenClass::Reduction || gen == GenClass::Extremum || gen == GenClass::VectorNorm) {
    attrs["keepdim"] = *rc::gen::arbitrary<bool>();
    const int form = *rc::gen::inRange(0, 4);
    if (form == 1) attrs["dim"] = dim(3);
    if (form == 2) attrs["dim"] = json::array({0, -1});
    if (form == 3) attrs["dim"] = json::array({dim(3)});
    // A norm's extents at full size from the first case: over one element per row the ranks' local
    // norms are the norm, and a wrong norm partial shows nothing.
    if (gen == GenClass::VectorNorm) {
      auto extent = [] { return *rc::gen::resize(100, rc::gen::inRange<int64_t>(1, 7)); };
      return {{extent(), extent(), extent()}};
    }
    return {{m, k, n}};
  }
  if (gen == GenClass::Select || gen == GenClass::SelectIndex) {  // along a dim of 2 or 3
    Shape x = *rc::gen::arbitrary<bool>() ? Shape{m, k} : Shape{b + 1, m, k};
    const auto rank = static_cast<int64_t>(x.size());
    const int64_t d = dim(rank);
    attrs["dim"] = d;
    // The dim's extent drawn at full size from the first case: over one element (inRange's early
    // cases) every rank picks the same, and a shard of the dim shows nothing.
    x[static_cast<size_t>(d < 0 ? d + rank : d)] = *rc::gen::resize(100, rc::gen::inRange<int64_t>(1, 9));
    if (name == "topk") {
      const int64_t n = x[static_cast<size_t>(d < 0 ? d + rank : d)];
      attrs["k"] = *rc::gen::resize(100, rc::gen::inRange(0, 8)) == 0 ? int64_t{0}
                                                                      : *rc::gen::resize(100, rc::gen::inRange<int64_t>(1, n + 1));
      attrs["largest"] = *rc::gen::arbitrary<bool>();
    } else if (name == "sort" || name == "argsort") {
      attrs["descending"] = *rc::gen::arbitrary<bool>();
    } else {
      attrs["keepdim"] = *rc::gen::arbitrary<bool>();
    }
    return {x};
  }
  // gather, index_select, scatter, scatter_add, index_add: along a dim of x (2 or 3 dims), its
  // extents at full size from the first case (over one row every position is 0, and a shard of one
  // row shows no offset); x's dim of 1-8, 1-8 positions.
  const bool scatter = name == "scatter" || name == "scatter_add" || name == "index_add";
  if (name == "gather" || name == "index_select" || scatter) {
    auto extent = [] { return *rc::gen::resize(100, rc::gen::inRange<int64_t>(1, 8)); };
    Shape x = *rc::gen::arbitrary<bool>() ? Shape{extent(), extent()} : Shape{extent(), extent(), extent()};
    const auto rank = static_cast<int64_t>(x.size());
    const int64_t d = dim(rank);
    const auto u = static_cast<size_t>(d < 0 ? d + rank : d);
    attrs["dim"] = d;
    x[u] = *rc::gen::resize(100, rc::gen::inRange<int64_t>(1, 9));
    const int64_t positions = *rc::gen::resize(100, rc::gen::inRange<int64_t>(1, 9));
    if (name == "index_select") return {x, {positions}};
    Shape index = x;
    index[u] = positions;
    if (name == "index_add") return {x, {positions}, index};
    // gather's and scatter's index (and src): as long as x on the other dims half of the time (the
    // rows sharding them alike), else shorter, by at least one and at least 2 (a shard of one row
    // is rank 0's block alike).
    for (size_t i = 0; i < index.size(); ++i)
      if (i != u && x[i] >= 3 && *rc::gen::arbitrary<bool>()) index[i] = *rc::gen::resize(100, rc::gen::inRange<int64_t>(2, x[i]));
    if (name == "gather") return {x, index};
    return {x, index, index};
  }
  if (name == "cumsum") {  // along a dim of 2 or 3, its extent at full size from the first case
    // (over one row a rank's running sums are the global ones, and the planted bug would not show)
    Shape x = *rc::gen::arbitrary<bool>() ? Shape{m, k} : Shape{m, k, n};
    const auto rank = static_cast<int64_t>(x.size());
    const int64_t d = dim(rank);
    attrs["dim"] = d;
    x[static_cast<size_t>(d < 0 ? d + rank : d)] = *rc::gen::resize(100, rc::gen::inRange<int64_t>(2, 9));
    return {x};
  }
  const bool integer_binary = name == "floor_divide" || name == "remainder";
  if (gen == GenClass::Compare || name == "logical_and" || name == "logical_or" || integer_binary) {
    // Two operands, the same shape or one broadcast, or (a comparison, integer division) the
    // scalar value (a divisor: never 0).
    const int form = *rc::gen::inRange(0, 6);
    if (form == 5 && (gen == GenClass::Compare || integer_binary)) {
      attrs["value"] = integer_binary ? *rc::gen::element(-3.0, 2.0, 3.0) : *rc::gen::element(-1.0, 0.0, 1.0, 2.0);
      return {{m, k}};
    }
    const Shape other = std::vector<Shape>{{m, k}, {k}, {1, k}, {m, 1}, {}, {m, k}}[static_cast<size_t>(form)];
    return *rc::gen::arbitrary<bool>() ? std::vector<Shape>{{m, k}, other} : std::vector<Shape>{other, {m, k}};
  }
  // item: a value of one element, 0-d (replicated or Partial) or [1] (a shard of it: rank 0's) or [1, 1].
  if (name == "item") return {*rc::gen::element(Shape{}, Shape{1}, Shape{1, 1})};
  // repeat: x [m, k] (or [m, k, n]), each dim repeated once (its shard kept) or 2-3 times (gathered),
  // a new leading dim now and then.
  if (name == "repeat") {
    Shape x = *rc::gen::arbitrary<bool>() ? Shape{m, k} : Shape{m, k, n};
    Shape sizes;
    if (*rc::gen::inRange(0, 3) == 0) sizes.push_back(*rc::gen::inRange<int64_t>(1, 3));
    for (size_t i = 0; i < x.size(); ++i) sizes.push_back(*rc::gen::arbitrary<bool>() ? 1 : *rc::gen::inRange<int64_t>(2, 4));
    attrs["sizes"] = sizes;
    return {x};
  }
  // repeat_interleave: along a dim of 2 or 3, its extent 12 half of the time (even on every axis
  // size drawn: the shard stays) or at full size from the first case (uneven ones are gathered).
  if (name == "repeat_interleave") {
    Shape x = *rc::gen::arbitrary<bool>() ? Shape{m, k} : Shape{m, k, n};
    const auto rank = static_cast<int64_t>(x.size());
    const int64_t d = dim(rank);
    attrs["dim"] = d;
    attrs["repeats"] = *rc::gen::inRange<int64_t>(1, 4);
    x[static_cast<size_t>(d < 0 ? d + rank : d)] =
        *rc::gen::arbitrary<bool>() ? int64_t{12} : *rc::gen::resize(100, rc::gen::inRange<int64_t>(2, 9));
    return {x};
  }
  // scaled_dot_product_attention: q [b, h, sq, d], k and v [b, hk, sk, d] (hk = h, or h / 2 under
  // enable_gqa: grouped heads, whose shard stays only where the groups line up), the sequences at
  // full size from the first case (over one key every rank's block is the whole); causal half of
  // the time, a scale now and then; else, half of the time, a mask (bool or float,
  // single_op_program draws which) of the scores' shape or broadcast.
  if (name == "scaled_dot_product_attention") {
    auto extent = [](int64_t lo, int64_t hi) { return *rc::gen::resize(100, rc::gen::inRange<int64_t>(lo, hi + 1)); };
    const int64_t hk = extent(1, 3), sq = extent(2, 7), sk = *rc::gen::arbitrary<bool>() ? sq : extent(2, 7), dh = extent(1, 3);
    const bool gqa = *rc::gen::arbitrary<bool>();
    const int64_t h = gqa ? 2 * hk : hk;
    attrs["is_causal"] = *rc::gen::arbitrary<bool>();
    if (gqa || *rc::gen::arbitrary<bool>()) attrs["enable_gqa"] = true;
    if (*rc::gen::inRange(0, 4) == 0) attrs["scale"] = *rc::gen::element(0.5, 2.0);
    std::vector<Shape> shapes = {{b, h, sq, dh}, {b, hk, sk, dh}, {b, hk, sk, extent(1, 3)}};
    if (!attrs["is_causal"].get<bool>() && *rc::gen::inRange(0, 2) == 0)  // PyTorch takes a mask or is_causal
      shapes.push_back(*rc::gen::elementOf(std::vector<Shape>{{b, h, sq, sk}, {sq, sk}, {b, 1, sq, sk}, {1, h, 1, sk}}));
    return shapes;
  }
  // one_hot, bincount: int64 values in [0, n) of n classes or bins (1-5), the values' extents at full
  // size from the first case (over one value a rank's counts and the global ones agree too often).
  if (name == "one_hot" || name == "bincount") {
    attrs[name == "one_hot" ? "num_classes" : "minlength"] = *rc::gen::resize(100, rc::gen::inRange<int64_t>(1, 6));
    const int64_t values = *rc::gen::resize(100, rc::gen::inRange<int64_t>(1, 9));
    if (name == "bincount") return {{values}};
    return {*rc::gen::arbitrary<bool>() ? Shape{values} : Shape{values, k}};
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
  if (gen == GenClass::Reshape) {
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
  // The pointwise ops take {m, k} (below), with the attributes the catalog draws (gelu's approximate, pow's exponent).
  attrs.update(drawn_attrs(name));
  if (name == "log_softmax") {  // at least 2 classes: a shard of one class has every rank's max right
    attrs["dim"] = dim(2);
    return {{m + 1, k + 1}};
  }
  if (name == "where") {  // condition, x, y: each whole or broadcast, one of them whole
    const std::vector<Shape> forms = {{m, k}, {k}, {1, k}, {m, 1}, {}, {1, k}};
    std::vector<Shape> shapes;
    for (int i = 0; i < 3; ++i) shapes.push_back(*rc::gen::elementOf(forms));
    shapes[*rc::gen::inRange<size_t>(0, 3)] = {m, k};
    return shapes;
  }
  if (name == "masked_fill") {  // x, mask broadcast to x
    attrs["value"] = *rc::gen::element(-2.0, 0.0, 3.5);
    return *rc::gen::elementOf(std::vector<std::vector<Shape>>{{{m, k}, {m, k}}, {{m, k}, {k}}, {{m, k}, {1, k}}, {{m, k}, {m, 1}}});
  }
  if (gen == GenClass::Triangle) {
    if (*rc::gen::arbitrary<bool>()) attrs["diagonal"] = *rc::gen::inRange<int64_t>(-2, 3);
    return {*rc::gen::arbitrary<bool>() ? Shape{m, k} : Shape{b + 1, m, k}};
  }
  if (gen == GenClass::Norm) {  // over the last 1 or 2 dims, with 0-2 parameters
    const Shape x = *rc::gen::arbitrary<bool>() ? Shape{m, k} : Shape{b + 1, m, k};
    const auto normalized = *rc::gen::inRange<size_t>(1, 3);
    const Shape ns(x.end() - static_cast<std::ptrdiff_t>(normalized), x.end());
    attrs["normalized_shape"] = ns;
    // rms_norm's default eps is the dtype's epsilon: a rounded zero row would be scaled by 1/sqrt(eps).
    if (name == "rms_norm" || *rc::gen::arbitrary<bool>()) attrs["eps"] = *rc::gen::element(1e-5, 0.25);
    std::vector<Shape> shapes{x};
    // A weight three times in four: its gradient is summed over the sharded batch dims.
    const int params = *rc::gen::inRange(0, 4) == 0 ? 0 : *rc::gen::inRange(1, optional_operands(name) + 1);
    for (int p = 0; p < params; ++p) shapes.push_back(ns);
    return shapes;
  }
  if (name == "embedding") {  // ids [m] or [m, k], a vocab of 12 rows (even on every axis size) or 1-8 (uneven)
    const int64_t vocab = *rc::gen::arbitrary<bool>() ? 12 : *rc::gen::inRange<int64_t>(1, 9);
    return {*rc::gen::arbitrary<bool>() ? Shape{m} : Shape{m, k}, {vocab, n}};
  }
  if (name == "pick_target" || name == "count_targets") return {{m, k}, {m}};  // scores [N, C], target [N]
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

namespace {

// The element type of operand i of an op, by the catalog: the condition of where and the mask of
// masked_fill are bool, embedding's ids and the losses' targets int64.
std::string operand_type(const std::string& name, size_t i) {
  const auto& operands = op_schema(name).operands;
  const OperandType t = i < operands.size() ? operands[i].type : OperandType::Float;
  return t == OperandType::Any || t == OperandType::Number ? "float" : operand_type_name(t);
}

// How many forms the drawn attributes of an op take: an optional one is absent or one of its values
// (gelu's approximate: three forms); a required one is counted once.
int attr_forms(const std::string& name) {
  int forms = 1;
  const OpSchema& s = op_schema(name);
  for (const auto& [key, values] : s.values.draws)
    if (const AttrSchema* a = s.attr(key); a && !a->required) forms *= 1 + static_cast<int>(json::parse(values).size());
  return forms;
}

// How often each op is drawn: matmul's ranks and batch broadcasting have the most rules; the
// losses and the embedding have the planted bugs of the most kinds; the extrema's ties.
int copies_of(const RuleFamily& f, const std::string& o) {
  if (o == "matmul") return 5;  // batch dims sharded, broadcast or not
  if (o == "bmm") return 6;     // P(avg) against R: its rarest rows
  if (o == "embedding" || o == "pick_target") return 4;
  if (f.name == "norm") return 7;  // weight and bias, each sharded or not, over batch or sequence dims
  if (o == "log_softmax") return 8;  // loss parallel besides the rows
  if (o == "clamp") return 2;  // min, max or both: its rows are the unary ones'
  if (attr_forms(o) > 1) return attr_forms(o);  // gelu: three forms of `approximate`
  if (o == "where") return 6;  // three operands, each whole or broadcast: the most rows
  // Comparisons of two operands: either one broadcast, or the scalar value.
  if (f.name == "compare" && o != "logical_not") return 3;
  // Along a dim: a shard after a dropped dim (max, min, argmax, argmin) moves down by one.
  if (o == "topk") return 15;  // the planted bug local_topk_sharded_dim: a shard of its dim, k >= 1
  if (f.name == "select" || f.name == "select_index") return 2;
  // x or the index sharded, on another dim or the dim; gather: the planted bug
  // gather_shard_extents_unchecked (x and a shorter index sharded alike)
  if (o == "gather") return 13;
  if (f.name == "index") return 3;
  if (o == "cumsum") return 12;  // the planted bug cumsum_sharded_dim_local: a shard of its dim
  // scaled_dot_product_attention: the batch, the heads (grouped or not), a mask; the planted bug
  // sdpa_sequence_shard_local: q, k and v sharded on the sequence.
  if (f.name == "attention") return 12;
  if (f.name == "repeat_interleave") return 3;  // a shard of its dim, even (kept) or not (gathered)
  if (f.name == "repeat") return 2;
  // dropout: a shard (its mask the global mask's piece) and a replica (every replica the same mask)
  // on meshes of two axes now and then: the planted bugs dropout_shard_offset_ignored and
  // dropout_replicas_rank_seeded.
  if (f.name == "random") return 8;
  // x, the index and src sharded alike on a dim, or the index and src with x Partial (or, under
  // the planted bug scatter_add_sharded_index_replicated, R); scatter has fewer rows.
  if (f.name == "scatter") return o == "scatter" ? 4 : o == "scatter_add" ? 9 : 8;
  if (f.name == "triangle") return 2;  // a batch dim's shard needs a third dim
  if (f.name == "cast" || f.name == "detach") return 4;  // every placement passes: four kinds of Partial
  // item: a Partial read whole (its all_reduce first; the planted bug item_of_partial_unreduced reads
  // each rank's part), a shard of its one element gathered.
  if (f.name == "item") return 10;
  // amax, amin: their gradient's split among ties shows only where the extremum ties.
  if (op_schema(o).gen == GenClass::Extremum) return 4;
  if (f.name == "vector_norm") return 24;  // seven ords, each over a shard of a reduced dim or a kept one
  if (f.name == "view") return 4;  // six ops, each merging or splitting dims a shard may sit in
  if (o == "div" || f.name == "expand" || f.name == "cat" || f.name == "stack") return 2;
  return 1;
}

}  // namespace

json single_op_program() {
  // The mesh and the op uniform at every case (inRange and elementOf alone narrow to the smallest
  // mesh and the first ops in the early, small-size cases, where a rule's bug may not show).
  const Mesh mesh = *rc::gen::resize(100, rc::gen::exec([] { return small_mesh(); }));
  const json options = draw_options({});
  std::vector<std::pair<std::string, size_t>> ops;  // (op, arity)
  for (const auto& f : rule_families())
    for (const auto& o : f.ops)
      for (int copies = copies_of(f, o); copies > 0; --copies) ops.emplace_back(o, f.arity);
  const auto [name, arity] = *rc::gen::resize(100, rc::gen::elementOf(ops));
  OpDecl decl;
  decl.op = name;
  decl.attrs = json::object();
  const std::vector<Shape> shapes = draw_case(name, arity, decl.attrs);
  // pick_target and count_targets are the parts of nll_loss and cross_entropy (their programs'
  // op); count_targets runs for a mean with an ignore_index.
  const bool loss = name == "pick_target" || name == "count_targets";
  const std::string program_op = !loss ? name : op_of(GenClass::Loss);
  // Every placement per axis, or (3 times in 4) per axis the operands of a random row of the
  // op's table, so that every row and every backward rule is drawn often (a rule of a rare shape
  // would wait long for random placements to fit it). An operand with P(max) or P(min) on an axis
  // has no gradient, nor have the operands of amax or amin when the result is P(max) or P(min).
  std::vector<Spec> specs;
  for (const auto& sh : shapes) specs.push_back(*gen::spec(mesh, any_placement(static_cast<int64_t>(sh.size()))));
  // Views take random placements half the time: which shards a view may keep is the rule under
  // test, and its table lists only the ones it keeps.
  if (*rc::gen::inRange(0, 4) >= (is_view_op(name) ? 2 : 1)) {
    // The operands the table is about: count_targets' is the target (operand 1).
    const size_t first = name == "count_targets" ? 1 : 0;
    std::vector<Shape> row_shapes = name == "count_targets" ? std::vector<Shape>{shapes[1]} : shapes;
    OpAttrs row_attrs = op_attrs(decl);
    if (row_attrs.scalar && shapes.size() == 1) {  // the scalar is a replicated 0-d operand
      row_shapes.push_back({});
      row_attrs.scalar = false;
    }
    std::vector<std::vector<Placement>> rows, shard_rows;  // rows that shard an operand: drawn two times in three
    for (const auto& row : rule_rows_for(name, row_shapes, row_attrs)) {
      rows.push_back(row.ins);
      for (const auto& p : row.ins)
        if (p.is_shard()) {
          shard_rows.push_back(row.ins);
          break;
        }
    }
    // embedding's vocab-parallel row (the masked partial, whose lookup and backward take a rank's
    // range) as often as the other rows together.
    if (name == "embedding")
      for (const auto& row : rows)
        if (row.size() == 2 && row[1].is_shard() && row[1].dim == 0)
          for (size_t more = shard_rows.size(); more > 0; --more) shard_rows.push_back(row);
    // A norm over a shard of a reduced dim (its norm partial: the rule a wrong partial breaks) as
    // often as the other rows together.
    if (op_schema(name).gen == GenClass::VectorNorm) {
      std::vector<std::vector<Placement>> partial_rows;
      for (const auto& row : rule_rows_for(name, row_shapes, row_attrs))
        if (row.out.is_partial()) partial_rows.push_back(row.ins);
      for (const auto& row : partial_rows)
        for (size_t more = shard_rows.size(); more > 0; --more) shard_rows.push_back(row);
    }
    // expand moves elements: its Partial rows (P(max) and P(min) pass through) drawn as its shards are.
    if (name == "expand")
      for (const auto& row : rows)
        if (row[0].is_partial()) shard_rows.push_back(row);
    // The losses' class-sharded pick (loss parallel: log_softmax over the shard, the masked pick) as
    // often as the other rows together.
    if (name == "pick_target")
      for (const auto& row : rows)
        if (row.size() == 2 && row[0].is_shard() && row[0].dim == 1)
          for (size_t more = shard_rows.size(); more > 0; --more) shard_rows.push_back(row);
    // log_softmax of a shard of its dim: loss parallel (no row: it runs as a decomposition).
    if (name == "log_softmax") {
      const int64_t d = decl.attrs["dim"].get<int64_t>();
      for (int more = 0; more < 3; ++more) shard_rows.push_back({Placement::shard(d < 0 ? d + 2 : d)});
    }
    // cumsum of a shard of its dim: no row takes it (the dim is gathered first, or, under the planted
    // bug cumsum_sharded_dim_local, each rank's own running sums are kept): drawn as often as a row.
    if (name == "cumsum") {
      const int64_t d = decl.attrs["dim"].get<int64_t>(), rank = static_cast<int64_t>(shapes[0].size());
      for (size_t more = rows.size(); more > 0; --more) shard_rows.push_back({Placement::shard(d < 0 ? d + rank : d)});
    }
    // attention of q, k and v sharded on the sequence: no row takes it (gathered first, or, under
    // the planted bug sdpa_sequence_shard_local, each rank's own block of keys), drawn as often as a row.
    if (name == "scaled_dot_product_attention")
      for (size_t more = rows.size(); more > 0; --more) shard_rows.push_back(std::vector<Placement>(3, Placement::shard(2)));
    // A selection of a shard of its dim: no row takes it (the dim is gathered first, or, under the
    // planted bug local_topk_sharded_dim, each rank's own top k is taken): drawn as often as a row,
    // topk's as often as its other rows together.
    if (op_schema(name).gen == GenClass::Select || op_schema(name).gen == GenClass::SelectIndex) {
      const int64_t d = decl.attrs["dim"].get<int64_t>(), rank = static_cast<int64_t>(shapes[0].size());
      for (size_t more = name == "topk" ? rows.size() : 1; more > 0; --more)
        shard_rows.push_back({Placement::shard(d < 0 ? d + rank : d)});
    }
    // gather of x and the index sharded alike on a dim not gathered where the index is shorter:
    // no row takes it (the planted bug gather_shard_extents_unchecked keeps it), drawn as four rows.
    if (name == "gather") {
      const int64_t d = decl.attrs["dim"].get<int64_t>(), rank = static_cast<int64_t>(shapes[0].size());
      for (int64_t other = 0; other < rank; ++other)
        if (other != (d < 0 ? d + rank : d) && shapes[1][static_cast<size_t>(other)] < shapes[0][static_cast<size_t>(other)])
          for (int more = 0; more < 4; ++more) shard_rows.push_back({Placement::shard(other), Placement::shard(other)});
    }
    // scatter_add and index_add of a replicated x with the index and src sharded alike: no row takes
    // it (x goes to P(sum) first; the planted bug scatter_add_sharded_index_replicated keeps it R).
    if (name == "scatter_add" || name == "index_add")
      for (const auto& row : rows)
        if (row.size() == 3 && row[0].is_partial() && row[1].is_shard())
          shard_rows.push_back({Placement::replicate(), row[1], row[2]});
    for (int a = 0; a < mesh.ndim(); ++a) {
      const auto& row = !shard_rows.empty() && *rc::gen::inRange(0, 3) != 0 ? *rc::gen::elementOf(shard_rows) : *rc::gen::elementOf(rows);
      for (size_t i = 0; i < row.size() && first + i < specs.size(); ++i)
        specs[first + i][static_cast<size_t>(a)] = row[i].is_plain_replicate() && *rc::gen::arbitrary<bool>() ? Placement::reduced() : row[i];
    }
  } else if (is_view_op(name) && !shapes[0].empty()) {  // a shard of any dim, on every axis now and then
    for (int a = 0; a < mesh.ndim(); ++a)
      if (*rc::gen::arbitrary<bool>())
        specs[0][static_cast<size_t>(a)] =
            Placement::shard(*rc::gen::inRange<int64_t>(0, static_cast<int64_t>(shapes[0].size())));
  }
  // A bool or int64 result (comparisons, indices): no gradient, the result compared alone.
  const bool integral = op_schema(name).result != OperandType::Any;
  bool result_differentiable = !integral && op_schema(name).differentiable;  // detach, item: none
  if (op_schema(name).gen == GenClass::Extremum || op_schema(name).gen == GenClass::VectorNorm) {
    try {
      for (const auto& p : propagate(name, mesh, specs, shapes, op_attrs(decl)).out_spec)
        result_differentiable &= !p.is_partial() || is_linear(p.op);  // a 0 norm's P(sum) has a gradient
    } catch (const SemanticError&) {
      result_differentiable = false;
    }
  }
  json inputs = json::array(), program = json::array();
  std::vector<std::string> args;
  const bool attention_mask = name == "scaled_dot_product_attention" && shapes.size() > 3;
  const bool bool_mask = attention_mask && *rc::gen::arbitrary<bool>();
  const uint64_t seed = options["seed"].get<uint64_t>();
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string arg = std::vector<std::string>{"a", "b", "d", "e"}.at(i);  // "c" weighs the result
    // pick_target, count_targets: the loss's; attention's mask bool half of the time
    const std::string type = attention_mask && i == 3 && bool_mask ? "bool" : operand_type(program_op, i);
    args.push_back(arg);
    if (type != "float") {  // no gradient, no Partial; ids in the table's vocab, targets in the classes
      specs[i] = without_partial(specs[i]);
      int64_t high = name == "embedding" ? shapes[1][0] : loss ? shapes[0][1] : 0;
      if (name == "gather" || name == "index_select" || name == "scatter" || name == "scatter_add" ||
          name == "index_add") {  // positions along x's dim
        const int64_t d = decl.attrs["dim"].get<int64_t>(), rank = static_cast<int64_t>(shapes[0].size());
        high = shapes[0][static_cast<size_t>(d < 0 ? d + rank : d)];
      }
      if (name == "one_hot" || name == "bincount")
        high = decl.attrs[name == "one_hot" ? "num_classes" : "minlength"].get<int64_t>();
      inputs.push_back(typed_input(arg, shapes[i], specs[i], type, high));
      if ((name == "floor_divide" || name == "remainder") && i == 1) {  // a divisor in [1, 3], laid out as drawn
        inputs.back()["init"] = {{"ids", 3}};
        program.push_back(op(arg + "_nz", "add", {arg}, {{"value", 1}}));
        args.back() = arg + "_nz";
      }
      continue;
    }
    const Spec& spec = specs[i];
    bool grad = result_differentiable && !(attention_mask && i == 3);  // a float mask: no gradient
    for (const auto& p : spec) grad &= !p.is_partial() || is_linear(p.op);
    // A kink at 0 (relu, abs): on randn data no value sits there (a mesh that rounds would move it
    // off). Scores of a loss: randn too, so that the ranks' maxes of a row differ (small integers
    // tie often, and a wrong max that ties the right one does not show).
    const bool scores = name == "log_softmax" || (loss && i == 0);
    json in = input(arg, shapes[i], spec, grad, has_kink(name) || scores);
    if (name == "div" && i == 1) in["init"] = "ones";  // a divisor with no zero, split over Partial axes
    // Ties on purpose half of the time: every element is the extremum, and the gradient's split
    // among ties is all there is to see.
    if (op_schema(name).gen == GenClass::Extremum && *rc::gen::arbitrary<bool>()) in["init"] = "ones";
    inputs.push_back(in);
    if (needs_positive(name)) {  // a positive operand: exp of the input, laid out as drawn where it can be
      program.push_back(op(arg + "_exp", "exp", {arg}));
      args.back() = arg + "_exp";
      try {
        const ShardingDecision e = propagate("exp", mesh, {spec}, {shapes[i]}, {});
        if (redistribute_illegal_reason(e.out_spec, spec).empty()) {
          program.push_back(op(arg + "_laid", "redistribute", {arg + "_exp"}, {{"placements", spec_json(spec)}}));
          args.back() = arg + "_laid";
        }
      } catch (const SemanticError&) {
      }
    }
  }
  if (loss) {  // a reduction, and an ignore_index among the targets now and then (always for count_targets)
    decl.attrs["reduction"] = name == "count_targets" ? "mean" : *rc::gen::element<std::string>("mean", "sum");
    if (name == "count_targets" || *rc::gen::arbitrary<bool>()) {
      const auto ignore = ignore_index_for(drawn_ids(seed, 1, shapes[1], shapes[0][1]), *rc::gen::inRange<int64_t>(0, 8));
      if (ignore || name == "count_targets") decl.attrs["ignore_index"] = ignore.value_or(-100);
    }
    // The loss's options, a third of the time each: reduction none (each row's loss), a class weight
    // (positive, in any placement without Partial: a weighted mean divides by the targets' weights)
    // and cross_entropy's label smoothing.
    if (name == "pick_target" && *rc::gen::inRange(0, 3) == 0) decl.attrs["reduction"] = "none";
    if (*rc::gen::inRange(0, 3) == 0) {
      const Shape w = {shapes[0][1]};
      inputs.push_back(input("w", w, without_partial(*gen::spec(mesh, any_placement(1))), false, false));
      program.push_back(op("w_pos", "exp", {"w"}));  // positive, and unequal
      args.push_back("w_pos");
    }
    if (program_op == "cross_entropy" && *rc::gen::inRange(0, 3) == 0)
      decl.attrs["label_smoothing"] = *rc::gen::element(0.1, 0.25, 0.5);
  }
  program.push_back(op("y", program_op, args, decl.attrs));
  if (integral)
    return {{"format", "meshsim.scenario/1"}, {"name", "single_op"}, {"mesh", mesh_json(mesh)},
            {"options", options}, {"inputs", inputs}, {"program", program}};
  // A weight of the result's shape in any differentiable placement, so that gradients are not uniform.
  Shape out;
  try {
    out = loss ? (decl.attrs.value("reduction", "") == "none" ? Shape{shapes[0][0]} : Shape{})
               : infer_shape(name, shapes, op_attrs(decl));
  } catch (const SemanticError&) {
    out = shapes[0];
  }
  inputs.push_back(input("c", out, *gen::spec(mesh, differentiable_placement(static_cast<int64_t>(out.size()))), false, false));
  // An op of a positive operand (exp of the input: up to e^4) may make values up to 1.6e5 (pow 3),
  // whose rounding a weight of mixed signs would leave in a sum that cancels to a few units, past
  // the loss's tolerance (the deep check, seed 9): a weight of ones there (each value keeps its
  // own comparison).
  if (needs_positive(name)) inputs.back()["init"] = "ones";
  // A norm's result without a gradient (a norm partial, P(max), P(min)) laid out R or Rd on every
  // axis half of the time: its reductions to R and to Rd.
  std::string result = "y";
  if (op_schema(name).gen == GenClass::VectorNorm && !result_differentiable && *rc::gen::arbitrary<bool>()) {
    json to = json::array();
    for (int a = 0; a < mesh.ndim(); ++a) to.push_back(*rc::gen::element<std::string>("R", "Rd"));
    program.push_back(op("y_laid", "redistribute", {"y"}, {{"placements", to}}));
    result = "y_laid";
  }
  program.push_back(op("weighted", "mul", {result, "c"}));
  program.push_back(op("loss", "sum", {"weighted"}));
  return {{"format", "meshsim.scenario/1"}, {"name", "single_op"}, {"mesh", mesh_json(mesh)},
          {"options", options}, {"inputs", inputs}, {"program", program}, {"backward", "loss"}};
}

}  // namespace meshsim::gen

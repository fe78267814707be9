#include "core/ops.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <unordered_map>

#include "core/error.h"

namespace meshsim {

namespace {

using T = AttrType;
using O = OperandSchema;
using A = AttrSchema;
constexpr OperandType kInt = OperandType::Int64, kBool = OperandType::Bool, kAny = OperandType::Any;

// ---- the generators' value ranges of the pointwise ops (ValueRules::range) ----

ValueRange same(ValueRange x, const nlohmann::json&) { return {x.bound, 0}; }
ValueRange unit_or_less(ValueRange x, const nlohmann::json&) { return {std::min(1.0, x.bound), 0}; }
ValueRange unit(ValueRange, const nlohmann::json&) { return {1.0, 0}; }
ValueRange exp_range(ValueRange x, const nlohmann::json&) { return {std::exp(x.bound), std::exp(-x.bound)}; }
ValueRange sigmoid_range(ValueRange x, const nlohmann::json&) { return {std::min(1.0, x.bound), 1 / (1 + std::exp(x.bound))}; }
ValueRange log_range(ValueRange x, const nlohmann::json&) {
  if (!(x.floor > 0)) return {INFINITY, 0};
  return {std::max(std::abs(std::log(x.floor)), std::abs(std::log(std::max(x.bound, 1.0)))), 0};
}
ValueRange sqrt_range(ValueRange x, const nlohmann::json&) {
  if (!(x.floor > 0)) return {INFINITY, 0};
  return {std::sqrt(x.bound), std::sqrt(x.floor)};
}
ValueRange rsqrt_range(ValueRange x, const nlohmann::json&) {
  if (!(x.floor > 0)) return {INFINITY, 0};
  return {1 / std::sqrt(x.floor), 1 / std::sqrt(x.bound)};
}
// clamp is monotone: its result lies between the clamped ends of its operand's range.
ValueRange clamp_range(ValueRange x, const nlohmann::json& attrs) {
  auto clamped = [&](double v) {
    if (attrs.contains("min") && attrs["min"].is_number()) v = std::max(v, attrs["min"].get<double>());
    if (attrs.contains("max") && attrs["max"].is_number()) v = std::min(v, attrs["max"].get<double>());
    return v;
  };
  const double lo = clamped(-x.bound), hi = clamped(x.bound);
  return {std::max(std::abs(lo), std::abs(hi)), lo > 0 ? lo : 0};
}
ValueRange pow_range(ValueRange x, const nlohmann::json& attrs) {
  if (!(x.floor > 0)) return {INFINITY, 0};
  const double e = attrs.value("exponent", 1.0);
  return {std::max(std::pow(x.bound, e), std::pow(x.floor, e)), std::min(std::pow(x.floor, e), std::pow(x.bound, e))};
}

// ---- attribute lists shared by several ops ----

const std::vector<A>& reduction_attrs() {
  static const std::vector<A> a = {{"dim", T::IntOrInts, false, "every dim"}, {"keepdim", T::Bool, false, "false"}};
  return a;
}
// A binary op's second operand may be the scalar `value` instead (then it takes one arg).
const std::vector<A>& binary_attrs() {
  static const std::vector<A> a = {{"value", T::Number, false}};
  return a;
}
// A comparison's operands: two of one element type (float, int64 or bool), or one and `value`.
const std::vector<O>& compared() {
  static const std::vector<O> o = {{"x", kAny}, {"y", kAny}};
  return o;
}
OpSchema comparison(const char* name, const char* summary) {
  OpSchema s;
  s.name = name;
  s.operands = compared();
  s.attrs = binary_attrs();
  s.family = "compare";
  s.exact = true;
  s.summary = summary;
  s.gen = GenClass::Compare;
  s.result = kBool;
  return s;
}
// The selection and order ops: along `dim` (sort, argsort, topk: the last by default).
std::vector<A> along(bool required, std::vector<A> more) {
  std::vector<A> a = {required ? A{"dim", T::Int, true} : A{"dim", T::Int, false, "-1"}};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// Creation ops take no operand: a shape, placements (S, R or Rd on each axis) and a dtype.
std::vector<A> creation_attrs(bool value, bool bools = true) {
  std::vector<A> a = {{"shape", T::Ints, true}, {"placements", T::Spec, true}, {"dtype", T::String, false, "float"}};
  a.back().choices = bools ? std::vector<const char*>{"float", "bool", "int64", "float64", "float32", "bfloat16", "float16"}
                            : std::vector<const char*>{"float", "int64", "float64", "float32", "bfloat16", "float16"};
  if (value) a.push_back({"value", T::NumberOrInf, true});
  return a;
}
// arange: a shape filled with start, start + step, ... in row-major order, or torch.arange's 1-D
// form, its length ceil((end - start) / step) (then shape may be left off).
std::vector<A> arange_attrs() {
  std::vector<A> a = creation_attrs(false, false);
  a[0].required = false;
  a[0].default_value = "[ceil((end - start) / step)]";
  a.push_back({"start", T::Number, false, "0"});
  a.push_back({"end", T::Number, false});
  a.push_back({"step", T::Number, false, "1"});
  return a;
}
// rand and randn: a shape and placements (S, R or Rd on each axis) as the creation ops; their
// values the run's float dtype, drawn from their stream (core/random.h).
std::vector<A> random_creation_attrs() {
  return {{"shape", T::Ints, true}, {"placements", T::Spec, true}, {"stream", T::String, false, "its result's name"}};
}
std::vector<A> loss_attrs(bool class_parallel) {
  std::vector<A> a = {{"reduction", T::String, false, "mean", {"mean", "sum", "none"}},
                      {"ignore_index", T::Int, false}};
  if (class_parallel) {  // a local_map body's class-parallel pick: the axis sharding the classes
    a.push_back({"axis", T::Axis, false});
    a.push_back({"classes", T::Int, false});
  } else {  // cross_entropy
    a.push_back({"label_smoothing", T::Number, false, "0"});
  }
  return a;
}
std::vector<A> norm_attrs(const char* eps) { return {{"normalized_shape", T::Ints, true}, {"eps", T::Number, false, eps}}; }

const std::vector<O>& x() {
  static const std::vector<O> o = {{"x"}};
  return o;
}
const std::vector<O>& xy() {
  static const std::vector<O> o = {{"x"}, {"y"}};
  return o;
}
const std::vector<O>& many() {
  static const std::vector<O> o = {{"xs", kAny, false, true}};
  return o;
}
// The operands of arithmetic that takes float or int64 data (add, sub, mul), of one type.
const std::vector<O>& numbers() {
  static const std::vector<O> o = {{"x", OperandType::Number}, {"y", OperandType::Number}};
  return o;
}
// The operand of an op that moves or selects data, whatever its element type.
const std::vector<O>& data() {
  static const std::vector<O> o = {{"x", kAny}};
  return o;
}

constexpr unsigned kEverywhere = kProgram | kBody | kReference;
constexpr unsigned kCollective = kProgram | kBody;  // local_map bodies and DTensor local code

OpSchema op(const char* name, std::vector<O> operands, std::vector<A> attrs, const char* family, bool exact,
            const char* summary) {
  OpSchema s;
  s.name = name;
  s.operands = std::move(operands);
  s.attrs = std::move(attrs);
  s.family = family;
  s.exact = exact;
  s.summary = summary;
  return s;
}

// An op whose result is bool or int64 whatever its operands' type (never differentiable).
OpSchema giving(OpSchema s, OperandType result) {
  s.result = result;
  return s;
}

// Integer division and remainder: int64 operands (or one and the whole scalar `value`), an int64
// result, no gradient.
OpSchema integer_binary(const char* name, const char* summary) {
  OpSchema s = op(name, {{"x", kInt}, {"y", kInt}}, binary_attrs(), "integer_binary", true, summary);
  s.result = kInt;
  return s;
}

// An op whose result never requires grad (detach, item): no backward through it.
OpSchema without_gradient(OpSchema s) {
  s.differentiable = false;
  return s;
}

OpSchema with(OpSchema s, GenClass gen, ValueRules values = {}) {
  s.gen = gen;
  s.values = std::move(values);
  return s;
}

// An op the runtime handles itself: no rule family, no per-rank kernel.
OpSchema handled(OpSchema s, unsigned scopes, int results = 1) {
  s.kernel = false;
  s.scopes = scopes;
  s.results = results;
  return s;
}

// An op of local code: a collective or a call (core/ops.h, OpSchema::local_code).
OpSchema local_code(OpSchema s, unsigned scopes) {
  s = handled(std::move(s), scopes);
  s.local_code = true;
  return s;
}

std::vector<OpSchema> build() {
  const double g = 64;  // the operand limit of the bounded transcendental ops
  std::vector<OpSchema> ops = {
      with(op("abs", x(), {}, "nonlinear_unary", false, "|x|"), GenClass::UnaryLayer, {0, false, true, same}),
      with(op("add", numbers(), binary_attrs(), "linear_binary", true, "x + y (or x + value), broadcast; float or int64"),
           GenClass::Binary),
      with(op("amax", x(), reduction_attrs(), "amax", false,
              "the largest element over dims; the gradient split evenly among ties"),
           GenClass::Extremum),
      with(op("amin", x(), reduction_attrs(), "amin", false,
              "the smallest element over dims; the gradient split evenly among ties"),
           GenClass::Extremum),
      with(handled(op("arange", {}, arange_attrs(), "", false,
                      "start, start + step, ... (0, 1, 2, ... by default) in row-major order, of a shape; or, with end, "
                      "torch.arange(start, end, step) (1-D, end excluded)"),
                   kEverywhere),
           GenClass::Creation),
      giving(with(op("argmax", x(), along(true, {{"keepdim", T::Bool, false, "false"}}), "select_index", true,
              "int64 index of the largest element along dim (the first of ties); no gradient"),
           GenClass::SelectIndex), kInt),
      giving(with(op("argmin", x(), along(true, {{"keepdim", T::Bool, false, "false"}}), "select_index", true,
              "int64 index of the smallest element along dim (the first of ties); no gradient"),
           GenClass::SelectIndex), kInt),
      giving(with(op("argsort", x(), along(false, {{"descending", T::Bool, false, "false"}}), "select_index", true,
              "int64 indices that sort x along dim (stable: ties keep their order); no gradient. "
              "narrow(argsort {descending}, dim, 0, k) gives topk's indices"),
           GenClass::SelectIndex), kInt),
      giving(op("bincount", {{"x", kInt}}, {{"minlength", T::Int, false, "0"}}, "bincount", true,
                "torch.bincount(x, minlength) of 1-D int64 values in [0, minlength): how often each occurs, "
                "[minlength]; a value at or beyond minlength is refused (the length would follow the data); no "
                "gradient"),
             kInt),
      op("bmm", xy(), {}, "matmul", true, "batched matrix product [b, n, k] @ [b, k, m]"),
      op("cat", many(), {{"dim", T::Int, true}}, "cat", true, "concatenation along dim"),
      with(handled(op("chunk", data(), {{"chunks", T::Int, true}, {"dim", T::Int, false, "0"}}, "", false,
                      "torch.chunk: pieces of ceil(extent / chunks) along dim (`outs` names them)"),
                   kEverywhere, 0),
           GenClass::Split),
      with(op("clamp", {{"x", OperandType::Number}}, {{"min", T::Number, false}, {"max", T::Number, false}},
              "nonlinear_unary", true,
              "torch.clamp(x, min, max) of float or int64 data (at least one bound; min above max gives max "
              "everywhere); the gradient g where min <= x <= max, bounds included (libtorch 1.13's clamp_backward; "
              "PyTorch 2.15's gives 0 on a bound), else 0"),
           GenClass::UnaryLayer, {0, false, true, clamp_range, {{"min", "[-1, 0]"}, {"max", "[1, 2]"}}}),
      with(op("cos", x(), {}, "nonlinear_unary", false, "cosine"), GenClass::Unary, {g, false, false, unit}),
      op("count_targets", {{"target", kInt}}, {{"ignore_index", T::Int, false}}, "count_targets", false,
         "1 where a target counts towards a mean loss (not ignore_index), else 0 (cross_entropy's parts)"),
      with(op("cross_entropy", {{"input"}, {"target", kInt}, {"weight", OperandType::Float, true}}, loss_attrs(false),
              "", false,
              "log_softmax over classes (dim 1) and nll_loss, with class weights and label smoothing as "
              "torch's; decomposed into its parts on the mesh"),
           GenClass::Loss, {g}),
      op("cumsum", {{"x", OperandType::Number}}, {{"dim", T::Int, true}}, "scan", true,
         "torch.cumsum(x, dim): the running sums along dim, of float or int64 data; the gradient the running sums "
         "of g taken from the end"),
      without_gradient(op("detach", data(), {}, "detach", true,
                          "x without gradient (the result requires none), every placement kept, Partial included")),
      op("div", xy(), binary_attrs(), "div", false, "x / y (or x / value), broadcast"),
      op("dropout", x(),
         {{"p", T::Number, false, "0.5"},
          {"training", T::Bool, false, "true"},
          {"stream", T::String, false, "its result's name"},
          {"generator", T::String, false, "same_seed", {"same_seed", "rank_seed"}}},
         "random", false,
         "x * mask / (1 - p), the mask's zeros drawn with probability p (training false: x); on a DTensor the "
         "global tensor's draw whatever its layout; on a local tensor each rank's own generator (same_seed: seeded "
         "alike on every rank, rank_seed: by rank)"),
      op("embedding", {{"ids", kInt}, {"weight"}},
         {{"axis", T::Axis, false}, {"vocab", T::Int, false}}, "embedding", false,
         "rows of weight at ids; in a local_map body, axis and vocab name a vocab-parallel table"),
      comparison("eq", "x == y (or x == value), broadcast; bool"),
      with(op("exp", x(), {}, "nonlinear_unary", false, "e^x"), GenClass::Unary, {6, false, false, exp_range}),
      op("expand", data(), {{"shape", T::Ints, true}}, "expand", true, "broadcast to shape (-1 keeps a dim)"),
      op("flatten", data(), {{"start_dim", T::Int, false, "0"}, {"end_dim", T::Int, false, "-1"}}, "view", true,
         "merge dims start_dim..end_dim"),
      handled(op("from_local", x(), {{"placements", T::Spec, true}, {"run_check", T::Bool, false, "false"}}, "", true,
                 "local code's end: each rank's local tensor as a DTensor of placements"),
              kProgram),
      integer_binary("floor_divide", "torch.floor_divide(x, y) (or x // value) of int64 data: the quotient rounded "
                                     "down (towards -inf), broadcast; a zero divisor is refused; no gradient"),
      with(handled(op("full", {}, creation_attrs(true), "", false, "value everywhere, of a shape"), kEverywhere),
           GenClass::Creation),
      op("gather", {{"x", kAny}, {"index", kInt}}, {{"dim", T::Int, true}}, "index", true,
         "torch.gather(x, dim, index): x at index along dim, index of x's rank and no larger on the other dims "
         "(the result has its shape); the gradient scatter_added back to x"),
      comparison("ge", "x >= y (or x >= value), broadcast; bool"),
      with(op("gelu", x(), {{"approximate", T::String, false, "none", {"none", "tanh"}}}, "nonlinear_unary", false,
              "x * Phi(x) (approximate tanh: the tanh form)"),
           GenClass::UnaryLayer, {g, false, false, same, {{"approximate", R"(["none", "tanh"])"}}}),
      comparison("gt", "x > y (or x > value), broadcast; bool"),
      op("index_add", {{"x", kAny}, {"index", kInt}, {"source", kAny}}, {{"dim", T::Int, true}}, "scatter", true,
         "torch.index_add(x, dim, index, source): x with source's slices added at the 1-D index along dim (source "
         "is x's shape with the index's length at dim); the gradient: g to x, index_select(g) to source"),
      op("index_select", {{"x", kAny}, {"index", kInt}}, {{"dim", T::Int, true}}, "index", true,
         "torch.index_select(x, dim, index): the entries of x at the 1-D index along dim; the gradient "
         "index_added back to x"),
      without_gradient(op("item", data(), {}, "item", true,
                          "the number a value of one element holds, as a 0-d value without gradient; on a DTensor "
                          "replicated first (a Partial reduced, a shard gathered); in local code each rank's own")),
      with(op("layer_norm", {{"x"}, {"weight", OperandType::Float, true}, {"bias", OperandType::Float, true}},
              norm_attrs("1e-5"), "norm", false, "normalize the trailing normalized_shape dims, then weight and bias"),
           GenClass::Norm),
      comparison("le", "x <= y (or x <= value), broadcast; bool"),
      with(op("linalg_vector_norm", x(),
              {{"ord", T::NumberOrInf, false, "2"}, {"dim", T::IntOrInts, false, "every dim"},
               {"keepdim", T::Bool, false, "false"}},
              "vector_norm", false,
              "torch.linalg.vector_norm(x, ord, dim, keepdim): (sum |x|^ord)^(1/ord) over dims (ord inf: max |x|, "
              "-inf: min |x|, 0: the count of nonzeros); over a sharded dim P(normP) (P(max), P(min), P(sum) for "
              "inf, -inf, 0)"),
           GenClass::VectorNorm),
      op("linear", {{"x"}, {"weight"}, {"bias", OperandType::Float, true}}, {}, "", true,
         "x @ weight^T + bias; decomposed into matmul and add on the mesh"),
      handled(op("local_map", many(),
                 {{"in_placements", T::Any, false},
                  {"in_grad_placements", T::Any, false},
                  {"out_placements", T::Any, true},
                  {"body", T::Any, true},
                  {"returns", T::Any, true},
                  {"reference", T::Any, false},
                  {"check_variance", T::Bool, false, "true"}},
                 "", false, "a region of local code on LTensors with variance tracking (scenario-format.md)"),
              kProgram, 0),
      with(op("log", x(), {}, "nonlinear_unary", false, "natural log of a positive x"), GenClass::UnaryLayer,
           {0, true, false, log_range}),
      giving(op("logical_and", {{"x", kBool}, {"y", kBool}}, {}, "compare", true, "x and y of bools, broadcast"), kBool),
      giving(op("logical_not", {{"x", kBool}}, {}, "compare", true, "not x of bools"), kBool),
      giving(op("logical_or", {{"x", kBool}, {"y", kBool}}, {}, "compare", true, "x or y of bools, broadcast"), kBool),
      with(op("log_softmax", x(), {{"dim", T::Int, true}}, "softmax", false, "log of softmax along dim"), GenClass::None,
           {g}),
      comparison("lt", "x < y (or x < value), broadcast; bool"),
      op("masked_fill", {{"x"}, {"mask", kBool}}, {{"value", T::NumberOrInf, true}}, "masked_fill", false,
         "value where mask, else x (mask broadcast)"),
      op("matmul", xy(), {}, "matmul", true, "torch.matmul: matrix products with broadcast batch dims"),
      with(op("max", x(), along(true, {{"keepdim", T::Bool, false, "false"}}), "select", true,
              "torch.max(x, dim).values: the largest element along dim, its gradient to the first of ties "
              "(argmax gives the indices; amax splits the gradient among ties)"),
           GenClass::Select),
      with(op("mean", x(), reduction_attrs(), "reduction", false, "mean over dims"), GenClass::Reduction),
      with(op("min", x(), along(true, {{"keepdim", T::Bool, false, "false"}}), "select", true,
              "torch.min(x, dim).values: the smallest element along dim, its gradient to the first of ties "
              "(argmin gives the indices)"),
           GenClass::Select),
      op("mm", xy(), {}, "mm", true, "matrix product [n, k] @ [k, m]"),
      with(op("mul", numbers(), binary_attrs(), "mul", true, "x * y (or x * value), broadcast; float or int64"),
           GenClass::Binary),
      comparison("ne", "x != y (or x != value), broadcast; bool"),
      op("narrow", data(), {{"dim", T::Int, true}, {"start", T::Int, true}, {"length", T::Int, true}}, "narrow", true,
         "length elements from start along dim"),
      op("neg", x(), {}, "linear_unary", true, "-x"),
      with(op("nll_loss", {{"log_probs"}, {"target", kInt}, {"weight", OperandType::Float, true}}, loss_attrs(true), "",
              false,
              "negative log likelihood of target classes (dim 1), weighted by class (weight [C]); decomposed into "
              "pick_target and count_targets"),
           GenClass::Loss),
      with(handled(op("ones", {}, creation_attrs(false), "", false, "ones, of a shape"), kEverywhere), GenClass::Creation),
      op("permute", data(), {{"dims", T::Ints, true}}, "permute", true, "dims reordered"),
      op("pick_target", {{"log_probs"}, {"target", kInt}}, {{"ignore_index", T::Int, false}}, "pick_target", false,
         "each row's element at its target class, 0 where ignored (nll_loss's part)"),
      with(op("pow", x(), {{"exponent", T::Number, true}}, "nonlinear_unary", false, "x^exponent of a positive x"),
           GenClass::UnaryLayer, {g, true, false, pow_range, {{"exponent", "[-1.0, -0.5, 0.5, 1.5, 2.0, 3.0]"}}}),
      handled(op("redistribute", x(), {{"placements", T::Spec, true}}, "", true,
                 "the value laid out by placements (the planner's collectives)"),
              kProgram | kReference),
      with(handled(op("rand", {}, random_creation_attrs(), "", false,
                      "uniform values in [0, 1) of a shape, the global tensor's draw whatever its layout"),
                   kProgram),
           GenClass::RandomCreation),
      with(handled(op("randn", {}, random_creation_attrs(), "", false,
                      "standard normal values of a shape, the global tensor's draw whatever its layout"),
                   kProgram),
           GenClass::RandomCreation),
      with(op("relu", x(), {}, "nonlinear_unary", true, "max(x, 0)"), GenClass::Unary, {0, false, true, same}),
      with(op("reshape", data(), {{"shape", T::Ints, true}}, "view", true, "the elements in another shape (-1 inferred)"),
           GenClass::Reshape),
      with(op("rms_norm", {{"x"}, {"weight", OperandType::Float, true}}, norm_attrs("the dtype's machine epsilon"), "norm", false,
              "x / sqrt(mean(x^2) + eps) over the trailing dims, times weight"),
           GenClass::Norm),
      with(op("rsqrt", x(), {}, "nonlinear_unary", false, "1 / sqrt(x) of a positive x"), GenClass::UnaryLayer,
           {0, true, false, rsqrt_range}),
      integer_binary("remainder", "torch.remainder(x, y) (or x % value) of int64 data: x - floor_divide(x, y) * y, "
                                  "the sign of the divisor, broadcast; a zero divisor is refused; no gradient"),
      op("repeat", data(), {{"sizes", T::Ints, true}}, "repeat", true,
         "Tensor.repeat(*sizes): x tiled sizes[i] times along dim i (leading sizes add dims); the gradient summed "
         "over the copies"),
      op("repeat_interleave", data(), {{"repeats", T::Int, true}, {"dim", T::Int, true}}, "repeat_interleave", true,
         "torch.repeat_interleave(x, repeats, dim): each entry along dim repeated `repeats` times in place; the "
         "gradient summed over each entry's copies"),
      giving(op("one_hot", {{"x", kInt}}, {{"num_classes", T::Int, true}}, "one_hot", true,
                "torch.nn.functional.one_hot(x, num_classes) of int64 values in [0, num_classes): a new trailing dim "
                "of num_classes, 1 at the value, else 0; num_classes -1 (inferred from the data) is refused; no "
                "gradient"),
             kInt),
      op("scale", x(), {{"value", T::Number, true}}, "linear_unary", true, "x * value"),
      op("scaled_dot_product_attention", {{"q"}, {"k"}, {"v"}, {"attn_mask", kAny, true}},
         {{"is_causal", T::Bool, false, "false"},
          {"scale", T::Number, false, "1/sqrt(d)"},
          {"enable_gqa", T::Bool, false, "false"}},
         "attention", false,
         "F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale, enable_gqa) of q [b, h, sq, d], k [b, hk, "
         "sk, d], v [b, hk, sk, dv]: softmax(q k^T * scale + mask) v; attn_mask bool (true: attend) or float (added), "
         "broadcast to [b, h, sq, sk]; is_causal: query i attends to keys j <= i (top left); enable_gqa: hk divides h, "
         "each k/v head serving h/hk query heads"),
      op("scatter", {{"x", kAny}, {"index", kInt}, {"src", kAny}}, {{"dim", T::Int, true}}, "scatter", true,
         "torch.scatter(x, dim, index, src): x with src written at index along dim (src of the index's shape, "
         "the index no larger than x but on dim); the gradient: g zeroed where written to x, gather(g) to src"),
      op("scatter_add", {{"x", kAny}, {"index", kInt}, {"src", kAny}}, {{"dim", T::Int, true}}, "scatter", true,
         "torch.scatter_add(x, dim, index, src): x with src added at index along dim (src of the index's shape, "
         "the index no larger than x but on dim); the gradient: g to x, gather(g) to src"),
      with(op("sigmoid", x(), {}, "nonlinear_unary", false, "1 / (1 + e^-x)"), GenClass::UnaryLayer,
           {g, false, false, sigmoid_range}),
      with(op("silu", x(), {}, "nonlinear_unary", false, "x * sigmoid(x)"), GenClass::UnaryLayer, {g, false, false, same}),
      with(op("sin", x(), {}, "nonlinear_unary", false, "sine"), GenClass::Unary, {g, false, false, unit_or_less}),
      with(op("softmax", x(), {{"dim", T::Int, true}}, "softmax", false, "softmax along dim"), GenClass::None, {8}),
      with(op("sort", x(), along(false, {{"descending", T::Bool, false, "false"}}), "select", true,
              "torch.sort(x, dim, stable=True).values: x sorted along dim, the gradient back to the positions "
              "(argsort gives the indices)"),
           GenClass::Select),
      with(handled(op("split", data(),
                      {{"sizes", T::Ints, false}, {"size", T::Int, false}, {"dim", T::Int, false, "0"}}, "", false,
                      "torch.split: pieces of size (the last shorter) or of sizes along dim (`outs` names them)"),
                   kEverywhere, 0),
           GenClass::Split),
      with(op("sqrt", x(), {}, "nonlinear_unary", false, "square root of a positive x"), GenClass::UnaryLayer,
           {0, true, false, sqrt_range}),
      op("squeeze", data(), {{"dim", T::Int, false, "every size-1 dim"}}, "view", true, "size-1 dims removed"),
      op("stack", many(), {{"dim", T::Int, true}}, "stack", true, "the operands stacked along a new dim"),
      with(op("sub", numbers(), binary_attrs(), "linear_binary", true, "x - y (or x - value), broadcast; float or int64"),
           GenClass::Binary),
      with(op("sum", x(), reduction_attrs(), "reduction", true, "sum over dims"), GenClass::Reduction),
      with(op("tanh", x(), {}, "nonlinear_unary", false, "hyperbolic tangent"), GenClass::Unary,
           {g, false, false, unit_or_less}),
      with(op("topk", x(), {{"k", T::Int, true}, {"dim", T::Int, false, "-1"}, {"largest", T::Bool, false, "true"}},
              "select", true,
              "torch.topk(x, k, dim, largest).values, sorted (ties: the first positions); the gradient back to "
              "the picked positions (narrow of argsort gives the indices)"),
           GenClass::Select),
      with(op("to", x(), {{"dtype", T::String, true, nullptr, {"float64", "float32", "bfloat16", "float16"}}}, "cast",
              false, "x cast to dtype (round to nearest even); the gradient cast back to x's dtype"),
           GenClass::None, {0, false, false, nullptr, {{"dtype", R"(["float64", "float32", "bfloat16", "float16"])"}}}),
      handled(op("to_local", x(), {{"grad_placements", T::Spec, false, "its own placements"}}, "", true,
                 "local code's start: each rank's local tensor (grad_placements: the layout of its gradient)"),
              kProgram),
      op("transpose", data(), {{"dim0", T::Int, true}, {"dim1", T::Int, true}}, "transpose", true, "dim0 and dim1 swapped"),
      with(op("tril", data(), {{"diagonal", T::Int, false, "0"}}, "triangle", false,
              "the lower triangle of the last two dims (zeros above diagonal)"),
           GenClass::Triangle),
      with(op("triu", data(), {{"diagonal", T::Int, false, "0"}}, "triangle", false,
              "the upper triangle of the last two dims (zeros below diagonal)"),
           GenClass::Triangle),
      op("unflatten", data(), {{"dim", T::Int, true}, {"sizes", T::Ints, true}}, "view", true, "dim split into sizes"),
      op("unsqueeze", data(), {{"dim", T::Int, true}}, "view", true, "a size-1 dim inserted at dim"),
      with(op("view", data(), {{"shape", T::Ints, true}}, "view", true, "the elements in another shape (-1 inferred)"),
           GenClass::Reshape),
      op("where", {{"cond", kBool}, {"x", kAny}, {"y", kAny}}, {}, "where", false, "x where cond, else y (broadcast)"),
      with(handled(op("zeros", {}, creation_attrs(false), "", false, "zeros, of a shape"), kEverywhere), GenClass::Creation),
      // Collectives of local code: a local_map body's, or a DTensor program's between to_local and
      // from_local. Their placements are tracked by the LTensor rules (SEMANTICS.md section 5).
      local_code(op("all_gather", x(),
                 {{"axis", T::Axis, true}, {"dim", T::Int, true}, {"to", T::String, false, "varying", {"varying", "reduced"}}},
                 "", true, "gather the ranks' pieces along dim over axis"),
              kCollective),
      local_code(op("all_reduce", x(), {{"axis", T::Axis, true}, {"reduce", T::String, false, "sum"}}, "", true,
                 "reduce over axis (sum, avg, max, min)"),
              kCollective),
      local_code(op("all_to_all", {{"x", kAny}, {"input_split_sizes", kInt, true}, {"output_split_sizes", kInt, true}},
                    {{"axis", T::Axis, true}, {"split_dim", T::Int, false, "0"}, {"concat_dim", T::Int, false, "0"}}, "", true,
                    "split split_dim among the ranks of axis, concatenate what arrives along concat_dim; with "
                    "input_split_sizes and output_split_sizes (int64, one per member), all_to_all_single's uneven rows "
                    "of dim 0, the backward by the transposed sizes"),
              kCollective),
      local_code(op("call", {{"args", kAny, false, true}},
                 {{"function", T::String, true}, {"axis", T::Axis, false}}, "", false,
                 "a registered custom autograd Function (its other fields are its attributes); `out` a list for a Function of several outputs"),
              kBody | kReference),
      local_code(op("mark_varying", x(), {{"axis", T::Axis, true}}, "", true,
                 "an invariant value marked varying over axis (pvary)"),
              kCollective),
      local_code(op("reduce_scatter", x(), {{"axis", T::Axis, true}, {"dim", T::Int, true}}, "", true,
                 "sum over axis, each rank keeping its piece of dim"),
              kCollective),
  };
  std::stable_sort(ops.begin(), ops.end(), [](const OpSchema& a, const OpSchema& b) { return std::string(a.name) < b.name; });
  for (size_t i = 0; i < ops.size(); ++i) ops[i].id = static_cast<OpId>(i);
  for (auto& s : ops)
    if (std::string(s.name) == "count_targets" || std::string(s.name) == "pick_target") s.scopes = kInternal;
  return ops;
}

}  // namespace

bool OpSchema::scalar_second() const {
  const AttrSchema* v = attr("value");
  return v && v->type == AttrType::Number && !v->required && operands.size() == 2;
}

int OpSchema::min_args() const {
  int n = 0;
  for (const auto& o : operands) n += o.optional || o.repeated ? 0 : 1;
  if (!operands.empty() && operands.back().repeated && std::string(name) != "local_map" && std::string(name) != "call")
    n += 1;  // cat and stack take one or more
  return n;
}

int OpSchema::max_args() const {
  if (!operands.empty() && operands.back().repeated) return -1;
  return static_cast<int>(operands.size());
}

const AttrSchema* OpSchema::attr(std::string_view key) const {
  for (const auto& a : attrs)
    if (key == a.key) return &a;
  return nullptr;
}

const std::vector<OpSchema>& op_catalog() {
  static const std::vector<OpSchema> ops = build();
  return ops;
}

const OpSchema* find_op(std::string_view name) {
  static const std::unordered_map<std::string_view, OpId> index = [] {
    std::unordered_map<std::string_view, OpId> m;
    for (const auto& s : op_catalog()) m.emplace(s.name, s.id);
    return m;
  }();
  auto it = index.find(name);
  return it == index.end() ? nullptr : &op_catalog()[it->second];
}

const OpSchema& op_schema(std::string_view name) {
  if (const OpSchema* s = find_op(name)) return *s;
  throw SemanticError(ErrorKind::UnsupportedOp, "no op \"" + std::string(name) + "\" in the op catalog");
}

OpId op_id(std::string_view name) { return op_schema(name).id; }

std::vector<int> rows_by_op_id(const std::vector<const char*>& names, const char* file, const char* what) {
  std::vector<int> rows(op_count(), -1);
  for (size_t i = 0; i < names.size(); ++i) {
    const OpSchema* s = find_op(names[i]);
    if (!s || !s->kernel)
      throw std::logic_error(std::string(file) + " has a " + what + " row for \"" + names[i] + "\", which " +
                             (s ? "the op catalog (core/ops.cpp) says has no kernel" : "is not in the op catalog"));
    if (rows[s->id] >= 0)
      throw std::logic_error(std::string(file) + " has two " + what + " rows for \"" + names[i] + "\"");
    rows[s->id] = static_cast<int>(i);
  }
  for (const OpSchema& s : op_catalog())
    if (s.kernel && rows[s.id] < 0)
      throw std::logic_error(std::string("op \"") + s.name + "\" of the op catalog has no " + what + " row in " + file);
  return rows;
}

const std::vector<std::string>& ops_of_class(GenClass c) {
  static const std::vector<std::vector<std::string>> by_class = [] {
    std::vector<std::vector<std::string>> out;
    for (const auto& s : op_catalog()) {
      const auto c = static_cast<size_t>(s.gen);
      if (out.size() <= c) out.resize(c + 1);
      out[c].push_back(s.name);
    }
    return out;
  }();
  static const std::vector<std::string> none;
  return static_cast<size_t>(c) < by_class.size() ? by_class[static_cast<size_t>(c)] : none;
}

nlohmann::json op_catalog_json() {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& s : op_catalog()) {
    nlohmann::json operands = nlohmann::json::array(), attrs = nlohmann::json::array(), scopes = nlohmann::json::array();
    for (const auto& o : s.operands)
      operands.push_back({{"name", o.name}, {"type", operand_type_name(o.type)}, {"optional", o.optional},
                          {"repeated", o.repeated}});
    for (const auto& a : s.attrs) {
      nlohmann::json j = {{"key", a.key}, {"type", attr_type_name(a.type)}, {"required", a.required}};
      j["default"] = a.default_value ? nlohmann::json(a.default_value) : nlohmann::json(nullptr);
      if (!a.choices.empty()) j["choices"] = a.choices;
      attrs.push_back(j);
    }
    if (s.scopes & kProgram) scopes.push_back("program");
    if (s.scopes & kBody) scopes.push_back("body");
    if (s.scopes & kReference) scopes.push_back("reference");
    if (s.scopes & kInternal) scopes.push_back("internal");
    ops.push_back({{"name", s.name},
                   {"id", s.id},
                   {"operands", operands},
                   {"attrs", attrs},
                   {"results", s.results == 0 ? nlohmann::json("outs") : nlohmann::json(s.results)},
                   {"family", *s.family ? nlohmann::json(s.family) : nlohmann::json(nullptr)},
                   {"exact_on_integers", s.exact},
                   {"kernel", s.kernel},
                   {"scopes", scopes},
                   {"generator_class", gen_class_name(s.gen)},
                   {"summary", s.summary}});
  }
  return {{"format", "meshsim.ops/1"}, {"ops", ops}};
}

std::string operands_signature(const OpSchema& s) {
  std::string out;
  for (const auto& o : s.operands) {
    out += (out.empty() ? "" : ", ") + std::string(o.name);
    if (o.optional) out += "?";
    if (o.repeated) out += "...";
    if (o.type != OperandType::Float) out += std::string(": ") + operand_type_name(o.type);
  }
  return out;
}

std::string attrs_signature(const OpSchema& s) {
  std::string out;
  for (const auto& a : s.attrs) {
    out += (out.empty() ? "" : ", ") + std::string(a.key) + (a.required ? "" : "?") + ": ";
    if (a.choices.empty()) {
      out += attr_type_name(a.type);
    } else {
      std::string c;
      for (const char* v : a.choices) c += (c.empty() ? "" : "|") + std::string(v);
      out += c;
    }
    if (a.default_value) out += std::string(" = ") + a.default_value;
  }
  return out;
}

std::string op_catalog_markdown() {
  // A table cell cannot hold a bare |.
  auto cell = [](std::string text) {
    for (size_t at = text.find('|'); at != std::string::npos; at = text.find('|', at + 2)) text.replace(at, 1, "\\|");
    return text;
  };
  std::string out = "| op | operands | attributes | rule family | where | what it computes |\n|---|---|---|---|---|---|\n";
  for (const auto& s : op_catalog()) {
    if (s.scopes == kInternal) continue;
    std::string where;
    if (s.scopes & kProgram) where += "program";
    if (s.scopes & kBody) where += std::string(where.empty() ? "" : ", ") + "body";
    if (s.scopes & kReference) where += std::string(where.empty() ? "" : ", ") + "reference";
    const std::string attrs = attrs_signature(s);
    out += "| `" + std::string(s.name) + "` | " + cell(operands_signature(s)) + " | " +
           (attrs.empty() ? "" : "`" + cell(attrs) + "`") + " | " + (*s.family ? s.family : "-") + " | " + where +
           " | " + cell(s.summary) + " |\n";
  }
  return out;
}

const char* attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::Int: return "int";
    case AttrType::Ints: return "int[]";
    case AttrType::IntOrInts: return "int|int[]";
    case AttrType::Number: return "number";
    case AttrType::NumberOrInf: return "number|\"inf\"|\"-inf\"";
    case AttrType::Bool: return "bool";
    case AttrType::Spec: return "placements";
    case AttrType::Axis: return "axis";
    case AttrType::String: return "string";
    case AttrType::Any: return "any";
  }
  return "?";
}

const char* operand_type_name(OperandType t) {
  switch (t) {
    case OperandType::Float: return "float";
    case OperandType::Int64: return "int64";
    case OperandType::Bool: return "bool";
    case OperandType::Any: return "any";
    case OperandType::Number: return "number";
  }
  return "?";
}

const char* gen_class_name(GenClass c) {
  switch (c) {
    case GenClass::None: return "none";
    case GenClass::Unary: return "unary";
    case GenClass::UnaryLayer: return "unary_layer";
    case GenClass::Binary: return "binary";
    case GenClass::Reduction: return "reduction";
    case GenClass::Extremum: return "extremum";
    case GenClass::Triangle: return "triangle";
    case GenClass::Norm: return "norm";
    case GenClass::Loss: return "loss";
    case GenClass::Creation: return "creation";
    case GenClass::Split: return "split";
    case GenClass::Compare: return "compare";
    case GenClass::Select: return "select";
    case GenClass::SelectIndex: return "select_index";
    case GenClass::Reshape: return "reshape";
    case GenClass::VectorNorm: return "vector_norm";
    case GenClass::RandomCreation: return "random_creation";
  }
  return "?";
}

}  // namespace meshsim

// The definitions' table for kernels_match_definitions: one row per op of the catalog with a kernel
// (core/ops.h), by name, with how its operands and attributes are drawn and its definition (built
// from kernels.cpp's and kernels_nn.cpp's builders), indexed by the op's id. A new op with a kernel
// needs a row here, or the table's check at its first use fails (tests/test_catalog.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "properties/kernel_nd.h"
#include "properties/kernels.h"
#include "properties/operand_draws.h"
#include "sim/local_ops.h"

namespace meshsim::kernel_nd {

namespace {

// ---- the drawing of each op's case (the rows name them) ----

// add, sub, mul, div: the scalar form now and then, else operands broadcasting against a shape
// (one of them of that shape); divisors kept away from zero.
void draw_binary(const std::string& op, Case& c) {
  OpAttrs& a = c.attrs;
  const Dims out = draw_shape(draw_in(0, 3));
  if (draw_in(0, 3) == 0) {  // the scalar form: operand 1 is the constant `value`
    a.scalar = true;
    a.value = op == "div" ? *rc::gen::element(-2.0, -0.5, 1.5, 3.0) : *rc::gen::element(-2.0, -0.5, 0.0, 1.5, 3.0);
    add_operand(c, out);
  } else {
    Dims s0 = broadcast_operand(out, true), s1 = broadcast_operand(out, true);
    if (coin()) s0 = out;
    else s1 = out;
    add_operand(c, s0);
    c.xs.push_back(draw_values(s1, op == "div"));
  }
}

// neg, scale, exp, relu, sin, tanh: one operand; scale's factor.
void draw_pointwise(const std::string&, Case& c) {
  c.attrs.value = *rc::gen::element(-2.0, -0.5, 0.0, 1.5, 3.0);
  add_operand(c, draw_shape(draw_in(0, 3)));
}

// detach: an operand of any shape; item: one of one element (0-d, or every extent 1).
void draw_detached(const std::string& op, Case& c) {
  const int64_t rank = draw_in(0, 3);
  add_operand(c, op == "item" ? Dims(static_cast<size_t>(rank), 1) : draw_shape(rank));
}

// to: a dtype, and an operand of up to 13 significant bits (k + 1/2) / 512, so that bfloat16 (8
// bits) and float16 (11) round it, ties to even included, where float32 and float64 hold it.
void draw_cast(const std::string&, Case& c) {
  c.attrs.dtype = std::vector<DType>{DType::Float64, DType::Float32, DType::BFloat16, DType::Float16}[static_cast<size_t>(
      draw_in(0, 3))];
  Nd x = zeros(draw_shape(draw_in(0, 3)));
  for (auto& e : x.v) e = (static_cast<double>(draw_in(-2048, 2047)) + 0.5) / 512.0;
  c.xs = {x};
}

// x rounded to the nearest number of `bits` significant bits, ties to the even one (a dtype's
// rounding where its exponent range holds x).
double round_to_bits(double x, int bits) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  const double m = std::frexp(x, &e);  // x = m * 2^e, 0.5 <= |m| < 1
  return std::ldexp(std::nearbyint(std::ldexp(m, bits)), e - bits);
}

// The transformer layers' pointwise ops: gelu's approximation; pow's exponent (small integer and
// fractional ones); a positive operand for those the catalog says need one (log, sqrt, rsqrt, pow).
void draw_nonlinear(const std::string& op, Case& c) {
  OpAttrs& a = c.attrs;
  a.tanh = op == "gelu" && coin();
  if (op == "pow") a.exponent = std::vector<double>{-1.0, -0.5, 0.5, 1.5, 2.0, 3.0}[static_cast<size_t>(draw_in(0, 5))];
  c.xs = {draw_values(draw_shape(draw_in(0, 3)), op_schema(op).values.needs_positive)};
}

void draw_mm(const std::string&, Case& c) {
  const int64_t k = draw_in(1, 4);
  add_operand(c, {draw_in(1, 4), k});
  add_operand(c, {k, draw_in(1, 4)});
}

void draw_bmm(const std::string&, Case& c) {
  const int64_t b = draw_in(1, 4), k = draw_in(1, 4);
  add_operand(c, {b, draw_in(1, 4), k});
  add_operand(c, {b, k, draw_in(1, 4)});
}

// matmul: operands of 1-3 dims, batch dims broadcasting now and then.
void draw_matmul(const std::string&, Case& c) {
  const int64_t ra = draw_in(1, 3), rb = draw_in(1, 3), k = draw_in(1, 4), batch = draw_in(1, 4);
  Dims sa, sb;
  if (ra == 3) sa.push_back(rb == 3 && coin() ? 1 : batch);
  if (ra >= 2) sa.push_back(draw_in(1, 4));
  sa.push_back(k);
  if (rb == 3) sb.push_back(ra == 3 && sa[0] != 1 && coin() ? 1 : batch);
  sb.push_back(k);
  if (rb >= 2) sb.push_back(draw_in(1, 4));
  add_operand(c, sa);
  add_operand(c, sb);
}

// linear: x of 1-3 dims [..., k], weight [n, k], a bias [n] half of the time.
void draw_linear(const std::string&, Case& c) {
  const int64_t k = draw_in(1, 4), n = draw_in(1, 4);
  Dims x = draw_shape(draw_in(0, 2));
  x.push_back(k);
  add_operand(c, x);
  add_operand(c, {n, k});
  if (coin()) add_operand(c, {n});
}

void draw_transpose(const std::string&, Case& c) {
  const int64_t r = draw_in(1, 3);
  c.attrs.dim0 = as_given(draw_in(0, r - 1), r);
  c.attrs.dim1 = as_given(draw_in(0, r - 1), r);
  add_operand(c, draw_shape(r));
}

void draw_permute(const std::string&, Case& c) {
  const int64_t r = draw_in(0, 3);
  for (int64_t d : permutation_of(r)) c.attrs.dims.push_back(as_given(d, r));
  add_operand(c, draw_shape(r));
}

// view, reshape: a shape of as many elements, one extent -1 now and then.
void draw_reshape(const std::string&, Case& c) {
  const Dims s = draw_shape(draw_in(0, 3));
  const int64_t n = count_of(s);
  c.attrs.shape = factorization(n, n == 1 ? draw_in(0, 3) : draw_in(1, 3));
  add_operand(c, s);
}

void draw_flatten(const std::string&, Case& c) {
  OpAttrs& a = c.attrs;
  const int64_t r = draw_in(0, 3);
  if (r == 0) {
    a.start_dim = *rc::gen::element<int64_t>(0, -1);
    a.end_dim = *rc::gen::element<int64_t>(0, -1);
  } else {
    const int64_t s = draw_in(0, r - 1), e = draw_in(s, r - 1);
    a.start_dim = as_given(s, r);
    a.end_dim = as_given(e, r);
  }
  add_operand(c, draw_shape(r));
}

void draw_unflatten(const std::string&, Case& c) {
  const int64_t r = draw_in(1, 3), d = draw_in(0, r - 1);
  const Dims s = draw_shape(r);
  c.attrs.dim = as_given(d, r);
  c.attrs.sizes = factorization(s[static_cast<size_t>(d)], draw_in(1, 3));
  add_operand(c, s);
}

void draw_squeeze(const std::string&, Case& c) {
  const int64_t r = draw_in(0, 3);
  if (r > 0 && coin()) c.attrs.dim = as_given(draw_in(0, r - 1), r);
  add_operand(c, draw_shape(r, true));
}

void draw_unsqueeze(const std::string&, Case& c) {
  const int64_t r = draw_in(0, 3);
  c.attrs.dim = as_given(draw_in(0, r), r + 1);
  add_operand(c, draw_shape(r));
}

// expand: leading dims added, size-1 dims grown, extents kept as -1 now and then.
void draw_expand(const std::string&, Case& c) {
  const Dims s = draw_shape(draw_in(0, 3), true);
  Dims& target = c.attrs.shape;
  for (int64_t lead = draw_in(0, 4 - static_cast<int64_t>(s.size())); lead > 0; --lead) target.push_back(draw_in(1, 4));
  for (int64_t e : s) target.push_back(draw_in(0, 3) == 0 ? -1 : e == 1 ? draw_in(1, 4) : e);
  add_operand(c, s);
}

// cat, stack: 2-3 operands, of one shape but (cat) along the dim.
void draw_join(const std::string& op, Case& c) {
  const bool stack = op == "stack";
  const int64_t r = draw_in(stack ? 0 : 1, 3), n = draw_in(2, 3);
  const int64_t d = draw_in(0, stack ? r : r - 1);
  c.attrs.dim = as_given(d, stack ? r + 1 : r);
  const Dims s = draw_shape(r);
  for (int64_t i = 0; i < n; ++i) {
    Dims si = s;
    if (!stack) si[static_cast<size_t>(d)] = draw_in(1, 4);
    add_operand(c, si);
  }
}

void draw_narrow(const std::string&, Case& c) {
  OpAttrs& a = c.attrs;
  const int64_t r = draw_in(1, 3), d = draw_in(0, r - 1);
  const Dims s = draw_shape(r);
  const int64_t n = s[static_cast<size_t>(d)];
  a.dim = as_given(d, r);
  a.length = draw_in(0, n);
  const int64_t start = draw_in(0, n - a.length);
  a.start = coin() ? start - n : start;
  add_operand(c, s);
}

// sum, mean, amax, amin: the reduced dims, and for mean on a rank the global count (its own or
// another); amax and amin on values with ties half of the time.
void draw_reduction(const std::string& op, Case& c) {
  OpAttrs& a = c.attrs;
  const Dims s = draw_shape(draw_in(0, 3));
  draw_reduced_dims(a, static_cast<int64_t>(s.size()));
  const int64_t divisor = draw_in(0, 3);  // mean on a rank: by the global count of the reduced elements
  if (divisor == 1) a = with_global_shape(op, a, s);
  if (divisor == 2) a.mean_divisor = draw_in(1, 9);
  if (op == "amax" || op == "amin") c.xs.push_back(draw_extremum_values(s));
  else add_operand(c, s);
}

// linalg_vector_norm: the reduced dims as for sum, an ord of 0, 1, 2, 3, 1.5, inf or -inf, on values
// with ties half of the time (the inf norms' gradient split among them).
void draw_vector_norm(const std::string&, Case& c) {
  OpAttrs& a = c.attrs;
  const Dims s = draw_shape(draw_in(0, 3));
  draw_reduced_dims(a, static_cast<int64_t>(s.size()));
  a.ord = std::vector<double>{0.0, 1.0, 2.0, 3.0, 1.5, INFINITY, -INFINITY}[static_cast<size_t>(draw_in(0, 6))];
  if (std::isinf(a.ord)) c.xs.push_back(draw_extremum_values(s));
  else add_operand(c, s);
}

// softmax, log_softmax: along one dim.
void draw_along_dim(const std::string&, Case& c) {
  const int64_t r = draw_in(1, 3);
  c.attrs.dim = as_given(draw_in(0, r - 1), r);
  add_operand(c, draw_shape(r));
}

// where, masked_fill: a shape and operands broadcasting against it.
void draw_where(const std::string& op, Case& c) {
  const Dims out = draw_shape(draw_in(0, 3));
  if (op == "masked_fill") {
    c.attrs.fill = std::vector<double>{-2.0, 0.0, 3.5, INFINITY, -INFINITY}[static_cast<size_t>(draw_in(0, 4))];
    c.xs = {draw_values(out, false), draw_mask(coin() ? out : broadcast_operand(out, false))};
    c.types = {"float", "bool"};
    return;
  }
  const size_t whole = static_cast<size_t>(draw_in(0, 2));  // one operand has the result's shape
  std::vector<Dims> shapes = {broadcast_operand(out, false), broadcast_operand(out, false),
                              broadcast_operand(out, false)};
  shapes[whole] = out;
  c.xs = {draw_mask(shapes[0]), draw_values(shapes[1], false), draw_values(shapes[2], false)};
  c.types = {"bool", "float", "float"};
}

// max, min, sort, topk, argmax, argmin, argsort: along one dim of 1-3, its attributes (k from 0
// to the extent), on values with ties half of the time.
void draw_selection(const std::string& op, Case& c) {
  OpAttrs& a = c.attrs;
  const int64_t r = draw_in(1, 3), d = draw_in(0, r - 1);
  const Dims s = draw_shape(r);
  a.dim = as_given(d, r);
  a.keepdim = coin();
  a.largest = coin();
  a.descending = coin();
  if (op == "topk") a.k = draw_in(0, s[static_cast<size_t>(d)]);
  c.xs.push_back(draw_extremum_values(s));
}

// The one operand as int64 data: small whole values in [-4, 4].
void draw_small_ints(const Dims& s, Case& c) {
  Nd x = zeros(s);
  for (auto& e : x.v) e = static_cast<double>(draw_in(-4, 4));
  c.xs = {x};
  c.types = {"int64"};
}

// cumsum along one dim of 1-3 (float data, or int64 now and then).
void draw_scan(const std::string&, Case& c) {
  const int64_t r = draw_in(1, 3), d = draw_in(0, r - 1);
  c.attrs.dim = as_given(d, r);
  const Dims s = draw_shape(r);
  if (coin()) {
    c.xs = {draw_values(s, false)};
    return;
  }
  draw_small_ints(s, c);
}

// clamp: halves of float data (or small int64 values now and then) against bounds among those
// values, so that an element sits on a bound often (its gradient passes there); min, max or both,
// min above max now and then.
void draw_clamp(const std::string&, Case& c) {
  const bool ints = coin();
  const Dims s = draw_shape(draw_in(0, 3));
  auto bound = [&] { return ints ? static_cast<double>(draw_in(-2, 2)) : (static_cast<double>(draw_in(-3, 2)) + 0.5) / 2.0; };
  const int64_t which = draw_in(0, 2);  // 0: min, 1: max, 2: both
  if (which != 1) c.attrs.clamp_min = bound();
  if (which != 0) c.attrs.clamp_max = bound();
  if (!ints) {
    c.xs = {draw_values(s, false)};
    return;
  }
  draw_small_ints(s, c);
}

// one_hot of 0-3 dims of values in [0, num_classes), num_classes 1-4; bincount of 0-6 values in
// [0, minlength), minlength 1-5 (repeats often).
void draw_counts(const std::string& op, Case& c) {
  const int64_t high = draw_in(1, op == "one_hot" ? 4 : 5);
  if (op == "one_hot") c.attrs.num_classes = high;
  else c.attrs.minlength = high;
  c.xs = {draw_ids(op == "one_hot" ? draw_shape(draw_in(0, 3)) : Dims{draw_in(0, 6)}, high)};
  c.types = {"int64"};
}

// Comparisons of small integers (equal often), against the scalar `value` now and then or an
// operand broadcasting; logic of bools.
void draw_comparison(const std::string& op, Case& c) {
  const Dims out = draw_shape(draw_in(0, 3));
  auto ints = [](const Dims& shape) {
    Nd x = zeros(shape);
    for (auto& e : x.v) e = static_cast<double>(draw_in(-2, 2));
    return x;
  };
  if (op == "logical_not") {
    c.xs = {draw_mask(out)};
    c.types = {"bool"};
    return;
  }
  const bool logic = op == "logical_and" || op == "logical_or";
  if (!logic && draw_in(0, 3) == 0) {
    c.attrs.scalar = true;
    c.attrs.value = *rc::gen::element(-1.0, 0.0, 0.5, 2.0);
    c.xs = {ints(out)};
    return;
  }
  Dims s0 = broadcast_operand(out, true), s1 = broadcast_operand(out, true);
  if (coin()) s0 = out;
  else s1 = out;
  c.xs = logic ? std::vector<Nd>{draw_mask(s0), draw_mask(s1)} : std::vector<Nd>{ints(s0), ints(s1)};
  if (logic) c.types = {"bool", "bool"};
}

// floor_divide, remainder: int64 data in [-6, 6] (negatives: the rounding towards -inf and the
// divisor's sign show), a divisor in [-3, 3] without 0, of the same shape, broadcast, or the whole
// scalar value now and then.
void draw_integer_binary(const std::string&, Case& c) {
  const Dims out = draw_shape(draw_in(0, 3));
  auto ints = [](const Dims& shape, bool divisor) {
    Nd x = zeros(shape);
    for (auto& e : x.v) {
      int64_t v = draw_in(divisor ? -3 : -6, divisor ? 2 : 6);
      if (divisor && v >= 0) ++v;  // [-3, -1] or [1, 3]
      e = static_cast<double>(v);
    }
    return x;
  };
  if (draw_in(0, 3) == 0) {
    c.attrs.scalar = true;
    c.attrs.value = *rc::gen::element(-3.0, -2.0, 2.0, 3.0);
    c.xs = {ints(out, false)};
    c.types = {"int64"};
    return;
  }
  const Dims s1 = coin() ? out : broadcast_operand(out, true);
  c.xs = {ints(out, false), ints(s1, true)};
  c.types = {"int64", "int64"};
}

// gather, index_select: x of 1-3 dims along one of them, positions in its extent (repeats
// often: their gradients add up); gather's index of x's rank, no larger on the other dims,
// index_select's 1-D of 0-4 positions.
void draw_indexing(const std::string& op, Case& c) {
  const int64_t r = draw_in(1, 3), d = draw_in(0, r - 1);
  const Dims s = draw_shape(r);
  c.attrs.dim = as_given(d, r);
  Dims index{draw_in(0, 4)};
  if (op == "gather") {
    index = s;
    for (int64_t i = 0; i < r; ++i) index[static_cast<size_t>(i)] = i == d ? draw_in(0, 4) : draw_in(1, s[static_cast<size_t>(i)]);
  }
  c.xs = {draw_values(s, false), draw_ids(index, s[static_cast<size_t>(d)])};
  c.types = {"float", "int64"};
}

// scatter, scatter_add: x of 1-3 dims along one of them, an index of x's rank no larger on the
// other dims with 0-4 positions on the dim (repeats often: scatter_add's add up, scatter's last
// write stays), src of the index's shape; index_add: a 1-D index of 0-4 positions, source x's
// shape with its length at the dim.
void draw_scatter(const std::string& op, Case& c) {
  const int64_t r = draw_in(1, 3), d = draw_in(0, r - 1);
  const auto u = static_cast<size_t>(d);
  const Dims s = draw_shape(r);
  c.attrs.dim = as_given(d, r);
  Dims index{draw_in(0, 4)}, src = s;
  if (op == "index_add") {
    src[u] = index[0];
  } else {
    index = s;
    for (int64_t i = 0; i < r; ++i) index[static_cast<size_t>(i)] = i == d ? draw_in(0, 4) : draw_in(1, s[static_cast<size_t>(i)]);
    src = index;
  }
  c.xs = {draw_values(s, false), draw_ids(index, s[u]), draw_values(src, false)};
  c.types = {"float", "int64", "float"};
}

void draw_triangle(const std::string&, Case& c) {
  c.attrs.diagonal = draw_in(-3, 3);
  add_operand(c, draw_shape(draw_in(2, 4)));
}

// layer_norm, rms_norm: the last 1-3 dims normalized, an eps now and then, 0-2 parameters.
void draw_norm(const std::string& op, Case& c) {
  OpAttrs& a = c.attrs;
  const int64_t r = draw_in(1, 3), k = draw_in(1, r);
  const Dims x = draw_shape(r);
  a.normalized_shape.assign(x.end() - k, x.end());
  if (op == "layer_norm" || coin()) a.eps = coin() ? std::optional<double>{} : std::optional<double>{0.25};
  add_operand(c, x);
  for (int64_t p = draw_in(0, op == "layer_norm" ? 2 : 1); p > 0; --p) add_operand(c, a.normalized_shape);
}

// embedding: ids of 0-2 dims into the whole table or a rank's vocab range of it.
void draw_embedding(const std::string&, Case& c) {
  const int64_t vocab = draw_in(1, 6), dim = draw_in(1, 3);
  int64_t rows = vocab;
  if (coin()) {
    c.attrs.range = draw_range(vocab);
    rows = c.attrs.range->size;
  }
  c.xs = {draw_ids(draw_shape(draw_in(0, 2)), vocab), draw_values({rows, dim}, false)};
  c.types = {"int64", "float"};
}

// The losses and their parts: scores [N, C] with targets in [0, C), an ignore_index now and then
// (one of the targets, never every one), a reduction; with a class range now and then (nll_loss
// and pick_target: the rank's classes, the scores then the rank's columns).
void draw_loss(const std::string& op, Case& c) {
  OpAttrs& a = c.attrs;
  const int64_t n = draw_in(1, 4), classes = draw_in(1, 5);
  Nd target = draw_ids({n}, classes);
  if (coin()) {
    const auto t = static_cast<int64_t>(draw_in(0, n - 1));
    a.ignore_index = static_cast<int64_t>(target.at(t));
    // Never every target: the last one is another class, or the index matches none.
    bool all = true;
    for (double v : target.v) all &= static_cast<int64_t>(v) == *a.ignore_index;
    if (all) a.ignore_index = op == "count_targets" || coin() ? -100 : classes;
  }
  a.sum_reduction = coin();
  int64_t columns = classes;
  if ((op == "pick_target" || op == "nll_loss") && coin()) {
    a.range = draw_range(classes);
    columns = a.range->size;
  }
  if (op == "count_targets") {
    a.float32 = coin();
    c.xs = {target};
    c.types = {"int64"};
    return;
  }
  c.xs = {draw_values({n, columns}, false), target};
  c.types = {"float", "int64"};
  if (op != "nll_loss" && op != "cross_entropy") return;
  // The losses' options: reduction none a third of the time; a class weight (positive: a mean over
  // weights that sum to 0 is NaN in torch too) and, for cross_entropy, label smoothing, half of it.
  if (!a.sum_reduction && draw_in(0, 2) == 0) a.no_reduction = true;
  if (op == "cross_entropy" && coin()) a.label_smoothing = static_cast<double>(draw_in(1, 9)) / 10.0;
  if (!a.range && coin()) {
    Nd w = draw_values({classes}, false);
    for (auto& v : w.v) v = std::abs(v) + 1.0;
    c.xs.push_back(w);
    c.types.push_back("weight");
  }
}

// dropout: p (none, a fraction, all), training three times in four, a stream and a seed, and half
// of the time the operand a block of a larger global tensor (a rank's local: its global indices
// per dim), so the kernel's indexing of the stream is compared with the definition's.
void draw_dropout(const std::string&, Case& c) {
  OpAttrs& a = c.attrs;
  a.p = std::vector<double>{0.0, 0.25, 0.5, 0.9, 1.0}[static_cast<size_t>(draw_in(0, 4))];
  a.training = draw_in(0, 3) != 0;
  a.draw.stream = "s" + std::to_string(draw_in(0, 9));
  a.draw.seed = static_cast<uint64_t>(draw_in(0, 5));
  const Dims shape = draw_shape(draw_in(0, 3));
  if (coin() && !shape.empty())
    for (int64_t e : shape) {
      const int64_t global = e + draw_in(0, 3), offset = draw_in(0, global - e);
      a.draw.global.push_back(global);
      a.draw.indices.emplace_back();
      for (int64_t i = 0; i < e; ++i) a.draw.indices.back().push_back(offset + i);
    }
  add_operand(c, shape);
}

// ---------------------------------------------------------------------------------------------
// The rows: one per op with a kernel, by name, in the catalog's (alphabetical) order. Each draws
// the op's case and builds its definition from the drawn attributes and operand 0's rank.

using Attrs = const OpAttrs&;
using Draw = void (*)(const std::string& op, Case& c);
using Define = Definition (*)(Attrs a, int64_t rank);
struct Row {
  const char* op;
  Draw draw;
  Define define;
};

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// view, reshape: the operand's elements in the shape `a.shape` (its -1 filled in).
Definition reshape_to(Attrs a) { return view([a](const Dims& in) { return filled(a.shape, count_of(in)); }); }

const Row kRows[] = {
    {"abs", draw_nonlinear,
     [](Attrs, int64_t) {
       return unary([](double x) { return std::abs(x); }, [](double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; });
     }},
    {"add", draw_binary,
     [](Attrs a, int64_t) {
       return elementwise(a.value, [](double x, double y) { return x + y; },
                          [](double, double, size_t) { return 1.0; });
     }},
    {"amax", draw_reduction, [](Attrs a, int64_t) { return extremum(a, true); }},
    {"amin", draw_reduction, [](Attrs a, int64_t) { return extremum(a, false); }},
    {"argmax", draw_selection, [](Attrs a, int64_t rank) { return selection("argmax", a, wrap(*a.dim, rank)); }},
    {"argmin", draw_selection, [](Attrs a, int64_t rank) { return selection("argmin", a, wrap(*a.dim, rank)); }},
    {"argsort", draw_selection, [](Attrs a, int64_t rank) { return selection("argsort", a, wrap(*a.dim, rank)); }},
    {"bincount", draw_counts, [](Attrs a, int64_t) { return counted(false, a.minlength); }},
    {"bmm", draw_bmm, [](Attrs, int64_t) { return matmul(); }},
    {"cat", draw_join, [](Attrs a, int64_t rank) { return join(wrap(*a.dim, rank), false); }},
    {"cos", draw_pointwise,
     [](Attrs, int64_t) { return unary([](double x) { return std::cos(x); }, [](double x) { return -std::sin(x); }); }},
    {"clamp", draw_clamp,
     [](Attrs a, int64_t) {
       const double lo = a.clamp_min.value_or(-INFINITY), hi = a.clamp_max.value_or(INFINITY);
       return unary([lo, hi](double x) { return std::min(std::max(x, lo), hi); },
                    [lo, hi](double x) { return lo <= x && x <= hi ? 1.0 : 0.0; });
     }},
    {"count_targets", draw_loss, [](Attrs a, int64_t) { return count_targets(a.ignore_index); }},
    {"cross_entropy", draw_loss, [](Attrs a, int64_t) { return loss(a, true); }},
    {"cumsum", draw_scan, [](Attrs a, int64_t rank) { return scan(wrap(*a.dim, rank)); }},
    // detach and item: the data as they are (item: as a 0-d value); no gradient (the kernel's result
    // requires none).
    {"detach", draw_detached, [](Attrs, int64_t) { return view([](const Dims& s) { return s; }); }},
    {"div", draw_binary,
     [](Attrs a, int64_t) {
       return elementwise(a.value, [](double x, double y) { return x / y; },
                          [](double x, double y, size_t i) { return i == 0 ? 1.0 / y : -x / (y * y); });
     }},
    {"dropout", draw_dropout, [](Attrs a, int64_t) { return dropout(a); }},
    {"embedding", draw_embedding, [](Attrs a, int64_t) { return embedding(a.range); }},
    {"eq", draw_comparison, [](Attrs a, int64_t) { return comparison("eq", a.value); }},
    {"exp", draw_pointwise,
     [](Attrs, int64_t) { return unary([](double x) { return std::exp(x); }, [](double x) { return std::exp(x); }); }},
    {"expand", draw_expand, [](Attrs a, int64_t) { return expand(a.shape); }},
    {"flatten", draw_flatten,
     [](Attrs a, int64_t rank) {
       return view([a, rank](const Dims& in) {
         if (rank == 0) return Dims{1};
         const int64_t s = wrap(a.start_dim, rank), e = wrap(a.end_dim, rank);
         Dims out(in.begin(), in.begin() + s);
         int64_t merged = 1;
         for (int64_t d = s; d <= e; ++d) merged *= in[static_cast<size_t>(d)];
         out.push_back(merged);
         out.insert(out.end(), in.begin() + e + 1, in.end());
         return out;
       });
     }},
    {"floor_divide", draw_integer_binary, [](Attrs a, int64_t) { return integer_binary("floor_divide", a.value); }},
    {"gather", draw_indexing, [](Attrs a, int64_t rank) { return indexed("gather", wrap(*a.dim, rank)); }},
    {"ge", draw_comparison, [](Attrs a, int64_t) { return comparison("ge", a.value); }},
    {"gelu", draw_nonlinear, [](Attrs a, int64_t) { return gelu(a.tanh); }},
    {"gt", draw_comparison, [](Attrs a, int64_t) { return comparison("gt", a.value); }},
    {"index_add", draw_scatter, [](Attrs a, int64_t rank) { return scattered("index_add", wrap(*a.dim, rank)); }},
    {"index_select", draw_indexing, [](Attrs a, int64_t rank) { return indexed("index_select", wrap(*a.dim, rank)); }},
    {"item", draw_detached, [](Attrs, int64_t) { return view([](const Dims&) { return Dims{}; }); }},
    {"layer_norm", draw_norm,
     [](Attrs a, int64_t) { return norm(true, a.normalized_shape.size(), a.eps.value_or(1e-5)); }},
    {"le", draw_comparison, [](Attrs a, int64_t) { return comparison("le", a.value); }},
    {"linalg_vector_norm", draw_vector_norm, [](Attrs a, int64_t) { return vector_norm(a); }},
    {"linear", draw_linear, [](Attrs, int64_t) { return linear(); }},
    {"log", draw_nonlinear,
     [](Attrs, int64_t) { return unary([](double x) { return std::log(x); }, [](double x) { return 1.0 / x; }); }},
    {"log_softmax", draw_along_dim, [](Attrs a, int64_t rank) { return log_softmax(wrap(*a.dim, rank)); }},
    {"logical_and", draw_comparison, [](Attrs a, int64_t) { return comparison("logical_and", a.value); }},
    {"logical_not", draw_comparison, [](Attrs a, int64_t) { return comparison("logical_not", a.value); }},
    {"logical_or", draw_comparison, [](Attrs a, int64_t) { return comparison("logical_or", a.value); }},
    {"lt", draw_comparison, [](Attrs a, int64_t) { return comparison("lt", a.value); }},
    {"masked_fill", draw_where, [](Attrs a, int64_t) { return masked_fill(a.fill); }},
    {"matmul", draw_matmul, [](Attrs, int64_t) { return matmul(); }},
    {"max", draw_selection, [](Attrs a, int64_t rank) { return selection("max", a, wrap(*a.dim, rank)); }},
    {"mean", draw_reduction, [](Attrs a, int64_t) { return sum_or_mean(a, true); }},
    {"min", draw_selection, [](Attrs a, int64_t rank) { return selection("min", a, wrap(*a.dim, rank)); }},
    {"mm", draw_mm, [](Attrs, int64_t) { return matmul(); }},
    {"mul", draw_binary,
     [](Attrs a, int64_t) {
       return elementwise(a.value, [](double x, double y) { return x * y; },
                          [](double x, double y, size_t i) { return i == 0 ? y : x; });
     }},
    {"narrow", draw_narrow, [](Attrs a, int64_t rank) { return narrow(wrap(*a.dim, rank), a.start, a.length); }},
    {"ne", draw_comparison, [](Attrs a, int64_t) { return comparison("ne", a.value); }},
    {"neg", draw_pointwise,
     [](Attrs, int64_t) { return unary([](double x) { return -x; }, [](double) { return -1.0; }); }},
    {"nll_loss", draw_loss, [](Attrs a, int64_t) { return loss(a, false); }},
    {"one_hot", draw_counts, [](Attrs a, int64_t) { return counted(true, a.num_classes); }},
    {"permute", draw_permute,
     [](Attrs a, int64_t rank) {
       Dims perm;
       for (int64_t d : a.dims) perm.push_back(wrap(d, rank));
       return permutation(perm);
     }},
    {"pick_target", draw_loss, [](Attrs a, int64_t) { return pick_target(a); }},
    {"pow", draw_nonlinear,
     [](Attrs a, int64_t) {
       const double e = a.exponent;
       return unary([e](double x) { return std::pow(x, e); }, [e](double x) { return e * std::pow(x, e - 1.0); });
     }},
    {"relu", draw_pointwise,
     [](Attrs, int64_t) {
       return unary([](double x) { return x > 0 ? x : 0.0; }, [](double x) { return x > 0 ? 1.0 : 0.0; });
     }},
    {"remainder", draw_integer_binary, [](Attrs a, int64_t) { return integer_binary("remainder", a.value); }},
    {"repeat", draw_repeat, [](Attrs a, int64_t) { return repeat_def(a.sizes); }},
    {"repeat_interleave", draw_repeat_interleave,
     [](Attrs a, int64_t rank) { return repeat_interleave_def(wrap(*a.dim, rank), a.repeats); }},
    {"reshape", draw_reshape, [](Attrs a, int64_t) { return reshape_to(a); }},
    {"rms_norm", draw_norm,
     [](Attrs a, int64_t) {
       return norm(false, a.normalized_shape.size(), a.eps.value_or(std::numeric_limits<double>::epsilon()));
     }},
    {"rsqrt", draw_nonlinear,
     [](Attrs, int64_t) {
       return unary([](double x) { return 1.0 / std::sqrt(x); }, [](double x) { return -0.5 / (x * std::sqrt(x)); });
     }},
    {"scale", draw_pointwise,
     [](Attrs a, int64_t) {
       const double c = a.value;
       return unary([c](double x) { return c * x; }, [c](double) { return c; });
     }},
    {"scaled_dot_product_attention", draw_attention, [](Attrs a, int64_t) { return attention_def(a); }},
    {"scatter", draw_scatter, [](Attrs a, int64_t rank) { return scattered("scatter", wrap(*a.dim, rank)); }},
    {"scatter_add", draw_scatter, [](Attrs a, int64_t rank) { return scattered("scatter_add", wrap(*a.dim, rank)); }},
    {"sigmoid", draw_nonlinear,
     [](Attrs, int64_t) { return unary(sigmoid, [](double x) { return sigmoid(x) * (1.0 - sigmoid(x)); }); }},
    {"silu", draw_nonlinear,
     [](Attrs, int64_t) {
       return unary([](double x) { return x * sigmoid(x); },
                    [](double x) { return sigmoid(x) * (1.0 + x * (1.0 - sigmoid(x))); });
     }},
    {"sin", draw_pointwise,
     [](Attrs, int64_t) { return unary([](double x) { return std::sin(x); }, [](double x) { return std::cos(x); }); }},
    {"softmax", draw_along_dim, [](Attrs a, int64_t rank) { return softmax(wrap(*a.dim, rank)); }},
    {"sort", draw_selection, [](Attrs a, int64_t rank) { return selection("sort", a, wrap(*a.dim, rank)); }},
    {"sqrt", draw_nonlinear,
     [](Attrs, int64_t) {
       return unary([](double x) { return std::sqrt(x); }, [](double x) { return 0.5 / std::sqrt(x); });
     }},
    {"squeeze", draw_squeeze,
     [](Attrs a, int64_t rank) {
       return view([a, rank](const Dims& in) {
         Dims out;
         for (int64_t d = 0; d < rank; ++d)
           if (in[static_cast<size_t>(d)] != 1 || (a.dim && wrap(*a.dim, rank) != d))
             out.push_back(in[static_cast<size_t>(d)]);
         return out;
       });
     }},
    {"stack", draw_join, [](Attrs a, int64_t rank) { return join(wrap(*a.dim, rank + 1), true); }},
    {"sub", draw_binary,
     [](Attrs a, int64_t) {
       return elementwise(a.value, [](double x, double y) { return x - y; },
                          [](double, double, size_t i) { return i == 0 ? 1.0 : -1.0; });
     }},
    {"sum", draw_reduction, [](Attrs a, int64_t) { return sum_or_mean(a, false); }},
    {"tanh", draw_pointwise,
     [](Attrs, int64_t) {
       return unary([](double x) { return std::tanh(x); }, [](double x) { return 1.0 - std::tanh(x) * std::tanh(x); });
     }},
    {"to", draw_cast,
     [](Attrs a, int64_t) {
       const DType d = a.dtype.value_or(DType::Float64);
       const int bits = d == DType::Float64 ? 53 : d == DType::Float32 ? 24 : d == DType::BFloat16 ? 8 : 11;
       return unary([bits](double x) { return round_to_bits(x, bits); }, [](double) { return 1.0; });
     }},
    {"topk", draw_selection, [](Attrs a, int64_t rank) { return selection("topk", a, wrap(*a.dim, rank)); }},
    {"transpose", draw_transpose,
     [](Attrs a, int64_t rank) {
       Dims perm;
       for (int64_t d = 0; d < rank; ++d) perm.push_back(d);
       std::swap(perm[static_cast<size_t>(wrap(a.dim0, rank))], perm[static_cast<size_t>(wrap(a.dim1, rank))]);
       return permutation(perm);
     }},
    {"tril", draw_triangle, [](Attrs a, int64_t) { return triangle(true, a.diagonal); }},
    {"triu", draw_triangle, [](Attrs a, int64_t) { return triangle(false, a.diagonal); }},
    {"unflatten", draw_unflatten,
     [](Attrs a, int64_t rank) {
       return view([a, rank](const Dims& in) {
         const int64_t d = wrap(*a.dim, rank);
         const Dims sizes = filled(a.sizes, in[static_cast<size_t>(d)]);
         Dims out(in.begin(), in.begin() + d);
         out.insert(out.end(), sizes.begin(), sizes.end());
         out.insert(out.end(), in.begin() + d + 1, in.end());
         return out;
       });
     }},
    {"unsqueeze", draw_unsqueeze,
     [](Attrs a, int64_t rank) {
       return view([a, rank](const Dims& in) {
         Dims out = in;
         out.insert(out.begin() + wrap(*a.dim, rank + 1), 1);
         return out;
       });
     }},
    {"view", draw_reshape, [](Attrs a, int64_t) { return reshape_to(a); }},
    {"where", draw_where, [](Attrs, int64_t) { return where_def(); }},
};

// The rows by OpId (null: none), checked against the catalog at first use: std::logic_error naming
// the op where a row is missing or names an op without a kernel, at every use.
const std::vector<const Row*>& table() {
  static const std::vector<const Row*> rows = rows_by_op_id(kRows, "properties/definitions.cpp", "definition");
  return rows;
}

const Row& row_of(OpId op) {
  const auto& t = table();
  if (op >= t.size() || !t[op])
    throw std::invalid_argument("no definition for op \"" + (op < t.size() ? std::string(op_schema(op).name)
                                                                            : std::to_string(op)) + "\"");
  return *t[op];
}

}  // namespace

Definition definition(OpId op, const OpAttrs& a, int64_t rank) { return row_of(op).define(a, rank); }

Case draw_case(OpId op) {
  Case c;
  row_of(op).draw(op_schema(op).name, c);
  return c;
}

}  // namespace meshsim::kernel_nd

namespace meshsim {

bool has_definition(OpId op) { return op < kernel_nd::table().size() && kernel_nd::table()[op]; }

}  // namespace meshsim

// The kernels property's own N-D arrays and op definitions: dense row-major arrays of doubles, the
// definitions written out element by element on them (the builders: kernels.cpp for the linear
// algebra and the moves of data, kernels_nn.cpp for the transformer layers' ops), and the table
// that gives each op of the catalog its definition and the drawing of its operands and attributes
// (definitions.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <rapidcheck.h>

#include "core/ops.h"
#include "core/propagation.h"

namespace meshsim::kernel_nd {

using Dims = std::vector<int64_t>;

inline int64_t count_of(const Dims& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

// A dense row-major N-D array of doubles (rank 0: one element): the definitions' own data type.
struct Nd {
  Dims shape;
  std::vector<double> v;
  double& at(int64_t flat) { return v[static_cast<size_t>(flat)]; }
  double at(int64_t flat) const { return v[static_cast<size_t>(flat)]; }
};

inline Nd zeros(const Dims& shape) { return {shape, std::vector<double>(static_cast<size_t>(count_of(shape)), 0.0)}; }

// Row-major index helpers: flat index <-> multi-index.
inline Dims multi_index(int64_t flat, const Dims& shape) {
  Dims idx(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

inline int64_t flat_index(const Dims& idx, const Dims& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

// The flat index in an operand of shape `in` read at index `out_idx` of a broadcast result:
// trailing dims aligned, a size-1 dim of the operand read at 0.
inline int64_t broadcast_read(const Dims& out_idx, const Dims& in) {
  const size_t lead = out_idx.size() - in.size();
  int64_t flat = 0;
  for (size_t d = 0; d < in.size(); ++d) flat = flat * in[d] + (in[d] == 1 ? 0 : out_idx[lead + d]);
  return flat;
}

// The broadcast shape of two shapes (trailing alignment); the drawn shapes always broadcast.
inline Dims broadcast(const Dims& a, const Dims& b) {
  Dims out(std::max(a.size(), b.size()), 1);
  for (const Dims* s : {&a, &b})
    for (size_t d = 0; d < s->size(); ++d) {
      int64_t& o = out[out.size() - s->size() + d];
      if ((*s)[d] != 1) o = (*s)[d];
    }
  return out;
}

// `d` in [-rank, rank) as a dim in [0, rank).
inline int64_t wrap(int64_t d, int64_t rank) { return d < 0 ? d + rank : d; }

inline std::string dims_str(const Dims& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

inline Nd of(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kDouble).contiguous();
  return {c.sizes().vec(), std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel())};
}

inline at::Tensor tensor_of(const Nd& a) { return at::tensor(a.v, at::kDouble).reshape(a.shape); }

// The largest difference between a kernel's result and the definition's, relative to the
// definition's magnitude (libm and libtorch's vectorized math may differ in the last bits). NaN
// when either side has one (then it fails the tolerance).
inline double relative_error(const Nd& got, const Nd& want) {
  double err = 0, scale = 1;
  for (size_t k = 0; k < want.v.size(); ++k) {
    const double d = got.v[k] == want.v[k] ? 0.0 : std::abs(got.v[k] - want.v[k]);  // equal infinities agree
    if (!(d <= err)) err = d;
    if (std::isfinite(want.v[k])) scale = std::max(scale, std::abs(want.v[k]));
  }
  return err / scale;
}

// The position of the largest difference, as a multi-index, with both values.
inline std::string where(const Nd& got, const Nd& want) {
  size_t worst = 0;
  double most = -1;
  for (size_t k = 0; k < want.v.size(); ++k) {
    const double d = got.v[k] == want.v[k] ? 0.0 : std::abs(got.v[k] - want.v[k]);
    if (!(d <= most)) {
      most = d;
      worst = k;
    }
  }
  if (want.v.empty()) return "(no elements)";
  return "at " + dims_str(multi_index(static_cast<int64_t>(worst), want.shape)) + ": expected " +
         std::to_string(want.v[worst]) + ", got " + std::to_string(got.v[worst]);
}

// An op's definition: its value and the gradient of sum(g * op(xs)) with respect to operand i.
using Xs = const std::vector<Nd>&;
struct Definition {
  std::function<Nd(Xs)> value;
  std::function<Nd(Xs, const Nd& g, size_t i)> vjp;
};

// Elementwise ops (with broadcasting) from the scalar function and its partial derivatives. With
// one operand the second argument is the constant `c` (the scalar form of a binary op; ignored
// by unary ops). The gradient of an operand sums g * df over every result element that reads it.
inline Definition elementwise(double c, std::function<double(double, double)> f,
                       std::function<double(double, double, size_t)> df) {
  auto shape_of = [](Xs xs) { return xs.size() > 1 ? broadcast(xs[0].shape, xs[1].shape) : xs[0].shape; };
  auto args = [c](Xs xs, const Dims& idx) {
    const double x = xs[0].at(broadcast_read(idx, xs[0].shape));
    return std::pair<double, double>{x, xs.size() > 1 ? xs[1].at(broadcast_read(idx, xs[1].shape)) : c};
  };
  Definition d;
  d.value = [=](Xs xs) {
    Nd y = zeros(shape_of(xs));
    for (int64_t k = 0; k < count_of(y.shape); ++k) {
      const auto [x, z] = args(xs, multi_index(k, y.shape));
      y.at(k) = f(x, z);
    }
    return y;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t i) {
    Nd r = zeros(xs[i].shape);
    for (int64_t k = 0; k < count_of(g.shape); ++k) {
      const Dims idx = multi_index(k, g.shape);
      const auto [x, z] = args(xs, idx);
      r.at(broadcast_read(idx, xs[i].shape)) += g.at(k) * df(x, z, i);
    }
    return r;
  };
  return d;
}

// A unary elementwise op from its function and derivative.
inline Definition unary(std::function<double(double)> f, std::function<double(double)> df) {
  return elementwise(0.0, [f](double x, double) { return f(x); }, [df](double x, double, size_t) { return df(x); });
}

// An integer in [lo, hi], uniform at every case (rc::gen::inRange alone narrows the range to
// `lo` in the early, small-size cases: every value alike, every rank 0), shrinking towards lo.
inline int64_t draw_in(int64_t lo, int64_t hi) {
  return lo == hi ? lo : *rc::gen::resize(100, rc::gen::inRange<int64_t>(lo, hi + 1));
}

inline bool coin() { return draw_in(0, 1) == 1; }

// A dim in [0, rank) given as itself or, half of the time, counted from the end.
inline int64_t as_given(int64_t d, int64_t rank) { return coin() ? d - rank : d; }

inline Dims draw_shape(int64_t rank, bool ones_often = false) {
  Dims s;
  for (int64_t d = 0; d < rank; ++d) s.push_back(ones_often && coin() ? 1 : draw_in(1, 4));
  return s;
}

// Small integers as halves, so no relu sits at its kink; divisors kept away from zero.
inline Nd draw_values(const Dims& shape, bool positive) {
  Nd x = zeros(shape);
  for (auto& e : x.v) e = positive ? static_cast<double>(draw_in(1, 8)) / 2.0 : (static_cast<double>(draw_in(-8, 8)) + 0.5) / 2.0;
  return x;
}

// An op's operands and attributes; `types` per operand: "float" (the default when empty), "bool"
// or "int64" (kept as doubles here; no gradient).
struct Case {
  OpAttrs attrs;
  std::vector<Nd> xs;
  std::vector<std::string> types;
};

// ---- the builders of definitions (kernels.cpp): linear algebra and moves of data ----

// torch.matmul (and mm, bmm, its 2-D and 3-D cases), with broadcast batch dims.
Definition matmul();
// linear(x [..., k], weight [n, k], bias [n]?): x @ weight^T + bias.
Definition linear();
// permute (transpose: a permutation swapping two dims): result dim j is operand dim perm[j].
Definition permutation(const Dims& perm);
// View ops: the same row-major data under the shape `shape_of` gives the operand's shape.
Definition view(std::function<Dims(const Dims&)> shape_of);
// A target shape with its one -1 (if any) filled in so that it holds `count` elements.
Dims filled(Dims shape, int64_t count);
// expand to `target` (-1 keeps the operand's extent).
Definition expand(const Dims& target);
// cat along `dim`, or stack (a new dim `dim`).
Definition join(int64_t dim, bool stack);
// narrow: `length` entries of `dim` from `start` (negative: counted from the end).
Definition narrow(int64_t dim, int64_t start, int64_t length);
// sum or mean over the dims `a` names (mean: over a.mean_divisor when set).
Definition sum_or_mean(const OpAttrs& a, bool mean);
// amax / amin over the dims `a` names; the gradient split evenly among ties.
Definition extremum(const OpAttrs& a, bool max);
// linalg_vector_norm {ord, dim, keepdim}, written out element by element.
Definition vector_norm(const OpAttrs& a);
// softmax along `dim`.
Definition softmax(int64_t dim);
// The selection and order ops along `dim` (max, min, sort, topk: the values, the gradient to the
// positions picked; argmax, argmin, argsort: the positions), written out line by line.
Definition selection(const std::string& op, const OpAttrs& a, int64_t dim);
// gather and index_select along `dim` (the index operand's values as positions); the gradient
// added back at them.
Definition indexed(const std::string& op, int64_t dim);
// scatter, scatter_add and index_add along `dim` (src's entries written or added into x at the
// index's positions; scatter: the last write in row-major order stays); the gradients: g to x
// (scatter: zeroed where written), g at the positions to src.
Definition scattered(const std::string& op, int64_t dim);
// floor_divide and remainder of int64 data (the quotient rounded towards -inf; x - q * y), with
// the scalar `value` for one operand; no gradient.
Definition integer_binary(const std::string& op, double value);
// cumsum along `dim`: each entry the sum of those before it and itself; the gradient the sums of
// g from the end.
Definition scan(int64_t dim);
// one_hot (a new trailing dim of `n`, 1 at each value) or bincount (how often each of 0..n-1
// occurs among the 1-D values) of int64 data; no gradient.
Definition counted(bool one_hot, int64_t n);
// Comparisons and logic (a bool result as 1 or 0), with the scalar `value` for one operand.
Definition comparison(const std::string& op, double value);

// ---- the builders of definitions (kernels_nn.cpp): the transformer layers' ops ----

// gelu, exact (from erf) or in its tanh form.
Definition gelu(bool tanh_form);
Definition log_softmax(int64_t dim);
Definition where_def();
Definition masked_fill(double value);
// tril (lower) / triu {diagonal}.
Definition triangle(bool lower, int64_t diagonal);
// layer_norm (layer) or rms_norm over the last `k` dims.
Definition norm(bool layer, size_t k, double eps);
// embedding; with a range, the rank's rows of a vocab-parallel table.
Definition embedding(const std::optional<Chunk>& range);
Definition pick_target(const OpAttrs& a);
// nll_loss or cross_entropy.
Definition loss(const OpAttrs& a, bool cross_entropy);
Definition count_targets(const std::optional<int64_t>& ignore);
// dropout at the global indices a.draw names (core/random.h); its gradient g times the same factor.
Definition dropout(const OpAttrs& a);

// ---- attention and its friends (kernels_attention.cpp): definitions and the drawing of cases ----

// repeat {sizes}: tiles (leading sizes add dims); the gradient summed over the copies.
Definition repeat_def(const Dims& sizes);
// repeat_interleave {repeats} along `dim`: each entry's copies in place; the gradient summed.
Definition repeat_interleave_def(int64_t dim, int64_t repeats);
// scaled_dot_product_attention (q, k, v, mask?) {is_causal, scale, enable_gqa}.
Definition attention_def(const OpAttrs& a);
void draw_repeat(const std::string& op, Case& c);
void draw_repeat_interleave(const std::string& op, Case& c);
void draw_attention(const std::string& op, Case& c);

// ---- the table (definitions.cpp) ----

// The op's definition for these attributes and an operand 0 of rank `rank`, and a case of it
// drawn. The table is checked against the catalog at its first use: every op with `kernel` has a
// row, and no row names another op (std::logic_error naming the op otherwise).
Definition definition(OpId op, const OpAttrs& a, int64_t rank);
Case draw_case(OpId op);

}  // namespace meshsim::kernel_nd

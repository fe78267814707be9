// The definitions of attention and its friends, written out element by element for
// kernels_match_definitions: repeat, repeat_interleave and scaled_dot_product_attention (its value
// and the gradients of q, k, v and a float mask from the softmax's Jacobian), and the drawing of
// their cases.
#include <cmath>
#include <vector>

#include "properties/kernel_nd.h"

namespace meshsim::kernel_nd {

namespace {

// A copy op: each result element reads one operand element (`source`: the operand's flat index of
// the result's multi-index); the gradient adds g back there.
Definition copying(std::function<Dims(const Dims&)> shape_of, std::function<int64_t(const Dims& out_idx, const Dims& in)> source) {
  Definition d;
  d.value = [=](Xs xs) {
    Nd y = zeros(shape_of(xs[0].shape));
    for (int64_t k = 0; k < count_of(y.shape); ++k) y.at(k) = xs[0].at(source(multi_index(k, y.shape), xs[0].shape));
    return y;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t) {
    Nd r = zeros(xs[0].shape);
    for (int64_t k = 0; k < count_of(g.shape); ++k) r.at(source(multi_index(k, g.shape), xs[0].shape)) += g.at(k);
    return r;
  };
  return d;
}

}  // namespace

Definition repeat_def(const Dims& sizes) {
  auto shape_of = [sizes](const Dims& in) {
    Dims out = sizes;
    const size_t lead = sizes.size() - in.size();
    for (size_t i = lead; i < out.size(); ++i) out[i] *= in[i - lead];
    return out;
  };
  auto source = [sizes](const Dims& idx, const Dims& in) {  // tile t of dim i holds entry idx % extent
    const size_t lead = sizes.size() - in.size();
    Dims at(in.size());
    for (size_t i = 0; i < in.size(); ++i) at[i] = idx[lead + i] % in[i];
    return flat_index(at, in);
  };
  return copying(shape_of, source);
}

Definition repeat_interleave_def(int64_t dim, int64_t repeats) {
  auto shape_of = [=](const Dims& in) {
    Dims out = in;
    out[static_cast<size_t>(dim)] *= repeats;
    return out;
  };
  auto source = [=](const Dims& idx, const Dims& in) {  // entry j of dim is entry j / repeats's copy
    Dims at = idx;
    at[static_cast<size_t>(dim)] /= repeats;
    return flat_index(at, in);
  };
  return copying(shape_of, source);
}

// softmax(q k^T * scale + mask) v per batch, head and query row: the scores of the keys a row may
// attend (the causal ones, a bool mask's true ones; a float mask added), their softmax p (zeros for
// a row with none), out = sum_j p_j v_j. The gradient: dv_j += p_j g; dp_j = g . v_j; ds_j = p_j
// (dp_j - sum_i p_i dp_i); dq += scale ds_j k_j; dk_j += scale ds_j q; a float mask's ds_j.
// A mask of only 0s and 1s is read as a bool one: the drawn float masks hold halves (draw_values).
bool bool_mask_of(Xs xs) {
  if (xs.size() < 4) return false;
  for (double e : xs[3].v)
    if (e != 0 && e != 1) return false;
  return true;
}

Definition attention_def(const OpAttrs& a) {
  struct Row {  // one query row: its keys' weights
    std::vector<double> p;
  };
  // The weights of row (b, h, i); `xs` q, k, v, mask?.
  auto weights = [a](Xs xs, int64_t b, int64_t h, int64_t i) {
    const bool bool_mask = bool_mask_of(xs);
    const Dims &q = xs[0].shape, &k = xs[1].shape;
    const int64_t d = q[3], sk = k[2], kh = h / (q[1] / k[1]);
    const double scale = a.attn_scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
    std::vector<double> s(static_cast<size_t>(sk));
    std::vector<bool> on(static_cast<size_t>(sk), true);
    for (int64_t j = 0; j < sk; ++j) {
      double dot = 0;
      for (int64_t e = 0; e < d; ++e) dot += xs[0].at(flat_index({b, h, i, e}, q)) * xs[1].at(flat_index({b, kh, j, e}, k));
      s[j] = dot * scale;
      if (a.is_causal && j > i) on[j] = false;
      if (xs.size() > 3) {
        const double m = xs[3].at(broadcast_read({b, h, i, j}, xs[3].shape));
        if (bool_mask && m == 0) on[j] = false;
        if (!bool_mask) s[j] += m;
      }
      if (std::isinf(s[j]) && s[j] < 0) on[j] = false;
    }
    double top = -INFINITY, sum = 0;
    for (int64_t j = 0; j < sk; ++j)
      if (on[j]) top = std::max(top, s[j]);
    Row r{std::vector<double>(static_cast<size_t>(sk), 0.0)};
    for (int64_t j = 0; j < sk; ++j)
      if (on[j]) sum += (r.p[j] = std::exp(s[j] - top));
    for (auto& w : r.p) w = sum > 0 ? w / sum : 0.0;
    return r;
  };
  auto out_shape = [](Xs xs) { return Dims{xs[0].shape[0], xs[0].shape[1], xs[0].shape[2], xs[2].shape[3]}; };
  Definition def;
  def.value = [=](Xs xs) {
    Nd y = zeros(out_shape(xs));
    const Dims& v = xs[2].shape;
    const int64_t group = xs[0].shape[1] / std::max<int64_t>(1, xs[1].shape[1]);
    for (int64_t b = 0; b < y.shape[0]; ++b)
      for (int64_t h = 0; h < y.shape[1]; ++h)
        for (int64_t i = 0; i < y.shape[2]; ++i) {
          const Row r = weights(xs, b, h, i);
          for (int64_t e = 0; e < y.shape[3]; ++e) {
            double acc = 0;
            for (int64_t j = 0; j < v[2]; ++j) acc += r.p[j] * xs[2].at(flat_index({b, h / group, j, e}, v));
            y.at(flat_index({b, h, i, e}, y.shape)) = acc;
          }
        }
    return y;
  };
  def.vjp = [=](Xs xs, const Nd& g, size_t which) {
    Nd r = zeros(xs[which].shape);
    const Dims &q = xs[0].shape, &k = xs[1].shape, &v = xs[2].shape;
    const int64_t group = q[1] / std::max<int64_t>(1, k[1]);
    const double scale = a.attn_scale.value_or(1.0 / std::sqrt(static_cast<double>(q[3])));
    for (int64_t b = 0; b < q[0]; ++b)
      for (int64_t h = 0; h < q[1]; ++h)
        for (int64_t i = 0; i < q[2]; ++i) {
          const Row w = weights(xs, b, h, i);
          const int64_t kh = h / group;
          std::vector<double> dp(static_cast<size_t>(k[2]), 0.0), ds(static_cast<size_t>(k[2]), 0.0);
          double mean = 0;
          for (int64_t j = 0; j < k[2]; ++j) {
            for (int64_t e = 0; e < v[3]; ++e)
              dp[j] += g.at(flat_index({b, h, i, e}, g.shape)) * xs[2].at(flat_index({b, kh, j, e}, v));
            mean += w.p[j] * dp[j];
          }
          for (int64_t j = 0; j < k[2]; ++j) ds[j] = w.p[j] * (dp[j] - mean);
          for (int64_t j = 0; j < k[2]; ++j) {
            if (which == 2)
              for (int64_t e = 0; e < v[3]; ++e)
                r.at(flat_index({b, kh, j, e}, v)) += w.p[j] * g.at(flat_index({b, h, i, e}, g.shape));
            if (which == 0)
              for (int64_t e = 0; e < q[3]; ++e)
                r.at(flat_index({b, h, i, e}, q)) += scale * ds[j] * xs[1].at(flat_index({b, kh, j, e}, k));
            if (which == 1)
              for (int64_t e = 0; e < q[3]; ++e)
                r.at(flat_index({b, kh, j, e}, k)) += scale * ds[j] * xs[0].at(flat_index({b, h, i, e}, q));
            if (which == 3) r.at(broadcast_read({b, h, i, j}, xs[3].shape)) += ds[j];
          }
        }
    return r;
  };
  return def;
}

// ---- drawing ----

// repeat: 0-3 dims, sizes of 1-3 per dim (1 half of the time) and 0-1 leading ones.
void draw_repeat(const std::string&, Case& c) {
  const Dims s = draw_shape(draw_in(0, 3));
  Dims sizes;
  for (int64_t lead = draw_in(0, 1); lead > 0; --lead) sizes.push_back(draw_in(1, 3));
  for (size_t i = 0; i < s.size(); ++i) sizes.push_back(coin() ? 1 : draw_in(0, 3));
  c.attrs.sizes = sizes;
  c.xs = {draw_values(s, false)};
}

// repeat_interleave: along a dim of 1-3, 0-3 copies.
void draw_repeat_interleave(const std::string&, Case& c) {
  const int64_t r = draw_in(1, 3);
  c.attrs.dim = as_given(draw_in(0, r - 1), r);
  c.attrs.repeats = draw_in(0, 3);
  c.xs = {draw_values(draw_shape(r), false)};
}

// scaled_dot_product_attention: b, h (hk of it under enable_gqa), sq and sk of 1-3 (apart most of
// the time: causal top left), d and dv of 1-3; causal half of the time, a scale now and then; else a
// mask broadcast over some dims, bool (a row may keep no key: zeros) or float, a third of the time
// each.
void draw_attention(const std::string&, Case& c) {
  OpAttrs& a = c.attrs;
  const int64_t b = draw_in(1, 2), hk = draw_in(1, 2), g = draw_in(1, 2), sq = draw_in(1, 3), sk = draw_in(1, 3),
                d = draw_in(1, 3), dv = draw_in(1, 3);
  a.enable_gqa = g > 1 || coin();
  const int64_t h = a.enable_gqa ? hk * g : hk;
  a.is_causal = coin();
  if (draw_in(0, 3) == 0) a.attn_scale = *rc::gen::element(0.5, 2.0);
  c.xs = {draw_values({b, h, sq, d}, false), draw_values({b, hk, sk, d}, false), draw_values({b, hk, sk, dv}, false)};
  const int64_t mask = a.is_causal ? 0 : draw_in(0, 2);  // PyTorch takes one or the other
  if (mask == 0) return;
  Dims m = {b, h, sq, sk};
  for (auto& e : m)
    if (coin()) e = 1;
  m.erase(m.begin(), m.begin() + draw_in(0, 2));
  if (mask == 1 && count_of(m) > 0) {
    Nd x = zeros(m);
    for (auto& e : x.v) e = draw_in(0, 3) == 0 ? 0.0 : 1.0;
    c.xs.push_back(x);
    c.types = {"float", "float", "float", "bool"};
  } else {
    c.xs.push_back(draw_values(m, false));
  }
}

}  // namespace meshsim::kernel_nd

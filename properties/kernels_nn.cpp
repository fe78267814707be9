// The definitions of the transformer-layer ops for kernels_match_definitions, written out element by
// element with std:: math (never through libtorch's fused kernels): gelu from erf (and its tanh
// form), log_softmax from logsumexp, layer_norm from the mean and the biased variance, rms_norm
// from the mean of squares, embedding and the target pick as lookups, cross_entropy from
// logsumexp minus the picked score. Each with the gradient written out too; their rows: definitions.cpp.
#include <cmath>
#include <limits>

#include "core/random.h"
#include "properties/kernel_nd.h"

namespace meshsim::kernel_nd {

namespace {

constexpr double kPi = 3.14159265358979323846;

// The lines of `shape` along `dim`: calls f(flat indices of one line) for every line.
void lines_along(const Dims& shape, int64_t dim, const std::function<void(const std::vector<int64_t>&)>& f) {
  const auto u = static_cast<size_t>(dim);
  int64_t stride = 1;
  for (size_t d = u + 1; d < shape.size(); ++d) stride *= shape[d];
  for (int64_t k = 0; k < count_of(shape); ++k) {
    if (multi_index(k, shape)[u] != 0) continue;  // k starts a line
    std::vector<int64_t> line;
    for (int64_t l = 0; l < shape[u]; ++l) line.push_back(k + l * stride);
    f(line);
  }
}

double logsumexp(const Nd& x, const std::vector<int64_t>& line) {
  double mx = -INFINITY, total = 0;
  for (int64_t k : line) mx = std::max(mx, x.at(k));
  for (int64_t k : line) total += std::exp(x.at(k) - mx);
  return mx + std::log(total);
}

// The groups a norm normalizes: the flat indices of each group of the last `k` dims (row-major,
// so each group is a run of `size` consecutive elements), and the index of each element in the
// normalized shape (a parameter's element).
struct Groups {
  int64_t count, size;
};
Groups groups_of(const Dims& shape, size_t k) {
  int64_t size = 1;
  for (size_t d = shape.size() - k; d < shape.size(); ++d) size *= shape[d];
  return {size == 0 ? 0 : count_of(shape) / size, size};
}

// The row an id reads in a table that holds rows [offset, offset + size) of the vocab (the whole
// table without a range), or -1 for another rank's id.
int64_t local_row(double id, const std::optional<Chunk>& range, int64_t rows) {
  const auto v = static_cast<int64_t>(id);
  if (!range) return v < rows ? v : -1;
  return v >= range->offset && v < range->offset + range->size ? v - range->offset : -1;
}

bool ignored(double target, const std::optional<int64_t>& ignore) { return ignore && static_cast<int64_t>(target) == *ignore; }

}  // namespace

// gelu(x) = x * Phi(x), Phi the standard normal CDF; the tanh form replaces Phi(x) by
// (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2.
Definition gelu(bool tanh_form) {
  if (!tanh_form)
    return unary([](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); },
                 [](double x) {
                   const double cdf = 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
                   return cdf + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * kPi);
                 });
  const double k = std::sqrt(2.0 / kPi), c = 0.044715;
  return unary([=](double x) { return 0.5 * x * (1.0 + std::tanh(k * (x + c * x * x * x))); },
               [=](double x) {
                 const double t = std::tanh(k * (x + c * x * x * x));
                 return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
               });
}

// log_softmax along dim: x - logsumexp(x); dx = g - softmax(x) * sum(g).
Definition log_softmax(int64_t dim) {
  Definition d;
  d.value = [dim](Xs xs) {
    Nd y = xs[0];
    lines_along(y.shape, dim, [&](const std::vector<int64_t>& line) {
      const double lse = logsumexp(xs[0], line);
      for (int64_t k : line) y.at(k) = xs[0].at(k) - lse;
    });
    return y;
  };
  d.vjp = [dim](Xs xs, const Nd& g, size_t) {
    Nd r = zeros(xs[0].shape);
    lines_along(r.shape, dim, [&](const std::vector<int64_t>& line) {
      const double lse = logsumexp(xs[0], line);
      double total = 0;
      for (int64_t k : line) total += g.at(k);
      for (int64_t k : line) r.at(k) = g.at(k) - std::exp(xs[0].at(k) - lse) * total;
    });
    return r;
  };
  return d;
}

// where(cond, x, y): the three broadcast against each other; x where cond, y elsewhere. The
// gradient of x (y) sums g where cond is true (false) over the elements reading it.
Definition where_def() {
  auto shape_of = [](Xs xs) { return broadcast(broadcast(xs[0].shape, xs[1].shape), xs[2].shape); };
  Definition d;
  d.value = [=](Xs xs) {
    Nd out = zeros(shape_of(xs));
    for (int64_t k = 0; k < count_of(out.shape); ++k) {
      const Dims idx = multi_index(k, out.shape);
      const bool c = xs[0].at(broadcast_read(idx, xs[0].shape)) != 0;
      out.at(k) = c ? xs[1].at(broadcast_read(idx, xs[1].shape)) : xs[2].at(broadcast_read(idx, xs[2].shape));
    }
    return out;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t i) {
    Nd r = zeros(xs[i].shape);
    for (int64_t k = 0; k < count_of(g.shape); ++k) {
      const Dims idx = multi_index(k, g.shape);
      const bool c = xs[0].at(broadcast_read(idx, xs[0].shape)) != 0;
      if (c == (i == 1)) r.at(broadcast_read(idx, xs[i].shape)) += g.at(k);
    }
    return r;
  };
  return d;
}

// masked_fill(x, mask) {value}: value where the mask (broadcast to x) is true, x elsewhere.
Definition masked_fill(double value) {
  Definition d;
  d.value = [=](Xs xs) {
    Nd y = xs[0];
    for (int64_t k = 0; k < count_of(y.shape); ++k)
      if (xs[1].at(broadcast_read(multi_index(k, y.shape), xs[1].shape)) != 0) y.at(k) = value;
    return y;
  };
  d.vjp = [](Xs xs, const Nd& g, size_t) {
    Nd r = g;
    for (int64_t k = 0; k < count_of(r.shape); ++k)
      if (xs[1].at(broadcast_read(multi_index(k, r.shape), xs[1].shape)) != 0) r.at(k) = 0;
    return r;
  };
  return d;
}

// tril / triu {diagonal}: on the last two dims, element (i, j) kept where j - i <= diagonal
// (tril) or j - i >= diagonal (triu), zero elsewhere; the gradient keeps the same elements of g.
Definition triangle(bool lower, int64_t diagonal) {
  auto kept = [=](const Dims& idx) {
    const int64_t i = idx[idx.size() - 2], j = idx.back();
    return lower ? j - i <= diagonal : j - i >= diagonal;
  };
  auto keep = [=](const Nd& x) {
    Nd y = x;
    for (int64_t k = 0; k < count_of(y.shape); ++k)
      if (!kept(multi_index(k, y.shape))) y.at(k) = 0;
    return y;
  };
  return {[=](Xs xs) { return keep(xs[0]); }, [=](Xs, const Nd& g, size_t) { return keep(g); }};
}

// layer_norm over the last dims, from the mean and the biased variance: xhat = (x - mean) /
// sqrt(var + eps), y = xhat * w + b. dx = (gw - mean(gw) - xhat * mean(gw * xhat)) / sqrt(var + eps)
// with gw = g * w; dw = sum over the groups of g * xhat; db = sum over the groups of g.
// rms_norm: r = 1 / sqrt(mean(x^2) + eps), y = x * r * w; dx = r * gw - x * r^3 * mean(gw * x);
// dw = sum over the groups of g * x * r.
Definition norm(bool layer, size_t k, double eps) {
  // Per group: (xhat or x * r, the scale 1 / sqrt(...)).
  auto stats = [=](const Nd& x, int64_t gi, int64_t size) {
    double mean = 0, var = 0;
    for (int64_t e = 0; e < size; ++e) mean += x.at(gi * size + e);
    mean = layer ? mean / static_cast<double>(size) : 0.0;
    for (int64_t e = 0; e < size; ++e) var += (x.at(gi * size + e) - mean) * (x.at(gi * size + e) - mean);
    var /= static_cast<double>(size);
    return std::pair<double, double>{mean, 1.0 / std::sqrt(var + eps)};
  };
  auto param = [](Xs xs, size_t i, int64_t e, double none) { return xs.size() > i ? xs[i].at(e) : none; };
  Definition d;
  d.value = [=](Xs xs) {
    const Groups gs = groups_of(xs[0].shape, k);
    Nd y = zeros(xs[0].shape);
    for (int64_t gi = 0; gi < gs.count; ++gi) {
      const auto [mean, scale] = stats(xs[0], gi, gs.size);
      for (int64_t e = 0; e < gs.size; ++e)
        y.at(gi * gs.size + e) = (xs[0].at(gi * gs.size + e) - mean) * scale * param(xs, 1, e, 1.0) + param(xs, 2, e, 0.0);
    }
    return y;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t i) {
    const Groups gs = groups_of(xs[0].shape, k);
    Nd r = zeros(xs[i].shape);
    for (int64_t gi = 0; gi < gs.count; ++gi) {
      const auto [mean, scale] = stats(xs[0], gi, gs.size);
      auto at = [&, mean = mean, scale = scale](int64_t e) { return (xs[0].at(gi * gs.size + e) - mean) * scale; };
      if (i == 1 || i == 2) {
        for (int64_t e = 0; e < gs.size; ++e) r.at(e) += g.at(gi * gs.size + e) * (i == 1 ? at(e) : 1.0);
        continue;
      }
      double mg = 0, mgx = 0;  // mean(gw), mean(gw * xhat)
      for (int64_t e = 0; e < gs.size; ++e) {
        const double gw = g.at(gi * gs.size + e) * param(xs, 1, e, 1.0);
        mg += gw;
        mgx += gw * at(e);
      }
      mg /= static_cast<double>(gs.size);
      mgx /= static_cast<double>(gs.size);
      for (int64_t e = 0; e < gs.size; ++e) {
        const double gw = g.at(gi * gs.size + e) * param(xs, 1, e, 1.0);
        r.at(gi * gs.size + e) = layer ? (gw - mg - at(e) * mgx) * scale : (gw - at(e) * mgx) * scale;
      }
    }
    return r;
  };
  return d;
}

// embedding(ids, weight [V, D]): y[..., d] = weight[id, d], zeros for an id outside the rank's
// range; the weight's gradient adds g's rows at the ids it holds.
Definition embedding(const std::optional<Chunk>& range) {
  Definition d;
  d.value = [=](Xs xs) {
    const int64_t rows = xs[1].shape[0], dim = xs[1].shape[1];
    Dims shape = xs[0].shape;
    shape.push_back(dim);
    Nd y = zeros(shape);
    for (int64_t k = 0; k < count_of(xs[0].shape); ++k) {
      const int64_t row = local_row(xs[0].at(k), range, rows);
      if (row >= 0)
        for (int64_t e = 0; e < dim; ++e) y.at(k * dim + e) = xs[1].at(row * dim + e);
    }
    return y;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t) {
    const int64_t rows = xs[1].shape[0], dim = xs[1].shape[1];
    Nd r = zeros(xs[1].shape);
    for (int64_t k = 0; k < count_of(xs[0].shape); ++k) {
      const int64_t row = local_row(xs[0].at(k), range, rows);
      if (row >= 0)
        for (int64_t e = 0; e < dim; ++e) r.at(row * dim + e) += g.at(k * dim + e);
    }
    return r;
  };
  return d;
}

// pick_target(log_probs [N, C], target [N]): -log_probs[n, target[n]], 0 where the target is
// ignored or (range) another rank's class; the gradient puts -g[n] at the picked class.
Definition pick_target(const OpAttrs& a) {
  const auto range = a.range;
  const auto ignore = a.ignore_index;
  auto column = [=](Xs xs, int64_t n) {
    return ignored(xs[1].at(n), ignore) ? -1 : local_row(xs[1].at(n), range, xs[0].shape[1]);
  };
  Definition d;
  d.value = [=](Xs xs) {
    Nd y = zeros({xs[0].shape[0]});
    for (int64_t n = 0; n < xs[0].shape[0]; ++n)
      if (const int64_t c = column(xs, n); c >= 0) y.at(n) = -xs[0].at(n * xs[0].shape[1] + c);
    return y;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t) {
    Nd r = zeros(xs[0].shape);
    for (int64_t n = 0; n < xs[0].shape[0]; ++n)
      if (const int64_t c = column(xs, n); c >= 0) r.at(n * xs[0].shape[1] + c) = -g.at(n);
    return r;
  };
  return d;
}

// nll_loss and cross_entropy: each kept row's loss -w[t] logp[n, t] (w the class weight, 1 without
// one; logp the scores for nll_loss, scores - logsumexp(row) for cross_entropy), with label smoothing
// eps that times 1 - eps plus eps / C times -sum_c w[c] logp[n, c]; the rows themselves (reduction
// none, 0 where ignored), their sum, or their sum over the kept rows' w[t] (the count without a
// weight). The gradient of logp[n, c] is -(1 - eps) w[t] s_n at the target and -eps / C w[c] s_n
// everywhere (s_n the row's share of g); cross_entropy's of the scores subtracts softmax times the
// row's sum of those.
Definition loss(const OpAttrs& a, bool cross_entropy) {
  const auto ignore = a.ignore_index;
  const auto range = a.range;  // nll_loss in a local_map body: the rank's classes (its columns)
  const bool sum = a.sum_reduction, none = a.no_reduction;
  const double eps = cross_entropy ? a.label_smoothing : 0.0;
  auto kept = [=](Xs xs, int64_t n) { return !ignored(xs[1].at(n), ignore); };
  auto column = [=](Xs xs, int64_t n) { return local_row(xs[1].at(n), range, xs[0].shape[1]); };
  auto w = [](Xs xs, int64_t c) { return xs.size() > 2 ? xs[2].at(c) : 1.0; };
  auto target_weight = [=](Xs xs, int64_t n) { return column(xs, n) >= 0 ? w(xs, column(xs, n)) : 0.0; };
  auto denominator = [=](Xs xs) {  // what the sum of the rows is divided by
    if (sum || none) return 1.0;
    double d = 0;
    for (int64_t n = 0; n < xs[0].shape[0]; ++n) d += kept(xs, n) ? (xs.size() > 2 ? target_weight(xs, n) : 1.0) : 0.0;
    return d;
  };
  auto logp = [=](Xs xs, int64_t n, int64_t c) {
    const int64_t classes = xs[0].shape[1];
    double lse = 0;
    if (cross_entropy) {
      std::vector<int64_t> line;
      for (int64_t k = 0; k < classes; ++k) line.push_back(n * classes + k);
      lse = logsumexp(xs[0], line);
    }
    return xs[0].at(n * classes + c) - lse;
  };
  auto row_loss = [=](Xs xs, int64_t n) {
    if (!kept(xs, n)) return 0.0;
    double l = column(xs, n) >= 0 ? -(1.0 - eps) * target_weight(xs, n) * logp(xs, n, column(xs, n)) : 0.0;
    if (eps > 0) {
      const int64_t classes = xs[0].shape[1];
      for (int64_t c = 0; c < classes; ++c) l -= eps / static_cast<double>(classes) * w(xs, c) * logp(xs, n, c);
    }
    return l;
  };
  Definition d;
  d.value = [=](Xs xs) {
    const int64_t rows = xs[0].shape[0];
    if (none) {
      Nd y = zeros({rows});
      for (int64_t n = 0; n < rows; ++n) y.at(n) = row_loss(xs, n);
      return y;
    }
    double total = 0;
    for (int64_t n = 0; n < rows; ++n) total += row_loss(xs, n);
    return Nd{{}, {total / denominator(xs)}};
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t) {
    const int64_t rows = xs[0].shape[0], classes = xs[0].shape[1];
    Nd r = zeros(xs[0].shape);
    for (int64_t n = 0; n < rows; ++n) {
      if (!kept(xs, n)) continue;
      const double share = none ? g.at(n) : g.at(0) / denominator(xs);
      std::vector<double> dlogp(static_cast<size_t>(classes), 0.0);
      if (column(xs, n) >= 0) dlogp[static_cast<size_t>(column(xs, n))] -= (1.0 - eps) * target_weight(xs, n) * share;
      if (eps > 0)
        for (int64_t c = 0; c < classes; ++c)
          dlogp[static_cast<size_t>(c)] -= eps / static_cast<double>(classes) * w(xs, c) * share;
      double row_sum = 0;
      for (double v : dlogp) row_sum += v;
      for (int64_t c = 0; c < classes; ++c) {
        double v = dlogp[static_cast<size_t>(c)];
        if (cross_entropy) v -= std::exp(logp(xs, n, c)) * row_sum;
        r.at(n * classes + c) = v;
      }
    }
    return r;
  };
  return d;
}

// dropout, element by element: x times 1 / (1 - p) where the stream keeps the element's global
// index (core/random.h, dropout_keeps), 0 where it drops it; its gradient g times the same factor.
Definition dropout(const OpAttrs& a) {
  const uint64_t key = random_stream_key(a.draw.seed, a.draw.stream, a.draw.step, a.draw.microbatch);
  auto factor = [a, key](const Dims& shape, int64_t k) {
    if (!a.training) return 1.0;
    const Dims idx = multi_index(k, shape);
    int64_t global = 0;
    for (size_t d = 0; d < idx.size(); ++d)
      global = a.draw.indices.empty() ? global * shape[d] + idx[d]
                                      : global * a.draw.global[d] + a.draw.indices[d][static_cast<size_t>(idx[d])];
    return dropout_keeps(key, static_cast<uint64_t>(global), a.p) ? 1.0 / (1.0 - a.p) : 0.0;
  };
  Definition d;
  d.value = [factor](Xs xs) {
    Nd y = zeros(xs[0].shape);
    for (int64_t k = 0; k < count_of(y.shape); ++k) y.at(k) = xs[0].at(k) * factor(y.shape, k);
    return y;
  };
  d.vjp = [factor](Xs xs, const Nd& g, size_t) {
    Nd r = zeros(xs[0].shape);
    for (int64_t k = 0; k < count_of(g.shape); ++k) r.at(k) = g.at(k) * factor(g.shape, k);
    return r;
  };
  return d;
}

// count_targets(target): 1 where the target is kept, else 0 (no gradient).
Definition count_targets(const std::optional<int64_t>& ignore) {
  return {[=](Xs xs) {
            Nd y = zeros(xs[0].shape);
            for (int64_t k = 0; k < count_of(y.shape); ++k) y.at(k) = ignored(xs[0].at(k), ignore) ? 0.0 : 1.0;
            return y;
          },
          [](Xs xs, const Nd&, size_t) { return zeros(xs[0].shape); }};
}

}  // namespace meshsim::kernel_nd

// The per-rank kernels against their definitions. The fake mesh and the single-device oracle run
// the same kernels (sim/kernels.cpp), so a wrong kernel would pass every differential property;
// here each op's forward and its gradient (through libtorch autograd, as the runtime takes it) are
// checked against the op's definition written out element by element, with std:: math on a dense
// N-D array of its own. Every op of the catalog with a kernel has a definition (definitions.cpp);
// the result's shape is computed from the attributes here, not by infer_shape(). This file holds
// the builders of the definitions of linear algebra and moves of data, and the property.
#include "properties/kernels.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <rapidcheck.h>
#include <torch/csrc/autograd/autograd.h>

#include "core/mutants.h"
#include "core/propagation.h"
#include "properties/kernel_nd.h"
#include "properties/properties.h"
#include "sim/local_ops.h"
#include "sim/vjps.h"

namespace meshsim::kernel_nd {

// torch.matmul (and mm, bmm, its 2-D and 3-D cases): a 1-D first operand is a row [1, k], a 1-D
// second one a column [k, 1], the added dim removed from the result; the dims before the last two
// are batch dims, broadcast against each other.
Definition matmul() {
  struct Plan {
    Dims a, b, batch, out;  // the operands as [..., m, k] and [..., k, n]; the batch; the result
    int64_t m, k, n;
  };
  auto plan = [](Xs xs) {
    Plan p;
    p.a = xs[0].shape.size() == 1 ? Dims{1, xs[0].shape[0]} : xs[0].shape;
    p.b = xs[1].shape.size() == 1 ? Dims{xs[1].shape[0], 1} : xs[1].shape;
    p.m = p.a[p.a.size() - 2];
    p.k = p.a.back();
    p.n = p.b.back();
    p.batch = broadcast(Dims(p.a.begin(), p.a.end() - 2), Dims(p.b.begin(), p.b.end() - 2));
    p.out = p.batch;
    if (xs[0].shape.size() > 1) p.out.push_back(p.m);
    if (xs[1].shape.size() > 1) p.out.push_back(p.n);
    return p;
  };
  // Calls f(result flat, a flat, b flat) for every term a[.., i, l] * b[.., l, j] of the result.
  auto terms = [](const Plan& p, const std::function<void(int64_t, int64_t, int64_t)>& f) {
    const Dims ba(p.a.begin(), p.a.end() - 2), bb(p.b.begin(), p.b.end() - 2);
    for (int64_t t = 0; t < count_of(p.batch); ++t) {
      const Dims bi = multi_index(t, p.batch);
      const int64_t ta = broadcast_read(bi, ba), tb = broadcast_read(bi, bb);
      for (int64_t i = 0; i < p.m; ++i)
        for (int64_t j = 0; j < p.n; ++j)
          for (int64_t l = 0; l < p.k; ++l)
            f((t * p.m + i) * p.n + j, (ta * p.m + i) * p.k + l, (tb * p.k + l) * p.n + j);
    }
  };
  Definition d;
  d.value = [=](Xs xs) {
    const Plan p = plan(xs);
    Nd y = zeros(p.out);
    terms(p, [&](int64_t o, int64_t ia, int64_t ib) { y.at(o) += xs[0].at(ia) * xs[1].at(ib); });
    return y;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t i) {
    const Plan p = plan(xs);
    Nd r = zeros(xs[i].shape);
    terms(p, [&](int64_t o, int64_t ia, int64_t ib) {
      if (i == 0) r.at(ia) += g.at(o) * xs[1].at(ib);
      else r.at(ib) += xs[0].at(ia) * g.at(o);
    });
    return r;
  };
  return d;
}

// linear(x [..., k], weight [n, k], bias [n]?): y[.., j] = sum_l x[.., l] * weight[j, l] + bias[j],
// x's leading dims taken as rows. dx[.., l] = sum_j g[.., j] * weight[j, l]; dweight[j, l] sums
// g[.., j] * x[.., l] over the rows; dbias[j] sums g[.., j] over the rows.
Definition linear() {
  // Calls f(row, j, l) for every term x[row, l] * weight[j, l].
  auto terms = [](Xs xs, const std::function<void(int64_t, int64_t, int64_t)>& f) {
    const int64_t rows = count_of(Dims(xs[0].shape.begin(), xs[0].shape.end() - 1));
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t j = 0; j < xs[1].shape[0]; ++j)
        for (int64_t l = 0; l < xs[1].shape[1]; ++l) f(row, j, l);
  };
  Definition d;
  d.value = [=](Xs xs) {
    const int64_t n = xs[1].shape[0], k = xs[1].shape[1];
    Dims shape(xs[0].shape.begin(), xs[0].shape.end() - 1);
    shape.push_back(n);
    Nd y = zeros(shape);
    terms(xs, [&](int64_t row, int64_t j, int64_t l) { y.at(row * n + j) += xs[0].at(row * k + l) * xs[1].at(j * k + l); });
    if (xs.size() > 2)
      for (int64_t e = 0; e < count_of(shape); ++e) y.at(e) += xs[2].at(e % n);
    return y;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t i) {
    const int64_t n = xs[1].shape[0], k = xs[1].shape[1];
    Nd r = zeros(xs[i].shape);
    if (i == 2) {
      for (int64_t e = 0; e < count_of(g.shape); ++e) r.at(e % n) += g.at(e);
      return r;
    }
    terms(xs, [&](int64_t row, int64_t j, int64_t l) {
      if (i == 0) r.at(row * k + l) += g.at(row * n + j) * xs[1].at(j * k + l);
      else r.at(j * k + l) += g.at(row * n + j) * xs[0].at(row * k + l);
    });
    return r;
  };
  return d;
}

// permute (transpose: a permutation swapping two dims): result dim j is operand dim perm[j].
Definition permutation(const Dims& perm) {
  auto source = [perm](const Dims& out_idx) {
    Dims in(perm.size());
    for (size_t j = 0; j < perm.size(); ++j) in[static_cast<size_t>(perm[j])] = out_idx[j];
    return in;
  };
  Definition d;
  d.value = [=](Xs xs) {
    Dims shape;
    for (int64_t p : perm) shape.push_back(xs[0].shape[static_cast<size_t>(p)]);
    Nd y = zeros(shape);
    for (int64_t k = 0; k < count_of(shape); ++k) y.at(k) = xs[0].at(flat_index(source(multi_index(k, shape)), xs[0].shape));
    return y;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t) {
    Nd r = zeros(xs[0].shape);
    for (int64_t k = 0; k < count_of(g.shape); ++k) r.at(flat_index(source(multi_index(k, g.shape)), xs[0].shape)) = g.at(k);
    return r;
  };
  return d;
}

// View ops: the same row-major data under the shape `shape_of` gives the operand's shape.
Definition view(std::function<Dims(const Dims&)> shape_of) {
  return {[=](Xs xs) { return Nd{shape_of(xs[0].shape), xs[0].v}; },
          [](Xs xs, const Nd& g, size_t) { return Nd{xs[0].shape, g.v}; }};
}

// A target shape with its one -1 (if any) filled in so that it holds `count` elements.
Dims filled(Dims shape, int64_t count) {
  int64_t known = 1;
  for (int64_t e : shape) known *= e == -1 ? 1 : e;
  for (int64_t& e : shape)
    if (e == -1) e = count / known;
  return shape;
}

// expand: the operand read with broadcasting against the target (-1 keeps the operand's extent);
// the gradient sums g over the copies.
Definition expand(const Dims& target) {
  auto shape_of = [target](const Dims& in) {
    Dims out = target;
    for (size_t d = 0; d < out.size(); ++d)
      if (out[d] == -1) out[d] = in[d - (out.size() - in.size())];
    return out;
  };
  Definition d;
  d.value = [=](Xs xs) {
    Nd y = zeros(shape_of(xs[0].shape));
    for (int64_t k = 0; k < count_of(y.shape); ++k) y.at(k) = xs[0].at(broadcast_read(multi_index(k, y.shape), xs[0].shape));
    return y;
  };
  d.vjp = [](Xs xs, const Nd& g, size_t) {
    Nd r = zeros(xs[0].shape);
    for (int64_t k = 0; k < count_of(g.shape); ++k) r.at(broadcast_read(multi_index(k, g.shape), xs[0].shape)) += g.at(k);
    return r;
  };
  return d;
}

// cat (stack: each operand first given a new size-1 dim at `dim`, then cat along it): operand i
// fills the slab of the result's `dim` from the sum of the earlier operands' extents.
Definition join(int64_t dim, bool stack) {
  auto as_cat = [stack, dim](Dims s) {
    if (stack) s.insert(s.begin() + dim, 1);
    return s;
  };
  auto offset = [=](Xs xs, size_t i) {
    int64_t off = 0;
    for (size_t j = 0; j < i; ++j) off += as_cat(xs[j].shape)[static_cast<size_t>(dim)];
    return off;
  };
  // The result index of element `k` of operand i.
  auto place = [=](Xs xs, size_t i, int64_t k) {
    Dims idx = multi_index(k, as_cat(xs[i].shape));
    idx[static_cast<size_t>(dim)] += offset(xs, i);
    return idx;
  };
  Definition d;
  d.value = [=](Xs xs) {
    Dims shape = as_cat(xs[0].shape);
    shape[static_cast<size_t>(dim)] = offset(xs, xs.size());
    Nd y = zeros(shape);
    for (size_t i = 0; i < xs.size(); ++i)
      for (int64_t k = 0; k < count_of(xs[i].shape); ++k) y.at(flat_index(place(xs, i, k), shape)) = xs[i].at(k);
    return y;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t i) {
    Nd r = zeros(xs[i].shape);
    for (int64_t k = 0; k < count_of(xs[i].shape); ++k) r.at(k) = g.at(flat_index(place(xs, i, k), g.shape));
    return r;
  };
  return d;
}

// narrow: `length` entries of `dim` from `start` (negative: counted from the end).
Definition narrow(int64_t dim, int64_t start_attr, int64_t length) {
  const auto u = static_cast<size_t>(dim);
  auto start_of = [=](const Dims& in) { return start_attr < 0 ? start_attr + in[u] : start_attr; };
  Definition d;
  d.value = [=](Xs xs) {
    Dims shape = xs[0].shape;
    shape[u] = length;
    Nd y = zeros(shape);
    for (int64_t k = 0; k < count_of(shape); ++k) {
      Dims idx = multi_index(k, shape);
      idx[u] += start_of(xs[0].shape);
      y.at(k) = xs[0].at(flat_index(idx, xs[0].shape));
    }
    return y;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t) {
    Nd r = zeros(xs[0].shape);
    for (int64_t k = 0; k < count_of(g.shape); ++k) {
      Dims idx = multi_index(k, g.shape);
      idx[u] += start_of(xs[0].shape);
      r.at(flat_index(idx, xs[0].shape)) = g.at(k);
    }
    return r;
  };
  return d;
}

namespace {

// The dims a reduction reduces for an operand of rank `rank`: the list (when given and not empty),
// else the one dim, else every dim.
std::vector<bool> reduced_set(const OpAttrs& a, int64_t rank) {
  std::vector<bool> r(static_cast<size_t>(rank), false);
  if (a.dims_given && !a.dims.empty()) {
    for (int64_t d : a.dims) r[static_cast<size_t>(wrap(d, rank))] = true;
  } else if (a.dim) {
    r[static_cast<size_t>(wrap(*a.dim, rank))] = true;
  } else {
    r.assign(r.size(), true);
  }
  return r;
}

// The result's shape of a reduction, and the result's flat index an operand index reduces into.
Dims reduced_shape(const Dims& in, const std::vector<bool>& red, bool keepdim) {
  Dims out;
  for (size_t d = 0; d < in.size(); ++d)
    if (!red[d]) out.push_back(in[d]);
    else if (keepdim) out.push_back(1);
  return out;
}

int64_t reduced_index(const Dims& in_idx, const std::vector<bool>& red, bool keepdim, const Dims& out_shape) {
  Dims idx;
  for (size_t d = 0; d < in_idx.size(); ++d)
    if (!red[d]) idx.push_back(in_idx[d]);
    else if (keepdim) idx.push_back(0);
  return flat_index(idx, out_shape);
}

}  // namespace

// sum and mean over a set of dims. mean divides by the number of elements each result element
// gathers, or by attrs.mean_divisor when set (the per-rank form: local sum over the global count).
Definition sum_or_mean(const OpAttrs& a, bool mean) {
  struct Plan {
    std::vector<bool> red;
    Dims out;
    double divisor;
  };
  auto plan = [a, mean](const Dims& in) {
    Plan p;
    p.red = reduced_set(a, static_cast<int64_t>(in.size()));
    p.out = reduced_shape(in, p.red, a.keepdim);
    int64_t gathered = 1;
    for (size_t d = 0; d < in.size(); ++d) gathered *= p.red[d] ? in[d] : 1;
    p.divisor = !mean ? 1.0 : a.mean_divisor ? static_cast<double>(*a.mean_divisor) : static_cast<double>(gathered);
    return p;
  };
  const bool keepdim = a.keepdim;
  Definition d;
  d.value = [=](Xs xs) {
    const Plan p = plan(xs[0].shape);
    Nd y = zeros(p.out);
    for (int64_t k = 0; k < count_of(xs[0].shape); ++k)
      y.at(reduced_index(multi_index(k, xs[0].shape), p.red, keepdim, p.out)) += xs[0].at(k);
    for (double& e : y.v) e /= p.divisor;
    return y;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t) {
    const Plan p = plan(xs[0].shape);
    Nd r = zeros(xs[0].shape);
    for (int64_t k = 0; k < count_of(xs[0].shape); ++k)
      r.at(k) = g.at(reduced_index(multi_index(k, xs[0].shape), p.red, keepdim, p.out)) / p.divisor;
    return r;
  };
  return d;
}

// amax / amin over a set of dims. Gradient: g goes to the operand positions equal to the
// extremum, split evenly among ties (a result element whose extremum appears t times sends g / t
// to each). That is libtorch's backward of amax/amin (unlike max(dim), which picks one index):
// this property draws ties half of the time for these ops and passes, and fails when the
// definition sends the whole g to every tie instead.
Definition extremum(const OpAttrs& a, bool max) {
  auto red_of = [a](const Dims& in) { return reduced_set(a, static_cast<int64_t>(in.size())); };
  const bool keepdim = a.keepdim;
  auto value = [=](Xs xs) {
    const auto red = red_of(xs[0].shape);
    const Dims out = reduced_shape(xs[0].shape, red, keepdim);
    Nd y{out, std::vector<double>(static_cast<size_t>(count_of(out)), max ? -INFINITY : INFINITY)};
    for (int64_t k = 0; k < count_of(xs[0].shape); ++k) {
      double& e = y.at(reduced_index(multi_index(k, xs[0].shape), red, keepdim, out));
      e = max ? std::max(e, xs[0].at(k)) : std::min(e, xs[0].at(k));
    }
    return y;
  };
  Definition d;
  d.value = value;
  d.vjp = [=](Xs xs, const Nd& g, size_t) {
    const auto red = red_of(xs[0].shape);
    const Nd y = value(xs);
    Nd ties = zeros(y.shape), r = zeros(xs[0].shape);
    for (int64_t k = 0; k < count_of(xs[0].shape); ++k) {
      const int64_t o = reduced_index(multi_index(k, xs[0].shape), red, keepdim, y.shape);
      if (xs[0].at(k) == y.at(o)) ties.at(o) += 1;
    }
    for (int64_t k = 0; k < count_of(xs[0].shape); ++k) {
      const int64_t o = reduced_index(multi_index(k, xs[0].shape), red, keepdim, y.shape);
      if (xs[0].at(k) == y.at(o)) r.at(k) = g.at(o) / ties.at(o);
    }
    return r;
  };
  return d;
}

// linalg_vector_norm {ord, dim, keepdim}: (sum |x|^p)^(1/p) over the reduced dims; ord inf (-inf):
// max (min) |x| (0 (inf) over no element); ord 0: the count of nonzeros. The gradient: g * sgn(x) *
// |x|^(p-1) / y^(p-1) (0 where y is 0; for p < 1, 0 where x is 0); for +-inf g * sgn(x) split evenly
// among the positions where |x| is y; for 0, none (torch's linalg_vector_norm_backward).
Definition vector_norm(const OpAttrs& a) {
  const double p = a.ord;
  if (std::isinf(p)) {  // amax (amin) of |x|, its gradient split among the ties alike, times sgn(x)
    const Definition ext = extremum(a, p > 0);
    auto abs_of = [](Xs xs) {
      std::vector<Nd> out = xs;
      for (double& e : out[0].v) e = std::abs(e);
      return out;
    };
    Definition d;
    d.value = [=](Xs xs) {
      Nd y = ext.value(abs_of(xs));
      if (p > 0)
        for (double& e : y.v) e = std::max(e, 0.0);  // over no element: 0, not amax's -inf
      return y;
    };
    d.vjp = [=](Xs xs, const Nd& g, size_t i) {
      Nd r = ext.vjp(abs_of(xs), g, i);
      for (int64_t k = 0; k < count_of(xs[0].shape); ++k) {
        const double x = xs[0].at(k);
        r.at(k) *= x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
      }
      return r;
    };
    return d;
  }
  auto red_of = [a](const Dims& in) { return reduced_set(a, static_cast<int64_t>(in.size())); };
  const bool keepdim = a.keepdim;
  auto value = [=](Xs xs) {
    const auto red = red_of(xs[0].shape);
    const Dims out = reduced_shape(xs[0].shape, red, keepdim);
    Nd y{out, std::vector<double>(static_cast<size_t>(count_of(out)), 0.0)};
    for (int64_t k = 0; k < count_of(xs[0].shape); ++k) {
      double& e = y.at(reduced_index(multi_index(k, xs[0].shape), red, keepdim, out));
      const double v = std::abs(xs[0].at(k));
      e += p == 0 ? (v != 0 ? 1.0 : 0.0) : std::pow(v, p);
    }
    if (p != 0)
      for (auto& e : y.v) e = std::pow(e, 1.0 / p);
    return y;
  };
  Definition d;
  d.value = value;
  d.vjp = [=](Xs xs, const Nd& g, size_t) {
    const auto red = red_of(xs[0].shape);
    const Nd y = value(xs);
    Nd r = zeros(xs[0].shape);
    if (p == 0) return r;
    for (int64_t k = 0; k < count_of(xs[0].shape); ++k) {
      const int64_t o = reduced_index(multi_index(k, xs[0].shape), red, keepdim, y.shape);
      const double x = xs[0].at(k), v = std::abs(x), sgn = x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
      if (p < 1) {
        if (x != 0) r.at(k) = sgn * std::pow(v, p - 1) * g.at(o) * std::pow(y.at(o), 1 - p);
      } else if (y.at(o) != 0) {
        r.at(k) = sgn * std::pow(v, p - 1) * g.at(o) / std::pow(y.at(o), p - 1);
      }
    }
    return r;
  };
  return d;
}

// softmax along `dim`: y = exp(x - max) / sum exp(x - max) on each line; dx = y * (g - sum(g * y)).
Definition softmax(int64_t dim) {
  // Applies f to every line along dim of x (with the same line of `other`, when given).
  auto along = [dim](Nd x, const std::function<void(std::vector<double>&, const std::vector<double>&)>& f,
                     const Nd* other) {
    const auto u = static_cast<size_t>(dim);
    const int64_t len = x.shape[u];
    int64_t stride = 1;
    for (size_t d = u + 1; d < x.shape.size(); ++d) stride *= x.shape[d];
    for (int64_t k = 0; k < count_of(x.shape); ++k) {
      if (multi_index(k, x.shape)[u] != 0) continue;  // k starts a line
      std::vector<double> line(static_cast<size_t>(len)), with(static_cast<size_t>(len));
      for (int64_t l = 0; l < len; ++l) {
        line[static_cast<size_t>(l)] = x.at(k + l * stride);
        if (other) with[static_cast<size_t>(l)] = other->at(k + l * stride);
      }
      f(line, with);
      for (int64_t l = 0; l < len; ++l) x.at(k + l * stride) = line[static_cast<size_t>(l)];
    }
    return x;
  };
  auto softmax_line = [](std::vector<double>& v, const std::vector<double>&) {
    double mx = -INFINITY, total = 0;
    for (double e : v) mx = std::max(mx, e);
    for (double& e : v) total += (e = std::exp(e - mx));
    for (double& e : v) e /= total;
  };
  return {[=](Xs xs) { return along(xs[0], softmax_line, nullptr); },
          [=](Xs xs, const Nd& g, size_t) {
            const Nd y = along(xs[0], softmax_line, nullptr);
            return along(g, [](std::vector<double>& gl, const std::vector<double>& yl) {
              double dot = 0;
              for (size_t k = 0; k < gl.size(); ++k) dot += gl[k] * yl[k];
              for (size_t k = 0; k < gl.size(); ++k) gl[k] = yl[k] * (gl[k] - dot);
            }, &y);
          }};
}

// The positions a selection op picks on one line (the values along `dim`), in order: a stable sort
// (ties by position), its first k for topk, the first extremum for max, min, argmax and argmin.
std::vector<int64_t> picked(const std::string& op, const OpAttrs& a, const std::vector<double>& line) {
  std::vector<int64_t> order(line.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  const bool descending = op == "topk" ? a.largest : op == "max" || op == "argmax" ? true
                          : op == "min" || op == "argmin" ? false : a.descending;
  std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) {
    return descending ? line[static_cast<size_t>(i)] > line[static_cast<size_t>(j)]
                      : line[static_cast<size_t>(i)] < line[static_cast<size_t>(j)];
  });
  if (op == "topk") order.resize(static_cast<size_t>(a.k));
  if (op != "topk" && op != "sort" && op != "argsort") order.resize(1);
  return order;
}

Definition selection(const std::string& op, const OpAttrs& a, int64_t dim) {
  const bool values = op == "max" || op == "min" || op == "sort" || op == "topk";
  const bool drops = (op == "max" || op == "min" || op == "argmax" || op == "argmin") && !a.keepdim;
  const auto u = static_cast<size_t>(dim);
  // Calls f(line, offset of the line's first element in x, stride along dim, line number) per line.
  auto lines = [u](const Dims& shape, const std::function<void(std::vector<int64_t>&, int64_t)>& f) {
    int64_t stride = 1;
    for (size_t d = u + 1; d < shape.size(); ++d) stride *= shape[d];
    const int64_t len = shape[u], outer = count_of(shape) / std::max<int64_t>(1, len * stride);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < stride; ++in) {
        std::vector<int64_t> at;
        for (int64_t j = 0; j < len; ++j) at.push_back(o * len * stride + j * stride + in);
        f(at, o * stride + in);
      }
  };
  auto out_shape = [=](const Dims& in) {
    Dims out = in;
    if (op == "topk") out[u] = a.k;
    else if (op != "sort" && op != "argsort") out[u] = 1;
    if (drops) out.erase(out.begin() + dim);
    return out;
  };
  // The flat index in the result of entry j along dim of line `line`.
  auto out_at = [=](const Dims& in, int64_t line, int64_t j) {
    const Dims out = out_shape(in);
    int64_t stride = 1;
    for (size_t d = u + 1; d < in.size(); ++d) stride *= in[d];
    const int64_t width = op == "topk" ? a.k : op == "sort" || op == "argsort" ? in[u] : 1;
    return (line / stride) * width * stride + j * stride + line % stride;
  };
  Definition d;
  d.value = [=](Xs xs) {
    Nd y = zeros(out_shape(xs[0].shape));
    lines(xs[0].shape, [&](std::vector<int64_t>& at, int64_t line) {
      std::vector<double> v;
      for (int64_t k : at) v.push_back(xs[0].at(k));
      const auto pos = picked(op, a, v);
      for (size_t j = 0; j < pos.size(); ++j)
        y.at(out_at(xs[0].shape, line, static_cast<int64_t>(j))) =
            values ? v[static_cast<size_t>(pos[j])] : static_cast<double>(pos[j]);
    });
    return y;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t) {
    Nd r = zeros(xs[0].shape);
    if (!values) return r;
    lines(xs[0].shape, [&](std::vector<int64_t>& at, int64_t line) {
      std::vector<double> v;
      for (int64_t k : at) v.push_back(xs[0].at(k));
      const auto pos = picked(op, a, v);
      for (size_t j = 0; j < pos.size(); ++j)
        r.at(at[static_cast<size_t>(pos[j])]) += g.at(out_at(xs[0].shape, line, static_cast<int64_t>(j)));
    });
    return r;
  };
  return d;
}

// gather and index_select along `dim`: the result's entry at multi-index o reads x at o with its
// `dim` position replaced by the index's value (gather: the index's entry at o; index_select: the
// index's entry o[dim]); the gradient adds g back there (scatter_add, index_add).
Definition indexed(const std::string& op, int64_t dim) {
  const auto u = static_cast<size_t>(dim);
  const bool gather = op == "gather";
  auto out_shape = [=](Xs xs) {
    if (gather) return xs[1].shape;
    Dims out = xs[0].shape;
    out[u] = xs[1].shape.at(0);
    return out;
  };
  // The flat position in x that result entry k reads.
  auto source = [=](Xs xs, int64_t k, const Dims& shape) {
    Dims o = multi_index(k, shape);
    o[u] = static_cast<int64_t>(gather ? xs[1].at(k) : xs[1].at(o[u]));
    return flat_index(o, xs[0].shape);
  };
  Definition d;
  d.value = [=](Xs xs) {
    Nd y = zeros(out_shape(xs));
    for (int64_t k = 0; k < count_of(y.shape); ++k) y.at(k) = xs[0].at(source(xs, k, y.shape));
    return y;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t) {
    Nd r = zeros(xs[0].shape);
    for (int64_t k = 0; k < count_of(g.shape); ++k) r.at(source(xs, k, g.shape)) += g.at(k);
    return r;
  };
  return d;
}

Definition scattered(const std::string& op, int64_t dim) {
  const auto u = static_cast<size_t>(dim);
  const bool index_add = op == "index_add", overwrite = op == "scatter";
  // The flat position in x that src entry k reaches.
  auto target = [=](Xs xs, int64_t k) {
    Dims o = multi_index(k, xs[2].shape);
    o[u] = static_cast<int64_t>(index_add ? xs[1].at(o[u]) : xs[1].at(k));
    return flat_index(o, xs[0].shape);
  };
  Definition d;
  d.value = [=](Xs xs) {
    Nd y = xs[0];
    for (int64_t k = 0; k < count_of(xs[2].shape); ++k) {
      if (overwrite) y.at(target(xs, k)) = xs[2].at(k);
      else y.at(target(xs, k)) += xs[2].at(k);
    }
    return y;
  };
  d.vjp = [=](Xs xs, const Nd& g, size_t i) {
    if (i == 0) {
      Nd r = g;
      if (overwrite)
        for (int64_t k = 0; k < count_of(xs[2].shape); ++k) r.at(target(xs, k)) = 0;
      return r;
    }
    Nd r = zeros(xs[2].shape);
    for (int64_t k = 0; k < count_of(xs[2].shape); ++k) r.at(k) = g.at(target(xs, k));
    return r;
  };
  return d;
}

Definition scan(int64_t dim) {
  const auto u = static_cast<size_t>(dim);
  // Sums along each line of `dim`, forwards (the value) or from the end (the gradient).
  auto running = [u](const Nd& x, bool reversed) {
    Nd y = zeros(x.shape);
    for (int64_t k = 0; k < count_of(x.shape); ++k) {
      Dims o = multi_index(k, x.shape);
      const int64_t at = o[u];
      double total = 0;
      for (int64_t i = 0; i < x.shape[u]; ++i) {
        if (reversed ? i < at : i > at) continue;
        o[u] = i;
        total += x.at(flat_index(o, x.shape));
      }
      y.at(k) = total;
    }
    return y;
  };
  Definition d;
  d.value = [=](Xs xs) { return running(xs[0], false); };
  d.vjp = [=](Xs, const Nd& g, size_t) { return running(g, true); };
  return d;
}

Definition integer_binary(const std::string& op, double value) {
  const bool quotient = op == "floor_divide";
  return elementwise(value, [quotient](double x, double y) {
    const double q = std::floor(x / y);
    return quotient ? q : x - q * y;
  }, [](double, double, size_t) { return 0.0; });
}

Definition counted(bool one_hot, int64_t n) {
  Definition d;
  d.value = [=](Xs xs) {
    const Nd& x = xs[0];
    Dims shape = one_hot ? x.shape : Dims{};
    shape.push_back(n);
    Nd y = zeros(shape);
    for (int64_t k = 0; k < count_of(x.shape); ++k) {
      const auto value = static_cast<int64_t>(x.at(k));
      y.at(one_hot ? k * n + value : value) += 1;
    }
    return y;
  };
  d.vjp = [](Xs xs, const Nd&, size_t) { return zeros(xs[0].shape); };
  return d;
}

Definition comparison(const std::string& op, double value) {
  std::function<bool(double, double)> f;
  if (op == "eq") f = [](double x, double y) { return x == y; };
  if (op == "ne") f = [](double x, double y) { return x != y; };
  if (op == "lt") f = [](double x, double y) { return x < y; };
  if (op == "le") f = [](double x, double y) { return x <= y; };
  if (op == "gt") f = [](double x, double y) { return x > y; };
  if (op == "ge") f = [](double x, double y) { return x >= y; };
  if (op == "logical_and") f = [](double x, double y) { return x != 0 && y != 0; };
  if (op == "logical_or") f = [](double x, double y) { return x != 0 || y != 0; };
  if (op == "logical_not") f = [](double x, double) { return x == 0; };
  if (!f) throw std::invalid_argument("no comparison \"" + op + "\"");
  return elementwise(value, [f](double x, double y) { return f(x, y) ? 1.0 : 0.0; },
                     [](double, double, size_t) { return 0.0; });
}

}  // namespace meshsim::kernel_nd

namespace meshsim {

using namespace kernel_nd;

void kernels_match_definitions() {
  // Every op with a kernel, in the catalog's order, and twice the ops whose kernels take the most
  // forms (gelu's approximation, a rank's vocab or class range, the norms' parameters, the
  // extrema's ties; those three times).
  static const std::vector<OpId> drawn = [] {
    std::vector<OpId> ids;
    for (const OpSchema& s : op_catalog())
      if (s.kernel) ids.push_back(s.id);
    for (const char* o : {"gelu", "embedding", "pick_target", "nll_loss", "layer_norm", "rms_norm", "amax", "amin"})
      ids.push_back(op_id(o));
    for (const char* o : {"amax", "amin"}) ids.push_back(op_id(o));  // three times: a tie shows only at the extremum
    return ids;
  }();
  // Uniformly at every case: RapidCheck's elementOf narrows to the first ops in the early, small
  // cases, where the ops late in the catalog (and the ones drawn twice) showed no bug in 100 cases.
  const OpSchema& schema = op_schema(*rc::gen::resize(100, rc::gen::elementOf(drawn)));
  const std::string op = schema.name, family = schema.family;
  auto [a, xs, types] = draw_case(schema.id);
  // float32 half of the time: libtorch's float kernels take paths of their own (vectorized ones, and
  // one that left gelu's gradient unwritten for a strided incoming gradient: sim/kernels.cpp). The
  // definition then reads the operands as float32 holds them, within float32's rounding.
  // Not the norms (a row of equal values is scaled by 1 / sqrt(eps): float32's rounding of its mean
  // by 300), nor the lookups and losses.
  const bool float_kernel = family != "norm" && family != "embedding" && family != "pick_target" &&
                            family != "count_targets" && schema.gen != GenClass::Loss;
  const bool single = float_kernel && coin();
  const at::ScalarType dtype = single ? at::kFloat : at::kDouble;
  const double tol = single ? 1e-4 : 1e-12;
  if (single)
    for (size_t i = 0; i < xs.size(); ++i)
      if (i >= types.size() || types[i] == "float") xs[i] = of(tensor_of(xs[i]).to(at::kFloat));
  std::string shapes;
  for (const auto& x : xs) shapes += (shapes.empty() ? "" : " ") + dims_str(x.shape);
  std::string name = op + " of " + shapes + " " + a.str() + (single ? " in float32" : "");
  auto type_of = [&types = types](size_t i) { return i < types.size() ? types[i] : std::string("float"); };

  // The kernel under test, with the planted bug of the check run on (a kernel's bug is the kernel's).
  std::vector<at::Tensor> ts, floats;
  for (size_t i = 0; i < xs.size(); ++i) {
    const std::string t = type_of(i);
    // "weight": a float operand no gradient is taken of (a loss's class weight)
    ts.push_back(t == "bool"     ? tensor_of(xs[i]).to(at::kBool)
                 : t == "int64"  ? tensor_of(xs[i]).to(at::kLong)
                 : t == "weight" ? tensor_of(xs[i]).to(dtype)
                                 : tensor_of(xs[i]).to(dtype).requires_grad_(true));
    if (t == "float") floats.push_back(ts.back());
  }
  const Definition def = definition(schema.id, a, static_cast<int64_t>(xs[0].shape.size()));
  at::Tensor y;
  {
    MutantScope planted(parse_mutant(planted_mutant()));
    y = local_op(schema.id, a, ts);
  }
  const Nd want = def.value(xs);
  auto check_value = [&](const Nd& got, const std::string& kernel) {
    if (got.shape != want.shape)
      RC_FAIL(name + ": " + kernel + "'s result has shape " + dims_str(got.shape) + ", the definition's " +
              dims_str(want.shape));
    if (!(relative_error(got, want) <= tol))
      RC_FAIL(name + ": " + kernel + "'s value differs from the definition " + where(got, want));
  };
  check_value(of(y), "the kernel");
  {
    // As the runtime runs an op whose gradient it writes in closed form (sim/vjps.h): without
    // autograd, where a kernel may take a path of its own (embedding's row copy).
    at::NoGradGuard no_grad;
    MutantScope planted(parse_mutant(planted_mutant()));
    std::vector<at::Tensor> detached_ts;
    for (const auto& t : ts) detached_ts.push_back(t.detach());
    check_value(of(local_op(schema.id, a, detached_ts)), "the kernel run without autograd");
  }
  if (floats.empty() || !y.requires_grad()) return;  // count_targets: no gradient
  at::Tensor gt = tensor_of(draw_values(want.shape, false)).to(y.scalar_type());
  const Nd g = of(gt);
  // The incoming gradient laid out column-major now and then, as a transpose or a matmul's backward
  // hands it on: a kernel must not depend on its operands' strides.
  if (gt.dim() >= 2 && coin()) {
    gt = gt.transpose(-1, -2).contiguous().transpose(-1, -2);
    name += ", its gradient strided";
  }
  const auto grads = torch::autograd::grad({y}, floats, {gt}, false, false, true);
  // The closed-form VJP (sim/vjps.h), where the op has one for these operands: the DTensor runtime's
  // gradient of a rank's kernel, with the planted bug of the check run on, as the kernel ran.
  std::vector<at::Tensor> closed(xs.size());
  {
    MutantScope planted(parse_mutant(planted_mutant()));
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> plain;
    for (const auto& t : ts) plain.push_back(t.detach());
    std::vector<size_t> wrt;
    for (size_t i = 0; i < xs.size(); ++i)
      if (type_of(i) == "float") wrt.push_back(i);
    if (has_closed_vjp(schema.id, plain)) {
      // All at once half of the time (as the runtime asks where no operand's gradient moves), else
      // one by one: a row that shares work between operands must give each the same.
      if (coin()) {
        const auto got = closed_vjp(schema.id, a, plain, y.detach(), gt, wrt);
        for (size_t k = 0; k < wrt.size(); ++k) closed[wrt[k]] = got[k];
      } else {
        for (size_t i : wrt) closed[i] = closed_vjp(schema.id, a, plain, y.detach(), gt, {i}).at(0);
      }
    }
  }
  auto check = [&](const Nd& dgot, const Nd& dwant, size_t i, const std::string& whose) {
    if (dgot.shape != dwant.shape)
      RC_FAIL(name + ": " + whose + " of operand " + std::to_string(i) + " has shape " + dims_str(dgot.shape) +
              ", the operand " + dims_str(dwant.shape));
    if (!(relative_error(dgot, dwant) <= tol))
      RC_FAIL(name + ": " + whose + " of operand " + std::to_string(i) + " differs from the definition's " +
              where(dgot, dwant));
  };
  for (size_t i = 0, f = 0; i < xs.size(); ++i) {
    if (type_of(i) != "float") continue;
    const Nd dwant = def.vjp(xs, g, i);
    check(grads[f].defined() ? of(grads[f]) : zeros(xs[i].shape), dwant, i, "the gradient");
    ++f;
    if (closed[i].defined()) {
      if (closed[i].scalar_type() != ts[i].scalar_type())
        RC_FAIL(name + ": the closed-form gradient (sim/vjps.cpp) of operand " + std::to_string(i) + " is " +
                std::string(c10::toString(closed[i].scalar_type())) + ", the operand " +
                std::string(c10::toString(ts[i].scalar_type())));
      check(of(closed[i]), dwant, i, "the closed-form gradient (sim/vjps.cpp)");
    }
  }
}

}  // namespace meshsim

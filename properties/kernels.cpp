// The per-rank kernels against their definitions. The fake mesh and the single-device oracle run
// the same kernels (sim/local_ops.cpp), so a wrong kernel would pass every differential property;
// here each op's forward and its gradient (through libtorch autograd, as the runtime takes it) are
// checked against the op's definition written out element by element, with std:: math.
#include "properties/kernels.h"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <rapidcheck.h>
#include <torch/csrc/autograd/autograd.h>

#include "core/propagation.h"
#include "sim/local_ops.h"

namespace meshsim {

namespace {

// A dense row-major [m, n] matrix of doubles: the definitions' own data type.
struct Mat {
  int64_t m = 0, n = 0;
  std::vector<double> v;
  double& at(int64_t i, int64_t j) { return v[static_cast<size_t>(i * n + j)]; }
  double at(int64_t i, int64_t j) const { return v[static_cast<size_t>(i * n + j)]; }
};

Mat zeros(int64_t m, int64_t n) { return {m, n, std::vector<double>(static_cast<size_t>(m * n), 0.0)}; }

Mat of(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kDouble).contiguous();
  const int64_t m = c.dim() > 0 ? c.size(0) : 1, n = c.dim() > 1 ? c.size(1) : 1;
  return {m, n, std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel())};
}

at::Tensor tensor_of(const Mat& a) { return at::tensor(a.v, at::kDouble).reshape({a.m, a.n}); }

// An op's definition: its value and the gradient of sum(g * op(xs)) with respect to operand i.
struct Definition {
  std::function<Mat(const std::vector<Mat>&)> value;
  std::function<Mat(const std::vector<Mat>&, const Mat& g, size_t i)> vjp;
};

// Elementwise ops from the scalar function and its partial derivatives.
Definition elementwise(std::function<double(double, double)> f, std::function<double(double, double, size_t)> df) {
  Definition d;
  d.value = [f](const std::vector<Mat>& xs) {
    Mat y = xs[0];
    for (size_t k = 0; k < y.v.size(); ++k) y.v[k] = f(xs[0].v[k], xs.size() > 1 ? xs[1].v[k] : 0.0);
    return y;
  };
  d.vjp = [df](const std::vector<Mat>& xs, const Mat& g, size_t i) {
    Mat r = g;
    for (size_t k = 0; k < r.v.size(); ++k) r.v[k] = g.v[k] * df(xs[0].v[k], xs.size() > 1 ? xs[1].v[k] : 0.0, i);
    return r;
  };
  return d;
}

// Reductions over `dim` of an [m, n] matrix (both dims when absent), kept as a [m', n'] matrix
// (the result's shape is compared separately). `scale` is 1 (sum) or 1/count (mean).
Definition reduction(std::optional<int64_t> dim, bool mean) {
  auto reduced = [dim](int64_t d) { return !dim || *dim == d; };
  Definition out;
  out.value = [=](const std::vector<Mat>& xs) {
    const Mat& x = xs[0];
    Mat y = zeros(reduced(0) ? 1 : x.m, reduced(1) ? 1 : x.n);
    const double count = (reduced(0) ? x.m : 1) * (reduced(1) ? x.n : 1);
    for (int64_t i = 0; i < x.m; ++i)
      for (int64_t j = 0; j < x.n; ++j) y.at(reduced(0) ? 0 : i, reduced(1) ? 0 : j) += x.at(i, j);
    if (mean)
      for (auto& e : y.v) e /= count;
    return y;
  };
  out.vjp = [=](const std::vector<Mat>& xs, const Mat& g, size_t) {
    const Mat& x = xs[0];
    Mat r = zeros(x.m, x.n);
    const double count = (reduced(0) ? x.m : 1) * (reduced(1) ? x.n : 1);
    for (int64_t i = 0; i < x.m; ++i)
      for (int64_t j = 0; j < x.n; ++j) r.at(i, j) = g.at(reduced(0) ? 0 : i, reduced(1) ? 0 : j) / (mean ? count : 1.0);
    return r;
  };
  return out;
}

Definition definition(const std::string& op, const OpAttrs& a) {
  using V = const std::vector<Mat>&;
  if (op == "add") return elementwise([](double x, double y) { return x + y; }, [](double, double, size_t) { return 1.0; });
  if (op == "sub")
    return elementwise([](double x, double y) { return x - y; }, [](double, double, size_t i) { return i == 0 ? 1.0 : -1.0; });
  if (op == "mul")
    return elementwise([](double x, double y) { return x * y; }, [](double x, double y, size_t i) { return i == 0 ? y : x; });
  if (op == "div")
    return elementwise([](double x, double y) { return x / y; },
                       [](double x, double y, size_t i) { return i == 0 ? 1.0 / y : -x / (y * y); });
  if (op == "neg") return elementwise([](double x, double) { return -x; }, [](double, double, size_t) { return -1.0; });
  const double c = a.value;
  if (op == "scale") return elementwise([c](double x, double) { return c * x; }, [c](double, double, size_t) { return c; });
  if (op == "exp") return elementwise([](double x, double) { return std::exp(x); }, [](double x, double, size_t) { return std::exp(x); });
  if (op == "relu")
    return elementwise([](double x, double) { return x > 0 ? x : 0.0; }, [](double x, double, size_t) { return x > 0 ? 1.0 : 0.0; });
  if (op == "sin") return elementwise([](double x, double) { return std::sin(x); }, [](double x, double, size_t) { return std::cos(x); });
  if (op == "tanh")
    return elementwise([](double x, double) { return std::tanh(x); },
                       [](double x, double, size_t) { return 1.0 - std::tanh(x) * std::tanh(x); });
  if (op == "sum" || op == "mean") return reduction(a.dim, op == "mean");
  if (op == "mm") {
    auto product = [](const Mat& x, const Mat& y, bool tx, bool ty) {  // op(x) @ op(y), op a transpose or not
      const int64_t m = tx ? x.n : x.m, k = tx ? x.m : x.n, n = ty ? y.m : y.n;
      Mat r = zeros(m, n);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          for (int64_t l = 0; l < k; ++l) r.at(i, j) += (tx ? x.at(l, i) : x.at(i, l)) * (ty ? y.at(j, l) : y.at(l, j));
      return r;
    };
    return {[product](V xs) { return product(xs[0], xs[1], false, false); },
            [product](V xs, const Mat& g, size_t i) { return i == 0 ? product(g, xs[1], false, true) : product(xs[0], g, true, false); }};
  }
  if (op == "transpose") {
    const bool swaps = a.dim0 != a.dim1;
    auto t = [swaps](const Mat& x) {
      if (!swaps) return x;
      Mat r = zeros(x.n, x.m);
      for (int64_t i = 0; i < x.m; ++i)
        for (int64_t j = 0; j < x.n; ++j) r.at(j, i) = x.at(i, j);
      return r;
    };
    return {[t](V xs) { return t(xs[0]); }, [t](V, const Mat& g, size_t) { return t(g); }};
  }
  if (op == "softmax") {
    const int64_t dim = *a.dim;
    // Along dim 1 (rows); dim 0 by transposing in and out.
    auto along = [dim](Mat x, const std::function<void(std::vector<double>&, const std::vector<double>&)>& f,
                       const Mat* other) {
      const bool cols = dim == 0;
      const int64_t lines = cols ? x.n : x.m, len = cols ? x.m : x.n;
      for (int64_t l = 0; l < lines; ++l) {
        std::vector<double> line(static_cast<size_t>(len)), with(static_cast<size_t>(len));
        for (int64_t k = 0; k < len; ++k) {
          line[static_cast<size_t>(k)] = cols ? x.at(k, l) : x.at(l, k);
          if (other) with[static_cast<size_t>(k)] = cols ? other->at(k, l) : other->at(l, k);
        }
        f(line, with);
        for (int64_t k = 0; k < len; ++k) (cols ? x.at(k, l) : x.at(l, k)) = line[static_cast<size_t>(k)];
      }
      return x;
    };
    auto softmax_line = [](std::vector<double>& v, const std::vector<double>&) {
      double mx = -INFINITY, total = 0;
      for (double e : v) mx = std::max(mx, e);
      for (double& e : v) total += (e = std::exp(e - mx));
      for (double& e : v) e /= total;
    };
    return {[=](V xs) { return along(xs[0], softmax_line, nullptr); },
            [=](V xs, const Mat& g, size_t) {
              const Mat y = along(xs[0], softmax_line, nullptr);
              // dx = y * (g - sum(g * y)) along the dim.
              return along(g, [](std::vector<double>& gl, const std::vector<double>& yl) {
                double dot = 0;
                for (size_t k = 0; k < gl.size(); ++k) dot += gl[k] * yl[k];
                for (size_t k = 0; k < gl.size(); ++k) gl[k] = yl[k] * (gl[k] - dot);
              }, &y);
            }};
  }
  throw std::invalid_argument("no definition for op \"" + op + "\"");
}

// The largest difference between a kernel's result and the definition's, relative to the
// definition's magnitude (libm and libtorch's vectorized math may differ in the last bits).
double relative_error(const Mat& got, const Mat& want) {
  double err = 0, scale = 1;
  for (size_t k = 0; k < want.v.size(); ++k) {
    err = std::max(err, std::abs(got.v[k] - want.v[k]));
    scale = std::max(scale, std::abs(want.v[k]));
  }
  return err / scale;
}

std::string where(const Mat& got, const Mat& want) {
  size_t worst = 0;
  for (size_t k = 0; k < want.v.size(); ++k)
    if (std::abs(got.v[k] - want.v[k]) > std::abs(got.v[worst] - want.v[worst])) worst = k;
  const auto i = static_cast<int64_t>(worst) / std::max<int64_t>(1, want.n), j = static_cast<int64_t>(worst) % std::max<int64_t>(1, want.n);
  return "at [" + std::to_string(i) + ", " + std::to_string(j) + "]: expected " + std::to_string(want.v[worst]) +
         ", got " + std::to_string(got.v[worst]);
}

}  // namespace

void kernels_match_definitions() {
  std::vector<std::pair<std::string, size_t>> ops;  // (op, arity)
  for (const auto& f : rule_families())
    for (const auto& o : f.ops) ops.emplace_back(o, f.arity);
  const auto [op, arity] = *rc::gen::elementOf(ops);
  const int64_t m = *rc::gen::inRange<int64_t>(1, 5), k = *rc::gen::inRange<int64_t>(1, 5);
  OpAttrs a;
  a.value = *rc::gen::element(-2.0, -0.5, 0.0, 1.5, 3.0);
  a.keepdim = *rc::gen::arbitrary<bool>();
  if (op == "softmax" || *rc::gen::arbitrary<bool>()) a.dim = *rc::gen::inRange<int64_t>(0, 2);
  a.dim0 = *rc::gen::inRange<int64_t>(0, 2);
  a.dim1 = *rc::gen::inRange<int64_t>(0, 2);
  if (*rc::gen::arbitrary<bool>()) a = with_global_shape(a, {m, k});  // mean by the count, as ranks do
  // Small integers as halves, so no relu sits at its kink; divisors kept away from zero.
  auto draw = [](int64_t rows, int64_t cols, bool positive) {
    Mat x = zeros(rows, cols);
    for (auto& e : x.v) e = positive ? *rc::gen::inRange(1, 9) / 2.0 : (*rc::gen::inRange(-8, 9) + 0.5) / 2.0;
    return x;
  };
  std::vector<Mat> xs = {draw(m, k, false)};
  if (arity == 2) xs.push_back(op == "mm" ? draw(k, *rc::gen::inRange<int64_t>(1, 5), false) : draw(m, k, op == "div"));

  std::vector<at::Tensor> ts;
  for (const auto& x : xs) ts.push_back(tensor_of(x).requires_grad_(true));
  const Definition def = definition(op, a);
  const at::Tensor y = local_op(op, a, ts);
  const Mat want = def.value(xs);
  RC_ASSERT(y.numel() == static_cast<int64_t>(want.v.size()));
  const double forward = relative_error(of(y), want);
  if (forward > 1e-12) RC_FAIL(op + " " + a.str() + ": the kernel's value differs from the definition " + where(of(y), want));
  Mat g = draw(want.m, want.n, false);
  const at::Tensor gt = tensor_of(g).reshape(y.sizes());
  const auto grads = torch::autograd::grad({y}, ts, {gt}, false, false, true);
  for (size_t i = 0; i < arity; ++i) {
    const Mat got = grads[i].defined() ? of(grads[i]) : zeros(xs[i].m, xs[i].n);
    const Mat dwant = def.vjp(xs, g, i);
    if (relative_error(got, dwant) > 1e-12)
      RC_FAIL(op + " " + a.str() + ": the gradient of operand " + std::to_string(i) + " differs from the definition's " +
              where(got, dwant));
  }
}

}  // namespace meshsim

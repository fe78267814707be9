// The closed-form VJPs: one row per op that has one, by name. Each row writes the derivative as
// libtorch's own backward formula for the kernel computes it (the same backward kernels where
// libtorch has one: softmax, tanh, gelu, embedding ...), so a rank's gradient is autograd's to
// rounding. The ops without a row (attention, the losses' composite forms, scatter, the random
// ops ...) keep their autograd graphs.
#include "sim/vjps.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <ATen/ExpandUtils.h>

#include "core/mutants.h"
#include "sim/local_ops.h"

namespace meshsim {

namespace {

using Xs = std::vector<at::Tensor>;
using Vjp = at::Tensor (*)(const OpAttrs&, const Xs&, const at::Tensor& y, const at::Tensor& g, size_t i);

// A gradient as the engine hands it to an operand: summed over the dims the op broadcast it along,
// then cast to the operand's dtype.
at::Tensor to_operand(at::Tensor grad, const at::Tensor& x) {
  if (!grad.sizes().equals(x.sizes())) grad = at::sum_to(grad, x.sizes());
  if (grad.scalar_type() != x.scalar_type()) grad = grad.to(x.scalar_type());
  return grad;
}

// g expanded back over the dims a reduction removed (or kept as 1), to x's shape.
at::Tensor unreduce(const at::Tensor& g, const at::Tensor& x, const OpAttrs& a) {
  if (x.dim() == 0) return g;
  at::Tensor grown = g;
  if (!a.keepdim) {
    std::vector<int64_t> dims = reduced_dims(x, a);
    std::sort(dims.begin(), dims.end());
    for (int64_t d : dims) grown = grown.unsqueeze(d);
  }
  return grown.expand(x.sizes());
}

// matmul of operands of 2 dims or more: [.., m, k] @ [k, n] with the first operand's leading dims
// folded into its rows (as libtorch's matmul runs it), else batched, each gradient summed over
// the batch dims its operand was broadcast along. A 1-D operand keeps autograd.
bool matmul_form(const Xs& xs) { return xs.at(0).dim() >= 2 && xs.at(1).dim() >= 2; }

at::Tensor matmul_vjp(const Xs& xs, const at::Tensor& g, size_t i) {
  const at::Tensor &a = xs[0], &b = xs[1];
  if (b.dim() == 2) {  // rows counted, not -1: an empty shard's reshape would be ambiguous
    int64_t rows = 1;
    for (int64_t d = 0; d + 1 < a.dim(); ++d) rows *= a.size(d);
    const at::Tensor g2 = g.reshape({rows, b.size(1)});
    if (i == 0) return g2.mm(b.t()).reshape(a.sizes());
    return a.reshape({rows, a.size(-1)}).t().mm(g2);
  }
  if (i == 0) return to_operand(at::matmul(g, b.transpose(-1, -2)), a);
  return to_operand(at::matmul(a.transpose(-1, -2), g), b);
}

// rms_norm: y = x * r * w, r = rsqrt(mean(x^2) + eps) over the normalized dims. With h = g * w:
// dx = r * h - x * r^3 * mean(h * x), dw = g * x * r summed to w's shape. r once for both.
void rms_norm_vjp(const OpAttrs& a, const Xs& xs, const at::Tensor& g, const std::vector<size_t>& wrt,
                  std::vector<at::Tensor>& out) {
  const at::Tensor& x = xs[0];
  const std::vector<int64_t> dims = normalized_dims(x, a);
  const at::Tensor r = at::rsqrt(x.pow(2).mean(dims, /*keepdim=*/true) + rms_norm_eps(x, a));
  for (size_t k = 0; k < wrt.size(); ++k) {
    if (wrt[k] == 1) {
      out[k] = to_operand(g * (x * r), xs[1]);
      continue;
    }
    const at::Tensor h = xs.size() > 1 ? g * xs[1] : g;
    out[k] = to_operand(r * h - x * r.pow(3) * (h * x).mean(dims, /*keepdim=*/true), x);
  }
}

// embedding's weight: the incoming rows added into the rows their ids name (libtorch's dense
// embedding backward); on a vocab shard, the ids of its range only.
at::Tensor embedding_vjp(const OpAttrs& a, const Xs& xs, const at::Tensor& g) {
  const at::Tensor &ids = xs[0], &w = xs[1];
  if (!a.range) return at::embedding_dense_backward(g, ids, w.size(0), -1, false);
  if (w.size(0) == 0) return at::zeros_like(w);
  auto [local, in] = local_ids(ids, *a.range);
  return at::embedding_dense_backward(at::where(in.unsqueeze(-1), g, at::zeros({}, g.options())), local, w.size(0),
                                      -1, false);
}

// pick_target's log-probabilities: -g at each kept target's column, 0 elsewhere.
at::Tensor pick_target_vjp(const OpAttrs& a, const Xs& xs, const at::Tensor& g) {
  const at::Tensor &logp = xs[0], &target = xs[1];
  at::Tensor out = at::zeros_like(logp);
  if (logp.size(1) == 0) return out;
  if (!a.ignore_index && !a.range) return out.scatter_(1, target.unsqueeze(1), g.neg().unsqueeze(1));
  const auto [keep, index] = picked_targets(target, a);
  return out.scatter_add_(1, index.unsqueeze(1), at::where(keep, g.neg(), at::zeros({}, g.options())).unsqueeze(1));
}

at::Tensor narrow_vjp(const OpAttrs& a, const at::Tensor& x, const at::Tensor& g) {
  const int64_t d = a.dim.value_or(0), n = x.size(d);
  at::Tensor out = at::zeros_like(x);
  out.narrow(d, a.start < 0 ? a.start + n : a.start, a.length).copy_(g);
  return out;
}

// The views that keep the elements' order: g read back in the operand's shape.
at::Tensor reshape_vjp(const OpAttrs&, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) {
  return g.reshape(xs[0].sizes());
}

at::Tensor permute_vjp(const OpAttrs& a, const at::Tensor& g) {
  std::vector<int64_t> inverse(a.dims.size());
  const auto rank = static_cast<int64_t>(a.dims.size());
  for (int64_t k = 0; k < rank; ++k) inverse[static_cast<size_t>(a.dims[k] < 0 ? a.dims[k] + rank : a.dims[k])] = k;
  return g.permute(inverse);
}

// A row's gradients of several operands at once, where they share work (rms_norm's r).
using VjpAll = void (*)(const OpAttrs&, const Xs&, const at::Tensor& g, const std::vector<size_t>& wrt,
                        std::vector<at::Tensor>& out);

struct VjpRow {
  const char* op;
  Vjp vjp;  // one operand's gradient; null where `all` gives them
  bool reads_result = false;
  VjpAll all = nullptr;
};

// By name, in the catalog's (alphabetical) order.
const VjpRow kRows[] = {
    {"abs", [](const OpAttrs&, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) { return g * xs[0].sgn(); }},
    {"add",
     [](const OpAttrs& a, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t i) {
       return to_operand(g, i == 0 ? xs[0] : second_operand(a, xs));
     }},
    {"bmm",
     [](const OpAttrs&, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t i) {
       return i == 0 ? g.bmm(xs[1].transpose(1, 2)) : xs[0].transpose(1, 2).bmm(g);
     }},
    {"cos", [](const OpAttrs&, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) { return g * xs[0].sin().neg(); }},
    {"div",
     [](const OpAttrs& a, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t i) {
       const at::Tensor d = second_operand(a, xs);
       if (i == 0) return to_operand(g / d, xs[0]);
       return to_operand(g.neg() * ((xs[0] / d) / d), d);
     }},
    {"embedding",
     [](const OpAttrs& a, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) { return embedding_vjp(a, xs, g); }},
    {"exp", [](const OpAttrs&, const Xs&, const at::Tensor& y, const at::Tensor& g, size_t) { return g * y; }, true},
    {"expand",
     [](const OpAttrs&, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) { return at::sum_to(g, xs[0].sizes()); }},
    {"flatten", reshape_vjp},
    {"gelu",
     [](const OpAttrs& a, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) {
       return at::gelu_backward(g.contiguous(), xs[0], a.tanh ? "tanh" : "none");  // contiguous: sim/kernels.cpp's gelu
     }},
    {"log", [](const OpAttrs&, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) { return g / xs[0]; }},
    {"log_softmax",
     [](const OpAttrs& a, const Xs& xs, const at::Tensor& y, const at::Tensor& g, size_t) {
       return at::_log_softmax_backward_data(g, y, a.dim.value_or(-1), xs[0].scalar_type());
     },
     true},
    {"masked_fill",
     [](const OpAttrs&, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) {
       return to_operand(g.masked_fill(xs[1], 0), xs[0]);
     }},
    {"matmul", [](const OpAttrs&, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t i) { return matmul_vjp(xs, g, i); }},
    {"mean",
     [](const OpAttrs& a, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) {
       const at::Tensor& x = xs[0];
       if (a.mean_divisor) return unreduce(g / static_cast<double>(*a.mean_divisor), x, a);
       if (x.dim() == 0) return g;
       int64_t count = 1;
       for (int64_t d : reduced_dims(x, a)) count *= x.size(d);
       return unreduce(g, x, a) / static_cast<double>(count);
     }},
    {"mm",
     [](const OpAttrs&, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t i) {
       return i == 0 ? g.mm(xs[1].t()) : xs[0].t().mm(g);
     }},
    {"mul",
     [](const OpAttrs& a, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t i) {
       const at::Tensor z = second_operand(a, xs);
       return i == 0 ? to_operand(g * z, xs[0]) : to_operand(g * xs[0], z);
     }},
    {"narrow", [](const OpAttrs& a, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) { return narrow_vjp(a, xs[0], g); }},
    {"neg", [](const OpAttrs&, const Xs&, const at::Tensor&, const at::Tensor& g, size_t) { return g.neg(); }},
    {"permute", [](const OpAttrs& a, const Xs&, const at::Tensor&, const at::Tensor& g, size_t) { return permute_vjp(a, g); }},
    {"pick_target",
     [](const OpAttrs& a, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) { return pick_target_vjp(a, xs, g); }},
    {"pow",
     [](const OpAttrs& a, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) {
       if (a.exponent == 0.0) return at::zeros_like(xs[0]);
       return g * (xs[0].pow(a.exponent - 1.0) * a.exponent);
     }},
    {"relu",
     [](const OpAttrs&, const Xs&, const at::Tensor& y, const at::Tensor& g, size_t) { return at::threshold_backward(g, y, 0); },
     true},
    {"reshape", reshape_vjp},
    {"rms_norm", nullptr, false, rms_norm_vjp},
    {"rsqrt",
     [](const OpAttrs&, const Xs&, const at::Tensor& y, const at::Tensor& g, size_t) { return g * y.pow(3) * -0.5; }, true},
    {"scale", [](const OpAttrs& a, const Xs&, const at::Tensor&, const at::Tensor& g, size_t) { return g * a.value; }},
    {"sigmoid",
     [](const OpAttrs&, const Xs&, const at::Tensor& y, const at::Tensor& g, size_t) { return at::sigmoid_backward(g, y); },
     true},
    {"silu", [](const OpAttrs&, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) { return at::silu_backward(g, xs[0]); }},
    {"sin", [](const OpAttrs&, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) { return g * xs[0].cos(); }},
    {"softmax",
     [](const OpAttrs& a, const Xs& xs, const at::Tensor& y, const at::Tensor& g, size_t) {
       return at::_softmax_backward_data(g, y, a.dim.value_or(-1), xs[0].scalar_type());
     },
     true},
    {"sqrt", [](const OpAttrs&, const Xs&, const at::Tensor& y, const at::Tensor& g, size_t) { return g / (y * 2); }, true},
    {"squeeze", reshape_vjp},
    {"sub",
     [](const OpAttrs& a, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t i) {
       return i == 0 ? to_operand(g, xs[0]) : to_operand(g.neg(), second_operand(a, xs));
     }},
    {"sum", [](const OpAttrs& a, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) { return unreduce(g, xs[0], a); }},
    {"tanh",
     [](const OpAttrs&, const Xs&, const at::Tensor& y, const at::Tensor& g, size_t) { return at::tanh_backward(g, y); }, true},
    {"to", [](const OpAttrs&, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t) { return g.to(xs[0].scalar_type()); }},
    {"transpose",
     [](const OpAttrs& a, const Xs&, const at::Tensor&, const at::Tensor& g, size_t) { return g.transpose(a.dim0, a.dim1); }},
    {"tril", [](const OpAttrs& a, const Xs&, const at::Tensor&, const at::Tensor& g, size_t) { return g.tril(a.diagonal); }},
    {"triu", [](const OpAttrs& a, const Xs&, const at::Tensor&, const at::Tensor& g, size_t) { return g.triu(a.diagonal); }},
    {"unflatten", reshape_vjp},
    {"unsqueeze", reshape_vjp},
    {"view", reshape_vjp},
    {"where",
     [](const OpAttrs&, const Xs& xs, const at::Tensor&, const at::Tensor& g, size_t i) {
       const at::Tensor none = at::zeros({}, g.options());
       return to_operand(i == 1 ? at::where(xs[0], g, none) : at::where(xs[0], none, g), xs[i]);
     }},
};

// The rows by OpId (null: no closed form). A row must name a differentiable op with a kernel.
const std::vector<const VjpRow*>& vjp_table() {
  static const std::vector<const VjpRow*> table = [] {
    std::vector<const VjpRow*> t(op_count(), nullptr);
    for (const VjpRow& row : kRows) {
      const OpSchema* s = find_op(row.op);
      if (!s || !s->kernel || !s->differentiable)
        throw std::logic_error(std::string("sim/vjps.cpp has a row for \"") + row.op +
                               "\", which is not a differentiable op with a kernel in the op catalog");
      t[s->id] = &row;
    }
    return t;
  }();
  return table;
}

const VjpRow* row_of(OpId op) {
  const auto& t = vjp_table();
  return op < t.size() ? t[op] : nullptr;
}

}  // namespace

bool has_closed_vjp(OpId op, const std::vector<at::Tensor>& xs) {
  const VjpRow* row = row_of(op);
  if (!row) return false;
  for (const auto& x : xs)
    if (x.defined() && at::isFloatingType(x.scalar_type()) && x.scalar_type() != at::kFloat &&
        x.scalar_type() != at::kDouble)
      return false;
  const std::string_view name = row->op;
  if (name == "gelu" && mutant_on(Mutant::GeluTanhDerivative)) return false;
  if (name == "matmul") return matmul_form(xs);
  return true;
}

bool closed_vjp_reads_result(OpId op) {
  const VjpRow* row = row_of(op);
  return row && row->reads_result;
}

std::vector<at::Tensor> closed_vjp(OpId op, const OpAttrs& attrs, const std::vector<at::Tensor>& xs,
                                   const at::Tensor& y, const at::Tensor& g, const std::vector<size_t>& wrt) {
  const VjpRow* row = row_of(op);
  if (!row) throw std::logic_error("closed_vjp: op \"" + std::string(op_schema(op).name) + "\" has no closed form");
  std::vector<at::Tensor> out(wrt.size());
  if (row->all) row->all(attrs, xs, g, wrt, out);
  else
    for (size_t k = 0; k < wrt.size(); ++k) out[k] = row->vjp(attrs, xs, y, g, wrt[k]);
  for (size_t k = 0; k < wrt.size(); ++k)
    if (out[k].scalar_type() != xs.at(wrt[k]).scalar_type()) out[k] = out[k].to(xs[wrt[k]].scalar_type());
  return out;
}

}  // namespace meshsim

// The per-rank kernels: the math of each op on plain tensors, one row per op of the catalog with
// a kernel (core/ops.h), in a table indexed by the op's id. A rank runs its locals through them and
// the single-device oracle its global tensors, so a call is one index into the table (the name's
// one lookup in the catalog aside), not a walk along a chain of names.
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include <ATen/Dispatch.h>
#include <torch/csrc/autograd/custom_function.h>

#include "core/error.h"
#include "core/mutants.h"
#include "core/ops.h"
#include "sim/data.h"
#include "sim/local_ops.h"

namespace meshsim {

// ---------------------------------------------------------------------------------------------
// Shared with the closed-form VJPs (sim/vjps.cpp)

std::vector<int64_t> normalized_dims(const at::Tensor& x, const OpAttrs& attrs) {
  std::vector<int64_t> dims;
  for (int64_t d = x.dim() - static_cast<int64_t>(attrs.normalized_shape.size()); d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

double rms_norm_eps(const at::Tensor& x, const OpAttrs& attrs) {
  return attrs.eps.value_or(x.scalar_type() == at::kFloat ? std::numeric_limits<float>::epsilon()
                                                          : std::numeric_limits<double>::epsilon());
}

at::Tensor second_operand(const OpAttrs& attrs, const std::vector<at::Tensor>& xs) {
  if (attrs.scalar && xs.size() == 1) return at::scalar_tensor(attrs.value, xs.at(0).options().requires_grad(false));
  return xs.at(1);
}

// Planted bug vocab_lookup_unmasked: ids outside the range are clamped into it and not masked.
std::pair<at::Tensor, at::Tensor> local_ids(const at::Tensor& ids, const Chunk& range) {
  at::Tensor in = (ids >= range.offset).logical_and(ids < range.offset + range.size);
  if (mutant_on(Mutant::VocabLookupUnmasked) && range.size > 0)
    return {(ids - range.offset).clamp(0, range.size - 1), at::ones_like(in)};
  return {at::where(in, ids - range.offset, at::zeros_like(ids)), in};
}

std::pair<at::Tensor, at::Tensor> picked_targets(const at::Tensor& target, const OpAttrs& attrs) {
  at::Tensor keep = attrs.ignore_index ? target.ne(*attrs.ignore_index) : at::ones_like(target, at::kBool);
  at::Tensor index = target;
  if (attrs.range) {
    auto [local, in] = local_ids(target, *attrs.range);
    keep = keep.logical_and(in);
    index = local;
  }
  return {keep, at::where(keep, index, at::zeros_like(index))};
}

namespace {

using Xs = std::vector<at::Tensor>;

at::Tensor reduce_sum(const at::Tensor& x, const OpAttrs& attrs) {
  if (x.dim() == 0) return x.clone();
  return at::sum(x, reduced_dims(x, attrs), attrs.keepdim);
}

// mean: on a rank, the local sum over the global count (OpAttrs::mean_divisor), so that a shard
// of a reduced dim is a P(sum) of the global mean, even and uneven shards alike (an empty shard
// gives 0, not NaN); on the global tensor (no divisor), at::mean.
// Under semantics pytorch (local_mean) the value is the rank's local mean, NaN on an empty shard,
// while the gradient is the global count's, as PyTorch's autograd computes it.
at::Tensor reduce_mean(const at::Tensor& x, const OpAttrs& attrs) {
  if (attrs.mean_divisor && attrs.local_mean) {
    const at::Tensor global = reduce_sum(x, attrs) / static_cast<double>(*attrs.mean_divisor);
    const at::Tensor local = x.dim() == 0 ? x.detach().clone() : at::mean(x.detach(), reduced_dims(x, attrs), attrs.keepdim);
    return global + (local - global.detach());
  }
  if (attrs.mean_divisor) return reduce_sum(x, attrs) / static_cast<double>(*attrs.mean_divisor);
  if (x.dim() == 0) return x.clone();
  return at::mean(x, reduced_dims(x, attrs), attrs.keepdim);
}

// linalg_vector_norm {ord, dim, keepdim}. An inf (-inf) norm of an empty local is 0 (+inf), the
// identity of its P(max) (P(min)) among norms, which are never negative (at::linalg_vector_norm
// refuses an empty max or min); a finite one is at::linalg_vector_norm's (0 for ord > 0).
at::Tensor vector_norm(const at::Tensor& x, const OpAttrs& attrs) {
  const std::vector<int64_t> dims = x.dim() == 0 ? std::vector<int64_t>{} : reduced_dims(x, attrs);
  bool empty = false;
  for (int64_t d : dims) empty |= x.size(d) == 0;
  if (empty && std::isinf(attrs.ord)) {
    auto shape = x.sizes().vec();
    std::vector<int64_t> kept;
    for (int64_t d = 0; d < x.dim(); ++d) {
      const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
      if (reduced) shape[static_cast<size_t>(d)] = 1;
      if (!reduced) kept.push_back(x.size(d));
    }
    at::Tensor filled = at::full(shape, attrs.ord > 0 ? 0.0 : INFINITY, x.options());
    return attrs.keepdim ? filled : filled.reshape(kept);
  }
  if (dims.empty()) return at::linalg_vector_norm(x, attrs.ord, c10::nullopt, attrs.keepdim);
  return at::linalg_vector_norm(x, attrs.ord, dims, attrs.keepdim);
}

// amax / amin of an empty local: the identity of the reduction (-inf / +inf), so that the ranks'
// P(max) / P(min) parts reduce to the global value (at::amax refuses an empty reduction).
at::Tensor reduce_extremum(const at::Tensor& x, const OpAttrs& attrs, bool max) {
  if (x.dim() == 0) return x.clone();
  const auto dims = reduced_dims(x, attrs);
  bool empty = false;
  for (int64_t d : dims) empty |= x.size(d) == 0;
  if (empty) {
    auto shape = x.sizes().vec();
    for (int64_t d : dims) shape[d] = 1;
    at::Tensor filled = at::full(shape, max ? -INFINITY : INFINITY, x.options());
    if (attrs.keepdim) return filled;
    std::vector<int64_t> kept;
    for (int64_t d = 0; d < x.dim(); ++d)
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) kept.push_back(x.size(d));
    return filled.reshape(kept);
  }
  const at::Tensor y = max ? at::amax(x, dims, attrs.keepdim) : at::amin(x, dims, attrs.keepdim);
  if (!mutant_on(Mutant::ExtremumGradFirstTie) || !x.requires_grad()) return y;
  // Planted bug: the gradient goes whole to the first tie, as max(dim) sends it to its index.
  std::vector<int64_t> order, kept_shape;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) {
      order.push_back(d);
      kept_shape.push_back(x.size(d));
    }
  order.insert(order.end(), dims.begin(), dims.end());
  std::vector<int64_t> rows = kept_shape;
  int64_t reduced = 1;
  for (int64_t d : dims) reduced *= x.size(d);
  rows.push_back(reduced);
  const at::Tensor flat = x.permute(order).reshape(rows);
  const at::Tensor first = (max ? flat.argmax(-1, true) : flat.argmin(-1, true));
  const at::Tensor picked = flat.gather(-1, first).reshape(y.sizes());
  return y.detach() + (picked - picked.detach());
}

// The shape a view op gives this tensor: the local shape the runtime computed, else the op's own.
std::vector<int64_t> view_shape(const std::string& op, const OpAttrs& attrs, const at::Tensor& x) {
  if (attrs.local_shape) return *attrs.local_shape;
  return infer_shape(op, {x.sizes().vec()}, attrs);
}

// The view ops but expand: the elements in the view's shape. contiguous: a local is always laid
// out in row-major order, whatever op made it.
at::Tensor reshaped(const char* op, const OpAttrs& attrs, const Xs& xs) {
  return xs.at(0).reshape(view_shape(op, attrs, xs.at(0))).contiguous();
}

// A comparison's second operand: as second_operand(), but a fractional scalar `value` against int64 or
// bool data stays a float64 0-d tensor, so that the comparison promotes as PyTorch's does
// (torch.eq(ids, 0.5) is all false; the value is not truncated to the data's type).
at::Tensor compared(const OpAttrs& attrs, const Xs& xs) {
  if (attrs.scalar && xs.size() == 1 && !at::isFloatingType(xs.at(0).scalar_type()) && attrs.value != std::trunc(attrs.value))
    return at::scalar_tensor(attrs.value, xs.at(0).options().dtype(at::kDouble).requires_grad(false));
  return second_operand(attrs, xs);
}

// gelu whose backward takes its incoming gradient contiguous. libtorch's CPU gelu_backward with
// approximate none writes nothing into its result when the gradient is laid out otherwise than the
// input in float32 (pytorch/pytorch#112006; libtorch 1.13 to 2.1 at least): the gradient is then
// whatever memory held, and a run's trace depends on the allocator. A strided gradient reaches gelu
// behind a transpose, a matmul's batch dims or a stack. meshsim's determinism property found it
// (docs/findings.md).
struct ContiguousGradGelu : torch::autograd::Function<ContiguousGradGelu> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, bool tanh) {
    ctx->save_for_backward({x});
    ctx->saved_data["tanh"] = tanh;
    return at::gelu(x, tanh ? "tanh" : "none");
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables().at(0);
    const bool tanh = ctx->saved_data["tanh"].toBool();
    return {at::gelu_backward(grads.at(0).contiguous(), x, tanh ? "tanh" : "none"), at::Tensor()};
  }
};

at::Tensor gelu_op(const at::Tensor& x, bool tanh) {
  if (!x.requires_grad()) return at::gelu(x, tanh ? "tanh" : "none");
  return ContiguousGradGelu::apply(x, tanh);
}

// gelu {approximate}. Planted bug: approximate none differentiated as the tanh approximation
// (the exact value, the tanh form's gradient).
at::Tensor gelu(const at::Tensor& x, bool tanh) {
  if (tanh) return gelu_op(x, true);
  at::Tensor y = gelu_op(x, false);
  if (!mutant_on(Mutant::GeluTanhDerivative) || !x.requires_grad()) return y;
  at::Tensor approx = gelu_op(x, true);
  return y.detach() + (approx - approx.detach());
}

// rms_norm: x / sqrt(mean(x^2) + eps) * weight, eps by default the dtype's machine epsilon (as
// torch.nn.functional.rms_norm with eps=None).
at::Tensor rms_norm(const Xs& xs, const OpAttrs& attrs) {
  const at::Tensor& x = xs.at(0);
  at::Tensor y = x * at::rsqrt(x.pow(2).mean(normalized_dims(x, attrs), /*keepdim=*/true) + rms_norm_eps(x, attrs));
  return xs.size() > 1 ? y * xs[1] : y;
}

// embedding's rows copied in one pass where no autograd graph records the call (the forward of
// its closed-form VJP, a forward without gradients): a float table and int64 ids, contiguous, on
// the CPU. libtorch's embedding runs index_select (a select and an as_strided per call: half of an
// embedding's time) and the vocab mask four calls more (local_ids, where). Nothing where it does
// not apply, or where an id is outside the table (libtorch's own then raises, in its words).
std::optional<at::Tensor> copied_rows(const at::Tensor& ids, const at::Tensor& weight, const OpAttrs& attrs) {
  const auto type = weight.scalar_type();
  if ((type != at::kFloat && type != at::kDouble) || ids.scalar_type() != at::kLong || weight.dim() != 2 ||
      !weight.device().is_cpu() || !ids.device().is_cpu() || !weight.is_contiguous() || !ids.is_contiguous() ||
      (at::GradMode::is_enabled() && weight.requires_grad()) || mutant_on(Mutant::VocabLookupUnmasked))
    return std::nullopt;
  const int64_t n = ids.numel(), rows = weight.size(0), width = weight.size(1);
  // A range longer than the table: libtorch's lookup (which raises where an id falls past it).
  if (attrs.range && attrs.range->size > rows) return std::nullopt;
  // The ids this rank looks up, [lo, hi) (the table's row: id - lo); unranged, every id must be one.
  const int64_t lo = attrs.range ? attrs.range->offset : 0;
  const int64_t hi = attrs.range ? attrs.range->offset + attrs.range->size : rows;
  const int64_t* id = ids.data_ptr<int64_t>();
  if (!attrs.range && !std::all_of(id, id + n, [rows](int64_t i) { return i >= 0 && i < rows; })) return std::nullopt;
  auto shape = ids.sizes().vec();
  shape.push_back(width);
  at::Tensor out = at::empty(shape, weight.options());
  AT_DISPATCH_FLOATING_TYPES(type, "copied_rows", [&] {
    const scalar_t* w = weight.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    for (int64_t k = 0; k < n; ++k, o += width) {
      if (id[k] >= lo && id[k] < hi) std::copy_n(w + (id[k] - lo) * width, width, o);
      else std::fill_n(o, width, scalar_t(0));  // another rank's id (range only)
    }
  });
  return out;
}

// embedding(ids, weight): the rows of the weight at the ids; on a vocab-sharded rank (range), the
// ids in its range and zeros for the others (PyTorch's _MaskPartial).
at::Tensor embedding(const at::Tensor& ids, const at::Tensor& weight, const OpAttrs& attrs) {
  if (auto rows = copied_rows(ids, weight, attrs)) return *rows;
  if (!attrs.range) return at::embedding(weight, ids);
  auto [local, in] = local_ids(ids, *attrs.range);
  if (weight.size(0) == 0) {  // an empty vocab shard (uneven split): every id is another rank's
    auto shape = ids.sizes().vec();
    shape.push_back(weight.size(1));
    return at::zeros(shape, weight.options());
  }
  at::Tensor rows = at::embedding(weight, local);
  return at::where(in.unsqueeze(-1), rows, at::zeros_like(rows));
}

// -log_probs[n, target[n]], 0 where the target is ignore_index or (range) outside the rank's
// classes.
at::Tensor pick_target(const at::Tensor& logp, const at::Tensor& target, const OpAttrs& attrs) {
  // Every target kept and in range: the pick alone (the same values and gradient as the masked
  // form below, without its four masks: it was 40% of a small cross_entropy's time), as libtorch's
  // unreduced nll_loss, one kernel where gather's form was four calls (unsqueeze, gather, squeeze,
  // neg). Its ignore_index cannot match: the targets were checked to lie in [0, classes).
  if (!attrs.ignore_index && !attrs.range && logp.size(1) > 0)
    return at::nll_loss(logp, target, {}, at::Reduction::None, /*ignore_index=*/-1);
  if (logp.size(1) == 0) return at::zeros({logp.size(0)}, logp.options());
  const auto [keep, index] = picked_targets(target, attrs);
  at::Tensor picked = logp.gather(1, index.unsqueeze(1)).squeeze(1);
  // where, not a product with the mask: a gradient of inf (a mean over no kept target) stays 0
  // where nothing was picked, as libtorch's nll_loss gives.
  return -at::where(keep, picked, at::zeros_like(picked));
}

// nll_loss on whole tensors (the oracle, a local_map body): libtorch's, or, in a body with a
// class range, the masked pick summed or averaged over the targets not ignored.
at::Reduction::Reduction reduction_of(const OpAttrs& attrs) {
  return attrs.no_reduction ? at::Reduction::None : attrs.sum_reduction ? at::Reduction::Sum : at::Reduction::Mean;
}

at::Tensor nll_loss(const at::Tensor& logp, const at::Tensor& target, const OpAttrs& attrs,
                    const at::Tensor& weight = {}) {
  if (!attrs.range) return at::nll_loss(logp, target, weight, reduction_of(attrs), attrs.ignore_index.value_or(-100));
  if (attrs.no_reduction) return pick_target(logp, target, attrs);
  at::Tensor loss = pick_target(logp, target, attrs).sum();
  if (attrs.sum_reduction) return loss;
  at::Tensor count = attrs.ignore_index ? target.ne(*attrs.ignore_index).sum() : at::scalar_tensor(target.numel());
  return loss / count.to(logp.scalar_type());
}

// sort along dim, stable (ties keep their order), as values and indices; topk is its first k
// (largest: the descending sort), so that ties pick the first positions on every rank and in the
// oracle alike (at::topk leaves the order of ties to its algorithm).
std::tuple<at::Tensor, at::Tensor> stable_sort(const at::Tensor& x, int64_t dim, bool descending) {
  return at::sort(x, /*stable=*/true, dim, descending);
}

at::Tensor topk(const at::Tensor& x, const OpAttrs& a) {
  const int64_t dim = a.dim.value_or(-1);
  const at::Tensor sorted = std::get<0>(stable_sort(x, dim, a.largest));
  // A rank's shard shorter than k (only under the planted bug local_topk_sharded_dim, whose rows
  // keep a shard of dim): the rank's whole shard, sorted.
  return sorted.narrow(dim, 0, std::min(a.k, sorted.size(dim))).contiguous();
}

// max, min {dim}: the element at argmax / argmin (the first of ties), so that the gradient goes to
// that one position, as torch.max(x, dim)'s does to its index.
at::Tensor max_min(const at::Tensor& x, const OpAttrs& a, bool max) {
  const int64_t dim = a.dim.value_or(-1);
  const at::Tensor at_index = max ? at::argmax(x, dim, true) : at::argmin(x, dim, true);
  const at::Tensor y = x.gather(dim, at_index);
  return a.keepdim ? y : y.squeeze(dim);
}

// repeat_interleave {repeats, dim}: each entry of dim repeated in place (unsqueeze, expand, flatten,
// as aten's repeat_interleave.self_int does), differentiable: the gradient sums each entry's copies.
at::Tensor repeat_interleave(const at::Tensor& x, const OpAttrs& a) {
  const int64_t d = a.dim.value_or(0) < 0 ? *a.dim + x.dim() : a.dim.value_or(0);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.insert(sizes.begin() + d + 1, a.repeats);
  return x.unsqueeze(d + 1).expand(sizes).flatten(d, d + 1).contiguous();
}

// scaled_dot_product_attention, as PyTorch's math kernel (_scaled_dot_product_attention_math):
// grouped k and v heads repeated to q's (enable_gqa), scores q k^T * scale (1/sqrt(d) by default),
// the causal mask (top left: query i attends to keys j <= i), a bool mask (false: masked) or a float
// one (added), softmax over the keys, times v. A row whose every key is masked gives zeros and no
// gradient (aten::_safe_softmax), not NaN.
at::Tensor attention(const OpAttrs& a, const Xs& xs) {
  at::Tensor q = xs.at(0), k = xs.at(1), v = xs.at(2);
  // As PyTorch raises, in local code too (a program's op is checked before it runs, core/shapes.cpp).
  if (k.size(1) != q.size(1) && !a.enable_gqa)
    throw SemanticError(ErrorKind::ShapeMismatch, "scaled_dot_product_attention: q has " + std::to_string(q.size(1)) + " heads, k and v " +
                                std::to_string(k.size(1)) + ": grouped heads need enable_gqa");
  if (xs.size() > 3 && a.is_causal)
    throw SemanticError(ErrorKind::InvalidScenario, "scaled_dot_product_attention: an attn_mask and is_causal together (PyTorch refuses both)");
  if (xs.size() > 3 && xs[3].scalar_type() != at::kBool && !at::isFloatingType(xs[3].scalar_type()))
    throw SemanticError(ErrorKind::InvalidScenario, "scaled_dot_product_attention: attn_mask must be bool or float");
  if (k.size(1) > 0 && k.size(1) != q.size(1)) {
    OpAttrs heads;
    heads.dim = 1;
    heads.repeats = q.size(1) / k.size(1);
    k = repeat_interleave(k, heads);
    v = repeat_interleave(v, heads);
  }
  const double scale = a.attn_scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)) * scale;
  if (a.is_causal)
    s = s.masked_fill(at::ones({q.size(2), k.size(2)}, q.options().dtype(at::kBool)).tril().logical_not(), -INFINITY);
  if (xs.size() > 3)
    s = xs[3].scalar_type() == at::kBool ? s.masked_fill(xs[3].logical_not(), -INFINITY) : s + xs[3];
  if (s.numel() == 0 || s.size(-1) == 0) return at::matmul(s, v).contiguous();
  const at::Tensor none = s.eq(-INFINITY).all(-1, /*keepdim=*/true);
  const at::Tensor p = at::softmax(s.masked_fill(none, 0.0), -1).masked_fill(none, 0.0);
  return at::matmul(p, v).contiguous();
}

// clamp {min, max}: a bound of int64 data as an int64 scalar (a float one would promote the result).
at::Tensor clamp(const at::Tensor& x, const OpAttrs& a) {
  auto bound = [&](const std::optional<double>& v) -> c10::optional<at::Scalar> {
    if (!v) return c10::nullopt;
    if (x.scalar_type() == at::kLong && *v != std::trunc(*v))
      throw SemanticError(ErrorKind::InvalidScenario, "clamp: a bound " + std::to_string(*v) +
                                                          " against int64 data: an integer clamp takes whole bounds");
    if (x.scalar_type() == at::kLong) return at::Scalar(static_cast<int64_t>(*v));
    return at::Scalar(*v);
  };
  return at::clamp(x, bound(a.clamp_min), bound(a.clamp_max));
}

// one_hot and bincount count values in [0, high): one outside is the scenario's error (libtorch's
// would be an abort-like c10::Error, or a longer bincount), named with the value.
void check_counted(const at::Tensor& x, int64_t high, const char* op, const char* what) {
  if (x.numel() == 0) return;
  const int64_t lo = x.min().item<int64_t>(), hi = x.max().item<int64_t>();
  if (lo >= 0 && hi < high) return;
  throw SemanticError(ErrorKind::InvalidScenario, std::string(op) + ": a value " + std::to_string(lo < 0 ? lo : hi) +
                                                      " outside [0, " + std::to_string(high) + ") (" + what + ")");
}

at::Tensor one_hot(const at::Tensor& x, const OpAttrs& a) {
  check_counted(x, a.num_classes, "one_hot", "num_classes");
  return at::one_hot(x, a.num_classes);
}

at::Tensor bincount(const at::Tensor& x, const OpAttrs& a) {
  check_counted(x, a.minlength, "bincount", "minlength: the counts' length would follow the data");
  return at::bincount(x, {}, a.minlength);
}

// ---------------------------------------------------------------------------------------------
// The rows: one per op with a kernel, by name, in the catalog's (alphabetical) order.

using Kernel = at::Tensor (*)(const OpAttrs&, const Xs&);
struct KernelRow {
  const char* op;
  Kernel run;
};

// contiguous where an op may return a strided result: a local is always laid out in row-major
// order, whatever op made it.
const KernelRow kRows[] = {
    {"abs", [](const OpAttrs&, const Xs& xs) { return at::abs(xs.at(0)); }},
    {"add", [](const OpAttrs& a, const Xs& xs) { return at::add(xs.at(0), second_operand(a, xs)); }},
    {"amax", [](const OpAttrs& a, const Xs& xs) { return reduce_extremum(xs.at(0), a, true); }},
    {"amin", [](const OpAttrs& a, const Xs& xs) { return reduce_extremum(xs.at(0), a, false); }},
    {"argmax", [](const OpAttrs& a, const Xs& xs) { return at::argmax(xs.at(0), a.dim.value_or(-1), a.keepdim); }},
    {"argmin", [](const OpAttrs& a, const Xs& xs) { return at::argmin(xs.at(0), a.dim.value_or(-1), a.keepdim); }},
    {"argsort",
     [](const OpAttrs& a, const Xs& xs) { return std::get<1>(stable_sort(xs.at(0), a.dim.value_or(-1), a.descending)); }},
    {"bincount", [](const OpAttrs& a, const Xs& xs) { return bincount(xs.at(0), a); }},
    {"bmm", [](const OpAttrs&, const Xs& xs) { return at::bmm(xs.at(0), xs.at(1)); }},
    {"cat", [](const OpAttrs& a, const Xs& xs) { return at::cat(xs, a.dim.value_or(0)); }},
    {"clamp", [](const OpAttrs& a, const Xs& xs) { return clamp(xs.at(0), a); }},
    {"cos", [](const OpAttrs&, const Xs& xs) { return at::cos(xs.at(0)); }},
    {"count_targets",
     [](const OpAttrs& a, const Xs& xs) {
       at::Tensor keep = a.ignore_index ? xs.at(0).ne(*a.ignore_index) : at::ones_like(xs.at(0), at::kBool);
       return keep.to(a.float32 ? at::kFloat : at::kDouble);
     }},
    {"cross_entropy",
     [](const OpAttrs& a, const Xs& xs) {
       const at::Tensor weight = xs.size() > 2 ? xs[2] : at::Tensor();
       if (a.label_smoothing > 0)
         return at::cross_entropy_loss(xs.at(0), xs.at(1), weight, reduction_of(a), a.ignore_index.value_or(-100),
                                       a.label_smoothing);
       return nll_loss(at::log_softmax(xs.at(0), 1), xs.at(1), a, weight);
     }},
    {"cumsum", [](const OpAttrs& a, const Xs& xs) { return at::cumsum(xs.at(0), a.dim.value_or(0)); }},
    // detach: the same data without autograd history (sharing storage, as torch's).
    {"detach", [](const OpAttrs&, const Xs& xs) { return xs.at(0).detach(); }},
    {"div", [](const OpAttrs& a, const Xs& xs) { return at::div(xs.at(0), second_operand(a, xs)); }},
    // dropout: x times its factor (1 / (1 - p) where kept, 0 where dropped) at each element's global
    // index (OpAttrs::draw); training false: x.
    {"dropout",
     [](const OpAttrs& a, const Xs& xs) {
       if (!a.training) return xs.at(0).clone();
       return at::mul(xs.at(0), dropout_factor(a, xs.at(0).sizes().vec(), xs.at(0).scalar_type()));
     }},
    {"embedding", [](const OpAttrs& a, const Xs& xs) { return embedding(xs.at(0), xs.at(1), a); }},
    {"eq", [](const OpAttrs& a, const Xs& xs) { return at::eq(xs.at(0), compared(a, xs)); }},
    {"exp", [](const OpAttrs&, const Xs& xs) { return at::exp(xs.at(0)); }},
    {"expand",
     [](const OpAttrs& a, const Xs& xs) { return xs.at(0).expand(view_shape("expand", a, xs.at(0))).contiguous(); }},
    {"flatten", [](const OpAttrs& a, const Xs& xs) { return reshaped("flatten", a, xs); }},
    {"floor_divide", [](const OpAttrs& a, const Xs& xs) { return at::floor_divide(xs.at(0), second_operand(a, xs)); }},
    {"gather", [](const OpAttrs& a, const Xs& xs) { return at::gather(xs.at(0), a.dim.value_or(0), xs.at(1)); }},
    {"ge", [](const OpAttrs& a, const Xs& xs) { return at::ge(xs.at(0), compared(a, xs)); }},
    {"gelu", [](const OpAttrs& a, const Xs& xs) { return gelu(xs.at(0), a.tanh); }},
    {"gt", [](const OpAttrs& a, const Xs& xs) { return at::gt(xs.at(0), compared(a, xs)); }},
    {"index_add",
     [](const OpAttrs& a, const Xs& xs) { return at::index_add(xs.at(0), a.dim.value_or(0), xs.at(1), xs.at(2)); }},
    {"index_select",
     [](const OpAttrs& a, const Xs& xs) { return at::index_select(xs.at(0), a.dim.value_or(0), xs.at(1)); }},
    // item: the one element as a 0-d value of its dtype, without autograd history (torch's
    // _local_scalar_dense refuses any other count with this message).
    {"item",
     [](const OpAttrs&, const Xs& xs) {
       TORCH_CHECK(xs.at(0).numel() == 1, "a Tensor with ", xs.at(0).numel(), " elements cannot be converted to Scalar");
       return xs.at(0).detach().reshape({}).clone();
     }},
    {"layer_norm",
     [](const OpAttrs& a, const Xs& xs) {
       const at::Tensor w = xs.size() > 1 ? xs[1] : at::Tensor(), b = xs.size() > 2 ? xs[2] : at::Tensor();
       return at::layer_norm(xs.at(0), a.normalized_shape, w, b, a.eps.value_or(1e-5));
     }},
    {"le", [](const OpAttrs& a, const Xs& xs) { return at::le(xs.at(0), compared(a, xs)); }},
    // linear runs as one op on a rank and in the oracle; the DTensor runtime runs its parts
    // (interpreter.cpp), as PyTorch's decomposition of aten.linear does.
    {"linalg_vector_norm", [](const OpAttrs& a, const Xs& xs) { return vector_norm(xs.at(0), a); }},
    {"linear",
     [](const OpAttrs&, const Xs& xs) {
       at::Tensor y = at::matmul(xs.at(0), xs.at(1).t());
       return xs.size() > 2 ? y + xs[2] : y.contiguous();
     }},
    {"log", [](const OpAttrs&, const Xs& xs) { return at::log(xs.at(0)); }},
    {"log_softmax", [](const OpAttrs& a, const Xs& xs) { return at::log_softmax(xs.at(0), a.dim.value_or(-1)); }},
    {"logical_and", [](const OpAttrs&, const Xs& xs) { return at::logical_and(xs.at(0), xs.at(1)); }},
    {"logical_not", [](const OpAttrs&, const Xs& xs) { return at::logical_not(xs.at(0)); }},
    {"logical_or", [](const OpAttrs&, const Xs& xs) { return at::logical_or(xs.at(0), xs.at(1)); }},
    {"lt", [](const OpAttrs& a, const Xs& xs) { return at::lt(xs.at(0), compared(a, xs)); }},
    {"masked_fill", [](const OpAttrs& a, const Xs& xs) { return xs.at(0).masked_fill(xs.at(1), a.fill); }},
    {"matmul", [](const OpAttrs&, const Xs& xs) { return at::matmul(xs.at(0), xs.at(1)).contiguous(); }},
    {"max", [](const OpAttrs& a, const Xs& xs) { return max_min(xs.at(0), a, true); }},
    {"mean", [](const OpAttrs& a, const Xs& xs) { return reduce_mean(xs.at(0), a); }},
    {"min", [](const OpAttrs& a, const Xs& xs) { return max_min(xs.at(0), a, false); }},
    {"mm", [](const OpAttrs&, const Xs& xs) { return at::mm(xs.at(0), xs.at(1)); }},
    {"mul", [](const OpAttrs& a, const Xs& xs) { return at::mul(xs.at(0), second_operand(a, xs)); }},
    {"narrow",
     [](const OpAttrs& a, const Xs& xs) {
       const int64_t d = a.dim.value_or(0), n = xs.at(0).size(d);
       return xs.at(0).narrow(d, a.start < 0 ? a.start + n : a.start, a.length).contiguous();
     }},
    {"ne", [](const OpAttrs& a, const Xs& xs) { return at::ne(xs.at(0), compared(a, xs)); }},
    {"neg", [](const OpAttrs&, const Xs& xs) { return at::neg(xs.at(0)); }},
    {"nll_loss",
     [](const OpAttrs& a, const Xs& xs) { return nll_loss(xs.at(0), xs.at(1), a, xs.size() > 2 ? xs[2] : at::Tensor()); }},
    {"one_hot", [](const OpAttrs& a, const Xs& xs) { return one_hot(xs.at(0), a); }},
    {"permute", [](const OpAttrs& a, const Xs& xs) { return xs.at(0).permute(a.dims).contiguous(); }},
    {"pick_target", [](const OpAttrs& a, const Xs& xs) { return pick_target(xs.at(0), xs.at(1), a); }},
    {"pow", [](const OpAttrs& a, const Xs& xs) { return at::pow(xs.at(0), a.exponent); }},
    {"relu", [](const OpAttrs&, const Xs& xs) { return at::relu(xs.at(0)); }},
    {"remainder", [](const OpAttrs& a, const Xs& xs) { return at::remainder(xs.at(0), second_operand(a, xs)); }},
    {"repeat", [](const OpAttrs& a, const Xs& xs) { return xs.at(0).repeat(a.sizes).contiguous(); }},
    {"repeat_interleave", [](const OpAttrs& a, const Xs& xs) { return repeat_interleave(xs.at(0), a); }},
    {"reshape", [](const OpAttrs& a, const Xs& xs) { return reshaped("reshape", a, xs); }},
    {"rms_norm", [](const OpAttrs& a, const Xs& xs) { return rms_norm(xs, a); }},
    {"rsqrt", [](const OpAttrs&, const Xs& xs) { return at::rsqrt(xs.at(0)); }},
    {"scale", [](const OpAttrs& a, const Xs& xs) { return at::mul(xs.at(0), a.value); }},
    {"scaled_dot_product_attention", [](const OpAttrs& a, const Xs& xs) { return attention(a, xs); }},
    {"scatter",
     [](const OpAttrs& a, const Xs& xs) { return at::scatter(xs.at(0), a.dim.value_or(0), xs.at(1), xs.at(2)); }},
    {"scatter_add",
     [](const OpAttrs& a, const Xs& xs) { return at::scatter_add(xs.at(0), a.dim.value_or(0), xs.at(1), xs.at(2)); }},
    {"sigmoid", [](const OpAttrs&, const Xs& xs) { return at::sigmoid(xs.at(0)); }},
    {"silu", [](const OpAttrs&, const Xs& xs) { return at::silu(xs.at(0)); }},
    {"sin", [](const OpAttrs&, const Xs& xs) { return at::sin(xs.at(0)); }},
    {"softmax", [](const OpAttrs& a, const Xs& xs) { return at::softmax(xs.at(0), a.dim.value_or(-1)); }},
    {"sort",
     [](const OpAttrs& a, const Xs& xs) { return std::get<0>(stable_sort(xs.at(0), a.dim.value_or(-1), a.descending)); }},
    {"sqrt", [](const OpAttrs&, const Xs& xs) { return at::sqrt(xs.at(0)); }},
    {"squeeze", [](const OpAttrs& a, const Xs& xs) { return reshaped("squeeze", a, xs); }},
    {"stack", [](const OpAttrs& a, const Xs& xs) { return at::stack(xs, a.dim.value_or(0)); }},
    {"sub", [](const OpAttrs& a, const Xs& xs) { return at::sub(xs.at(0), second_operand(a, xs)); }},
    {"sum", [](const OpAttrs& a, const Xs& xs) { return reduce_sum(xs.at(0), a); }},
    {"tanh", [](const OpAttrs&, const Xs& xs) { return at::tanh(xs.at(0)); }},
    // A copy always (a node of its own, ToCopyBackward casting the gradient back); in the float64
    // reference the value stays float64.
    {"to",
     [](const OpAttrs& a, const Xs& xs) {
       const at::ScalarType st = float64_reference() ? at::kDouble : scalar_type(a.dtype.value_or(DType::Float64));
       return xs.at(0).to(st, /*non_blocking=*/false, /*copy=*/true);
     }},
    {"topk", [](const OpAttrs& a, const Xs& xs) { return topk(xs.at(0), a); }},
    {"transpose",
     [](const OpAttrs& a, const Xs& xs) { return at::transpose(xs.at(0), a.dim0, a.dim1).contiguous(); }},
    {"tril", [](const OpAttrs& a, const Xs& xs) { return at::tril(xs.at(0), a.diagonal); }},
    {"triu", [](const OpAttrs& a, const Xs& xs) { return at::triu(xs.at(0), a.diagonal); }},
    {"unflatten", [](const OpAttrs& a, const Xs& xs) { return reshaped("unflatten", a, xs); }},
    {"unsqueeze", [](const OpAttrs& a, const Xs& xs) { return reshaped("unsqueeze", a, xs); }},
    {"view", [](const OpAttrs& a, const Xs& xs) { return reshaped("view", a, xs); }},
    {"where", [](const OpAttrs&, const Xs& xs) { return at::where(xs.at(0), xs.at(1), xs.at(2)); }},
};

// The rows by OpId (null: no kernel), checked against the catalog at first use, and again at every
// later call when that failed (a throwing static initializer is retried).
const std::vector<const KernelRow*>& kernel_table() {
  static const std::vector<const KernelRow*> table = rows_by_op_id(kRows, "sim/kernels.cpp", "kernel");
  return table;
}

[[noreturn]] void no_kernel(std::string_view op) {
  throw SemanticError(ErrorKind::UnsupportedOp, "op \"" + std::string(op) + "\" has no local implementation");
}

}  // namespace

bool has_kernel(OpId op) { return op < kernel_table().size() && kernel_table()[op]; }

namespace {

// Whether every float operand is float16 (and one is): libtorch's CPU kernels lack most float16 ops
// (addmm, tanh, ...), which a GPU computes in float32 registers and rounds once (CUDA's opmath
// type for half, cuBLAS's float32 accumulation); run_kernel does the same.
bool all_float16(const std::vector<at::Tensor>& xs) {
  bool any = false;
  for (const auto& x : xs) {
    if (!x.defined() || !at::isFloatingType(x.scalar_type())) continue;
    if (x.scalar_type() != at::kHalf) return false;
    any = true;
  }
  return any;
}

}  // namespace

at::Tensor local_op(OpId op, const OpAttrs& attrs, const std::vector<at::Tensor>& xs) {
  const auto& table = kernel_table();
  if (op >= table.size() || !table[op]) no_kernel(op < table.size() ? op_schema(op).name : std::to_string(op));
  if (!all_float16(xs) || op == op_id("to")) return table[op]->run(attrs, xs);
  std::vector<at::Tensor> wide = xs;
  for (auto& x : wide)
    if (x.defined() && x.scalar_type() == at::kHalf) x = x.to(at::kFloat);
  at::Tensor y = table[op]->run(attrs, wide);
  return y.scalar_type() == at::kFloat ? y.to(at::kHalf) : y;
}

at::Tensor local_op(const std::string& op, const OpAttrs& attrs, const std::vector<at::Tensor>& xs) {
  const OpSchema* s = find_op(op);
  if (!s) no_kernel(op);
  return local_op(s->id, attrs, xs);
}

}  // namespace meshsim

// The attributes of an op: read from the scenario (op_attrs()), printed (OpAttrs::str()), and
// resolved for an operand (rules::resolved(): dims wrapped by its rank).
#include <algorithm>
#include <array>
#include <cmath>
#include <iomanip>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "core/propagation.h"
#include "core/rules/common.h"

namespace meshsim::rules {

std::string list_str(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

namespace {

// `dim` in [-rank, rank) as a dim in [0, rank), or nothing when out of range.
std::optional<int64_t> wrapped(int64_t dim, int64_t rank) {
  if (dim < -rank || dim >= rank) return std::nullopt;
  return dim < 0 ? dim + rank : dim;
}

// The selection and order ops (topk, sort, argsort, max, min, argmax, argmin): along one `dim`.
bool is_selection(const std::string& op) {
  const OpSchema* s = find_op(op);
  return s && (std::string_view(s->family) == "select" || std::string_view(s->family) == "select_index");
}

bool is_reduction(const std::string& op) {
  const OpSchema* s = find_op(op);
  return s && (s->gen == GenClass::Reduction || s->gen == GenClass::Extremum || s->gen == GenClass::VectorNorm);
}

}  // namespace

OpAttrs resolved(const std::string& op, const OpAttrs& attrs, int64_t rank, const std::string& operand) {
  auto wrap_in = [&](int64_t d, const char* what, int64_t r) {
    auto w = wrapped(d, r);
    if (!w)
      throw SemanticError(ErrorKind::ShapeMismatch, op + ": " + what + " " + std::to_string(d) +
                                                        " out of range for " + operand);
    return *w;
  };
  auto wrap = [&](int64_t d, const char* what) { return wrap_in(d, what, rank); };
  OpAttrs r = attrs;
  auto need_dim = [&] {
    if (!attrs.dim) throw SemanticError(ErrorKind::ShapeMismatch, op + ": needs a dim");
  };
  if (is_reduction(op)) {
    std::set<int64_t> dims;
    if (attrs.dims_given && !attrs.dims.empty()) {
      for (int64_t d : attrs.dims)
        if (!dims.insert(wrap(d, "dim")).second)
          throw SemanticError(ErrorKind::ShapeMismatch, op + ": dim " + std::to_string(d) + " appears twice");
    } else if (attrs.dim) {
      dims.insert(wrap(*attrs.dim, "dim"));
    } else {
      for (int64_t d = 0; d < rank; ++d) dims.insert(d);
    }
    r.dims.assign(dims.begin(), dims.end());
    r.dims_given = true;
    r.dim.reset();
  }
  if (op == "softmax" || op == "log_softmax" || op == "cat" || op == "narrow" || op == "unflatten" || is_selection(op) ||
      op == "gather" || op == "index_select" || op == "index_add" || op == "scatter" || op == "scatter_add" ||
      op == "cumsum" || op == "repeat_interleave") {
    need_dim();
    r.dim = wrap(*attrs.dim, "dim");
  }
  if (op == "stack" || op == "unsqueeze") {
    need_dim();
    r.dim = wrap_in(*attrs.dim, "dim", rank + 1);
  }
  if (op == "squeeze" && attrs.dim) r.dim = wrap(*attrs.dim, "dim");
  if (op == "transpose") {
    r.dim0 = wrap(attrs.dim0, "dim0");
    r.dim1 = wrap(attrs.dim1, "dim1");
  }
  if (op == "flatten") {
    r.start_dim = rank == 0 ? 0 : wrap(attrs.start_dim, "start_dim");
    r.end_dim = rank == 0 ? 0 : wrap(attrs.end_dim, "end_dim");
    if (r.start_dim > r.end_dim)
      throw SemanticError(ErrorKind::ShapeMismatch, op + ": start_dim " + std::to_string(attrs.start_dim) +
                                                        " comes after end_dim " + std::to_string(attrs.end_dim));
  }
  if (op == "permute") {
    if (static_cast<int64_t>(attrs.dims.size()) != rank)
      throw SemanticError(ErrorKind::ShapeMismatch, op + ": dims " + list_str(attrs.dims) + " must name each of the " +
                                                        std::to_string(rank) + " dims of " + operand + " once");
    std::set<int64_t> seen;
    r.dims.clear();
    for (int64_t d : attrs.dims) {
      r.dims.push_back(wrap(d, "dim"));
      if (!seen.insert(r.dims.back()).second)
        throw SemanticError(ErrorKind::ShapeMismatch, op + ": dims " + list_str(attrs.dims) + " name a dim twice");
    }
  }
  return r;
}

bool reduces(const OpAttrs& resolved_attrs, int64_t d) {
  const auto& v = resolved_attrs.dims;
  return std::find(v.begin(), v.end(), d) != v.end();
}

int64_t reduced_before(const OpAttrs& resolved_attrs, int64_t d) {
  if (resolved_attrs.keepdim) return 0;
  int64_t k = 0;
  for (int64_t r : resolved_attrs.dims) k += r < d ? 1 : 0;
  return k;
}

}  // namespace meshsim::rules

namespace meshsim {

using namespace rules;

// ---------------------------------------------------------------------------------------------
// Attributes

std::string OpAttrs::str() const {
  std::ostringstream o;
  o << std::setprecision(17);  // every double apart: the text is a cache key
  o << "dim=" << (dim ? std::to_string(*dim) : "-") << " dims=" << list_str(dims) << " dims_given=" << dims_given
    << " keepdim=" << keepdim << " value=" << value << " scalar=" << scalar << " dim0=" << dim0 << " dim1=" << dim1
    << " shape=" << list_str(shape) << " sizes=" << list_str(sizes) << " start_dim=" << start_dim
    << " end_dim=" << end_dim << " start=" << start << " length=" << length << " split_size=" << split_size
    << " chunks=" << chunks << " tanh=" << tanh << " exponent=" << exponent << " diagonal=" << diagonal
    << " normalized_shape=" << list_str(normalized_shape) << " eps=" << (eps ? std::to_string(*eps) : "-")
    << " sum_reduction=" << sum_reduction << " no_reduction=" << no_reduction
    << " label_smoothing=" << label_smoothing << " ignore_index=" << (ignore_index ? std::to_string(*ignore_index) : "-")
    << " fill=" << fill << " k=" << k << " largest=" << largest << " descending=" << descending
    << " float32=" << float32 << " ord=" << ord << " dtype=" << (dtype ? dtype_name(*dtype) : "-")
    << " range=" << (range ? std::to_string(range->offset) + "+" + std::to_string(range->size) : "-")
    << " divisor=" << (mean_divisor ? std::to_string(*mean_divisor) : "-") << " local_mean=" << local_mean
    << " local_shape=" << (local_shape ? list_str(*local_shape) : "-") << " p=" << p << " training=" << training
    << " repeats=" << repeats << " is_causal=" << is_causal << " attn_scale=" << attn_scale.value_or(NAN)
    << " enable_gqa=" << enable_gqa
    << " stream=" << draw.stream << " seed=" << draw.seed << " step=" << draw.step << " microbatch=" << draw.microbatch
    << " global=" << list_str(draw.global);
  for (const auto& idx : draw.indices) o << " indices=" << list_str(idx);
  auto bound = [&](const char* key, const std::optional<double>& v) {
    o << " " << key << "=";
    if (v) o << *v;
    else o << "-";
  };
  bound("clamp_min", clamp_min);
  bound("clamp_max", clamp_max);
  o << " num_classes=" << num_classes << " minlength=" << minlength;
  return o.str();
}

namespace {

// Fields appended as their bytes: equal keys are equal fields (a double's bits, a list's length
// before its elements).
struct KeyBytes {
  std::string out;
  template <class T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void ints(const std::vector<int64_t>& v) {
    pod(v.size());
    out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
  }
  template <class T>
  void opt(const std::optional<T>& v) {
    pod(v.has_value());
    if (v) pod(*v);
  }
};

}  // namespace

std::string OpAttrs::key() const {
  KeyBytes k;
  k.out.reserve(256);
  k.opt(dim);
  k.ints(dims);
  k.pod(dims_given);
  k.pod(keepdim);
  k.pod(value);
  k.pod(scalar);
  k.pod(dim0);
  k.pod(dim1);
  k.ints(shape);
  k.ints(sizes);
  k.pod(start_dim);
  k.pod(end_dim);
  k.pod(start);
  k.pod(length);
  k.pod(split_size);
  k.pod(chunks);
  k.pod(tanh);
  k.pod(exponent);
  k.pod(diagonal);
  k.ints(normalized_shape);
  k.opt(eps);
  k.pod(sum_reduction);
  k.pod(no_reduction);
  k.pod(label_smoothing);
  k.opt(ignore_index);
  k.pod(fill);
  k.pod(this->k);
  k.pod(largest);
  k.pod(descending);
  k.pod(float32);
  k.pod(ord);
  k.opt(dtype);
  k.pod(p);
  k.pod(training);
  k.opt(clamp_min);
  k.opt(clamp_max);
  k.pod(num_classes);
  k.pod(minlength);
  k.pod(repeats);
  k.pod(is_causal);
  k.opt(attn_scale);
  k.pod(enable_gqa);
  k.pod(draw.stream.size());
  k.out += draw.stream;
  k.pod(draw.seed);
  k.pod(draw.step);
  k.pod(draw.microbatch);
  k.pod(draw.indices.size());
  for (const auto& idx : draw.indices) k.ints(idx);
  k.ints(draw.global);
  k.pod(range.has_value());
  if (range) {
    k.pod(range->offset);
    k.pod(range->size);
  }
  k.opt(mean_divisor);
  k.pod(local_mean);
  k.pod(local_shape.has_value());
  if (local_shape) k.ints(*local_shape);
  return std::move(k.out);
}

OpAttrs with_global_shape(const std::string& op, const OpAttrs& attrs, const Shape& global_in) {
  if (op != "mean") return attrs;
  OpAttrs r = attrs;
  const auto rank = static_cast<int64_t>(global_in.size());
  OpAttrs a;
  try {
    a = resolved("mean", attrs, rank, shape_str(global_in));
  } catch (const SemanticError&) {
    return r;  // propagate() reports it
  }
  int64_t count = 1;
  for (int64_t d = 0; d < rank; ++d)
    if (reduces(a, d)) count *= global_in[d];
  r.mean_divisor = count;
  return r;
}

namespace {

// The attribute fields op_attrs() reads, found in one pass over the op's JSON object (a lookup per
// field in a map of a few keys was a tenth of a small op's time; issue #35 item 2).
enum Field : int {
  kDim, kDims, kKeepdim, kValue, kApproximate, kExponent, kDiagonal, kNormalizedShape, kEps, kReduction,
  kLabelSmoothing, kIgnoreIndex, kDim0, kDim1, kShape, kSizes, kStartDim, kEndDim, kStart, kLength, kSize,
  kChunks, kK, kLargest, kDescending, kOrd, kDtype, kMin, kMax, kNumClasses, kMinlength, kP, kTraining,
  kRepeats, kIsCausal, kScale, kEnableGqa, kStream, kFields
};

const std::unordered_map<std::string_view, Field>& field_names() {
  static const std::unordered_map<std::string_view, Field> names = {
      {"dim", kDim}, {"dims", kDims}, {"keepdim", kKeepdim}, {"value", kValue}, {"approximate", kApproximate},
      {"exponent", kExponent}, {"diagonal", kDiagonal}, {"normalized_shape", kNormalizedShape}, {"eps", kEps},
      {"reduction", kReduction}, {"label_smoothing", kLabelSmoothing}, {"ignore_index", kIgnoreIndex},
      {"dim0", kDim0}, {"dim1", kDim1}, {"shape", kShape}, {"sizes", kSizes}, {"start_dim", kStartDim},
      {"end_dim", kEndDim}, {"start", kStart}, {"length", kLength}, {"size", kSize}, {"chunks", kChunks},
      {"k", kK}, {"largest", kLargest}, {"descending", kDescending}, {"ord", kOrd}, {"dtype", kDtype},
      {"min", kMin}, {"max", kMax}, {"num_classes", kNumClasses}, {"minlength", kMinlength}, {"p", kP},
      {"training", kTraining}, {"repeats", kRepeats}, {"is_causal", kIsCausal}, {"scale", kScale},
      {"enable_gqa", kEnableGqa}, {"stream", kStream}};
  return names;
}

}  // namespace

OpAttrs op_attrs(const OpDecl& decl) {
  OpAttrs a;
  std::array<const nlohmann::json*, kFields> f{};
  if (decl.attrs.is_object()) {
    const auto& names = field_names();
    for (auto it = decl.attrs.begin(); it != decl.attrs.end(); ++it)
      if (auto n = names.find(it.key()); n != names.end()) f[n->second] = &it.value();
  }
  auto has = [&](Field k) { return f[k] != nullptr; };
  auto at = [&](Field k) -> const nlohmann::json& { return *f[k]; };
  auto integer = [&](Field k) { return has(k) && at(k).is_number_integer(); };
  auto number = [&](Field k) { return has(k) && at(k).is_number(); };
  auto boolean = [&](Field k) { return has(k) && at(k).is_boolean(); };
  auto ints = [&](Field k) {
    std::vector<int64_t> out;
    if (has(k) && at(k).is_array())
      for (const auto& v : at(k))
        if (v.is_number_integer()) out.push_back(v.get<int64_t>());
    return out;
  };
  // A text field that is present (a field of another type throws, as json::value does).
  auto text = [&](Field k) { return at(k).get<std::string>(); };
  if (integer(kDim)) a.dim = at(kDim).get<int64_t>();
  if (has(kDim) && at(kDim).is_array()) {
    a.dims = ints(kDim);
    a.dims_given = true;
  }
  if (has(kDims)) a.dims = ints(kDims);  // permute
  if (boolean(kKeepdim)) a.keepdim = at(kKeepdim).get<bool>();
  const OpSchema* schema = find_op(decl.op);
  const bool binary = schema && schema->scalar_second();
  if (number(kValue)) {
    a.value = at(kValue).get<double>();
    a.scalar = binary;
  }
  if (has(kValue) && (decl.op == "masked_fill" || decl.op == "full")) {
    if (at(kValue).is_number()) a.fill = at(kValue).get<double>();
    if (at(kValue).is_string()) a.fill = at(kValue) == "-inf" ? -INFINITY : INFINITY;
  }
  a.tanh = has(kApproximate) && text(kApproximate) == "tanh";
  if (number(kExponent)) a.exponent = at(kExponent).get<double>();
  if (integer(kDiagonal)) a.diagonal = at(kDiagonal).get<int64_t>();
  a.normalized_shape = ints(kNormalizedShape);
  if (number(kEps)) a.eps = at(kEps).get<double>();
  if (has(kReduction)) {
    const std::string reduction = text(kReduction);
    a.sum_reduction = reduction == "sum";
    a.no_reduction = reduction == "none";
  }
  if (number(kLabelSmoothing)) a.label_smoothing = at(kLabelSmoothing).get<double>();
  if (integer(kIgnoreIndex)) a.ignore_index = at(kIgnoreIndex).get<int64_t>();
  if (integer(kDim0)) a.dim0 = at(kDim0).get<int64_t>();
  if (integer(kDim1)) a.dim1 = at(kDim1).get<int64_t>();
  a.shape = ints(kShape);
  a.sizes = ints(kSizes);
  if (integer(kStartDim)) a.start_dim = at(kStartDim).get<int64_t>();
  if (integer(kEndDim)) a.end_dim = at(kEndDim).get<int64_t>();
  if (integer(kStart)) a.start = at(kStart).get<int64_t>();
  if (integer(kLength)) a.length = at(kLength).get<int64_t>();
  if (integer(kSize)) a.split_size = at(kSize).get<int64_t>();
  if (integer(kChunks)) a.chunks = at(kChunks).get<int64_t>();
  if (!a.dim && (decl.op == "sort" || decl.op == "argsort" || decl.op == "topk")) a.dim = -1;  // their default
  if (integer(kK)) a.k = at(kK).get<int64_t>();
  if (has(kLargest)) a.largest = at(kLargest).get<bool>();
  if (has(kDescending)) a.descending = at(kDescending).get<bool>();
  if (number(kOrd)) a.ord = at(kOrd).get<double>();
  if (has(kOrd) && at(kOrd).is_string()) a.ord = at(kOrd) == "-inf" ? -INFINITY : INFINITY;
  if (has(kDtype) && at(kDtype).is_string() && decl.op == "to") a.dtype = find_dtype(at(kDtype).get<std::string>());
  if (number(kMin) && decl.op == "clamp") a.clamp_min = at(kMin).get<double>();
  if (number(kMax) && decl.op == "clamp") a.clamp_max = at(kMax).get<double>();
  if (integer(kNumClasses)) a.num_classes = at(kNumClasses).get<int64_t>();
  if (integer(kMinlength)) a.minlength = at(kMinlength).get<int64_t>();
  if (number(kP)) a.p = at(kP).get<double>();
  if (boolean(kTraining)) a.training = at(kTraining).get<bool>();
  if (integer(kRepeats)) a.repeats = at(kRepeats).get<int64_t>();
  if (boolean(kIsCausal)) a.is_causal = at(kIsCausal).get<bool>();
  if (number(kScale) && decl.op == "scaled_dot_product_attention") a.attn_scale = at(kScale).get<double>();
  if (boolean(kEnableGqa)) a.enable_gqa = at(kEnableGqa).get<bool>();
  // A random op's stream (its result's name by default); other ops have none (no cache key of theirs
  // names their result).
  if (schema && (std::string_view(schema->family) == "random" || schema->gen == GenClass::RandomCreation))
    a.draw.stream = has(kStream) && at(kStream).is_string() ? at(kStream).get<std::string>() : decl.out;
  return a;
}

}  // namespace meshsim

// The attributes of an op: read from the scenario (op_attrs()), printed (OpAttrs::str()), and
// resolved for an operand (rules::resolved(): dims wrapped by its rank).
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <optional>
#include <set>
#include <sstream>
#include <string>
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

OpAttrs op_attrs(const OpDecl& decl) {
  OpAttrs a;
  static const nlohmann::json kNone = nlohmann::json::object();
  const auto& j = decl.attrs.is_object() ? decl.attrs : kNone;
  auto integer = [&](const char* key) { return j.contains(key) && j[key].is_number_integer(); };
  auto ints = [&](const char* key) {
    std::vector<int64_t> out;
    if (j.contains(key) && j[key].is_array())
      for (const auto& v : j[key])
        if (v.is_number_integer()) out.push_back(v.get<int64_t>());
    return out;
  };
  if (integer("dim")) a.dim = j["dim"].get<int64_t>();
  if (j.contains("dim") && j["dim"].is_array()) {
    a.dims = ints("dim");
    a.dims_given = true;
  }
  if (j.contains("dims")) a.dims = ints("dims");  // permute
  if (j.contains("keepdim") && j["keepdim"].is_boolean()) a.keepdim = j["keepdim"].get<bool>();
  const OpSchema* schema = find_op(decl.op);
  const bool binary = schema && schema->scalar_second();
  if (j.contains("value") && j["value"].is_number()) {
    a.value = j["value"].get<double>();
    a.scalar = binary;
  }
  if (decl.op == "masked_fill" || decl.op == "full") {
    if (j.contains("value") && j["value"].is_number()) a.fill = j["value"].get<double>();
    if (j.contains("value") && j["value"].is_string()) a.fill = j["value"] == "-inf" ? -INFINITY : INFINITY;
  }
  a.tanh = j.value("approximate", "none") == "tanh";
  if (j.contains("exponent") && j["exponent"].is_number()) a.exponent = j["exponent"].get<double>();
  if (integer("diagonal")) a.diagonal = j["diagonal"].get<int64_t>();
  a.normalized_shape = ints("normalized_shape");
  if (j.contains("eps") && j["eps"].is_number()) a.eps = j["eps"].get<double>();
  a.sum_reduction = j.value("reduction", "mean") == "sum";
  a.no_reduction = j.value("reduction", "mean") == "none";
  if (j.contains("label_smoothing") && j["label_smoothing"].is_number()) a.label_smoothing = j["label_smoothing"].get<double>();
  if (integer("ignore_index")) a.ignore_index = j["ignore_index"].get<int64_t>();
  if (integer("dim0")) a.dim0 = j["dim0"].get<int64_t>();
  if (integer("dim1")) a.dim1 = j["dim1"].get<int64_t>();
  a.shape = ints("shape");
  a.sizes = ints("sizes");
  if (integer("start_dim")) a.start_dim = j["start_dim"].get<int64_t>();
  if (integer("end_dim")) a.end_dim = j["end_dim"].get<int64_t>();
  if (integer("start")) a.start = j["start"].get<int64_t>();
  if (integer("length")) a.length = j["length"].get<int64_t>();
  if (integer("size")) a.split_size = j["size"].get<int64_t>();
  if (integer("chunks")) a.chunks = j["chunks"].get<int64_t>();
  if (!a.dim && (decl.op == "sort" || decl.op == "argsort" || decl.op == "topk")) a.dim = -1;  // their default
  if (integer("k")) a.k = j["k"].get<int64_t>();
  a.largest = j.value("largest", true);
  a.descending = j.value("descending", false);
  if (j.contains("ord") && j["ord"].is_number()) a.ord = j["ord"].get<double>();
  if (j.contains("ord") && j["ord"].is_string()) a.ord = j["ord"] == "-inf" ? -INFINITY : INFINITY;
  if (decl.op == "to" && j.contains("dtype") && j["dtype"].is_string()) a.dtype = find_dtype(j["dtype"].get<std::string>());
  if (decl.op == "clamp" && j.contains("min") && j["min"].is_number()) a.clamp_min = j["min"].get<double>();
  if (decl.op == "clamp" && j.contains("max") && j["max"].is_number()) a.clamp_max = j["max"].get<double>();
  if (integer("num_classes")) a.num_classes = j["num_classes"].get<int64_t>();
  if (integer("minlength")) a.minlength = j["minlength"].get<int64_t>();
  if (j.contains("p") && j["p"].is_number()) a.p = j["p"].get<double>();
  if (j.contains("training") && j["training"].is_boolean()) a.training = j["training"].get<bool>();
  if (integer("repeats")) a.repeats = j["repeats"].get<int64_t>();
  if (j.contains("is_causal") && j["is_causal"].is_boolean()) a.is_causal = j["is_causal"].get<bool>();
  if (decl.op == "scaled_dot_product_attention" && j.contains("scale") && j["scale"].is_number())
    a.attn_scale = j["scale"].get<double>();
  if (j.contains("enable_gqa") && j["enable_gqa"].is_boolean()) a.enable_gqa = j["enable_gqa"].get<bool>();
  // A random op's stream (its result's name by default); other ops have none (no cache key of theirs
  // names their result).
  if (schema && (std::string_view(schema->family) == "random" || schema->gen == GenClass::RandomCreation))
    a.draw.stream = j.contains("stream") && j["stream"].is_string() ? j["stream"].get<std::string>() : decl.out;
  return a;
}

}  // namespace meshsim

#include "sim/local_ops.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace meshsim {

OpAttrs op_attrs(const OpDecl& decl) {
  OpAttrs a;
  const auto& j = decl.attrs;
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
  if (j.contains("value") && j["value"].is_number()) {
    a.value = j["value"].get<double>();
    a.scalar = decl.op != "scale";
  }
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
  return a;
}

namespace {

// The reduced dims of a reduction: a list, one dim, or every dim (none given, or an empty list).
// Dims are wrapped into [0, rank) (the rules checked they are in range).
std::vector<int64_t> reduced_dims(const at::Tensor& x, const OpAttrs& attrs) {
  std::vector<int64_t> dims;
  if (attrs.dims_given && !attrs.dims.empty()) dims = attrs.dims;
  else if (attrs.dim) dims = {*attrs.dim};
  else
    for (int64_t d = 0; d < x.dim(); ++d) dims.push_back(d);
  for (auto& d : dims) d = d < 0 ? d + x.dim() : d;
  return dims;
}

at::Tensor reduce_sum(const at::Tensor& x, const OpAttrs& attrs) {
  if (x.dim() == 0) return x.clone();
  return at::sum(x, reduced_dims(x, attrs), attrs.keepdim);
}

// mean: on a rank, the local sum over the global count (OpAttrs::mean_divisor), so that a shard
// of a reduced dim is a P(sum) of the global mean, even and uneven shards alike (an empty shard
// gives 0, not NaN); on the global tensor (no divisor), at::mean.
at::Tensor reduce_mean(const at::Tensor& x, const OpAttrs& attrs) {
  if (attrs.mean_divisor) return reduce_sum(x, attrs) / static_cast<double>(*attrs.mean_divisor);
  if (x.dim() == 0) return x.clone();
  return at::mean(x, reduced_dims(x, attrs), attrs.keepdim);
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
  return max ? at::amax(x, dims, attrs.keepdim) : at::amin(x, dims, attrs.keepdim);
}

// The shape a view op gives this tensor: the local shape the runtime computed, else the op's own.
std::vector<int64_t> view_shape(const std::string& op, const OpAttrs& attrs, const at::Tensor& x) {
  if (attrs.local_shape) return *attrs.local_shape;
  return infer_shape(op, {x.sizes().vec()}, attrs);
}

// The second operand of a binary op: the tensor, or the scalar `value` as a 0-d tensor.
at::Tensor second(const OpAttrs& attrs, const std::vector<at::Tensor>& xs) {
  if (attrs.scalar && xs.size() == 1) return at::scalar_tensor(attrs.value, xs.at(0).options().requires_grad(false));
  return xs.at(1);
}

}  // namespace

bool is_split_op(const std::string& op) { return op == "split" || op == "chunk"; }

std::vector<OpAttrs> split_as_narrows(const OpDecl& decl, const std::vector<int64_t>& shape) {
  const OpAttrs a = op_attrs(decl);
  const auto rank = static_cast<int64_t>(shape.size());
  const int64_t d = a.dim.value_or(0);
  if (d < -rank || d >= rank)
    throw SemanticError(ErrorKind::ShapeMismatch, decl.path + ": " + decl.op + ": dim " + std::to_string(d) +
                                                      " out of range for " + shape_str(shape));
  const int64_t dim = d < 0 ? d + rank : d;
  std::vector<Chunk> pieces;
  try {
    pieces = split_pieces(decl.op, a, shape[static_cast<size_t>(dim)]);
  } catch (const SemanticError& e) {
    throw SemanticError(ErrorKind::ShapeMismatch, decl.path + ": " + e.what());
  }
  if (pieces.size() != decl.outs.size())
    throw SemanticError(ErrorKind::ShapeMismatch,
                        decl.path + ": " + decl.op + " of dim " + std::to_string(dim) + " of " + shape_str(shape) +
                            " gives " + std::to_string(pieces.size()) + " pieces, outs names " +
                            std::to_string(decl.outs.size()));
  std::vector<OpAttrs> out;
  for (const auto& p : pieces) {
    OpAttrs n;
    n.dim = dim;
    n.start = p.offset;
    n.length = p.size;
    out.push_back(n);
  }
  return out;
}

// In the order of rule_families().
at::Tensor local_op(const std::string& op, const OpAttrs& attrs, const std::vector<at::Tensor>& xs) {
  if (op == "add") return at::add(xs.at(0), second(attrs, xs));
  if (op == "sub") return at::sub(xs.at(0), second(attrs, xs));
  if (op == "neg") return at::neg(xs.at(0));
  if (op == "scale") return at::mul(xs.at(0), attrs.value);
  if (op == "exp") return at::exp(xs.at(0));
  if (op == "relu") return at::relu(xs.at(0));
  if (op == "sin") return at::sin(xs.at(0));
  if (op == "tanh") return at::tanh(xs.at(0));
  if (op == "mul") return at::mul(xs.at(0), second(attrs, xs));
  if (op == "div") return at::div(xs.at(0), second(attrs, xs));
  if (op == "mm") return at::mm(xs.at(0), xs.at(1));
  if (op == "bmm") return at::bmm(xs.at(0), xs.at(1));
  if (op == "matmul") return at::matmul(xs.at(0), xs.at(1)).contiguous();
  // linear runs as one op on a rank and in the oracle; the DTensor runtime runs its parts
  // (interpreter.cpp), as PyTorch's decomposition of aten.linear does.
  if (op == "linear") {
    at::Tensor y = at::matmul(xs.at(0), xs.at(1).t());
    return xs.size() > 2 ? y + xs[2] : y.contiguous();
  }
  // contiguous: a local is always laid out in row-major order, whatever op made it.
  if (op == "transpose") return at::transpose(xs.at(0), attrs.dim0, attrs.dim1).contiguous();
  if (op == "permute") return xs.at(0).permute(attrs.dims).contiguous();
  if (is_view_op(op) && op != "expand") return xs.at(0).reshape(view_shape(op, attrs, xs.at(0))).contiguous();
  if (op == "expand") return xs.at(0).expand(view_shape(op, attrs, xs.at(0))).contiguous();
  if (op == "cat") return at::cat(xs, attrs.dim.value_or(0));
  if (op == "stack") return at::stack(xs, attrs.dim.value_or(0));
  if (op == "narrow") {
    const int64_t d = attrs.dim.value_or(0), n = xs.at(0).size(d);
    return xs.at(0).narrow(d, attrs.start < 0 ? attrs.start + n : attrs.start, attrs.length).contiguous();
  }
  if (op == "mean") return reduce_mean(xs.at(0), attrs);
  if (op == "sum") return reduce_sum(xs.at(0), attrs);
  if (op == "amax") return reduce_extremum(xs.at(0), attrs, true);
  if (op == "amin") return reduce_extremum(xs.at(0), attrs, false);
  if (op == "softmax") return at::softmax(xs.at(0), attrs.dim.value_or(-1));
  throw SemanticError(ErrorKind::UnsupportedOp, "op \"" + op + "\" has no local implementation");
}

}  // namespace meshsim

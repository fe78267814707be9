#include "sim/local_ops.h"

#include "core/error.h"

namespace meshsim {

OpAttrs op_attrs(const OpDecl& decl) {
  OpAttrs a;
  const auto& j = decl.attrs;
  auto integer = [&](const char* key) { return j.contains(key) && j[key].is_number_integer(); };
  if (integer("dim")) a.dim = j["dim"].get<int64_t>();
  if (j.contains("keepdim") && j["keepdim"].is_boolean()) a.keepdim = j["keepdim"].get<bool>();
  if (j.contains("value") && j["value"].is_number()) a.value = j["value"].get<double>();
  if (integer("dim0")) a.dim0 = j["dim0"].get<int64_t>();
  if (integer("dim1")) a.dim1 = j["dim1"].get<int64_t>();
  return a;
}

namespace {

// sum over attrs.dim (every dim when absent), keeping the reduced dims as 1 when keepdim.
at::Tensor reduce_sum(const at::Tensor& x, const OpAttrs& attrs) {
  if (attrs.dim) return at::sum(x, {*attrs.dim}, attrs.keepdim);
  at::Tensor s = at::sum(x);
  return attrs.keepdim ? s.reshape(std::vector<int64_t>(x.dim(), 1)) : s;
}

// mean: on a rank, the local sum over the global count (OpAttrs::mean_divisor), so that a shard
// of a reduced dim is a P(sum) of the global mean, even and uneven shards alike (an empty shard
// gives 0, not NaN); on the global tensor (no divisor), at::mean.
at::Tensor reduce_mean(const at::Tensor& x, const OpAttrs& attrs) {
  if (attrs.mean_divisor) return reduce_sum(x, attrs) / static_cast<double>(*attrs.mean_divisor);
  if (attrs.dim) return at::mean(x, {*attrs.dim}, attrs.keepdim);
  at::Tensor m = at::mean(x);
  return attrs.keepdim ? m.reshape(std::vector<int64_t>(x.dim(), 1)) : m;
}

}  // namespace

// In the order of rule_families().
at::Tensor local_op(const std::string& op, const OpAttrs& attrs, const std::vector<at::Tensor>& xs) {
  if (op == "add") return at::add(xs.at(0), xs.at(1));
  if (op == "sub") return at::sub(xs.at(0), xs.at(1));
  if (op == "neg") return at::neg(xs.at(0));
  if (op == "scale") return at::mul(xs.at(0), attrs.value);
  if (op == "exp") return at::exp(xs.at(0));
  if (op == "relu") return at::relu(xs.at(0));
  if (op == "sin") return at::sin(xs.at(0));
  if (op == "tanh") return at::tanh(xs.at(0));
  if (op == "mul") return at::mul(xs.at(0), xs.at(1));
  if (op == "div") return at::div(xs.at(0), xs.at(1));
  if (op == "mm") return at::mm(xs.at(0), xs.at(1));
  // contiguous: a local is always laid out in row-major order, whatever op made it.
  if (op == "transpose") return at::transpose(xs.at(0), attrs.dim0, attrs.dim1).contiguous();
  if (op == "mean") return reduce_mean(xs.at(0), attrs);
  if (op == "sum") return reduce_sum(xs.at(0), attrs);
  if (op == "softmax") return at::softmax(xs.at(0), attrs.dim.value_or(-1));
  throw SemanticError(ErrorKind::UnsupportedOp, "op \"" + op + "\" has no local implementation");
}

}  // namespace meshsim

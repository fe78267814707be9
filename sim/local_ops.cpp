#include "sim/local_ops.h"

#include "core/error.h"

namespace meshsim {

OpAttrs op_attrs(const OpDecl& decl) {
  OpAttrs a;
  if (decl.attrs.contains("dim") && decl.attrs["dim"].is_number_integer()) a.dim = decl.attrs["dim"].get<int64_t>();
  if (decl.attrs.contains("keepdim") && decl.attrs["keepdim"].is_boolean()) a.keepdim = decl.attrs["keepdim"].get<bool>();
  return a;
}

at::Tensor local_op(const std::string& op, const OpAttrs& attrs, const std::vector<at::Tensor>& xs) {
  if (op == "add") return at::add(xs.at(0), xs.at(1));
  if (op == "sub") return at::sub(xs.at(0), xs.at(1));
  if (op == "mul") return at::mul(xs.at(0), xs.at(1));
  if (op == "mm") return at::mm(xs.at(0), xs.at(1));
  if (op == "sum") {
    if (attrs.dim) return at::sum(xs.at(0), {*attrs.dim}, attrs.keepdim);
    at::Tensor s = at::sum(xs.at(0));
    return attrs.keepdim ? s.reshape(std::vector<int64_t>(xs[0].dim(), 1)) : s;
  }
  throw SemanticError(ErrorKind::UnsupportedOp, "op \"" + op + "\" has no local implementation");
}

}  // namespace meshsim

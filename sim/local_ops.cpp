// What the runtimes need around the per-rank kernels (sim/kernels.cpp): a reduction's dims, split
// and chunk as narrows, a creation op's value.
#include "sim/local_ops.h"

#include <stdexcept>

#include "core/error.h"

namespace meshsim {

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

bool is_split_op(const std::string& op) {
  const OpSchema* s = find_op(op);
  return s && s->gen == GenClass::Split;
}

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

at::Tensor created_value(const OpDecl& op, DType run_dtype) {
  const auto& j = op.attrs;
  std::vector<int64_t> shape = j.at("shape").get<std::vector<int64_t>>();
  const ElementType type = parse_element_type(j.value("dtype", "float"));
  const at::ScalarType st = type == ElementType::Bool    ? at::kBool
                            : type == ElementType::Int64 ? at::kLong
                            : run_dtype == DType::Float32 ? at::kFloat
                                                          : at::kDouble;
  const auto opts = at::TensorOptions().dtype(st);
  if (op.op == "zeros") return at::zeros(shape, opts);
  if (op.op == "ones") return at::ones(shape, opts);
  if (op.op == "full") return at::full(shape, op_attrs(op).fill, opts);
  return at::arange(numel(shape), opts).reshape(shape);
}

}  // namespace meshsim

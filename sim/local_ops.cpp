// What the runtimes need around the per-rank kernels (sim/kernels.cpp): a reduction's dims, split
// and chunk as narrows, a creation op's value.
#include "sim/local_ops.h"

#include <stdexcept>

#include "core/error.h"
#include "core/layout.h"
#include "core/mutants.h"
#include "core/random.h"
#include "sim/data.h"

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
  const std::string named = j.value("dtype", "float");
  const ElementType type = parse_element_type(named);
  const DType float_dtype = float64_reference() ? DType::Float64 : find_dtype(named).value_or(run_dtype);
  const at::ScalarType st = type == ElementType::Bool    ? at::kBool
                            : type == ElementType::Int64 ? at::kLong
                                                         : scalar_type(float_dtype);
  const auto opts = at::TensorOptions().dtype(st);
  if (op.op == "zeros") return at::zeros(shape, opts);
  if (op.op == "ones") return at::ones(shape, opts);
  if (op.op == "full") return at::full(shape, op_attrs(op).fill, opts);
  // arange: start + step * i at row-major index i, computed in int64 or float64 and then cast (as
  // torch.arange computes a float range in double).
  const double start = j.value("start", 0.0), step = j.value("step", 1.0);
  if (st == at::kLong)
    return (at::arange(numel(shape), opts) * static_cast<int64_t>(step) + static_cast<int64_t>(start)).reshape(shape);
  return (at::arange(numel(shape), at::kDouble) * step + start).to(st).reshape(shape);
}

namespace {

// Per element of a block of `shape`, row-major, the global linear index its draw reads.
std::vector<uint64_t> global_indices(const OpAttrs& a, const std::vector<int64_t>& shape) {
  const auto& d = a.draw;
  const bool whole = d.indices.empty();
  if (!whole && (d.indices.size() != shape.size() || d.global.size() != shape.size()))
    throw std::logic_error("a random op's draw names " + std::to_string(d.indices.size()) + " dims for a block of " +
                           std::to_string(shape.size()));
  const std::vector<int64_t>& global = whole ? shape : d.global;
  std::vector<uint64_t> out{0};
  for (size_t k = 0; k < shape.size(); ++k) {
    std::vector<uint64_t> next;
    next.reserve(out.size() * static_cast<size_t>(shape[k]));
    for (uint64_t prefix : out)
      for (int64_t i = 0; i < shape[k]; ++i) {
        const int64_t at = whole ? i : d.indices[k].at(static_cast<size_t>(i));
        next.push_back(prefix * static_cast<uint64_t>(global[k]) + static_cast<uint64_t>(at));
      }
    out = std::move(next);
  }
  return out;
}

uint64_t key_of(const OpAttrs& a) { return random_stream_key(a.draw.seed, a.draw.stream, a.draw.step, a.draw.microbatch); }

at::Tensor of_values(const std::vector<double>& v, const std::vector<int64_t>& shape, at::ScalarType type) {
  return at::tensor(v, at::kDouble).reshape(shape).to(type);
}

}  // namespace

at::Tensor drawn_block(const OpAttrs& attrs, const std::vector<int64_t>& shape, bool normal, at::ScalarType type) {
  const uint64_t key = key_of(attrs);
  std::vector<double> v;
  for (uint64_t i : global_indices(attrs, shape)) v.push_back(normal ? normal_at(key, i) : uniform_at(key, i));
  return of_values(v, shape, type);
}

at::Tensor dropout_factor(const OpAttrs& attrs, const std::vector<int64_t>& shape, at::ScalarType type) {
  const uint64_t key = key_of(attrs);
  const double kept = attrs.p < 1.0 ? 1.0 / (1.0 - attrs.p) : 0.0;
  std::vector<double> v;
  for (uint64_t i : global_indices(attrs, shape)) v.push_back(dropout_keeps(key, i, attrs.p) ? kept : 0.0);
  return of_values(v, shape, type);
}

void place_draw(OpAttrs& attrs, const Mesh& mesh, const Spec& spec, const std::vector<int64_t>& global, int64_t rank) {
  if (!mutant_on(Mutant::DropoutShardOffsetIgnored)) {  // planted bug: every shard draws from index 0
    attrs.draw.indices = local_indices(mesh, spec, global, rank);
    attrs.draw.global = global;
  }
  if (mutant_on(Mutant::DropoutReplicasRankSeeded)) attrs.draw.seed += static_cast<uint64_t>(rank);  // planted bug
}

namespace {

// The run's float dtype (half precision included); float64 in the oracle's float64 reference.
at::ScalarType float_type(DType dtype) { return scalar_type(float64_reference() ? DType::Float64 : dtype); }

OpAttrs draw_of(const OpDecl& op, uint64_t seed) {
  OpAttrs a = op_attrs(op);
  a.draw.seed = seed;
  return a;
}

}  // namespace

std::vector<at::Tensor> drawn_locals(const OpDecl& op, const Mesh& mesh, const Spec& spec, uint64_t seed, DType dtype) {
  const std::vector<int64_t> shape = op.attrs.at("shape").get<std::vector<int64_t>>();
  std::vector<at::Tensor> out;
  for (int64_t r = 0; r < mesh.size(); ++r) {
    OpAttrs a = draw_of(op, seed);
    place_draw(a, mesh, spec, shape, r);
    out.push_back(drawn_block(a, local_layout(mesh, spec, shape, r).shape, op.op == "randn", float_type(dtype)));
  }
  return out;
}

at::Tensor drawn_value(const OpDecl& op, uint64_t seed, DType dtype) {
  const std::vector<int64_t> shape = op.attrs.at("shape").get<std::vector<int64_t>>();
  return drawn_block(draw_of(op, seed), shape, op.op == "randn", float_type(dtype));
}

}  // namespace meshsim

// The math of each op on plain tensors: what one rank computes on its locals, and what the
// single-device oracle computes on global tensors.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "core/ops.h"
#include "core/propagation.h"
#include "core/scenario.h"

namespace meshsim {

// The op's kernel (sim/kernels.cpp: a table indexed by the op's id) on `xs`. Throws
// SemanticError(UnsupportedOp) for an op without one (one the runtime handles itself, or none).
at::Tensor local_op(OpId op, const OpAttrs& attrs, const std::vector<at::Tensor>& xs);
// The same by name: one lookup in the op catalog, then the table.
at::Tensor local_op(const std::string& op, const OpAttrs& attrs, const std::vector<at::Tensor>& xs);

// Whether the op has a kernel row. The table is checked against the catalog at its first use (every
// op with `kernel` has a row, no row names another op): std::logic_error naming the op otherwise.
bool has_kernel(OpId op);

// The reduced dims of a reduction (sum, mean, amax, amin) of `x`: a list, one dim, or every dim
// (none given, or an empty list), wrapped into [0, rank).
std::vector<int64_t> reduced_dims(const at::Tensor& x, const OpAttrs& attrs);

// split and chunk run as one narrow per piece (core/propagation.h, split_pieces): the narrow's
// attributes of each piece for an operand of `shape`. Throws SemanticError(ShapeMismatch) naming
// the op's JSON path when the pieces are not as many as its `outs`.
std::vector<OpAttrs> split_as_narrows(const OpDecl& decl, const std::vector<int64_t>& shape);
bool is_split_op(const std::string& op);

// The global value a creation op (zeros, ones, full, arange) makes: its `shape`, its `dtype`
// (float: the run's), `value` for full; arange counts 0, 1, ... in row-major order.
at::Tensor created_value(const OpDecl& op, DType run_dtype);

}  // namespace meshsim

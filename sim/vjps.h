// Closed-form VJPs of the kernels (sim/kernels.cpp): the gradient of sum(g * op(xs)) with respect
// to one operand, written out with plain tensor math from the operands, the result and g, without
// libtorch's autograd. The DTensor runtime takes a rank's VJP here where the op has a row and its
// operands qualify (Runtime::apply_op): no autograd graph recorded in the forward, no engine run in
// the backward. Everywhere else, and in the single-device oracle always, the gradients are
// libtorch autograd's, so gradient_equivalence compares the two; kernels_match_definitions checks
// each row against the op's definition written out element by element.
#pragma once

#include <vector>

#include <ATen/ATen.h>

#include "core/ops.h"
#include "core/propagation.h"

namespace meshsim {

// Whether the op's VJP has a closed form for these operands: a row for the op, every float
// operand float32 or float64 (half precision runs its kernels widened: its gradient stays
// autograd's), the operands' shapes of a form the row handles (matmul: no 1-D operand), and no
// planted bug that acts through the kernel's autograd (gelu_tanh_derivative).
bool has_closed_vjp(OpId op, const std::vector<at::Tensor>& xs);

// Whether the row reads the op's result (the ops whose derivative is written with it: exp,
// softmax, ...); the others need the operands only.
bool closed_vjp_reads_result(OpId op);

// The gradients of the operands `wrt` (indices into `xs`, the kernel's operands; `y` its result,
// undefined where closed_vjp_reads_result is false) for the incoming gradient `g` (y's shape and
// dtype), in wrt's order: each of its operand's shape and dtype, as libtorch's engine hands it on
// (a broadcast operand's gradient summed over its broadcast dims, then cast to its dtype). Only
// where has_closed_vjp holds.
std::vector<at::Tensor> closed_vjp(OpId op, const OpAttrs& attrs, const std::vector<at::Tensor>& xs,
                                   const at::Tensor& y, const at::Tensor& g, const std::vector<size_t>& wrt);

}  // namespace meshsim

// The math of each op on plain tensors: what one rank computes on its locals, and what the
// single-device oracle computes on global tensors.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "core/propagation.h"
#include "core/scenario.h"

namespace meshsim {

OpAttrs op_attrs(const OpDecl& decl);
at::Tensor local_op(const std::string& op, const OpAttrs& attrs, const std::vector<at::Tensor>& xs);

}  // namespace meshsim

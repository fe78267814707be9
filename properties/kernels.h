// The per-rank kernels (sim/kernels.cpp) against the ops' definitions written out element by
// element: the one check of the kernels that does not run them on both sides.
#pragma once

#include "core/ops.h"

namespace meshsim {

// A property body: one op of the catalog with a kernel, random attributes and data; the kernel's
// value and the gradient of every operand (libtorch autograd) must equal the definition's.
void kernels_match_definitions();

// Whether the op has a definition row (properties/definitions.cpp). The table is checked against
// the catalog at its first use: std::logic_error naming the op where a row is missing or names an
// op without a kernel.
bool has_definition(OpId op);

}  // namespace meshsim

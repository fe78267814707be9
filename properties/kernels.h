// The per-rank kernels (sim/local_ops.cpp) against the ops' definitions written out element by
// element: the one check of the kernels that does not run them on both sides.
#pragma once

namespace meshsim {

// A property body: one op of the file format, random attributes and data; the kernel's value and
// the gradient of every operand (libtorch autograd) must equal the definition's.
void kernels_match_definitions();

}  // namespace meshsim

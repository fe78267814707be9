// The Reduced (Rd) label policy, SEMANTICS.md section 4: rules read Rd as R; after an op, an axis
// whose output is R becomes Rd again by the run's option `reduced_propagation`:
//   intersection: if every operand is Rd on that axis (the LTensor notes);
//   union:        if any operand is Rd on that axis (the DTensor notes);
//   strict:       all Rd -> Rd; Rd mixed with anything else is a reduced_mismatch error (JAX).
#pragma once

#include <vector>

#include "core/mesh.h"
#include "core/placement.h"
#include "core/scenario.h"

namespace meshsim {

// `operands` are the operands' specs as given to the op (before redistribution).
Spec restore_reduced(const std::string& op, const Mesh& mesh, const std::vector<Spec>& operands,
                     const Spec& out, ReducedPropagation policy);

}  // namespace meshsim

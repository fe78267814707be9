// Primal-cotangent duality, SEMANTICS.md section 2: the placement a gradient must have.
#pragma once

#include <cstdint>

#include "core/mesh.h"
#include "core/placement.h"

namespace meshsim {

struct Cotangent {
  Placement placement;
  // P(avg): the local cotangent is the replicated global cotangent times 1/n.
  bool scaled_by_inverse_group = false;
};

// S(d) -> S(d), R -> R, P(sum) -> Rd, Rd -> P(sum), P(avg) -> Rd scaled by 1/n.
// P(max) and P(min) throw SemanticError(NotDifferentiable).
Cotangent cotangent(const Placement& primal);
// Whether every placement has a cotangent (no P(max), no P(min)); never throws.
bool has_cotangent(const Spec& primal);
Spec cotangent_spec(const Spec& primal);
// The product of the group sizes of the P(avg) axes: the local cotangent is the assembled global
// cotangent divided by this.
int64_t cotangent_scale_divisor(const Mesh& mesh, const Spec& primal);

}  // namespace meshsim

#include "core/cotangent.h"

#include "core/error.h"
#include "core/mutants.h"

namespace meshsim {

Cotangent cotangent(const Placement& primal) {
  switch (primal.kind) {
    case Placement::Kind::Shard:
    case Placement::Kind::Replicate:
      return {primal, false};
    case Placement::Kind::Reduced:
      if (mutant_on(Mutant::CotangentRdAsR)) return {Placement::replicate(), false};
      return {Placement::partial(ReduceOp::Sum), false};
    case Placement::Kind::Partial:
      if (primal.op == ReduceOp::Sum)
        return {mutant_on(Mutant::CotangentPsumAsR) ? Placement::replicate() : Placement::reduced(), false};
      if (primal.op == ReduceOp::Avg) return {Placement::reduced(), true};
      throw SemanticError(ErrorKind::NotDifferentiable,
                          primal.str() + " is not differentiable: a gradient reached a " + primal.str() +
                              " value; redistribute it to R before it is used on the backward path, or, for an "
                              "amax/amin or a vector norm over a sharded dim, gather the reduced dim before the "
                              "reduction");
  }
  return {primal, false};
}

bool has_cotangent(const Spec& primal) {
  for (const auto& p : primal)
    if (p.is_partial() && !is_linear(p.op)) return false;
  return true;
}

Spec cotangent_spec(const Spec& primal) {
  Spec out;
  out.reserve(primal.size());
  for (const auto& p : primal) out.push_back(cotangent(p).placement);
  return out;
}

int64_t cotangent_scale_divisor(const Mesh& mesh, const Spec& primal) {
  int64_t d = 1;
  for (int a = 0; a < mesh.ndim(); ++a)
    if (cotangent(primal.at(a)).scaled_by_inverse_group) d *= mesh.axis_size(a);
  return d;
}

}  // namespace meshsim

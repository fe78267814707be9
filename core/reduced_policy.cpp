#include "core/reduced_policy.h"

#include "core/error.h"
#include "core/mutants.h"

namespace meshsim {

Spec restore_reduced(const std::string& op, const Mesh& mesh, const std::vector<Spec>& operands,
                     const Spec& out, ReducedPropagation policy) {
  Spec result = out;
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (!out[a].is_replicate()) continue;
    size_t reduced = 0;
    for (const auto& s : operands) reduced += s[a].is_reduced() ? 1 : 0;
    if (reduced == 0) continue;
    const bool all = reduced == operands.size();
    if (policy == ReducedPropagation::Strict && !all)
      throw SemanticError(ErrorKind::ReducedMismatch,
                          op + ": operands disagree on Reduced over mesh axis \"" + mesh.axes()[a] +
                              "\" (reduced_propagation=strict)");
    if (all && mutant_on(Mutant::ReducedLabelDropped)) continue;  // planted bug
    if (all || policy == ReducedPropagation::Union) result[a] = Placement::reduced();
  }
  return result;
}

}  // namespace meshsim

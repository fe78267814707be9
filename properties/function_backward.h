// The property function_backward_matches_reference: every registered Function's backward (the
// built-ins and the user's, plugins included) against central finite differences of its reference,
// on a one-rank mesh.
#pragma once

namespace meshsim {

void function_backward_matches_reference();

}  // namespace meshsim

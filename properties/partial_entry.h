// The property local_map_partial_entry: a Partial entering a local_map under both readings of
// `partial_in_local_map` (variant and unreduced): right programs pass both, a misuse is refused by
// the one and fails the oracle under the other.
#pragma once

namespace meshsim {

void local_map_partial_entry();

}  // namespace meshsim

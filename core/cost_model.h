// Communication volume per rank, SEMANTICS.md section 3 (the NCCL bus-bandwidth model): for a
// tensor of B bytes in full over a group of n ranks, all_gather, reduce_scatter and all_to_all
// move (n-1)/n * B, all_reduce 2(n-1)/n * B. B counts the padded chunks collectives send.
#pragma once

#include <cstdint>

#include "core/redistribute.h"

namespace meshsim {

// Bytes one rank moves for `kind` over a group of `group_size` ranks, where `full_bytes` is the
// size of the group's full (padded) tensor; rounded down. Local steps move 0.
int64_t collective_bytes(StepKind kind, int64_t full_bytes, int64_t group_size);

}  // namespace meshsim

// Communication volume per rank, SEMANTICS.md section 3 (the NCCL bus-bandwidth model): for a
// tensor of B bytes in full over a group of n ranks, all_gather, reduce_scatter and all_to_all
// move (n-1)/n * B, all_reduce 2(n-1)/n * B. B counts the padded chunks collectives send.
#pragma once

#include <cstdint>

#include <string>
#include <vector>

#include "core/redistribute.h"

namespace meshsim {

// Bytes one rank moves for `kind` over a group of `group_size` ranks, where `full_bytes` is the
// size of the group's full (padded) tensor; rounded down. Local steps move 0.
int64_t collective_bytes(StepKind kind, int64_t full_bytes, int64_t group_size);

// "3,840": a count or a byte figure with its thousands grouped, as every report prints them.
std::string grouped_digits(int64_t n);

// What redistributing a tensor of global `shape` from `from` to `to` costs one rank by this model:
// the planner's steps (plan_redistribute), each on the group's tensor (the global one divided by
// the sizes of the other axes that shard it at that step; padding not counted). Throws what the
// planner throws for an illegal move.
struct MoveCost {
  struct Step {
    StepKind kind;
    int axis;
    int64_t bytes;
  };
  std::vector<Step> steps;  // the communicating ones
  int64_t bytes = 0;
};
MoveCost estimate_move(const Mesh& mesh, const Spec& from, const Spec& to, const std::vector<int64_t>& shape,
                       int64_t element_bytes);

}  // namespace meshsim

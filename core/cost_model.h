// Communication volume per rank, SEMANTICS.md section 3 (the NCCL bus-bandwidth model): for a
// tensor of B bytes in full over a group of n ranks, all_gather, reduce_scatter and all_to_all
// move (n-1)/n * B, all_reduce 2(n-1)/n * B. B counts the padded chunks collectives send.
#pragma once

#include <cstdint>
#include <functional>

#include <string>
#include <vector>

#include "core/redistribute.h"

namespace meshsim {

// Bytes one rank moves for `kind` over a group of `group_size` ranks, where `full_bytes` is the
// size of the group's full (padded) tensor; rounded down. Local steps move 0.
int64_t collective_bytes(StepKind kind, int64_t full_bytes, int64_t group_size);

// "3,840": a count or a byte figure with its thousands grouped, as every report prints them.
std::string grouped_digits(int64_t n);

// The bytes one rank moves for `step`, given every rank's local shape before it: all_reduce the
// local tensor, all_gather the widest piece n times, reduce_scatter and all_to_all n padded chunks
// of the split dim (SEMANTICS.md section 3); the largest group's figure. The run's collectives and
// estimate_move count alike with it.
int64_t step_bytes_of(const Mesh& mesh, const RedistStep& step,
                      const std::function<std::vector<int64_t>(int64_t rank)>& local_shape, int64_t element_bytes);

// What redistributing a tensor of global `shape` from `from` to `to` costs one rank by this model:
// the planner's steps (plan_redistribute), each counted by step_bytes_of on the ranks' local shapes
// at that step. Throws what the planner throws for an illegal move.
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

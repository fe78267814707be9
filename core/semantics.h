// Semantics profiles: meshsim's own rules (the default) or PyTorch DTensor's as released. Every
// place where a profile departs from meshsim's rules is one row of `differences()`, named after the
// source it follows; the runtime asks `follows(profile, Difference)` at that place and nowhere
// else, so the table in docs/semantics.md is this table.
#pragma once

#include <string>
#include <vector>

namespace meshsim {

enum class Semantics { Meshsim, Pytorch };

const char* semantics_name(Semantics s);  // "meshsim" | "pytorch"

enum class Difference {
  MeanPartialAvg,          // mean over a sharded dim: P(avg) of local means
  NoGradientHook,          // gradient contributions keep the placement the op's backward gives them
  RedistributeBackward,    // Redistribute.backward: to the source's placements, Partial as Replicate
  ReplicateToPartialDivides,  // R -> P(sum) divides by the group size (no rank0 convention)
  LossParallelOnlyInContext,  // log_softmax over a sharded class dim gathers it (outside loss_parallel())
  LocalMapUntracked,       // local_map bodies are plain local code: no variance tracking, no casts
};

struct DifferenceRow {
  Difference id;
  const char* name;     // the switch's name, as results and docs print it
  const char* meshsim;  // what meshsim does
  const char* other;    // what the profile does instead
  const char* source;   // the file, function or issue the profile follows
};

// The rows of one profile (none for meshsim), in the order of the enum.
const std::vector<DifferenceRow>& differences(Semantics s);
bool follows(Semantics s, Difference d);

}  // namespace meshsim

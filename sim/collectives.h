// The in-process collective engine: every collective acts on the locals of one group, in group
// order, and reduces in rank order, so results are deterministic. A group's replicated result is
// one tensor shared by every member (copy on write: nothing writes a local in place).
#pragma once

#include <vector>

#include <ATen/ATen.h>

#include "core/mesh.h"
#include "core/placement.h"
#include "core/redistribute.h"

namespace meshsim {

using Locals = std::vector<at::Tensor>;

Locals all_gather(const Locals& group, int64_t dim);
Locals all_reduce(const Locals& group, ReduceOp op);
// The value of a Partial's group: all_reduce by its op; a norm's partial P(normP) as the p-th root
// of the sum of the locals' p-th powers.
at::Tensor reduce_partial(const Locals& group, const Placement& p);
Locals reduce_scatter(const Locals& group, ReduceOp op, int64_t dim);
Locals all_to_all(const Locals& group, int64_t split_dim, int64_t concat_dim);

// The split sizes of an uneven all_to_all (all_to_all_single with input_split_sizes and
// output_split_sizes): sends[k][s] is how many rows (entries of dim 0) member k sends to member s,
// taken from its local in member order. Member k receives sends[s][k] rows from each member s,
// concatenated along dim 0 in member order. The transposed table is the backward's.
using SplitTable = std::vector<std::vector<int64_t>>;
SplitTable transposed(const SplitTable& sends);
// Every member's pieces moved by the table (rows of dim 0; sizes checked by the caller: each row of
// `sends` sums to its member's extent, none negative).
Locals all_to_all_split(const Locals& group, const SplitTable& sends);

// The rank's torch.chunk piece of `t` along dim for coordinate `coord` of `n`.
at::Tensor chunk_piece(const at::Tensor& t, int64_t dim, int64_t n, int64_t coord);

// Applies one planned step to the locals of every rank of the mesh (rank order).
Locals apply_step(const Mesh& mesh, const RedistStep& step, const Locals& locals);

// Bytes one rank moves for a step (cost model, the largest over the step's groups).
int64_t step_bytes(const Mesh& mesh, const RedistStep& step, const Locals& locals);

}  // namespace meshsim

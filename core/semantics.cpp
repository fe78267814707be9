#include "core/semantics.h"

#include <algorithm>

namespace meshsim {

const char* semantics_name(Semantics s) { return s == Semantics::Pytorch ? "pytorch" : "meshsim"; }

const std::vector<DifferenceRow>& differences(Semantics s) {
  static const std::vector<DifferenceRow> none;
  // PyTorch DTensor as released in 2.9 to 2.11 (torch/distributed/tensor/).
  static const std::vector<DifferenceRow> pytorch = {
      {Difference::MeanPartialAvg, "mean_partial_avg",
       "mean over a sharded dim is P(sum): each rank's local sum over the global count, exact on uneven shards",
       "P(avg) of each rank's local mean: wrong on uneven shards, NaN on an empty one; the backward divides by the "
       "global count (autograd's MeanBackward sees the global sizes)",
       "_ops/_math_ops.py, LINEAR_REDUCTION_OP_MAP (mean -> \"avg\"); pytorch/pytorch#162692"},
      {Difference::NoGradientHook, "no_gradient_hook",
       "every gradient contribution is redistributed to the cotangent of its operand before contributions add up; "
       "an input's gradient has its cotangent's placements (the duality check)",
       "a contribution keeps the placements the op's backward strategy gives it where they differ from the "
       "cotangent only in Partial or Replicate labels, so an input's .grad may be Partial (duality is not a check); "
       "one sharded otherwise goes to the cotangent; contributions of different placements are moved to the first "
       "one's before they add up, as DTensor's add would",
       "_api.py, DTensor.__torch_dispatch__ (autograd accumulates DTensor gradients as they come)"},
      {Difference::RedistributeBackward, "redistribute_backward",
       "the gradient moves from the cotangent of the target to the cotangent of the source (S(0) -> R: the "
       "gradient's P(sum) is all_reduced by the hook, then chunked)",
       "the gradient moves from whatever placements it has to the source's placements with every Partial as "
       "Replicate (S(0) -> R: the P(sum) gradient is reduce_scattered straight to S(0))",
       "_redistribute.py, Redistribute.backward (normalized_placements; is_backward=True)"},
      {Difference::ReplicateToPartialDivides, "replicate_to_partial_divides",
       "R -> P(sum) divides or keeps the value on rank 0, by the option partial_from_replicate",
       "divides by the group size; partial_from_replicate=rank0 is refused",
       "placement_types.py, Partial._partition_value"},
      {Difference::LossParallelOnlyInContext, "loss_parallel_only_in_context",
       "log_softmax, cross_entropy and nll_loss over a sharded class dim run as loss parallel",
       "the class dim is gathered first, as outside the loss_parallel() context",
       "parallel/loss.py, loss_parallel(); _ops/_math_ops.py, softmax_strategy"},
      {Difference::LocalMapUntracked, "local_map_untracked",
       "local_map bodies are tracked: invariant inputs of a varying op are marked varying (their gradient "
       "all_reduced), reduced inputs cast, returns checked against out_placements",
       "a body is plain local code (check_variance: false unless the local_map says otherwise): no automatic "
       "mark_varying, no casts, out_placements trusted",
       "experimental/_func_map.py, local_map (no variance tracking)"},
  };
  return s == Semantics::Pytorch ? pytorch : none;
}

bool follows(Semantics s, Difference d) {
  const auto& rows = differences(s);
  return std::any_of(rows.begin(), rows.end(), [d](const DifferenceRow& r) { return r.id == d; });
}

}  // namespace meshsim

#include "core/mutants.h"

#include <stdexcept>

namespace meshsim {

namespace {
Mutant g_active = Mutant::None;
}

const std::vector<MutantInfo>& mutant_catalog() {
  static const std::vector<MutantInfo> catalog = {
      {Mutant::AccumulationDoubleReduce, "accumulation_double_reduce",
       "training steps: the gradient of each microbatch, already reduced by the backward, is all_reduced again "
       "over its replicated axes when an accumulation of several microbatches ends (a factor of their sizes)"},
      {Mutant::AccumulationLostGradient, "accumulation_lost_gradient",
       "training steps: the accumulated gradient is reset at every microbatch (zero_grad inside the "
       "accumulation loop): only the last microbatch's gradient reaches the optimizer"},
      {Mutant::AllGatherVaryingDropsAxis, "all_gather_varying_drops_axis",
       "local_map: all_gather to varying drops the axis from the variant set"},
      {Mutant::AllReduceBackwardAllReduces, "all_reduce_backward_all_reduces",
       "local_map: all_reduce(sum)'s backward all_reduces the gradient again"},
      {Mutant::AllToAllBackwardUnswapped, "all_to_all_backward_unswapped",
       "local_map: all_to_all's backward does not swap split and concat dims"},
      {Mutant::AllToAllSplitBackwardUntransposed, "all_to_all_split_backward_untransposed",
       "local code: all_to_all with split sizes (all_to_all_single) moves the gradient back by the forward's "
       "input and output split sizes instead of swapping them (each rank splits its gradient by what it sent)"},
      {Mutant::BelowAutogradSkipsBackward, "below_autograd_skips_backward",
       "redistribution below autograd skips the backward collective"},
      {Mutant::BmmBatchShardDroppedBackward, "bmm_batch_shard_dropped_backward",
       "bmm/matmul backward: an operand's gradient sharded on a batch dim is labelled R (the shard is dropped)"},
      {Mutant::BroadcastGradNotSummed, "broadcast_grad_not_summed",
       "the gradient of a broadcast operand (a bias) is not summed over the ranks that shard its broadcast dims"},
      {Mutant::CatShardedDimNotGathered, "cat_sharded_dim_not_gathered",
       "cat along a sharded dim concatenates each rank's chunks instead of gathering first"},
      {Mutant::CotangentPsumAsR, "cotangent_psum_as_r", "the cotangent of P(sum) taken as R"},
      {Mutant::CotangentRdAsR, "cotangent_rd_as_r", "the cotangent of Rd taken as R"},
      {Mutant::CumsumShardedDimLocal, "cumsum_sharded_dim_local",
       "cumsum over a sharded dim computed locally: each rank's running sums of its own block kept as S(dim), "
       "missing the sums of the ranks before it (no all_gather of the dim, no offset)"},
      {Mutant::DropoutReplicasRankSeeded, "dropout_replicas_rank_seeded",
       "a random op on a DTensor (dropout, rand, randn) draws with a generator seeded by the run's seed plus the "
       "rank: the replicas of a Replicate axis get different masks (replicated activations diverge across "
       "tensor-parallel ranks)"},
      {Mutant::DropoutShardOffsetIgnored, "dropout_shard_offset_ignored",
       "a random op on a DTensor (dropout, rand, randn) draws each rank's local from the stream's start, not at its "
       "global offsets: every shard gets the same mask (the global mask repeats along a sequence shard)"},
      {Mutant::EmbeddingGradWrongRank, "embedding_grad_wrong_rank",
       "vocab-parallel embedding backward: each rank's gradient rows land in the next rank's vocab shard"},
      {Mutant::ExtremumGradFirstTie, "extremum_grad_first_tie",
       "amax/amin backward: the whole gradient goes to the first element equal to the extremum (max(dim)'s "
       "index), not split evenly among the ties"},
      {Mutant::FlattenKeepsInnerShard, "flatten_keeps_inner_shard",
       "a view keeps a shard of a non-leading dim of a merged group (flatten of [a, b] sharded on b)"},
      {Mutant::Float32RandomReductionOrder, "float32_random_reduction_order",
       "collectives reduce float32 in an order that depends on a hidden random choice"},
      {Mutant::FunctionBackwardWrongFactor, "function_backward_wrong_factor",
       "a built-in Function's backward scales its gradient by 2 (local_square returns 4 x g, not 2 x g)"},
      {Mutant::FunctionOutputsShareSets, "function_outputs_share_sets",
       "a Function with several outputs: every output takes the first output's variant and reduced sets, not its "
       "own (all_reduce_keep_local's kept local labelled invariant)"},
      {Mutant::GatherShardExtentsUnchecked, "gather_shard_extents_unchecked",
       "gather of x and the index sharded alike on a dim d other than the gather dim, S(d), S(d) -> S(d), "
       "without checking that the index is as long as x on d: where it is shorter, a rank's blocks of x and of "
       "the index are different rows"},
      {Mutant::GeluTanhDerivative, "gelu_tanh_derivative",
       "gelu {approximate: none} differentiated with the tanh approximation's derivative"},
      {Mutant::GradAccumulationMixedLayouts, "grad_accumulation_mixed_layouts",
       "pytorch semantics: a gradient contribution laid out otherwise than the value's first one is added to it "
       "unmoved (a P(sum) and an R contribution summed locally)"},
      {Mutant::ItemOfPartialUnreduced, "item_of_partial_unreduced",
       "item of a Partial DTensor reads each rank's own part and labels it replicated, without the all_reduce "
       "first (DTensor.item() before PyTorch's fix: a clip-grad-norm or loss logged from a partial sum)"},
      {Mutant::LocalTopkShardedDim, "local_topk_sharded_dim",
       "topk over a sharded dim: each rank takes the top k of its own shard and the results are labelled "
       "replicated, taken for the global top k (no all_gather of the dim first)"},
      {Mutant::LossParallelLocalMax, "loss_parallel_local_max",
       "loss parallel: each rank shifts its logits by its own local max instead of the all_reduce(max)"},
      {Mutant::MarkVaryingForReduced, "mark_varying_for_reduced",
       "local_map: mark_varying instead of the reduced -> varying cast"},
      {Mutant::MissingMarkVarying, "missing_mark_varying",
       "local_map: an invariant input of a varying op is not marked varying"},
      {Mutant::MissingReducedInvariantCast, "missing_reduced_invariant_cast",
       "local_map: a reduced input whose output is invariant keeps its unreduced-gradient contract"},
      {Mutant::MmS1S0LabelledR, "mm_s1_s0_labelled_r", "S(1) @ S(0) labelled R instead of P(sum)"},
      {Mutant::NormPartialAsSum, "norm_partial_as_sum",
       "a vector norm over a sharded dim: the ranks' local norms are added up (P(sum)) instead of combined as "
       "(sum of local^p)^(1/p) (P(normP)): a gradient norm summed over the shards of a sharded gradient"},
      {Mutant::NormWeightGradNotReduced, "norm_weight_grad_not_reduced",
       "layer_norm/rms_norm: the weight's gradient over a sharded batch or sequence dim is labelled R (never all_reduced)"},
      {Mutant::PartialPlusReplicateUndivided, "partial_plus_replicate_undivided",
       "P + R without dividing the R operand (it stays R)"},
      {Mutant::PartialSeedOnEveryRank, "partial_seed_on_every_rank",
       "a loss whose cotangent is Partial seeded with ones on every rank"},
      {Mutant::PavgBackwardUnscaled, "pavg_backward_unscaled", "P(avg)'s local cotangent not scaled by 1/n"},
      {Mutant::PsumFromReplicateNoDivide, "psum_from_replicate_no_divide", "R -> P(sum) without the divide"},
      {Mutant::ReduceScatterBackwardWrongDim, "reduce_scatter_backward_wrong_dim",
       "local_map: reduce_scatter's backward gathers along the wrong dim"},
      {Mutant::ReducedLabelDropped, "reduced_label_dropped",
       "the Reduced policy drops the Rd label of an op whose operands are all Rd (values right, an extra "
       "backward all_reduce)"},
      {Mutant::ScatterAddShardedIndexReplicated, "scatter_add_sharded_index_replicated",
       "scatter_add or index_add of a replicated x with the index and src sharded alike: each rank adds its own "
       "part of src into x and the result is labelled R, not P(sum) (expert-parallel tokens added into a "
       "replicated buffer without the all_reduce)"},
      {Mutant::SdpaSequenceShardLocal, "sdpa_sequence_shard_local",
       "scaled_dot_product_attention with q, k and v sharded on the sequence (dim 2) keeps the shard, as PyTorch's "
       "context-parallel rows do, without the ring that passes the k and v blocks: each rank's queries attend only "
       "to its own block of keys, and its causal mask is built from local positions"},
      {Mutant::StrategyRegistryIgnored, "strategy_registry_ignored",
       "variance-tracking strategies (registry and static) are ignored"},
      {Mutant::StridedGatheredPlain, "strided_gathered_plain",
       "a strided shard SS(d, k) all_gathered in plain-shard order (the pieces not interleaved back)"},
      {Mutant::UncheckedInsertsMarkVarying, "unchecked_inserts_mark_varying",
       "plain local code (to_local, check_variance false) marks an invariant input of a varying op varying, as "
       "tracked code does (a missing pvary goes unseen)"},
      {Mutant::UnevenArraySplit, "uneven_array_split",
       "uneven sharding as numpy.array_split instead of torch.chunk in the collectives"},
      {Mutant::UnreducedAllReduceAnyOp, "unreduced_all_reduce_any_op",
       "partial_in_local_map unreduced: all_reduce over an unreduced axis takes any op, not the Partial's own "
       "(all_reduce(sum) of a P(avg) passes the types, n times the mean)"},
      {Mutant::VocabLookupUnmasked, "vocab_lookup_unmasked",
       "vocab-parallel embedding: ids outside the rank's vocab range are clamped into it instead of masked to zero"},
  };
  return catalog;
}

Mutant parse_mutant(const std::string& name) {
  if (name.empty()) return Mutant::None;
  std::string known;
  for (const auto& m : mutant_catalog()) {
    if (name == m.name) return m.id;
    known += (known.empty() ? "" : ", ") + std::string(m.name);
  }
  throw std::invalid_argument("unknown mutant \"" + name + "\" (known: " + known + ")");
}

Mutant active_mutant() { return g_active; }
bool mutant_on(Mutant m) { return g_active == m; }

MutantScope::MutantScope(Mutant m) : ScopedOverride(g_active, m) {}

}  // namespace meshsim

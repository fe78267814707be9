// Planted bugs (mutants): switches of a run, off by default, so that the property suite can prove
// it finds real bug classes. The catalog is kept in alphabetical order.
#pragma once

#include <string>
#include <vector>

#include "core/scoped.h"

namespace meshsim {

enum class Mutant {
  None,
  AccumulationDoubleReduce,        // training: an accumulated gradient all_reduced again over its replicated axes
  AccumulationLostGradient,        // training: the gradient reset at every microbatch (only the last one kept)
  AllGatherVaryingDropsAxis,       // local_map: all_gather to varying drops the axis from variant
  AllReduceBackwardAllReduces,     // local_map: all_reduce(sum)'s backward all_reduces again
  AllToAllBackwardUnswapped,       // local_map: all_to_all's backward does not swap the dims
  AllToAllSplitBackwardUntransposed,  // local code: all_to_all with split sizes moves the gradient by the forward's sizes
  BelowAutogradSkipsBackward,      // below autograd: the op's gradient is not moved to the cotangent
  BmmBatchShardDroppedBackward,    // bmm/matmul: a batch-dim shard of an operand's gradient labelled R
  BroadcastGradNotSummed,          // a broadcast operand's gradient not summed over the ranks sharding its broadcast dims
  CatShardedDimNotGathered,        // cat along a sharded dim concatenates the chunks without gathering
  CotangentPsumAsR,                // the cotangent of P(sum) taken as R
  CotangentRdAsR,                  // the cotangent of Rd taken as R
  CumsumShardedDimLocal,           // cumsum over a sharded dim: each rank's own running sums kept as S(dim)
  DropoutReplicasRankSeeded,       // dropout/rand/randn on a DTensor: each rank's draw seeded by the run's seed plus its rank
  DropoutShardOffsetIgnored,       // dropout/rand/randn on a DTensor: each shard draws from index 0, not its global offsets
  EmbeddingGradWrongRank,          // a vocab-parallel embedding's gradient rows scattered to the next rank's shard
  ExtremumGradFirstTie,            // amax/amin: the gradient goes whole to the first tied element
  FlattenKeepsInnerShard,          // a view keeps a shard of a non-leading dim of a merged group
  Float32RandomReductionOrder,     // collectives reduce float32 in a hidden random order
  FunctionBackwardWrongFactor,     // a built-in Function's backward (local_square) scales its gradient by 2
  FunctionOutputsShareSets,        // a Function with several outputs: every output takes the first one's sets
  GatherShardExtentsUnchecked,     // gather: x and index S(d) -> S(d) kept where the index is shorter than x on d
  GeluTanhDerivative,              // gelu {approximate: none} differentiated as the tanh approximation
  GradAccumulationMixedLayouts,    // pytorch semantics: a gradient contribution in another layout added unmoved
  ItemOfPartialUnreduced,          // item of a Partial DTensor: each rank reads its own part, labelled replicated
  LocalTopkShardedDim,             // topk over a sharded dim: each rank's own top k labelled replicated
  LossParallelLocalMax,            // loss parallel: each rank shifts its logits by its own max (no all_reduce(max))
  MarkVaryingForReduced,           // local_map: mark_varying instead of the reduced -> varying cast
  MissingMarkVarying,              // local_map: an invariant input is not marked varying
  MissingReducedInvariantCast,     // local_map: a reduced input meeting an invariant one is not cast
  MmS1S0LabelledR,                 // S(1) @ S(0) labelled R instead of P(sum)
  NormPartialAsSum,                // linalg_vector_norm over a sharded dim: the local norms labelled P(sum), not P(normP)
  NormWeightGradNotReduced,        // a norm weight's gradient over a sharded batch/sequence dim labelled R, not P(sum)
  PartialPlusReplicateUndivided,   // P + R without turning the R operand into P
  PartialSeedOnEveryRank,          // a Partial-cotangent loss seeded with ones on every rank
  PavgBackwardUnscaled,            // P(avg)'s local cotangent not scaled by 1/n
  PsumFromReplicateNoDivide,       // R -> P(sum) without the divide
  ReduceScatterBackwardWrongDim,   // local_map: reduce_scatter's backward gathers along another dim
  ReducedLabelDropped,             // the Reduced policy does not restore Rd when every operand is Rd
  ScatterAddShardedIndexReplicated,  // scatter_add/index_add: R x, index and src sharded alike -> R, not P(sum)
  SdpaSequenceShardLocal,          // sdpa: q, k, v S(2) -> S(2) kept (context parallel without the ring): local keys only
  StrategyRegistryIgnored,         // variance-tracking strategies are ignored
  StridedGatheredPlain,            // a strided shard all_gathered in plain-shard order (no interleave)
  UncheckedInsertsMarkVarying,     // plain local code (unchecked) still marks invariant inputs varying
  UnevenArraySplit,                // collectives chunk uneven dims as numpy.array_split
  UnreducedAllReduceAnyOp,         // partial_in_local_map unreduced: all_reduce takes any op of an unreduced axis
  VocabLookupUnmasked,             // vocab-parallel embedding: ids outside the rank's range are clamped, not masked
};

struct MutantInfo {
  Mutant id;
  const char* name;
  const char* bug;  // the bug class it plants
};

const std::vector<MutantInfo>& mutant_catalog();
// Throws std::invalid_argument for an unknown name; "" is Mutant::None.
Mutant parse_mutant(const std::string& name);

// The planted bug in force for the current run (one run at a time per process).
Mutant active_mutant();
bool mutant_on(Mutant m);

// Switches a mutant on for a scope.
class MutantScope : ScopedOverride<Mutant> {
 public:
  explicit MutantScope(Mutant m);
};

}  // namespace meshsim

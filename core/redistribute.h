// The redistribution planner: turns (from spec, to spec) into per-axis steps, SEMANTICS.md
// section 3. Illegal transitions (S -> P, P(a) -> P(b)) throw SemanticError(IllegalRedistribute).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/mesh.h"
#include "core/placement.h"

namespace meshsim {

enum class StepKind {
  AllGather,             // S(d) -> R or Rd
  ReduceScatter,         // P(op) -> S(d)
  AllReduce,             // P(op) -> R or Rd
  AllToAll,              // S(i) -> S(j): split along j, concat along i
  LocalChunk,            // R or Rd -> S(d): keep this rank's chunk
  PartialFromReplicate,  // R or Rd -> P(op): divide by n or keep on rank 0 (sum); unchanged (avg, max, min)
  PadToPartial,          // S(d) -> P(sum), gradients only: zero-pad the chunk to the group's extent
  RescalePartial,        // P(avg) <-> P(sum), gradients only: scale each local by 1/n (or n); `op` is the source's
  Relabel,               // R <-> Rd, or any step over an axis of size 1: no data moves
};

const char* step_kind_name(StepKind kind);  // "all_gather", "local_chunk", ...

// R -> P(sum): PyTorch divides the local value by the group size; JAX keeps it on rank 0.
enum class PartialFromReplicate { Divide, Rank0 };
const char* partial_from_replicate_name(PartialFromReplicate c);

struct RedistStep {
  StepKind kind = StepKind::Relabel;
  int axis = 0;
  Placement from, to;
  int64_t dim = 0;         // AllGather, ReduceScatter, LocalChunk, PadToPartial
  // AllGather, ReduceScatter, LocalChunk, PadToPartial with a strided shard (SS(dim, k)) on the
  // strided side: the number of pieces whose sub-chunks the rank's local holds along `dim` (k over
  // the sizes of the inner axes that plainly shard `dim` then). An all_gather gathers then reorders
  // member-major to piece-major; a local_chunk keeps the rank's sub-chunk of each piece; a
  // reduce_scatter reorders piece-major to member-major first. 1 for plain steps.
  int64_t split_factor = 1;
  int64_t split_dim = 0;   // AllToAll: the dim the sender splits (the target shard dim)
  int64_t concat_dim = 0;  // AllToAll: the dim the receiver concatenates (the source shard dim)
  ReduceOp op = ReduceOp::Sum;  // AllReduce, ReduceScatter, PartialFromReplicate
  PartialFromReplicate convention = PartialFromReplicate::Divide;

  bool communicates() const;
  std::string str() const;  // "all_gather(axis 0, dim=0): S(0) -> Rd", "..., dim=0, split=2): SS(0,2) -> R"
};

struct PlanOptions {
  PartialFromReplicate partial_from_replicate = PartialFromReplicate::Divide;
  // Planning a gradient: S(d) -> P(sum) (a zero pad) and P(avg) <-> P(sum) (a local rescale) are
  // allowed, without communication.
  bool gradient = false;
};

// Axis by axis: first unshard the axes that change, innermost first (all_to_all where no other
// axis shards either dim and neither side is strided); then reduce Partials (reduce_scatter where
// the outer sharding of the dim is already in place, else all_reduce); then shard and relabel,
// outermost first. A strided shard is gathered, reduce_scattered to and chunked to as a shard of
// its dim (split_factor set); inner plain S(d) axes stay in place when the one outer axis of d that
// changes goes between SS(d,k) and R, Rd or (to SS) a Partial, and k is the product of their sizes
// (FSDP over TP: one collective). The plan is a pure function of its arguments. Steps over an axis
// of size 1 are Relabel. Specs must be normalized (no negative dim).
std::vector<RedistStep> plan_redistribute(const Mesh& mesh, const Spec& from, const Spec& to,
                                          const PlanOptions& options = {});

// The rule-coverage key of a planned step (core/coverage.h): "redistribute: all_gather S -> Rd".
std::string coverage_key(const RedistStep& step, bool gradient);

// Empty string when legal, else why not (the message plan_redistribute throws).
std::string redistribute_illegal_reason(const Spec& from, const Spec& to, bool gradient = false);

}  // namespace meshsim

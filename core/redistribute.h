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
  int64_t split_dim = 0;   // AllToAll: the dim the sender splits (the target shard dim)
  int64_t concat_dim = 0;  // AllToAll: the dim the receiver concatenates (the source shard dim)
  ReduceOp op = ReduceOp::Sum;  // AllReduce, ReduceScatter, PartialFromReplicate
  PartialFromReplicate convention = PartialFromReplicate::Divide;

  bool communicates() const;
  std::string str() const;  // "all_gather(dp, dim=0): S(0) -> Rd"
};

struct PlanOptions {
  PartialFromReplicate partial_from_replicate = PartialFromReplicate::Divide;
  // Planning a gradient: S(d) -> P(sum) (a zero pad) and P(avg) <-> P(sum) (a local rescale) are
  // allowed, without communication.
  bool gradient = false;
};

// Axis by axis: first unshard the axes that change, innermost first (all_to_all where no other
// axis shards either dim); then reduce Partials (reduce_scatter where the outer sharding of the
// dim is already in place, else all_reduce); then shard and relabel, outermost first. The plan is
// a pure function of its arguments. Steps over an axis of size 1 are Relabel.
std::vector<RedistStep> plan_redistribute(const Mesh& mesh, const Spec& from, const Spec& to,
                                          const PlanOptions& options = {});

// The rule-coverage key of a planned step (core/coverage.h): "redistribute: all_gather S -> Rd".
std::string coverage_key(const RedistStep& step, bool gradient);

// Empty string when legal, else why not (the message plan_redistribute throws).
std::string redistribute_illegal_reason(const Spec& from, const Spec& to, bool gradient = false);

}  // namespace meshsim

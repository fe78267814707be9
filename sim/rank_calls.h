// Each rank's call of an op's kernel on its locals, for Runtime::apply_op: the rank's attributes,
// the calls with and without the local graphs its backward needs, and the calls ranks share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "core/mesh.h"
#include "core/ops.h"
#include "core/propagation.h"
#include "sim/collectives.h"

namespace meshsim {

// A small op: its operands hold at most this many elements on every rank. Once a run keeps the
// per-rank graphs of this many small ops times ranks (about 50 MB of libtorch's graph objects), its
// further small ops run again in the backward instead (Runtime::apply_op).
constexpr int64_t kSmallOpElements = 4096;
constexpr int64_t kKeptSmallGraphs = 32768;

// Per rank: an op's operands as local leaves and its result with the local graph that made it.
// Ranks whose call is the same (RankCalls::same_as) hold the same leaves and result, one graph.
struct LocalGraphs {
  explicit LocalGraphs(size_t ranks) : leaves(ranks), results(ranks) {}
  std::vector<std::vector<at::Tensor>> leaves;
  Locals results;
};

// An op's call on every rank: the kernel's attributes per rank (mean's global count, a view's local
// shape, the range of a sharded dim the kernel needs, a draw's place), from the operands' specs
// and shapes, and per rank the first rank whose call is the same.
struct RankCalls {
  std::vector<OpAttrs> attrs;  // one per rank, or one for every rank where no rank's differs
  const OpAttrs& of(size_t rank) const { return attrs.size() == 1 ? attrs[0] : attrs[rank]; }
  // Two ranks' calls are the same when their operands are the same data (the same storage, offset,
  // shape, strides and dtype: replicated locals share storage) and their attributes are the same
  // (a random op's never are: each rank draws its own place). Kernels are deterministic, so a rank
  // whose call is an earlier rank's takes that rank's result (and its local graph) without running
  // the kernel again: a TP weight gathered once per group is transposed once per group, not once
  // per rank (a third of the memory of a 4096-rank transformer step; issue #35 item 5).
  std::vector<size_t> same_as;
};
RankCalls rank_calls(const std::string& op, const OpAttrs& attrs, const Mesh& mesh, const std::vector<Spec>& specs,
                     const std::vector<Shape>& shapes, const Spec& out_spec, const Shape& out_shape,
                     const std::vector<Locals>& operands);

// Each rank's kernel on its operands (`operands[i][r]`) as fresh local leaves, requiring grad as
// `needs` says, with autograd: the leaves and the results with their local graphs, for the VJP.
LocalGraphs local_graphs(const std::string& op, const RankCalls& calls, const std::vector<Locals>& operands,
                         const std::vector<bool>& needs);

// Each rank's VJP through its local graph: for every rank whose result requires grad, the
// gradients of `g.results[r]` (weighted by `grads[r]`) with respect to its leaves `wrt` (indices
// into `g.leaves[r]`); undefined where a leaf is unused or the rank's result needs none. The ranks'
// graphs are disjoint, so one engine run serves every rank of distinct graph at once (a rank whose
// graph is an earlier rank's, which may get another incoming gradient, runs in a later pass): one
// run of libtorch's engine per op instead of one per rank, the same numbers.
std::vector<std::vector<at::Tensor>> rank_vjps(const LocalGraphs& g, const std::vector<size_t>& wrt, const Locals& grads);

// What an op whose VJP has a closed form (sim/vjps.h) keeps from its forward instead of local
// graphs: its calls, its operands as the kernel took them (detached, sharing storage) and, where
// the VJP reads it, its result.
struct ClosedForms {
  OpId op;
  RankCalls calls;
  std::vector<Locals> operands;
  Locals results;  // empty where closed_vjp_reads_result is false
};

// rank_vjps for an op of closed form: per rank, the gradients of the operands `wrt` for the
// incoming gradient `grads[r]`, each rank's written out (sim/vjps.h) without libtorch's autograd.
// A rank whose call and incoming gradient are an earlier rank's (the same data) takes its
// gradients (a tensor object of its own, sharing storage).
std::vector<std::vector<at::Tensor>> closed_vjps(const ClosedForms& c, const std::vector<size_t>& wrt, const Locals& grads);

// Each rank's kernel on its operands without autograd: the results, a tensor object per rank (those
// of the same call share storage).
Locals local_results(const std::string& op, const RankCalls& calls, const std::vector<Locals>& operands);

}  // namespace meshsim

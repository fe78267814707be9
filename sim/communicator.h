// The communicator interface (DESIGN.md: one interface, three engines). Every collective a run
// performs, in a redistribution, a local_map body or either's backward, goes through the current
// communicator, one group at a time. The in-process simulation is one engine; the real ones
// (gpu_validate/: Gloo, NCCL) implement the same five calls.
#pragma once

#include <cstdint>
#include <vector>

#include "core/scoped.h"
#include "sim/collectives.h"

namespace meshsim {

using Ranks = std::vector<int64_t>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const char* name() const = 0;
  // `ranks` are the group's mesh ranks in group order, `group` their locals (one per member, the
  // same order); each call returns the members' locals after the collective, in that order.
  virtual Locals all_gather(const Ranks& ranks, const Locals& group, int64_t dim) = 0;
  virtual Locals all_reduce(const Ranks& ranks, const Locals& group, ReduceOp op) = 0;
  virtual Locals reduce_scatter(const Ranks& ranks, const Locals& group, ReduceOp op, int64_t dim) = 0;
  virtual Locals all_to_all(const Ranks& ranks, const Locals& group, int64_t split_dim, int64_t concat_dim) = 0;
  // Uneven pieces along dim 0 (all_to_all_single with split sizes): `sends` as collectives.h says,
  // checked before the call (every row sums to its member's extent, the members agree).
  virtual Locals all_to_all_split(const Ranks& ranks, const Locals& group, const SplitTable& sends) = 0;
};

// The simulation: collectives.h, deterministic, reducing in rank order.
class SimCommunicator : public Communicator {
 public:
  const char* name() const override { return "sim"; }
  Locals all_gather(const Ranks&, const Locals& group, int64_t dim) override { return meshsim::all_gather(group, dim); }
  Locals all_reduce(const Ranks&, const Locals& group, ReduceOp op) override { return meshsim::all_reduce(group, op); }
  Locals reduce_scatter(const Ranks&, const Locals& group, ReduceOp op, int64_t dim) override {
    return meshsim::reduce_scatter(group, op, dim);
  }
  Locals all_to_all(const Ranks&, const Locals& group, int64_t split_dim, int64_t concat_dim) override {
    return meshsim::all_to_all(group, split_dim, concat_dim);
  }
  Locals all_to_all_split(const Ranks&, const Locals& group, const SplitTable& sends) override {
    return meshsim::all_to_all_split(group, sends);
  }
};

// The engine collectives go through now: the simulation unless one is installed.
Communicator& communicator();

// Installs `c` for the scope's lifetime (runs are single-threaded; libtorch runs a CPU backward on
// the thread that calls it), then restores the previous engine.
class UseCommunicator : ScopedOverride<Communicator*> {
 public:
  explicit UseCommunicator(Communicator& c);
};

// The group a custom Function's kernel runs over (set by local_map's per-group calls), so that an
// opaque kernel's own collective reaches the communicator with its ranks. Empty outside one.
const Ranks& current_group();
class InGroup : ScopedOverride<Ranks> {
 public:
  explicit InGroup(Ranks ranks);
};

}  // namespace meshsim

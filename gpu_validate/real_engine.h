// What every real engine shares. A worker process of a real engine runs the whole scenario, as
// the simulation does, but answers for one rank only: at a collective over a group that holds
// its rank, its own local goes to the engine and the engine's result becomes its local; the
// other members' locals (simulated in the same process, never sent anywhere) only keep the
// program's shapes flowing. So the worker's rank computes from its own inputs and what the engine
// delivered, as a process of a real job does, and that rank alone is compared with the simulation.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/mesh.h"
#include "gpu_validate/store.h"
#include "sim/communicator.h"

namespace meshsim {

// A fault planted in one worker, for testing that failures are reported by rank, that nothing
// hangs, and that a wrong result is caught: at the `at`-th collective (1-based) of rank `rank`, the
// worker kills itself (SIGKILL), hangs (sleeps until killed), stops itself (SIGSTOP: the whole
// process freezes, its heartbeat too), or corrupts the engine's result (adds 1 to its first
// element: an engine bug). Spelled "kill:RANK:AT", "hang:RANK:AT", "stop:RANK:AT", "corrupt:RANK:AT".
struct Fault {
  enum class Kind { None, Kill, Hang, Stop, Corrupt } kind = Kind::None;
  int64_t rank = -1;
  int64_t at = 0;
};
// Throws std::invalid_argument for a malformed spec (parsed strictly: three fields, RANK and AT
// whole decimal numbers and nothing else, "kill:1:2junk" refused) or a RANK that is not one of
// the `world` ranks of the mesh (`mesh`, as Mesh::str() says it, for the message).
Fault parse_fault(const std::string& spec, int64_t world, const std::string& mesh);

// Throws std::invalid_argument when the fault's rank takes part in fewer than AT collectives, so
// that the fault would inject nothing: `per_rank` is the simulation's count of each rank's
// collectives (CollectiveCounter), the same the engine counts AT in.
void check_fault_reached(const std::string& spec, const Fault& fault, const std::vector<int64_t>& per_rank);

// The simulation, counting the collectives each rank takes part in as RealCommunicator counts
// them for its rank (one per call over a group that holds the rank).
class CollectiveCounter : public SimCommunicator {
 public:
  explicit CollectiveCounter(int64_t world) : per_rank_(static_cast<size_t>(world), 0) {}
  Locals all_gather(const Ranks& ranks, const Locals& group, int64_t dim) override;
  Locals all_reduce(const Ranks& ranks, const Locals& group, ReduceOp op) override;
  Locals reduce_scatter(const Ranks& ranks, const Locals& group, ReduceOp op, int64_t dim) override;
  Locals all_to_all(const Ranks& ranks, const Locals& group, int64_t split_dim, int64_t concat_dim) override;
  Locals all_to_all_split(const Ranks& ranks, const Locals& group, const SplitTable& sends) override;
  const std::vector<int64_t>& per_rank() const { return per_rank_; }

 private:
  void count(const Ranks& ranks);
  std::vector<int64_t> per_rank_;
};

struct EngineStats {
  int64_t collectives = 0;         // collectives this rank ran on the engine
  int64_t bytes = 0;               // bytes this rank sent into them (its locals)
  int64_t inexact_reductions = 0;  // sums whose terms were not all integers (order matters)
  double seconds = 0;              // time spent inside the engine's calls
};

// What every engine is told: where to meet (rank, world, timeout, store), a planted fault, and
// where to write its progress lines.
struct EngineConfig {
  StoreConfig store;
  Fault fault;
  std::string progress_file;
};

// A worker's sign of life for whoever watches it: a background thread sets the modification time of
// `path` (created if absent) every `period`, whatever the worker's own thread is doing. A process
// that is stopped (SIGSTOP) or frozen stops beating; one that is merely slow or waiting does not.
class Heartbeat {
 public:
  Heartbeat(std::string path, std::chrono::milliseconds period);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  std::string path_;
  std::chrono::milliseconds period_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

// Position of `rank` in `ranks`, or -1.
int64_t position_of(const Ranks& ranks, int64_t rank);

// A mesh group that `rank` belongs to, and its position there.
struct MemberGroup {
  Ranks ranks;
  int64_t position;
};
// Every group that `rank` belongs to (a group of one rank too), axis by axis, groups in order: the
// same order on every rank, so that engines making one communicator per group meet at each
// rendezvous.
std::vector<MemberGroup> member_groups(const Mesh& mesh, int64_t rank);

class RealCommunicator : public Communicator {
 public:
  explicit RealCommunicator(const EngineConfig& config);

  Locals all_gather(const Ranks& ranks, const Locals& group, int64_t dim) override;
  Locals all_reduce(const Ranks& ranks, const Locals& group, ReduceOp op) override;
  Locals reduce_scatter(const Ranks& ranks, const Locals& group, ReduceOp op, int64_t dim) override;
  Locals all_to_all(const Ranks& ranks, const Locals& group, int64_t split_dim, int64_t concat_dim) override;
  Locals all_to_all_split(const Ranks& ranks, const Locals& group, const SplitTable& sends) override;

  // After the run: waits until every rank is done (a closing barrier), so none leaves early.
  virtual void finish() {}

  int64_t rank() const { return rank_; }
  const EngineStats& stats() const { return stats_; }

 protected:
  // A progress line of the engine's own waits beyond the collectives ("in the rendezvous", "after
  // the closing barrier"), so that a rank waiting there for its peers is seen waiting, not hung.
  void note_progress(const std::string& line);

  // The engine's part: `k` is this rank's position in `ranks`, `group` every member's local (the
  // peers' only for their shapes, which a real job knows from the program). Each returns this
  // rank's result.
  virtual at::Tensor real_all_gather(const Ranks& ranks, size_t k, const Locals& group, int64_t dim) = 0;
  virtual at::Tensor real_all_reduce(const Ranks& ranks, size_t k, const at::Tensor& mine, ReduceOp op) = 0;
  virtual at::Tensor real_all_to_all(const Ranks& ranks, size_t k, const Locals& group, int64_t split_dim,
                                     int64_t concat_dim) = 0;
  // Uneven rows of dim 0: this rank sends sends[k][s] rows to each member s and receives
  // sends[s][k] from each (the peers' rows for their counts only, which a real job exchanges first).
  virtual at::Tensor real_all_to_all_split(const Ranks& ranks, size_t k, const Locals& group, const SplitTable& sends) = 0;
  // reduce_scatter by default: the engine's all_reduce, then this rank's torch.chunk piece (the
  // values a reduce_scatter delivers; engines with a native one override it).
  virtual at::Tensor real_reduce_scatter(const Ranks& ranks, size_t k, const Locals& group, ReduceOp op, int64_t dim);

 private:
  void begin(const char* what, const Ranks& ranks);
  // Books the call; returns the engine's result, corrupted when the planted fault says so.
  at::Tensor end(const at::Tensor& mine, at::Tensor result);
  void note_reduction(const Locals& group, ReduceOp op);

  SimCommunicator sim_;
  int64_t rank_;
  Fault fault_;
  std::ofstream progress_;
  std::chrono::steady_clock::time_point started_;
  EngineStats stats_;
};

// Engines gather pieces of one size: this rank's local zero-padded to the widest member's along
// dim (the members' sizes follow from the program, as in a real job) ...
at::Tensor padded_for_gather(const Locals& group, size_t k, int64_t dim);
// ... and the gathered pieces (one per member, in group order) cut back and concatenated.
at::Tensor unpad_gathered(const std::vector<at::Tensor>& pieces, const Locals& group, int64_t dim);

// An engine that is not usable here (no GPU, no library): validate reports it and skips.
struct EngineUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace meshsim

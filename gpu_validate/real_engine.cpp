#include "gpu_validate/real_engine.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sstream>
#include <stdexcept>
#include <thread>

namespace meshsim {

Fault parse_fault(const std::string& spec) {
  Fault f;
  std::istringstream in(spec);
  std::string kind, rank, at;
  if (!std::getline(in, kind, ':') || !std::getline(in, rank, ':') || !std::getline(in, at) ||
      (kind != "kill" && kind != "hang" && kind != "stop" && kind != "corrupt"))
    throw std::invalid_argument("fault \"" + spec +
                                "\": expected kill:RANK:AT, hang:RANK:AT, stop:RANK:AT or corrupt:RANK:AT");
  try {
    f.rank = std::stoll(rank);
    f.at = std::stoll(at);
  } catch (const std::exception&) {
    throw std::invalid_argument("fault \"" + spec + "\": RANK and AT are integers");
  }
  if (f.rank < 0 || f.at < 1) throw std::invalid_argument("fault \"" + spec + "\": RANK >= 0 and AT >= 1");
  f.kind = kind == "kill" ? Fault::Kind::Kill
           : kind == "hang" ? Fault::Kind::Hang
           : kind == "stop" ? Fault::Kind::Stop
                            : Fault::Kind::Corrupt;
  return f;
}

Heartbeat::Heartbeat(std::string path, std::chrono::milliseconds period) : path_(std::move(path)), period_(period) {
  // Created here, appended to by the engine later, never truncated: its lines are the progress.
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd >= 0) ::close(fd);
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!done_) {
      ::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);  // now
      wake_.wait_for(lock, period_, [this] { return done_; });
    }
  });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

namespace {

// Engines move numbers, not truth values: neither Gloo nor NCCL takes a bool tensor ("Invalid
// scalar type"). A bool local (a mask, a condition) travels as uint8 (0 or 1, one byte a value, as
// the cost model counts it) and comes back as bool; a reduction of bools (never reached: a bool is
// never Partial) is then the logical or (sum, max) or and (min) the simulation computes. Int64
// locals (ids, targets) and floats go as they are.
bool is_bool(const Locals& group) { return !group.empty() && group.front().scalar_type() == at::kBool; }

Locals on_wire(const Locals& group) {
  Locals out;
  out.reserve(group.size());
  for (const auto& t : group) out.push_back(t.to(at::kByte));
  return out;
}

at::Tensor off_wire(const at::Tensor& t, bool was_bool) { return was_bool ? t.ne(0) : t; }

}  // namespace

int64_t position_of(const Ranks& ranks, int64_t rank) {
  for (size_t k = 0; k < ranks.size(); ++k)
    if (ranks[k] == rank) return static_cast<int64_t>(k);
  return -1;
}

std::vector<MemberGroup> member_groups(const Mesh& mesh, int64_t rank) {
  std::vector<MemberGroup> out;
  for (int axis = 0; axis < mesh.ndim(); ++axis)
    for (const auto& ranks : mesh.groups(axis)) {
      const int64_t k = position_of(ranks, rank);
      if (ranks.size() < 2 || k < 0) continue;
      // Two axes of size 1 around one real axis give the same group twice: one communicator.
      bool seen = false;
      for (const auto& g : out) seen = seen || g.ranks == ranks;
      if (!seen) out.push_back({ranks, k});
    }
  return out;
}

RealCommunicator::RealCommunicator(const EngineConfig& config) : rank_(config.store.rank), fault_(config.fault) {
  if (!config.progress_file.empty()) progress_.open(config.progress_file, std::ios::app);
}

void RealCommunicator::note_progress(const std::string& line) {
  if (progress_.is_open()) progress_ << line << std::endl;
}

void RealCommunicator::begin(const char* what, const Ranks& ranks) {
  const int64_t n = ++stats_.collectives;
  if (fault_.rank == rank_ && fault_.at == n) {
    if (fault_.kind == Fault::Kind::Kill) ::kill(::getpid(), SIGKILL);
    if (fault_.kind == Fault::Kind::Stop) ::raise(SIGSTOP);  // every thread, until SIGCONT or SIGKILL
    if (fault_.kind == Fault::Kind::Hang)
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // until killed
  }
  if (progress_.is_open()) {
    // A line when this rank enters a collective and one when it leaves, flushed, so that whoever
    // watches the rank sees where it is: a rank that hangs before a collective has left the
    // previous one; its peers are in the next.
    progress_ << "in collective #" << n << " (" << what << " over ranks";
    for (auto r : ranks) progress_ << ' ' << r;
    progress_ << ")" << std::endl;
  }
  started_ = std::chrono::steady_clock::now();
}

at::Tensor RealCommunicator::end(const at::Tensor& mine, at::Tensor result) {
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  stats_.bytes += mine.numel() * static_cast<int64_t>(mine.element_size());
  if (progress_.is_open()) progress_ << "after collective #" << stats_.collectives << std::endl;
  if (fault_.kind == Fault::Kind::Corrupt && fault_.rank == rank_ && fault_.at == stats_.collectives && result.numel()) {
    result = result.clone(at::MemoryFormat::Contiguous);
    if (result.scalar_type() == at::kBool)
      result.view(-1)[0].logical_not_();
    else
      result.view(-1)[0].add_(1);
  }
  return result;
}

void RealCommunicator::note_reduction(const Locals& group, ReduceOp op) {
  if (op != ReduceOp::Sum && op != ReduceOp::Avg) return;  // max and min are exact in any order
  for (const auto& t : group)
    if (t.numel() && t.is_floating_point() && !at::equal(t, at::round(t))) {
      ++stats_.inexact_reductions;
      return;
    }
}

Locals RealCommunicator::all_gather(const Ranks& ranks, const Locals& group, int64_t dim) {
  Locals out = sim_.all_gather(ranks, group, dim);
  const int64_t k = position_of(ranks, rank_);
  if (k < 0) return out;
  begin("all_gather", ranks);
  const bool b = is_bool(group);
  out[k] = end(group[k], off_wire(real_all_gather(ranks, static_cast<size_t>(k), b ? on_wire(group) : group, dim), b));
  return out;
}

Locals RealCommunicator::all_reduce(const Ranks& ranks, const Locals& group, ReduceOp op) {
  Locals out = sim_.all_reduce(ranks, group, op);
  const int64_t k = position_of(ranks, rank_);
  if (k < 0) return out;
  note_reduction(group, op);
  begin("all_reduce", ranks);
  const bool b = is_bool(group);
  out[k] = end(group[k], off_wire(real_all_reduce(ranks, static_cast<size_t>(k), b ? group[k].to(at::kByte) : group[k], op), b));
  return out;
}

Locals RealCommunicator::reduce_scatter(const Ranks& ranks, const Locals& group, ReduceOp op, int64_t dim) {
  Locals out = sim_.reduce_scatter(ranks, group, op, dim);
  const int64_t k = position_of(ranks, rank_);
  if (k < 0) return out;
  note_reduction(group, op);
  begin("reduce_scatter", ranks);
  const bool b = is_bool(group);
  out[k] = end(group[k], off_wire(real_reduce_scatter(ranks, static_cast<size_t>(k), b ? on_wire(group) : group, op, dim), b));
  return out;
}

Locals RealCommunicator::all_to_all(const Ranks& ranks, const Locals& group, int64_t split_dim, int64_t concat_dim) {
  Locals out = sim_.all_to_all(ranks, group, split_dim, concat_dim);
  const int64_t k = position_of(ranks, rank_);
  if (k < 0) return out;
  begin("all_to_all", ranks);
  const bool b = is_bool(group);
  out[k] = end(group[k], off_wire(real_all_to_all(ranks, static_cast<size_t>(k), b ? on_wire(group) : group, split_dim, concat_dim), b));
  return out;
}

at::Tensor RealCommunicator::real_reduce_scatter(const Ranks& ranks, size_t k, const Locals& group, ReduceOp op,
                                                 int64_t dim) {
  at::Tensor full = real_all_reduce(ranks, k, group[k], op);
  return chunk_piece(full, dim, static_cast<int64_t>(ranks.size()), static_cast<int64_t>(k)).clone();
}

at::Tensor padded_for_gather(const Locals& group, size_t k, int64_t dim) {
  int64_t widest = 0;
  for (const auto& t : group) widest = std::max(widest, t.size(dim));
  auto shape = group[k].sizes().vec();
  shape[dim] = widest;
  at::Tensor mine = at::zeros(shape, group[k].options().requires_grad(false));
  mine.narrow(dim, 0, group[k].size(dim)).copy_(group[k].detach());
  return mine;
}

at::Tensor unpad_gathered(const std::vector<at::Tensor>& pieces, const Locals& group, int64_t dim) {
  std::vector<at::Tensor> cut;
  for (size_t s = 0; s < group.size(); ++s) cut.push_back(pieces[s].narrow(dim, 0, group[s].size(dim)));
  return at::cat(cut, dim);
}

}  // namespace meshsim

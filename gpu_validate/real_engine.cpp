#include "gpu_validate/real_engine.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <map>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

namespace meshsim {

namespace {

// A whole decimal number, nothing before or after it ("2junk", " 2", "+2", "" are not), or nullopt.
std::optional<int64_t> whole_number(const std::string& text) {
  int64_t n = 0;
  const char* end = text.data() + text.size();
  const auto [at, ec] = std::from_chars(text.data(), end, n);
  if (text.empty() || ec != std::errc() || at != end) return std::nullopt;
  return n;
}

}  // namespace

Fault parse_fault(const std::string& spec, int64_t world, const std::string& mesh) {
  const std::string what = "fault \"" + spec + "\": ";
  std::vector<std::string> fields;
  for (size_t from = 0;;) {
    const size_t colon = spec.find(':', from);
    fields.push_back(spec.substr(from, colon == std::string::npos ? std::string::npos : colon - from));
    if (colon == std::string::npos) break;
    from = colon + 1;
  }
  static const std::map<std::string, Fault::Kind> kinds{
      {"kill", Fault::Kind::Kill}, {"hang", Fault::Kind::Hang}, {"stop", Fault::Kind::Stop}, {"corrupt", Fault::Kind::Corrupt}};
  if (fields.size() != 3 || !kinds.count(fields[0]))
    throw std::invalid_argument(what + "expected kill:RANK:AT, hang:RANK:AT, stop:RANK:AT or corrupt:RANK:AT");
  const std::optional<int64_t> rank = whole_number(fields[1]), at = whole_number(fields[2]);
  if (!rank || !at) throw std::invalid_argument(what + "RANK and AT are whole decimal numbers, nothing else");
  if (*rank < 0 || *at < 1) throw std::invalid_argument(what + "RANK >= 0 and AT >= 1");
  if (*rank >= world)
    throw std::invalid_argument(what + "rank " + fields[1] + " is not a rank of the mesh (" + mesh + ": ranks 0 to " +
                                std::to_string(world - 1) + "), so nothing would be injected");
  return Fault{kinds.at(fields[0]), *rank, *at};
}

void check_fault_reached(const std::string& spec, const Fault& fault, const std::vector<int64_t>& per_rank) {
  const int64_t n = per_rank.at(static_cast<size_t>(fault.rank));
  if (fault.at <= n) return;
  throw std::invalid_argument("fault \"" + spec + "\": rank " + std::to_string(fault.rank) + " takes part in " +
                              (n == 0 ? "no collective" : n == 1 ? "1 collective" : std::to_string(n) + " collectives") +
                              " in this scenario, so its collective #" + std::to_string(fault.at) +
                              " never comes and nothing would be injected");
}

void CollectiveCounter::count(const Ranks& ranks) {
  for (auto r : ranks)
    if (r >= 0 && r < static_cast<int64_t>(per_rank_.size())) ++per_rank_[static_cast<size_t>(r)];
}

Locals CollectiveCounter::all_gather(const Ranks& ranks, const Locals& group, int64_t dim) {
  count(ranks);
  return SimCommunicator::all_gather(ranks, group, dim);
}

Locals CollectiveCounter::all_reduce(const Ranks& ranks, const Locals& group, ReduceOp op) {
  count(ranks);
  return SimCommunicator::all_reduce(ranks, group, op);
}

Locals CollectiveCounter::reduce_scatter(const Ranks& ranks, const Locals& group, ReduceOp op, int64_t dim) {
  count(ranks);
  return SimCommunicator::reduce_scatter(ranks, group, op, dim);
}

Locals CollectiveCounter::all_to_all(const Ranks& ranks, const Locals& group, int64_t split_dim, int64_t concat_dim) {
  count(ranks);
  return SimCommunicator::all_to_all(ranks, group, split_dim, concat_dim);
}

Locals CollectiveCounter::all_to_all_split(const Ranks& ranks, const Locals& group, const SplitTable& sends) {
  count(ranks);
  return SimCommunicator::all_to_all_split(ranks, group, sends);
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
      if (k < 0) continue;
      // A group of one rank (an axis of size 1) gets its communicator too: local code may call a
      // collective over it (psum over a one-rank axis), and the engine runs it, as a real run
      // would. Two axes of size 1 around one real axis give the same group twice: one communicator.
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

Locals RealCommunicator::all_to_all_split(const Ranks& ranks, const Locals& group, const SplitTable& sends) {
  Locals out = sim_.all_to_all_split(ranks, group, sends);
  const int64_t k = position_of(ranks, rank_);
  if (k < 0) return out;
  begin("all_to_all", ranks);
  const bool b = is_bool(group);
  out[k] = end(group[k], off_wire(real_all_to_all_split(ranks, static_cast<size_t>(k), b ? on_wire(group) : group, sends), b));
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

#include "gpu_validate/validate.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/files.h"
#include "gpu_validate/gloo_engine.h"
#include "gpu_validate/nccl_engine.h"
#include "sim/data.h"
#include "sim/interpreter.h"
#include "sim/train.h"

namespace meshsim {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr std::chrono::milliseconds kHeartbeatPeriod{200};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::unique_ptr<RealCommunicator> make_engine(const Mesh& mesh, const ValidateConfig& c, const Fault& fault) {
  StoreConfig store;
  store.rank = c.rank;
  store.world = mesh.size();
  store.timeout = std::chrono::milliseconds(static_cast<int64_t>(c.timeout_s * 1000));
  store.file = c.store;
  store.master_addr = c.master_addr;
  store.master_port = c.master_port;
  const EngineConfig engine{store, fault, c.progress_file};
  if (c.backend == "nccl") return make_nccl_communicator(mesh, engine);
  return std::make_unique<GlooCommunicator>(mesh, GlooConfig{engine, c.hostname});
}

// The planted fault (none when `spec` is empty): InputError naming --fault (exit 2) when it is
// malformed or names a rank the mesh does not have.
Fault planted_fault(const std::string& spec, const Mesh& mesh) {
  if (spec.empty()) return {};
  try {
    return parse_fault(spec, mesh.size(), mesh.str());
  } catch (const std::invalid_argument& e) {
    throw InputError("--fault", "", e.what());
  }
}

// Runs the simulation, counting each rank's collectives; then refuses, as planted_fault does, a
// fault whose rank takes part in fewer collectives than its AT: it would inject nothing.
void simulate_checking_fault(const Scenario& sc, const RunOptions& options, const std::string& spec, const Fault& fault) {
  CollectiveCounter counter(sc.mesh.size());
  {
    UseCommunicator use(counter);
    const SimRun first = run_distributed(sc, options);
    if (sc.train.present) run_train_steps(sc, options, first, nullptr, nullptr);  // the steps' collectives too
  }
  if (fault.kind == Fault::Kind::None) return;
  try {
    check_fault_reached(spec, fault, counter.per_rank());
  } catch (const std::invalid_argument& e) {
    throw InputError("--fault", "", e.what());
  }
}

// The tolerance when some sum was over non-integers: the engine may add in another order (Gloo's
// ring, NCCL's trees), so results may differ in the last bits; relative to the largest magnitude.
double tolerance_for(at::ScalarType t) { return t == at::kFloat ? 1e-4 : 1e-9; }

// Equal means the same bits (tensor_hash); otherwise the largest difference (max_abs_diff, which
// counts NaN against a number as one) and, when some sum was inexact, whether it is within the
// tolerance.
json compare_local(const std::string& name, const char* of, const at::Tensor& real, const at::Tensor& sim,
                   bool exact) {
  json c{{"name", name}, {"of", of}};
  if (!real.defined() || !sim.defined()) {
    c["equal"] = real.defined() == sim.defined();
    c["max_abs_diff"] = 0.0;
    return c;
  }
  const bool bits = tensor_hash(real) == tensor_hash(sim);
  const double diff = bits ? 0.0 : max_abs_diff(real, sim);  // JSON: null when not finite
  c["equal"] = bits;
  c["max_abs_diff"] = diff;
  if (!real.sizes().equals(sim.sizes())) c["note"] = "local shapes differ";
  else if (!bits && !exact) c["within_tolerance"] = within(diff, tolerance_for(real.scalar_type()), sim);
  return c;
}

std::string describe_event(const Event& e) {
  std::string s = "event " + std::to_string(e.seq) + " (" + e.phase + " " + e.kind + " " + e.name;
  if (!e.value.empty()) s += " -> " + e.value;
  if (!e.axis.empty()) s += " over " + e.axis;
  return s + ")";
}

// The first event whose local on `rank` differs between the two runs.
json first_divergence(const std::vector<Event>& real, const std::vector<Event>& sim, int64_t rank) {
  const auto r = static_cast<size_t>(rank);
  for (size_t i = 0; i < std::min(real.size(), sim.size()); ++i) {
    const Event &a = real[i], &b = sim[i];
    const bool differ = a.kind != b.kind || a.name != b.name || a.value != b.value ||
                        (r < a.hashes.size() && r < b.hashes.size() && a.hashes[r] != b.hashes[r]) ||
                        (r < a.local_shapes.size() && r < b.local_shapes.size() && a.local_shapes[r] != b.local_shapes[r]);
    if (differ) return {{"seq", a.seq}, {"event", describe_event(a)}};
  }
  if (real.size() != sim.size()) return {{"seq", std::min(real.size(), sim.size())}, {"event", "the event counts differ"}};
  return nullptr;
}

void write_json(const std::string& path, const json& j) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << j.dump(2) << "\n";
  }
  fs::rename(tmp, path);  // whole or absent, for the coordinator
}

std::string rank_line(const json& v) {
  std::ostringstream s;
  s << "rank " << v.value("rank", -1) << ": " << v.value("status", "?");
  if (v.contains("error")) {
    s << ": " << v["error"].value("message", "");
    return s.str();
  }
  int values = 0, grads = 0, trained = 0, equal = 0, within = 0;
  for (const auto& c : v["compared"]) {
    (c["of"] == "grad" ? grads : c["of"] == "train" ? trained : values)++;
    if (c["equal"].get<bool>()) ++equal;
    else if (c.value("within_tolerance", false)) ++within;
  }
  const auto& e = v["engine"];
  auto count = [](int n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); };
  s << ": " << count(values, "value") << " and " << count(grads, "gradient");
  if (trained) s << ", " << trained << " parameters and optimizer states after the training steps";
  s << ", " << equal << " equal bit for bit";
  if (within) s << ", " << within << " within tolerance";
  s << "; " << count(static_cast<int>(e["collectives"].get<int64_t>()), "collective") << " on " << v.value("backend", "") << " ("
    << (v["exact"].get<bool>() ? "every sum over integers: exact" : "sums over non-integers: tolerance") << ")";
  if (v.contains("first_divergence") && !v["first_divergence"].is_null())
    s << "\n    first difference at " << v["first_divergence"]["event"].get<std::string>();
  return s.str();
}

}  // namespace

std::string engine_unavailable(const std::string& backend, int64_t world) {
  if (backend == "nccl") return nccl_unavailable(world);
  return "";
}

int validate_worker(const Scenario& sc, const RunOptions& options, const ValidateConfig& config, std::ostream& out) {
  json v{{"format", "meshsim.validate.rank/1"}, {"rank", config.rank}, {"backend", config.backend}};
  // Beats from the start, the simulation included, so that the coordinator tells a worker that is
  // busy or waiting from one that is stopped or frozen.
  std::optional<Heartbeat> heartbeat;
  if (!config.progress_file.empty()) heartbeat.emplace(config.progress_file, kHeartbeatPeriod);
  int code = 0;
  try {
    if (config.rank < 0 || config.rank >= sc.mesh.size())
      throw InputError(sc.file, "/mesh/shape",
                       "--rank " + std::to_string(config.rank) + " is not a rank of the mesh (" + sc.mesh.str() + ")");
    const Fault fault = planted_fault(config.fault, sc.mesh);
    // The simulation first, once to warm libtorch up (and check the fault) and once timed, then the
    // engine, timed alike.
    simulate_checking_fault(sc, options, config.fault, fault);
    auto t0 = std::chrono::steady_clock::now();
    SimRun sim = run_distributed(sc, options);
    const double sim_s = seconds_since(t0);
    std::unique_ptr<RealCommunicator> engine = make_engine(sc.mesh, config, fault);
    t0 = std::chrono::steady_clock::now();
    SimRun real;
    {
      UseCommunicator use(*engine);
      real = run_distributed(sc, options);
    }
    const double real_s = seconds_since(t0);
    const auto r = static_cast<size_t>(config.rank);
    // Training steps: the steps after the first backward, on the engine and on the simulation, this
    // rank's parameters and optimizer states kept after every step.
    using Kept = std::vector<std::pair<std::string, at::Tensor>>;
    Kept sim_steps, real_steps;
    if (sc.train.present) {
      auto keep = [r](Kept& into) {
        return [&into, r](int64_t step, const MeshTrainer& t, const std::vector<double>&) {
          const std::string at = "step " + std::to_string(step) + " ";
          for (const auto& [p, l] : t.params()) into.emplace_back(at + p, l.at(r));
          for (const auto& [p, states] : t.states())
            for (const auto& [s, l] : states) into.emplace_back(at + p + "." + s, l.at(r));
          return true;
        };
      };
      run_train_steps(sc, options, sim, nullptr, keep(sim_steps));
      UseCommunicator use(*engine);
      run_train_steps(sc, options, real, nullptr, keep(real_steps));
    }
    engine->finish();
    const bool exact = engine->stats().inexact_reductions == 0;
    json compared = json::array();
    bool pass = true;
    for (const auto& name : sim.named) {
      compared.push_back(compare_local(name, "value", real.values.at(name).locals.at(r), sim.values.at(name).locals.at(r), exact));
    }
    for (const auto& name : sim.grad_inputs)
      if (sim.grads.count(name))
        compared.push_back(compare_local(name, "grad", real.grads.at(name).at(r), sim.grads.at(name).at(r), exact));
    if (real_steps.size() != sim_steps.size()) throw std::runtime_error("the training steps kept different values on the engine");
    for (size_t i = 0; i < sim_steps.size(); ++i)
      compared.push_back(compare_local(sim_steps[i].first, "train", real_steps[i].second, sim_steps[i].second, exact));
    for (const auto& c : compared) pass = pass && (c["equal"].get<bool>() || (!exact && c.value("within_tolerance", false)));
    v["status"] = pass ? "pass" : "fail";
    v["exact"] = exact;
    v["tolerance"] = exact ? json(nullptr) : json{{"float64", tolerance_for(at::kDouble)}, {"float32", tolerance_for(at::kFloat)},
                                                 {"relative_to", "max(1, largest magnitude of the simulated local)"}};
    v["compared"] = compared;
    v["first_divergence"] = first_divergence(real.runtime->events(), sim.runtime->events(), config.rank);
    const auto& st = engine->stats();
    v["engine"] = {{"collectives", st.collectives}, {"bytes", st.bytes}, {"inexact_reductions", st.inexact_reductions},
                   {"seconds_in_collectives", st.seconds}};
    v["seconds"] = {{"engine_run", real_s}, {"sim_run", sim_s}};
    code = pass ? 0 : 1;
  } catch (const InputError& e) {
    v["status"] = "error";
    v["error"] = {{"kind", "invalid_input"}, {"message", e.what()}};
    code = 2;
  } catch (const SemanticError& e) {
    v["status"] = "error";
    v["error"] = {{"kind", error_kind_name(e.kind())}, {"message", e.what()}};
    code = exit_code_for(e.kind());
  } catch (const EngineUnavailable& e) {
    v["status"] = "skipped";
    v["error"] = {{"kind", "engine_unavailable"}, {"message", first_line(e.what())}};
    code = kExitEngineSkipped;
  } catch (const std::exception& e) {  // the engine failed: a peer died, a timeout, a refused connection
    // libtorch's errors carry a C++ backtrace after their first line: of no use in a report.
    v["status"] = "error";
    v["error"] = {{"kind", "engine_failure"}, {"message", first_line(e.what())}};
    code = kExitEngineFailure;
  }
  write_json(config.result_file, v);
  if (config.json) out << v.dump(2) << "\n";
  else out << rank_line(v) << "\n";
  return code;
}

namespace {

using Clock = std::chrono::steady_clock;

// A worker whose process is alive and not stopped, but whose heartbeat (kHeartbeatPeriod) has not
// come for this long (ten beats), is not responding: frozen, not merely busy or waiting.
constexpr double kHeartbeatStaleSeconds = 2.0;

// A worker is computing while its CPU time grows by at least kBusyShare of a core over a window of
// kCpuWindowSeconds: simulating, or running the ops between two collectives. Computing is progress,
// as entering or leaving a wait is; a worker that sleeps (hung) or waits spends next to nothing
// (its heartbeat thread, microseconds a beat).
constexpr double kCpuWindowSeconds = 0.5;
constexpr double kBusyShare = 0.1;

struct Worker {
  int64_t rank = 0;
  pid_t pid = -1;
  std::string result, progress, log;
  bool running = false;
  int status = 0;       // waitpid's
  bool killed = false;  // killed by the coordinator, the run having failed
  // What the coordinator saw while watching it: its progress file grows by a line at each wait it
  // enters or leaves, and its modification time is the heartbeat; its CPU time says it computes.
  off_t progress_bytes = 0;
  Clock::time_point last_progress;  // the last wait entered or left, or the last window it computed in
  double cpu_s = 0;                 // its CPU time at cpu_sampled
  Clock::time_point cpu_sampled;
  timespec beat{};
  bool beating = false;  // it has beaten at least once
  Clock::time_point last_beat;
  // Taken just before the coordinator killed it.
  char state = '?';  // /proc/PID/stat's: R, S, D, T (stopped by a signal), t (stopped by a debugger)
  double beat_age_s = 0, idle_s = 0;
};

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

// A line of a C++ backtrace, which libtorch's errors print after their message.
bool backtrace_line(const std::string& line) {
  const auto at = line.find_first_not_of(" \t");
  return at != std::string::npos &&
         (line.compare(at, 7, "frame #") == 0 || line.compare(at, 21, "Exception raised from") == 0);
}

// The last `n` lines of a worker's output, for the report (the workers' directory is removed):
// without backtraces, and without the verdict it printed, which the report has already.
json output_tail(const Worker& w, size_t n) {
  const std::string own = "rank " + std::to_string(w.rank) + ": ";
  std::vector<std::string> kept;
  for (const auto& line : lines_of(w.log))
    if (!backtrace_line(line) && line.rfind(own, 0) != 0 && line.rfind("    first difference at", 0) != 0)
      kept.push_back(line);
  if (kept.size() > n) kept.erase(kept.begin(), kept.end() - static_cast<std::ptrdiff_t>(n));
  return kept;
}

// Where a worker is, from its progress lines (real_engine.cpp, gloo_engine.cpp): waiting in a
// collective, the rendezvous or the closing barrier, or between two of them, and how many waits of
// each kind it entered. The collectives over one group come in the same order on every member,
// so a member that entered fewer of the group's collectives than a waiting rank is one it waits for.
struct Position {
  std::string text = "before its first collective";  // its last line
  bool waiting = false;
  std::string key;  // what it waits in: "ranks 0 1 2 3", "the rendezvous", "the closing barrier"
  Ranks members;    // who must come there too
  std::map<std::string, int64_t> entered;
};

Position position_of(const Worker& w, int64_t world) {
  Position p;
  for (const auto& line : lines_of(w.progress)) {
    p.text = line;
    p.waiting = line.rfind("in ", 0) == 0;
    if (!p.waiting) continue;
    p.members.clear();
    const auto over = line.find(" over ranks ");
    if (over == std::string::npos) {  // the rendezvous or the closing barrier: every rank
      p.key = line.substr(3);
      for (int64_t r = 0; r < world; ++r) p.members.push_back(r);
    } else {
      std::istringstream in(line.substr(over + 12));  // "0 1 2 3)"
      p.key = "ranks";
      for (int64_t r = 0; in >> r;) {
        p.members.push_back(r);
        p.key += " " + std::to_string(r);
      }
    }
    ++p.entered[p.key];
  }
  return p;
}

// The members that a waiting rank waits for: those that have not come to its wait yet.
Ranks waits_for(int64_t rank, const std::vector<Position>& all) {
  const Position& p = all[static_cast<size_t>(rank)];
  Ranks out;
  if (!p.waiting) return out;
  const int64_t k = p.entered.at(p.key);
  for (auto m : p.members) {
    if (m == rank || m < 0 || m >= static_cast<int64_t>(all.size())) continue;
    const auto& theirs = all[static_cast<size_t>(m)].entered;
    const auto it = theirs.find(p.key);
    if ((it == theirs.end() ? 0 : it->second) < k) out.push_back(m);
  }
  return out;
}

// "rank 1", "ranks 1 and 3", "ranks 1, 2 and 3".
std::string ranks_text(const Ranks& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i)
    s += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  return s;
}

// "in collective #2" of "in collective #2 (reduce_scatter over ranks 0 1 2 3)".
std::string short_wait(const Position& p) { return p.text.substr(0, p.text.find(" (")); }

// A process's state and CPU time (user and system), from /proc/PID/stat.
struct ProcStat {
  char state = '?';  // R, S, D, T (stopped by a signal), t (stopped by a debugger)
  double cpu_s = 0;
};

ProcStat proc_stat(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(f, stat);
  const auto close = stat.rfind(')');  // after the command name, which may hold anything
  ProcStat p;
  if (close == std::string::npos) return p;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  // Fields 3 (state) to 15 (stime), of which 14 and 15 are the clock ticks in user and system mode.
  std::vector<std::string> f3_to_15;
  while (f3_to_15.size() < 13 && fields >> field) f3_to_15.push_back(field);
  if (f3_to_15.size() < 13) return p;
  p.state = f3_to_15[0][0];
  p.cpu_s = static_cast<double>(std::stoull(f3_to_15[11]) + std::stoull(f3_to_15[12])) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  return p;
}

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

void watch(Worker& w, Clock::time_point now) {
  if (w.running && seconds_between(w.cpu_sampled, now) >= kCpuWindowSeconds) {  // a reaped worker's pid may be another's
    const double cpu_s = proc_stat(w.pid).cpu_s;
    if (cpu_s - w.cpu_s >= kBusyShare * seconds_between(w.cpu_sampled, now)) w.last_progress = now;
    w.cpu_s = cpu_s;
    w.cpu_sampled = now;
  }
  struct stat st {};
  if (::stat(w.progress.c_str(), &st) != 0) return;
  if (st.st_size != w.progress_bytes) {
    w.progress_bytes = st.st_size;
    w.last_progress = now;
  }
  if (!w.beating || st.st_mtim.tv_sec != w.beat.tv_sec || st.st_mtim.tv_nsec != w.beat.tv_nsec) {
    w.beat = st.st_mtim;
    w.beating = true;
    w.last_beat = now;
  }
}

// While the workers run, SIGINT, SIGTERM and SIGHUP make the coordinator stop them and remove
// their directory before it dies of the signal; dying at once would leave the directory behind.
// A signal ignored when meshsim started (a background job's SIGINT) stays ignored.
volatile std::sig_atomic_t g_interrupted = 0;
void note_interrupt(int sig) { g_interrupted = sig; }

class InterruptWatch {
 public:
  InterruptWatch() {
    g_interrupted = 0;
    struct sigaction on {};
    on.sa_handler = note_interrupt;
    sigemptyset(&on.sa_mask);
    on.sa_flags = SA_RESTART;
    for (size_t i = 0; i < kSignals.size(); ++i) {
      ::sigaction(kSignals[i], nullptr, &old_[i]);
      if (old_[i].sa_handler != SIG_IGN) ::sigaction(kSignals[i], &on, nullptr);
    }
  }
  ~InterruptWatch() { restore(); }
  InterruptWatch(const InterruptWatch&) = delete;
  InterruptWatch& operator=(const InterruptWatch&) = delete;

  int signal() const { return g_interrupted; }
  // Dies of the signal that came, as a program interrupted is expected to (a shell's loop stops).
  [[noreturn]] void die() {
    const int sig = g_interrupted;
    restore();
    ::raise(sig);
    std::_Exit(128 + sig);  // a handler of the caller's caught it
  }

 private:
  void restore() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
  }
  static constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> old_{};
};

// The workers' directory: removed whichever way the run ends (an exception included), unless --keep.
class RunDir {
 public:
  explicit RunDir(bool keep) : keep_(keep) {
    // meshsim-validate-HOST-PID-XXXXXX: those of coordinators killed before they could remove
    // theirs (SIGKILL) are removed here.
    path_ = make_private_directory(fs::temp_directory_path().string(), "meshsim-validate");
  }
  ~RunDir() { close(); }
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

  const fs::path& path() const { return path_; }
  // Removes it (unless kept); says where it is when kept.
  void close(std::ostream* note = nullptr) {
    if (path_.empty()) return;
    if (keep_ && note) *note << "workers' files kept in " << path_.string() << "\n";
    std::error_code ec;
    if (!keep_) fs::remove_all(path_, ec);
    path_.clear();
  }

 private:
  bool keep_;
  fs::path path_;
};

// The worker processes, one process group: whatever happens, none outlives the coordinator's run.
class Crew {
 public:
  explicit Crew(std::vector<Worker>& workers) : workers_(workers) {}
  ~Crew() { stop(); }
  Crew(const Crew&) = delete;
  Crew& operator=(const Crew&) = delete;

  pid_t group = 0;  // the first worker's pid
  // Kills the workers still running and reaps them.
  void stop() {
    if (group > 0) ::kill(-group, SIGKILL);
    for (auto& w : workers_)
      if (w.running) {
        ::kill(w.pid, SIGKILL);  // not reaped yet, so still this worker's pid
        ::waitpid(w.pid, &w.status, 0);
        w.running = false;
        w.killed = WIFSIGNALED(w.status) && WTERMSIG(w.status) == SIGKILL;  // else it exited just before
      }
  }

 private:
  std::vector<Worker>& workers_;
};

// A worker that was still running when the run failed: what it was doing, and whether it is the
// cause. A rank waiting for peers is not blamed; a rank is blamed when stopped by a signal, alive
// but silent (no heartbeat), or alive and beating but idle between two waits while others wait for it.
json verdict_of_killed(const Worker& w, const Position& p, const Ranks& waited, bool awaited, double hung_s) {
  auto error = [&](const char* kind, const std::string& message) {
    return json{{"rank", w.rank}, {"status", "error"}, {"error", {{"kind", kind}, {"message", message}}}};
  };
  std::ostringstream age;
  age.precision(2);
  age << std::fixed << w.beat_age_s;
  if (w.state == 'T') return error("suspended", "stopped (SIGSTOP) " + p.text + ", killed by the coordinator");
  if (w.state == 't') return error("suspended", "stopped by a debugger " + p.text + ", killed by the coordinator");
  if (w.beating && w.beat_age_s >= kHeartbeatStaleSeconds)
    return error("not_responding", "not responding " + p.text + ": no heartbeat for " + age.str() +
                                       " s though its process is alive (state " + std::string(1, w.state) +
                                       "), killed by the coordinator");
  if (p.waiting && !waited.empty()) {
    json v = error("stopped", "waiting " + p.text + " for " + ranks_text(waited) + ", stopped by the coordinator");
    v["error"]["waiting_for"] = waited;
    return v;
  }
  if (!p.waiting && awaited && w.idle_s >= hung_s) {
    const bool started = p.text.rfind("before", 0) != 0;
    return error("hung", "hung " + p.text + (started ? ": never entered its next collective" : ": never reached the rendezvous") +
                             ", stopped by the coordinator");
  }
  if (!w.beating) return error("stopped", "still starting (no heartbeat yet), stopped by the coordinator");
  return error("stopped", "still running " + p.text + ", stopped by the coordinator");
}

}  // namespace

std::string self_executable() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot find this executable (/proc/self/exe): " + ec.message());
  return self.string();
}

namespace {

pid_t start_worker(const std::string& self_exe, const std::vector<std::string>& args, const std::string& log, pid_t parent,
                   pid_t group) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    // The worker: in the coordinator's process group of workers, killed with its parent.
    ::setpgid(0, group);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    ::execv(self_exe.c_str(), argv.data());
    ::_exit(127);
  }
  ::setpgid(pid, group == 0 ? pid : group);  // both sides, so neither races the other
  return pid;
}

}  // namespace

int validate_coordinator(const Scenario& sc, const RunOptions& options, const ValidateConfig& config, std::ostream& out) {
  const std::string self_exe = self_executable();
  const int64_t world = sc.mesh.size();
  const Fault fault = planted_fault(config.fault, sc.mesh);
  const std::string why = engine_unavailable(config.backend, world);
  if (!why.empty()) {
    if (config.json)
      out << json{{"format", "meshsim.validate/1"}, {"scenario", sc.name}, {"backend", config.backend}, {"ranks", world},
                  {"status", "skipped"}, {"reason", why}}.dump(2) << "\n";
    else
      out << "validate " << sc.file << " on " << config.backend << ": skipped: " << why << "\n";
    return kExitEngineSkipped;
  }
  // An illegal scenario stops here (SemanticError, exit 3), and a fault that would inject nothing.
  simulate_checking_fault(sc, options, config.fault, fault);

  // Declared in this order so that the workers are stopped before their directory goes.
  InterruptWatch interrupt;
  RunDir dir(config.keep);
  std::vector<Worker> workers(static_cast<size_t>(world));
  Crew crew(workers);
  // The document this process read and checked, which every worker runs: none re-opens the path
  // (a pipe's, <(...), is gone; a file may have changed since).
  const std::string copy = (dir.path() / "scenario.json").string();
  const std::string text = sc.source.dump();
  write_new_file(copy, {text});
  const uint64_t max_input = std::max<uint64_t>(max_input_bytes(), text.size());
  const pid_t parent = ::getpid();
  const auto started = Clock::now();
  for (int64_t r = 0; r < world; ++r) {
    Worker& w = workers[static_cast<size_t>(r)];
    w.rank = r;
    w.result = (dir.path() / ("rank" + std::to_string(r) + ".json")).string();
    w.progress = (dir.path() / ("rank" + std::to_string(r) + ".progress")).string();
    w.log = (dir.path() / ("rank" + std::to_string(r) + ".log")).string();
    std::vector<std::string> args{self_exe, "validate", sc.file, "--backend", config.backend,
                                  "--rank", std::to_string(r), "--store", (dir.path() / "store").string(),
                                  "--result", w.result, "--progress", w.progress,
                                  "--timeout", std::to_string(config.timeout_s),
                                  "--scenario-copy", copy, "--max-input", std::to_string(max_input)};
    for (const auto& o : config.options) args.insert(args.end(), {"--option", o});
    if (!config.fault.empty()) args.insert(args.end(), {"--fault", config.fault});
    w.pid = start_worker(self_exe, args, w.log, parent, crew.group);
    if (crew.group == 0) crew.group = w.pid;
    w.running = true;
    w.last_progress = w.cpu_sampled = started;
  }

  // Watch: a worker that dies (a signal, or an exit other than pass/fail) stops the run at once. A
  // run is hung when no worker has made progress (entered or left a wait, or computed: watch) for
  // the timeout plus a grace: a wait longer than the timeout ends in the engine itself, so this
  // catches the rest. Time spent computing, before the first collective (the worker simulates
  // twice) or between two, is never held against the timeout.
  const double idle_limit = config.timeout_s + 10;
  auto last_progress = started;
  bool failed = false, hung = false;
  while (!interrupt.signal()) {
    bool any_running = false;
    for (auto& w : workers) {
      if (!w.running) continue;
      int st = 0;
      if (::waitpid(w.pid, &st, WNOHANG) == w.pid) {
        w.running = false;
        w.status = st;
        if (WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 1)) failed = true;
      } else {
        any_running = true;
      }
    }
    if (failed || !any_running) break;
    const auto now = Clock::now();
    for (auto& w : workers) {
      watch(w, now);
      if (w.last_progress > last_progress) last_progress = w.last_progress;
    }
    if (seconds_between(last_progress, now) > idle_limit) {
      hung = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (interrupt.signal()) {
    crew.stop();
    std::cerr << "meshsim: validate: interrupted (" << strsignal(interrupt.signal()) << "): the workers were stopped\n";
    dir.close(&std::cerr);
    interrupt.die();
  }
  if (failed || hung) {
    // How each worker still running was, before killing it changes that.
    const auto now = Clock::now();
    for (auto& w : workers) {
      if (!w.running) continue;
      w.state = proc_stat(w.pid).state;
      watch(w, now);
      w.beat_age_s = w.beating ? seconds_between(w.last_beat, now) : 0;
      w.idle_s = seconds_between(w.last_progress, now);
    }
    crew.stop();
  }

  if (!config.json)
    out << "validate " << sc.file << " on " << config.backend << ": " << world << " worker processes (mesh "
        << sc.mesh.str() << "), timeout " << config.timeout_s << " s per collective\n";
  json report{{"format", "meshsim.validate/1"}, {"scenario", sc.name}, {"backend", config.backend},
              {"ranks", world}, {"timeout_s", config.timeout_s}};
  std::vector<Position> positions;
  for (const auto& w : workers) positions.push_back(position_of(w, world));
  std::vector<Ranks> waited(static_cast<size_t>(world));
  std::vector<bool> awaited(static_cast<size_t>(world), false);
  for (int64_t r = 0; r < world; ++r) {
    waited[static_cast<size_t>(r)] = waits_for(r, positions);
    for (auto m : waited[static_cast<size_t>(r)]) awaited[static_cast<size_t>(m)] = true;
  }
  const double hung_s = std::max(0.5, config.timeout_s / 2);
  json ranks = json::array();
  bool all_pass = true;
  double slowest_engine = 0, slowest_sim = 0;
  for (const auto& w : workers) {
    const auto r = static_cast<size_t>(w.rank);
    const Position& p = positions[r];
    json v;
    if (w.killed) {
      v = verdict_of_killed(w, p, waited[r], awaited[r], hung_s);
    } else if (WIFSIGNALED(w.status)) {
      v = {{"rank", w.rank}, {"status", "error"},
           {"error", {{"kind", "died"}, {"message", std::string("died (signal ") + std::to_string(WTERMSIG(w.status)) + ", " +
                                                        strsignal(WTERMSIG(w.status)) + ") " + p.text}}}};
    } else if (fs::exists(w.result)) {
      std::ifstream f(w.result);
      v = json::parse(f);
      // A rank that gave up waiting (a timeout, a peer gone) says for whom it waited.
      if (v.value("status", "") == "error" && v["error"].value("kind", "") == "engine_failure" && !waited[r].empty()) {
        v["error"]["message"] =
            v["error"].value("message", "") + " (waiting " + short_wait(p) + " for " + ranks_text(waited[r]) + ")";
        v["error"]["waiting_for"] = waited[r];
      }
    } else {
      v = {{"rank", w.rank}, {"status", "error"},
           {"error", {{"kind", "no_verdict"},
                      {"message", "exited with code " + std::to_string(WEXITSTATUS(w.status)) + " without a verdict"}}}};
    }
    if (v.value("status", "") == "error") {
      const json tail = output_tail(w, 8);
      if (!tail.empty()) v["error"]["output"] = tail;
    }
    if (v.value("status", "") != "pass") all_pass = false;
    if (v.contains("seconds")) {
      slowest_engine = std::max(slowest_engine, v["seconds"]["engine_run"].get<double>());
      slowest_sim = std::max(slowest_sim, v["seconds"]["sim_run"].get<double>());
    }
    if (!config.json) {
      out << "  " << rank_line(v) << "\n";
      if (v.contains("error") && v["error"].contains("output")) {
        out << "    its output (last lines):\n";
        for (const auto& line : v["error"]["output"]) out << "      " << line.get<std::string>() << "\n";
      }
    }
    ranks.push_back(v);
  }
  const bool engine_failed = failed || hung ||
                             std::any_of(ranks.begin(), ranks.end(), [](const json& v) { return v.value("status", "") == "error"; });
  const std::string status = all_pass ? "pass" : engine_failed ? "error" : "fail";
  report["status"] = status;
  report["rank_results"] = ranks;
  if (all_pass) report["seconds"] = {{"engine_run_slowest_rank", slowest_engine}, {"sim_run_slowest_rank", slowest_sim}};
  if (config.json) {
    out << report.dump(2) << "\n";
  } else {
    out << "status: " << status;
    if (all_pass)
      out << " (every rank's values and gradients agree with the simulation)\ntime: " << config.backend << " run "
          << slowest_engine * 1e3 << " ms, simulation " << slowest_sim * 1e3 << " ms (slowest rank of each)";
    if (hung) out << " (hung: for " << idle_limit << " s no worker entered or left a wait, or computed)";
    out << "\n";
  }
  dir.close(config.json ? &std::cerr : &out);
  if (interrupt.signal()) interrupt.die();  // came while the report was written: the report stands
  return all_pass ? 0 : engine_failed ? kExitEngineFailure : 1;
}

}  // namespace meshsim

#include "gpu_validate/validate.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "gpu_validate/gloo_engine.h"
#include "gpu_validate/nccl_engine.h"
#include "sim/data.h"
#include "sim/interpreter.h"

namespace meshsim {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::unique_ptr<RealCommunicator> make_engine(const Mesh& mesh, const ValidateConfig& c) {
  StoreConfig store;
  store.rank = c.rank;
  store.world = mesh.size();
  store.timeout = std::chrono::milliseconds(static_cast<int64_t>(c.timeout_s * 1000));
  store.file = c.store;
  store.master_addr = c.master_addr;
  store.master_port = c.master_port;
  const EngineConfig engine{store, c.fault.empty() ? Fault{} : parse_fault(c.fault), c.progress_file};
  if (c.backend == "nccl") return make_nccl_communicator(mesh, engine);
  return std::make_unique<GlooCommunicator>(mesh, GlooConfig{engine, c.hostname});
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
  int values = 0, grads = 0, equal = 0, within = 0;
  for (const auto& c : v["compared"]) {
    (c["of"] == "grad" ? grads : values)++;
    if (c["equal"].get<bool>()) ++equal;
    else if (c.value("within_tolerance", false)) ++within;
  }
  const auto& e = v["engine"];
  auto count = [](int n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); };
  s << ": " << count(values, "value") << " and " << count(grads, "gradient") << ", " << equal << " equal bit for bit";
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
  int code = 0;
  try {
    if (config.rank < 0 || config.rank >= sc.mesh.size())
      throw InputError(sc.file, "/mesh/shape",
                       "--rank " + std::to_string(config.rank) + " is not a rank of the mesh (" + sc.mesh.str() + ")");
    // The simulation first, once to warm libtorch up and once timed, then the engine, timed alike.
    run_distributed(sc, options);
    auto t0 = std::chrono::steady_clock::now();
    SimRun sim = run_distributed(sc, options);
    const double sim_s = seconds_since(t0);
    std::unique_ptr<RealCommunicator> engine = make_engine(sc.mesh, config);
    t0 = std::chrono::steady_clock::now();
    SimRun real;
    {
      UseCommunicator use(*engine);
      real = run_distributed(sc, options);
    }
    const double real_s = seconds_since(t0);
    engine->finish();
    const bool exact = engine->stats().inexact_reductions == 0;
    const auto r = static_cast<size_t>(config.rank);
    json compared = json::array();
    bool pass = true;
    for (const auto& name : sim.named) {
      compared.push_back(compare_local(name, "value", real.values.at(name).locals.at(r), sim.values.at(name).locals.at(r), exact));
    }
    for (const auto& name : sim.grad_inputs)
      if (sim.grads.count(name))
        compared.push_back(compare_local(name, "grad", real.grads.at(name).at(r), sim.grads.at(name).at(r), exact));
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
    v["error"] = {{"kind", "engine_unavailable"}, {"message", e.what()}};
    code = kExitEngineSkipped;
  } catch (const std::exception& e) {  // the engine failed: a peer died, a timeout, a refused connection
    v["status"] = "error";
    v["error"] = {{"kind", "engine_failure"}, {"message", e.what()}};
    code = kExitEngineFailure;
  }
  write_json(config.result_file, v);
  if (config.json) out << v.dump(2) << "\n";
  else out << rank_line(v) << "\n";
  return code;
}

namespace {

struct Worker {
  int64_t rank = 0;
  pid_t pid = -1;
  std::string result, progress, log;
  bool running = false;
  int status = 0;           // waitpid's
  bool stopped = false;     // killed by the coordinator
};

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

// The last `n` lines of a worker's log, indented for the report.
std::string tail(const std::string& path, size_t n) {
  const std::vector<std::string> all = lines_of(path);
  std::string out;
  for (size_t i = all.size() > n ? all.size() - n : 0; i < all.size(); ++i) out += "      " + all[i] + "\n";
  return out;
}

// Where a worker is, from its progress lines (real_engine.cpp).
std::string where(const Worker& w) {
  const std::vector<std::string> lines = lines_of(w.progress);
  return lines.empty() ? "before its first collective" : lines.back();
}

off_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : 0;
}

}  // namespace

std::string self_executable() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot find this executable (/proc/self/exe): " + ec.message());
  return self.string();
}

int validate_coordinator(const Scenario& sc, const RunOptions& options, const ValidateConfig& config, std::ostream& out) {
  const std::string self_exe = self_executable();
  const int64_t world = sc.mesh.size();
  if (!config.fault.empty()) parse_fault(config.fault);  // malformed: std::invalid_argument, exit 2
  const std::string why = engine_unavailable(config.backend, world);
  if (!why.empty()) {
    if (config.json)
      out << json{{"format", "meshsim.validate/1"}, {"scenario", sc.name}, {"backend", config.backend}, {"ranks", world},
                  {"status", "skipped"}, {"reason", why}}.dump(2) << "\n";
    else
      out << "validate " << sc.file << " on " << config.backend << ": skipped: " << why << "\n";
    return kExitEngineSkipped;
  }
  run_distributed(sc, options);  // an illegal scenario stops here (SemanticError, exit 3)

  std::string tmpl = (fs::temp_directory_path() / "meshsim-validate-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("cannot make a private directory: " + std::string(std::strerror(errno)));
  const fs::path dir = tmpl;
  std::vector<Worker> workers(static_cast<size_t>(world));
  const pid_t parent = ::getpid();
  pid_t group = 0;
  for (int64_t r = 0; r < world; ++r) {
    Worker& w = workers[static_cast<size_t>(r)];
    w.rank = r;
    w.result = (dir / ("rank" + std::to_string(r) + ".json")).string();
    w.progress = (dir / ("rank" + std::to_string(r) + ".progress")).string();
    w.log = (dir / ("rank" + std::to_string(r) + ".log")).string();
    std::vector<std::string> args{self_exe, "validate", sc.file, "--backend", config.backend,
                                  "--rank", std::to_string(r), "--store", (dir / "store").string(),
                                  "--result", w.result, "--progress", w.progress,
                                  "--timeout", std::to_string(config.timeout_s)};
    for (const auto& o : config.options) args.insert(args.end(), {"--option", o});
    if (!config.fault.empty()) args.insert(args.end(), {"--fault", config.fault});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed: " + std::string(std::strerror(errno)));
    if (pid == 0) {
      // The worker: in the coordinator's process group of workers, killed with its parent.
      ::setpgid(0, group);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      const int fd = ::open(w.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
      ::execv(self_exe.c_str(), argv.data());
      ::_exit(127);
    }
    ::setpgid(pid, group);  // both sides, so neither races the other
    if (group == 0) group = pid;
    w.pid = pid;
    w.running = true;
  }

  // Watch: a worker that dies (a signal, or an exit other than pass/fail) stops the run at once; a
  // run where no rank starts a collective for the timeout (plus a grace for start-up) is hung.
  const double idle_limit = config.timeout_s + 10;
  auto last_progress = std::chrono::steady_clock::now();
  off_t progress_total = 0;
  bool failed = false, hung = false;
  for (;;) {
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
    off_t total = 0;
    for (const auto& w : workers) total += file_size(w.progress);
    if (total != progress_total) {
      progress_total = total;
      last_progress = std::chrono::steady_clock::now();
    } else if (seconds_since(last_progress) > idle_limit) {
      hung = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (failed || hung) {
    ::kill(-group, SIGKILL);
    for (auto& w : workers)
      if (w.running) {
        ::waitpid(w.pid, &w.status, 0);
        w.running = false;
        w.stopped = true;
      }
  }

  if (!config.json)
    out << "validate " << sc.file << " on " << config.backend << ": " << world << " worker processes (mesh "
        << sc.mesh.str() << "), timeout " << config.timeout_s << " s per collective\n";
  json report{{"format", "meshsim.validate/1"}, {"scenario", sc.name}, {"backend", config.backend},
              {"ranks", world}, {"timeout_s", config.timeout_s}};
  json ranks = json::array();
  bool all_pass = true;
  double slowest_engine = 0, slowest_sim = 0;
  for (const auto& w : workers) {
    json v;
    if (w.stopped) {
      // A rank that left a collective and never entered the next, while its peers wait in a
      // collective, is the one that hangs.
      const std::string at = where(w);
      const bool between = at.rfind("after", 0) == 0 || at.rfind("before", 0) == 0;
      v = {{"rank", w.rank}, {"status", "error"},
           {"error", {{"kind", between ? "hung" : "stopped"},
                      {"message", between ? "hung " + at + ": never entered its next collective, stopped by the coordinator"
                                          : "still running " + at + ", stopped by the coordinator"}}}};
    } else if (WIFSIGNALED(w.status)) {
      v = {{"rank", w.rank}, {"status", "error"},
           {"error", {{"kind", "died"}, {"message", std::string("died (signal ") + std::to_string(WTERMSIG(w.status)) + ", " +
                                                        strsignal(WTERMSIG(w.status)) + ") " + where(w)}}}};
    } else if (fs::exists(w.result)) {
      std::ifstream f(w.result);
      v = json::parse(f);
    } else {
      v = {{"rank", w.rank}, {"status", "error"},
           {"error", {{"kind", "no_verdict"},
                      {"message", "exited with code " + std::to_string(WEXITSTATUS(w.status)) +
                                      " without a verdict; its output:\n" + tail(w.log, 8)}}}};
    }
    if (v.value("status", "") != "pass") all_pass = false;
    if (v.contains("seconds")) {
      slowest_engine = std::max(slowest_engine, v["seconds"]["engine_run"].get<double>());
      slowest_sim = std::max(slowest_sim, v["seconds"]["sim_run"].get<double>());
    }
    if (!config.json) out << "  " << rank_line(v) << "\n";
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
    if (hung) out << " (hung: no rank started a collective for " << idle_limit << " s)";
    out << "\n";
  }
  if (config.keep || engine_failed) (config.json ? std::cerr : out) << "workers' files kept in " << dir.string() << "\n";
  else fs::remove_all(dir);
  return all_pass ? 0 : engine_failed ? kExitEngineFailure : 1;
}

}  // namespace meshsim

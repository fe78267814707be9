// The same scenario on the simulation and on Gloo with the same number of ranks (4), as a ratio
// measured in one run: the goal is the simulation at least 100 times faster than Gloo on small
// tensors, for whole scenarios (forward, backward, every collective).
//
// This process is rank 0; it starts ranks 1..3 as copies of itself (`--worker`, re-executed, not
// forked, so no libtorch thread pool crosses a fork), all meeting through a FileStore. Every
// iteration runs the scenario once on the simulation alone (rank 0, untouched by the others) and
// once on Gloo (all four processes, each its rank). A Gloo run, as in `meshsim validate`, also
// simulates the peers' locals in every process: that in-process work is the simulation's cost
// again, small against the engine's.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "gpu_validate/gloo_engine.h"
#include "gpu_validate/validate.h"
#include "sim/interpreter.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace meshsim;

constexpr int kRanks = 4;
constexpr int kIterations = 30;

std::unique_ptr<GlooCommunicator> engine(const Scenario& sc, int rank, const std::string& store) {
  GlooConfig c;
  c.store.rank = rank;
  c.store.world = sc.mesh.size();
  c.store.file = store;
  c.store.timeout = std::chrono::milliseconds(60000);
  return std::make_unique<GlooCommunicator>(sc.mesh, c);
}

// Ranks 1..3: the scenario on Gloo, as many times as rank 0 runs it (one warm-up included).
int worker(const std::string& file, int rank, const std::string& store, int runs) {
  meshsim::bench::set_threads_from_env();
  const Scenario sc = load_scenario(file);
  auto gloo = engine(sc, rank, store);
  UseCommunicator use(*gloo);
  for (int i = 0; i < runs; ++i) run_distributed(sc, sc.options);
  gloo->finish();
  return 0;
}

void BM_SimVsGloo(benchmark::State& state, const std::string& example) {
  const std::string file = std::string(MESHSIM_SOURCE_DIR) + "/examples/" + example;
  const Scenario sc = load_scenario(file);
  if (sc.mesh.size() != kRanks) {
    state.SkipWithError("the example's mesh is not 4 ranks");
    return;
  }
  const fs::path dir = fs::temp_directory_path() / ("meshsim_bench_engines_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string store = (dir / "store").string(), exe = self_executable();
  const int runs = static_cast<int>(state.max_iterations) + 1;
  std::vector<pid_t> pids;
  for (int r = 1; r < kRanks; ++r) {
    std::vector<std::string> args{exe, "--worker", file, std::to_string(r), store, std::to_string(runs)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid;
    if (::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), environ) == 0) pids.push_back(pid);
  }
  {
    auto gloo = engine(sc, 0, store);
    auto sim_run = [&] { run_distributed(sc, sc.options); };
    auto gloo_run = [&] {
      UseCommunicator use(*gloo);
      run_distributed(sc, sc.options);
    };
    sim_run();  // warm both
    gloo_run();
    std::vector<double> ts, tg;
    for (auto _ : state) {
      ts.push_back(meshsim::bench::time_once(sim_run));
      const double g = meshsim::bench::time_once(gloo_run);
      tg.push_back(g);
      state.SetIterationTime(g);
    }
    gloo->finish();
    const double ms = meshsim::bench::median(ts), mg = meshsim::bench::median(tg);
    state.counters["sim_us"] = ms * 1e6;
    state.counters["gloo_us"] = mg * 1e6;
    state.counters["gloo_over_sim"] = ms > 0 ? mg / ms : 0.0;
    state.counters["collectives"] = static_cast<double>(gloo->stats().collectives) / runs;
  }
  for (auto pid : pids) ::waitpid(pid, nullptr, 0);
  fs::remove_all(dir);
}

}  // namespace

BENCHMARK_CAPTURE(BM_SimVsGloo, fsdp_reduced, std::string("fsdp_reduced.json"))
    ->Iterations(kIterations)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SimVsGloo, fsdp_tp_2d, std::string("fsdp_tp_2d.json"))
    ->Iterations(kIterations)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SimVsGloo, tp_megatron_mlp, std::string("tp_megatron_mlp.json"))
    ->Iterations(kIterations)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SimVsGloo, lm_expert_parallel, std::string("lm_expert_parallel.json"))
    ->Iterations(kIterations)->UseManualTime()->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  if (argc == 6 && std::strcmp(argv[1], "--worker") == 0)
    return worker(argv[2], std::atoi(argv[3]), argv[4], std::atoi(argv[5]));
  meshsim::bench::set_threads_from_env();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

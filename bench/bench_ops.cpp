// meshsim's time per op on small tensors, for the comparison with PyTorch's LocalTensorMode
// (tools/crosscheck/perf writes the scenarios, runs this and the same scenarios under
// LocalTensorMode in one run, and reports the ratios; docs/performance.md). Each scenario in the
// folder MESHSIM_BENCH_OPS is a chain of 32 ops of one kind on 4 ranks, 8x8 float64 (forward only,
// as LocalTensorMode's op timings are); the time per op is the whole run's (inputs laid out, every
// op propagated and run) divided by the program's ops, so meshsim's set-up counts against it.
// MESHSIM_BENCH_FILTER (a scenario's file name without .json) registers that one alone, and
// MESHSIM_BENCH_MIN_TIME (seconds, default 0.5) sets how long each runs.
// With MESHSIM_BENCH_CHECKED=1 each run is a whole checked run instead (check_scenario: the mesh's
// run with its backward, the single-device oracle, the comparison), for whole programs.
// run_us and per_op_us are wall time (the median run, and over the ops); run_cpu_us and
// per_op_cpu_us the process's CPU time (std::clock).
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>

#include "bench/bench_common.h"
#include "core/scoped.h"
#include "oracles/check.h"
#include "sim/interpreter.h"
#include "sim/runtime.h"

namespace {

namespace fs = std::filesystem;
using namespace meshsim;

void BM_PerOp(benchmark::State& state, const std::string& file) {
  meshsim::bench::set_threads_from_env();
  const Scenario sc = load_scenario(file);
  const bool checked = std::getenv("MESHSIM_BENCH_CHECKED") != nullptr;
  // As `meshsim run` without --trace: no trace is written, so the locals are not hashed.
  ScopedOverride<bool> no_hashes(local_hashes_enabled(), false);
  std::vector<double> times, cpu;
  for (auto _ : state) {
    const std::clock_t c0 = std::clock();
    const double t = meshsim::bench::time_once([&] {
      if (checked)
        benchmark::DoNotOptimize(check_scenario(sc, sc.options));
      else
        benchmark::DoNotOptimize(run_distributed(sc, sc.options));
    });
    cpu.push_back(static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
    state.SetIterationTime(t);
    times.push_back(t);
  }
  const double ops = static_cast<double>(sc.program.size()), run = meshsim::bench::median(times),
               run_cpu = meshsim::bench::median(cpu);
  state.counters["ops"] = ops;
  state.counters["run_us"] = run * 1e6;
  state.counters["run_cpu_us"] = run_cpu * 1e6;
  state.counters["per_op_us"] = run / ops * 1e6;
  state.counters["per_op_cpu_us"] = run_cpu / ops * 1e6;
}

const bool registered = [] {
  std::vector<fs::path> files;
  const char* dir = std::getenv("MESHSIM_BENCH_OPS");
  if (dir == nullptr || !fs::is_directory(dir)) {
    std::fprintf(stderr, "meshsim_bench_ops: set MESHSIM_BENCH_OPS to a folder of scenarios (tools/crosscheck/perf does)\n");
    return false;
  }
  const char* only = std::getenv("MESHSIM_BENCH_FILTER");
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json" && (only == nullptr || e.path().stem() == only)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files)
    benchmark::RegisterBenchmark(("BM_PerOp/" + f.stem().string()).c_str(), BM_PerOp, f.string())
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(std::getenv("MESHSIM_BENCH_MIN_TIME") ? std::atof(std::getenv("MESHSIM_BENCH_MIN_TIME")) : 0.5);
  return true;
}();

}  // namespace

BENCHMARK_MAIN();

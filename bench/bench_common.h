// Helpers shared by the meshsim benchmarks: paired timing of a baseline and meshsim in the same
// loop (interleaved, so that load from other processes hits both alike), reported as medians and
// their ratio through Google Benchmark counters.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

namespace meshsim::bench {

inline double seconds_of(const std::chrono::steady_clock::time_point& a,
                         const std::chrono::steady_clock::time_point& b) {
  return std::chrono::duration<double>(b - a).count();
}

template <class F>
double time_once(F&& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  auto t1 = std::chrono::steady_clock::now();
  return seconds_of(t0, t1);
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A further baseline: its median is reported as <name>_us and the subject's ratio to it as
// ratio_<name>.
struct Extra {
  std::string name;
  std::function<void()> run;
};

// MESHSIM_BENCH_PLANT_SLOWDOWN=k (k >= 1): the subject runs k times within each of its timings, a
// slowdown by k planted so that the CI ratio check's own test can show it fails (tests/perf_ratio.py).
inline int planted_slowdown() {
  const char* s = std::getenv("MESHSIM_BENCH_PLANT_SLOWDOWN");
  return s ? std::max(1, std::atoi(s)) : 1;
}

// Runs `baseline` and `subject` (and any extra baselines) alternately once per benchmark
// iteration (the benchmark's time is the subject's, by manual timing) and sets the counters
// baseline_us, meshsim_us (medians) and ratio (meshsim median over baseline median). Register
// with ->UseManualTime().
inline void paired(benchmark::State& state, const std::function<void()>& baseline,
                   const std::function<void()>& subject, const std::vector<Extra>& extras = {}) {
  baseline();  // warm both: first-touch allocations, lazy initialisation
  subject();
  for (const auto& e : extras) e.run();
  const int slowdown = planted_slowdown();
  std::vector<double> tb, ts;
  std::vector<std::vector<double>> te(extras.size());
  for (auto _ : state) {
    tb.push_back(time_once(baseline));
    for (size_t i = 0; i < extras.size(); ++i) te[i].push_back(time_once(extras[i].run));
    const double s = time_once([&] {
      for (int k = 0; k < slowdown; ++k) subject();
    });
    ts.push_back(s);
    state.SetIterationTime(s);
  }
  const double mb = median(tb), ms = median(ts);
  state.counters["baseline_us"] = mb * 1e6;
  state.counters["meshsim_us"] = ms * 1e6;
  state.counters["ratio"] = mb > 0 ? ms / mb : 0.0;
  for (size_t i = 0; i < extras.size(); ++i) {
    const double me = median(te[i]);
    state.counters[extras[i].name + "_us"] = me * 1e6;
    state.counters["ratio_" + extras[i].name] = me > 0 ? ms / me : 0.0;
  }
}

// libtorch's intra-op threads: MESHSIM_BENCH_THREADS (default 1, so that figures on a shared
// 2-core machine are stable; baseline and meshsim always run with the same setting).
inline void set_threads_from_env() {
  int n = 1;
  if (const char* s = std::getenv("MESHSIM_BENCH_THREADS")) n = std::max(1, std::atoi(s));
  at::set_num_threads(n);
}

}  // namespace meshsim::bench

// main() for a benchmark executable that first fixes libtorch's thread count.
#define MESHSIM_BENCH_MAIN()                                  \
  int main(int argc, char** argv) {                           \
    meshsim::bench::set_threads_from_env();                   \
    benchmark::Initialize(&argc, argv);                       \
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) { \
      return 1;                                               \
    }                                                         \
    benchmark::RunSpecifiedBenchmarks();                      \
    benchmark::Shutdown();                                    \
    return 0;                                                 \
  }

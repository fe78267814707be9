// What training steps cost (issue #32, docs/performance.md): a checked run of
// examples/transformer_fsdp_tp_sp.json with "train" of 3 AdamW steps (clip_grad_norm on) against
// the same with 1 step. The first forward and backward is the checked run itself (values,
// gradients, the result); every later step adds a forward and backward on the mesh and in the
// oracle, the optimizer on both, and the comparison of parameters and states. The goal: 3 steps at
// most 3.5 x one step. Both are timed in the same iteration, so the ratio sees the same machine.
#include <chrono>
#include <string>

#include "bench/bench_common.h"
#include "core/scenario.h"
#include "oracles/check.h"

namespace meshsim::bench {
namespace {

Scenario transformer_steps(int64_t steps) {
  const std::string file = std::string(MESHSIM_SOURCE_DIR) + "/examples/transformer_fsdp_tp_sp.json";
  nlohmann::json doc = read_json_file(file);
  doc["train"] = {{"steps", steps},
                  {"lr", 0.01},
                  {"optimizer", {{"kind", "adamw"}}},
                  {"clip_grad_norm", {{"max_norm", 1.0}}}};
  return parse_scenario(std::move(doc), file);
}

double seconds_of(const Scenario& sc, benchmark::State& state) {
  const auto t0 = std::chrono::steady_clock::now();
  CheckedRun r = check_scenario(sc, sc.options);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.exit_code != 0) state.SkipWithError("the scenario does not pass");
  return s;
}

// Manual time: the 3-step run's. Counters: each run's mean milliseconds and their ratio.
void BM_TransformerAdamW3StepsOver1(benchmark::State& state) {
  set_threads_from_env();
  static const Scenario one = transformer_steps(1), three = transformer_steps(3);
  double t1 = 0, t3 = 0;
  int64_t n = 0;
  for (auto _ : state) {
    t1 += seconds_of(one, state);
    const double s3 = seconds_of(three, state);
    t3 += s3;
    state.SetIterationTime(s3);
    ++n;
  }
  state.counters["one_step_ms"] = 1e3 * t1 / static_cast<double>(n);
  state.counters["three_steps_ms"] = 1e3 * t3 / static_cast<double>(n);
  state.counters["ratio"] = t3 / t1;
}
BENCHMARK(BM_TransformerAdamW3StepsOver1)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace
}  // namespace meshsim::bench

BENCHMARK_MAIN();

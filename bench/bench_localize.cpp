// The cost of looking for the first divergence (result "first_divergence"), on the FSDP2 + TP + SP
// transformer of examples/transformer_fsdp_tp_sp.json (two layers, 84 ops, dp=2 x tp=2): whole
// checked runs (check_scenario: the mesh, the oracle, the comparison).
//
//   Passing: the plain run (localize on_failure, the default: nothing is kept) against the run
//   that keeps every intermediate gradient and both graphs (localize always, `--localize`), and
//   against localize never (ratio_never: the default costs nothing when the run passes).
//   Failing (planted bug norm_weight_grad_not_reduced): the run with the search in the run itself
//   (always) against the same run without any search (never); on_failure, which runs the mesh and
//   the oracle a second time, is the extra baseline.
// The goal (docs/performance.md): localization at most 1.5x a plain run.
#include <string>

#include "bench/bench_common.h"
#include "core/scenario.h"
#include "oracles/check.h"

namespace meshsim::bench {
namespace {

Scenario transformer() {
  const std::string file = std::string(MESHSIM_SOURCE_DIR) + "/examples/transformer_fsdp_tp_sp.json";
  return parse_scenario(read_json_file(file), file);
}

RunOptions with(RunOptions o, Localize l, const std::string& mutant = "") {
  o.localize = l;
  o.mutant = mutant;
  return o;
}

void BM_LocalizePassing(benchmark::State& state) {
  set_threads_from_env();
  const Scenario sc = transformer();
  const RunOptions plain = with(sc.options, Localize::OnFailure), always = with(sc.options, Localize::Always),
                   never = with(sc.options, Localize::Never);
  paired(
      state, [&] { benchmark::DoNotOptimize(check_scenario(sc, plain)); },
      [&] { benchmark::DoNotOptimize(check_scenario(sc, always)); },
      {{"never", [&] { benchmark::DoNotOptimize(check_scenario(sc, never)); }}});
}
BENCHMARK(BM_LocalizePassing)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(15);

void BM_LocalizeFailing(benchmark::State& state) {
  set_threads_from_env();
  const Scenario sc = transformer();
  const std::string bug = "norm_weight_grad_not_reduced";
  const RunOptions never = with(sc.options, Localize::Never, bug), always = with(sc.options, Localize::Always, bug),
                   second = with(sc.options, Localize::OnFailure, bug);
  paired(
      state, [&] { benchmark::DoNotOptimize(check_scenario(sc, never)); },
      [&] { benchmark::DoNotOptimize(check_scenario(sc, always)); },
      {{"on_failure", [&] { benchmark::DoNotOptimize(check_scenario(sc, second)); }}});
}
BENCHMARK(BM_LocalizeFailing)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(15);

}  // namespace
}  // namespace meshsim::bench

BENCHMARK_MAIN();

// Where a checked run's time goes (check_scenario: the mesh's run, the single-device oracle, the
// comparison of every value and gradient, the rest of the result; CheckedRun::seconds), on bundled examples and on a chain
// of 32 small adds (the scenario tools/crosscheck/perf times per op). Reported per scenario as
// shares of the whole checked run, measured in one run: the goal (issue #35, docs/performance.md)
// is a comparison of at most 10% of a checked run.
#include <chrono>
#include <map>
#include <string>

#include "bench/bench_common.h"
#include "core/scenario.h"
#include "oracles/check.h"

namespace meshsim::bench {
namespace {

Scenario example(const std::string& name) {
  const std::string file = std::string(MESHSIM_SOURCE_DIR) + "/examples/" + name + ".json";
  return parse_scenario(read_json_file(file), file);
}

// y0 = x + b, y1 = y0 + b, ... on dp=4, 8x8 float64 S(0): small ops, many values to compare.
Scenario add_chain() {
  nlohmann::json program = nlohmann::json::array();
  std::string prev = "x";
  for (int i = 0; i < 32; ++i) {
    program.push_back({{"op", "add"}, {"args", {prev, "b"}}, {"out", "y" + std::to_string(i)}});
    prev = "y" + std::to_string(i);
  }
  nlohmann::json doc = {{"format", "meshsim.scenario/1"}, {"name", "add_chain"},
                        {"mesh", {{"axes", {"dp"}}, {"shape", {4}}}},
                        {"inputs", {{{"name", "x"}, {"shape", {8, 8}}, {"placements", {"S(0)"}}, {"init", "randn"}},
                                    {{"name", "b"}, {"shape", {8, 8}}, {"placements", {"S(0)"}}, {"init", "randn"}}}},
                        {"program", program}};
  return parse_scenario(std::move(doc), "add_chain");
}

void BM_CheckedRunPhases(benchmark::State& state, const Scenario& sc) {
  set_threads_from_env();
  double total = 0, simulation = 0, oracle = 0, comparison = 0, result = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    CheckedRun r = check_scenario(sc, sc.options);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r.exit_code != 0) state.SkipWithError("the scenario does not pass");
    state.SetIterationTime(s);
    total += s;
    simulation += r.seconds.simulation;
    oracle += r.seconds.oracle;
    comparison += r.seconds.comparison;
    result += r.seconds.result;
  }
  state.counters["simulation_share"] = simulation / total;
  state.counters["oracle_share"] = oracle / total;
  state.counters["comparison_share"] = comparison / total;
  state.counters["result_share"] = result / total;
}

const Scenario& cached(const std::string& name) {
  static std::map<std::string, Scenario> scenarios;
  auto it = scenarios.find(name);
  if (it == scenarios.end()) it = scenarios.emplace(name, name == "add_chain" ? add_chain() : example(name)).first;
  return it->second;
}

void BM_TransformerFsdpTpSp(benchmark::State& s) { BM_CheckedRunPhases(s, cached("transformer_fsdp_tp_sp")); }
void BM_FsdpTp2d(benchmark::State& s) { BM_CheckedRunPhases(s, cached("fsdp_tp_2d")); }
void BM_LmMegatronTp(benchmark::State& s) { BM_CheckedRunPhases(s, cached("lm_megatron_tp")); }
void BM_AddChain(benchmark::State& s) { BM_CheckedRunPhases(s, cached("add_chain")); }
BENCHMARK(BM_TransformerFsdpTpSp)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_FsdpTp2d)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(BM_LmMegatronTp)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(BM_AddChain)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);

}  // namespace
}  // namespace meshsim::bench

BENCHMARK_MAIN();

// Properties: cases per second of every property of the catalog, run as `meshsim check` runs them
// (properties/runner.h run_property) with a fixed seed. A case of a scenario property parses a
// generated scenario, runs it on the fake mesh and checks it against the oracle.
#include "bench/bench_common.h"
#include "properties/properties.h"
#include "properties/runner.h"

namespace meshsim::bench {
namespace {

constexpr int kCases = 50;

void BM_Property(benchmark::State& state, const Property* property) {
  int64_t cases = 0;
  bool passed = true;
  for (auto _ : state) {
    PropertyOutcome out = run_property(*property, /*seed=*/1, kCases, nullptr);
    cases += out.progress.cases;
    passed &= out.status == PropertyOutcome::Status::Passed;
  }
  state.SetItemsProcessed(cases);  // items_per_second: cases per second
  state.counters["cases_per_s"] = benchmark::Counter(static_cast<double>(cases), benchmark::Counter::kIsRate);
  state.counters["passed"] = passed ? 1 : 0;
}

int register_all() {
  for (const auto& p : property_catalog())
    benchmark::RegisterBenchmark(p.name, BM_Property, &p)->Unit(benchmark::kMillisecond)->MinTime(1.0);
  return 0;
}
const int registered = register_all();

}  // namespace
}  // namespace meshsim::bench

MESHSIM_BENCH_MAIN()

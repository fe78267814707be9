// The trace of a checked run (DESIGN.md, contract 4): what `meshsim run --trace`, counterexamples
// and run_scenario's RunSettings::trace_out write.
#pragma once

#include "core/scenario.h"
#include "oracles/check.h"
#include "traces/trace.h"

namespace meshsim {

// Takes the run's events and result (a long program's events are as large as its graph was).
inline Trace trace_of(const Scenario& sc, const RunOptions& options, CheckedRun&& run) {
  Trace t;
  t.version = MESHSIM_VERSION;
  t.scenario = sc.source;
  t.options = options.to_json();
  t.events = std::move(run.events);
  t.result = std::move(run.result);
  return t;
}

// The same without taking the run's events and result (a copy of each).
inline Trace trace_of(const Scenario& sc, const RunOptions& options, const CheckedRun& run) {
  return trace_of(sc, options, CheckedRun(run));
}

}  // namespace meshsim

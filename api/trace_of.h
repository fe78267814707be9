// The trace of a checked run (DESIGN.md, contract 4): what `meshsim run --trace`, counterexamples
// and run_scenario's RunSettings::trace_out write.
#pragma once

#include "core/scenario.h"
#include "oracles/check.h"
#include "traces/trace.h"

namespace meshsim {

inline Trace trace_of(const Scenario& sc, const RunOptions& options, const CheckedRun& run) {
  Trace t;
  t.version = MESHSIM_VERSION;
  t.scenario = sc.source;
  t.options = options.to_json();
  t.events = run.events;
  t.result = run.result;
  return t;
}

}  // namespace meshsim

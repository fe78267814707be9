// The property suite: each property has a name (for `meshsim check --property`), what it checks,
// and a body that RapidCheck runs. A property over scenarios leaves the scenario of its latest
// failing case in `Failure`, so that the shrunk counterexample can be written as a trace.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/coverage.h"

namespace meshsim {

struct Property {
  const char* name;
  const char* checks;
  std::function<void()> body;  // draws with rc::gen and asserts with RC_ASSERT
};

struct CheckedRun;
// Runs a generated scenario against the oracle, with the planted bug of the check run on and the
// rules it exercises covered; a failing case is kept in latest_failure().
CheckedRun run_generated(const nlohmann::json& doc);

// In alphabetical order.
const std::vector<Property>& property_catalog();

// The scenario (and run options) of the latest failing case of a scenario property; null when the
// failing property has no scenario.
struct Failure {
  nlohmann::json scenario;
  nlohmann::json options;
};
Failure& latest_failure();

// The rule-coverage sink of the current test case (null when coverage is off): properties install
// it (a CoverageScope) around the system under test only, never around a generator or a check.
CoverageSink*& case_coverage();

// The planted bug of this check run ("" for none). Properties switch it on only around the
// system under test (a scenario's run, a table under test); the checks use the true rules.
std::string& planted_mutant();

}  // namespace meshsim

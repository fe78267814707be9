// A scenario's `expect` block: what `meshsim run` must find, so that a scenario file is a
// regression test, of a known failure too. Parsed up front (a malformed block is unusable input,
// named by its JSON path) and checked against the run's result.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/scenario.h"

namespace meshsim::cli {

// Filters the result's collectives by the fields given (empty: any) and checks how many match
// and/or the sum of their bytes per rank.
struct CollectiveExpectation {
  std::string path;  // "/expect/collectives/0", for messages
  std::string phase, op, axis, value;
  std::optional<int64_t> count, bytes;
};

struct Expectation {
  // pass | fail | error | unchecked. Without one (and without `error`), the run must not fail
  // or err: pass or unchecked. A block that pins collectives only must not hide a failure.
  std::optional<std::string> status;
  std::optional<std::string> error;  // an error kind (status error implied)
  std::vector<std::pair<std::string, bool>> checks;
  std::vector<CollectiveExpectation> collectives;
  std::vector<std::string> failures;  // each must be a substring of some failure text
  std::optional<int> exit;            // the run's own exit code (contract 1), before expect and --strict
  // How many redistributions the planner inserted that communicate (result "implicit" entries with
  // collectives); "implicit": 0 says the program asks for all of its communication.
  std::optional<int64_t> implicit;
  // How many places an imported program's recorded choices differ from meshsim's (result
  // "recorded" differences); "recorded_differences": 0 says meshsim agrees with PyTorch everywhere.
  std::optional<int64_t> recorded_differences;
};

// The scenario's expect block (null when it has none: std::nullopt). Throws InputError naming the
// scenario's file and the JSON path of what is malformed; phases, collective ops and mesh axes are
// checked against what a run can record, so a typo never matches nothing silently.
std::optional<Expectation> parse_expectation(const Scenario& sc);

// The unmet expectations, each "PATH: what was expected, what was found"; empty when all are met.
std::vector<std::string> unmet_expectations(const Expectation& e, const nlohmann::json& result, int exit_code);

}  // namespace meshsim::cli

// One checked run: the scenario on the fake mesh and on the single-device oracle, compared, as a
// result (DESIGN.md, contract 3) with the run's events (contract 4).
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "core/event.h"
#include "core/scenario.h"

namespace meshsim {

struct CheckedRun {
  nlohmann::json result;  // meshsim.result/1
  std::vector<Event> events;
  int exit_code = 0;      // 0 pass, 1 a check failed, 2 or 3 an error (contract 1)
};

// Never throws for a scenario that parsed: errors of the semantics become status "error".
CheckedRun check_scenario(const Scenario& sc, const RunOptions& options);

}  // namespace meshsim

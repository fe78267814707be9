// `meshsim explain FILE --op PATH|NAME [--value NAME] [--json]`: why an op's operands and result
// have the placements they have (core/explain.h, per mesh axis, every candidate row with its cost),
// and how a value's placement came to be, op by op. For debugging and for teaching.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace meshsim::cli {

struct ExplainArgs {
  std::string file;
  std::string op;     // "/program/15" or an output name ("l0_q"); empty: none
  std::string value;  // a value's name; empty: none
  bool json = false;  // meshsim.explain/1
  std::vector<std::string> options;  // key=value
};

// Runs the scenario's forward once on the fake mesh, then explains. Exit codes of contract 1: 0,
// 2 (unusable input, an unknown op or value, named with the closest that exist), 3 (the scenario
// is illegal at or before the op explained; what could be explained is printed first).
int cmd_explain(const ExplainArgs& args, std::ostream& out);

}  // namespace meshsim::cli

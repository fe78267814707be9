// The subcommands of `meshsim` (DESIGN.md, contract 1). Each returns the process exit code.
#pragma once

#include <string>
#include <vector>

#include "core/scenario.h"

namespace meshsim::cli {

// The scenario's options with `--option key=value` overrides applied (InputError when malformed).
RunOptions options_with_overrides(const Scenario& sc, const std::vector<std::string>& overrides);

struct RunArgs {
  std::string file;
  bool json = false;
  std::string trace_out;
  std::string render_out;
  std::string render_view = "logical";  // logical | ranks
  std::vector<std::string> options;  // key=value
};
int cmd_run(const RunArgs& args);

struct ReplayArgs {
  std::string trace;
};
int cmd_replay(const ReplayArgs& args);

struct RenderArgs {
  std::string file;
  std::string out;
  std::string view = "logical";  // logical | ranks
};
int cmd_render(const RenderArgs& args);

}  // namespace meshsim::cli

#include "gpu_validate/validate.h"

namespace meshsim::cli {

int cmd_validate(const ValidateConfig& config);

}  // namespace meshsim::cli

// The command line (DESIGN.md, contract 1), defined once for the two executables that run it:
// `meshsim` (cli/front.cpp), which runs the commands that compute nothing with tensors without
// loading libtorch, and the full command (meshsim::main: meshsim-torch, and a user's own binary
// with their Functions built in), which runs them all.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "cli/check.h"
#include "cli/commands.h"
#include "cli/emit.h"
#include "cli/explain.h"

namespace meshsim::cli {

// What the commands that compute with tensors are, in this executable. The full command's table
// (cli/tensor_commands.cpp) runs them; the front's hands the whole command line over to
// meshsim-torch (they do not return there).
struct TensorCommands {
  int (*run)(const RunArgs&);
  int (*check)(const CheckArgs&, std::ostream&);
  int (*emit)(const EmitArgs&, std::ostream&);
  int (*replay)(const ReplayArgs&);
  int (*explain)(const ExplainArgs&, std::ostream&);
  int (*validate)(const ValidateConfig&);
  // The plugins MESHSIM_PLUGINS names, then those of --plugin (cli/plugin.h).
  void (*load_plugins)(const std::vector<std::string>& named);
  // render and explore of a scenario (not a trace): its checked run's trace.
  ScenarioTracer trace_scenario;
  // Before render or explore reads a stream (a pipe, a FIFO, /dev/stdin), which can be read once:
  // null where this executable runs whatever the stream holds; the front hands the command over
  // unread, since a scenario there would be handed over after it was read.
  void (*before_reading_stream)();
  void (*install_progress_line)();
  void (*erase_progress_line)();
};

// The full command's table (libtorch).
const TensorCommands& tensor_commands();

// Parses argv and runs its subcommand; returns the exit code.
int command_line(int argc, char** argv, const TensorCommands& tensors);

}  // namespace meshsim::cli

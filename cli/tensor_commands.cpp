// The full command: the commands that compute with tensors (libtorch), and meshsim::main, the
// whole command line with them (meshsim-torch's, and a user's own binary's).
#include "api/trace_of.h"
#include "cli/app.h"
#include "cli/import.h"
#include "cli/plugin.h"
#include "meshsim/meshsim.h"
#include "oracles/check.h"

namespace meshsim {

namespace cli {

namespace {

void load_every_plugin(const std::vector<std::string>& named) {
  load_plugins(plugins_from_environment());
  load_plugins(named);
}

Trace checked_trace(const Scenario& sc) { return trace_of(sc, sc.options, check_scenario(sc, sc.options)); }

}  // namespace

const TensorCommands& tensor_commands() {
  static const TensorCommands table{cmd_run,          cmd_check,     cmd_emit,
                                    cmd_replay,       cmd_explain,   cmd_validate,
                                    load_every_plugin, checked_trace, nullptr,
                                    install_progress_line, erase_progress_line};
  return table;
}

}  // namespace cli

int main(int argc, char** argv) { return cli::command_line(argc, argv, cli::tensor_commands()); }

}  // namespace meshsim

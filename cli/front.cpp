// `meshsim`, the command people run. It parses the command line itself (cli/app.cpp, the same
// definition as the full command's) and runs the commands that compute nothing with tensors
// without loading libtorch: --help and --version, `ops`, `render` and `explore` of traces, and
// `import`. Loading Debian's libtorch (286 shared libraries) is 0.4-0.7 s of CPU before main, and
// those commands need none of it (docs/performance.md, "Start-up"). Every other command, render or
// explore of a scenario, and any command with a plugin, it hands over whole: execv of
// meshsim-torch with the same arguments, so the process, its output and its exit code are the full
// command's.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cli/app.h"
#include "traces/trace.h"

namespace meshsim::cli {

namespace {

namespace fs = std::filesystem;

char** g_argv = nullptr;

// meshsim-torch: beside this executable (the build tree), else at MESHSIM_TORCH_COMMAND_RELATIVE
// from this executable's folder (installed: ../libexec/meshsim/meshsim-torch).
std::vector<fs::path> full_command_candidates() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return {self.parent_path() / "meshsim-torch", (self.parent_path() / MESHSIM_TORCH_COMMAND_RELATIVE).lexically_normal()};
}

[[noreturn]] void hand_over() {
  std::cout.flush();
  std::string tried;
  for (const fs::path& candidate : full_command_candidates()) {
    if (::access(candidate.c_str(), X_OK) != 0) {
      tried += (tried.empty() ? "" : ", ") + candidate.string();
      continue;
    }
    ::execv(candidate.c_str(), g_argv);
    std::cerr << "meshsim: cannot run " << candidate.string() << ": " << std::strerror(errno) << "\n";
    std::exit(1);
  }
  std::cerr << "meshsim: this command needs meshsim-torch, the part of meshsim that computes with tensors, and "
               "it is not installed beside meshsim (looked for "
            << (tried.empty() ? std::string("/proc/self/exe's folder") : tried) << ")\n";
  std::exit(1);
}

template <class... Args>
int handed_over(Args&&...) {
  hand_over();
}

void plugins_hand_over(const std::vector<std::string>& named) {
  const char* env = std::getenv("MESHSIM_PLUGINS");
  if (!named.empty() || (env && *env)) hand_over();  // a plugin's Functions are libtorch code
}

Trace scenario_hands_over(const Scenario&) { hand_over(); }

void nothing() {}

}  // namespace

}  // namespace meshsim::cli

int main(int argc, char** argv) {
  using namespace meshsim::cli;
  g_argv = argv;
  static const TensorCommands front{handed_over<const RunArgs&>,
                                    handed_over<const CheckArgs&, std::ostream&>,
                                    handed_over<const EmitArgs&, std::ostream&>,
                                    handed_over<const ReplayArgs&>,
                                    handed_over<const ExplainArgs&, std::ostream&>,
                                    handed_over<const meshsim::ValidateConfig&>,
                                    plugins_hand_over,
                                    scenario_hands_over,
                                    hand_over,
                                    nothing,
                                    nothing};
  return command_line(argc, argv, front);
}

// meshsim import (docs/import.md): the program the user runs, read into a scenario.
#pragma once

#include <string>
#include <vector>

namespace meshsim::cli {

// Runs tools/import/meshsim-import with `args` (everything after `import`), replacing this
// process: its exit code is the command's (0 written, 2 unusable input, 5 no environment, 7 an
// importer bug). Returns 2 only when python3 cannot be started.
int cmd_import(const std::vector<std::string>& args);

}  // namespace meshsim::cli

// `meshsim validate` (DESIGN.md, contract 1): the command-line side of gpu_validate/validate.h.
#include <algorithm>
#include <iostream>
#include <stdexcept>

#include "cli/commands.h"
#include "core/error.h"
#include "core/files.h"
#include "gpu_validate/validate.h"

namespace meshsim::cli {

int cmd_validate(const ValidateConfig& config) {
  // A worker started by the coordinator runs the document the coordinator read and checked (its
  // copy); the scenario's path only names it.
  Scenario sc = config.scenario_copy.empty() ? load_scenario(config.file)
                                             : parse_scenario(read_json_file(config.scenario_copy), config.file);
  RunOptions options = options_with_overrides(sc, config.options);
  if (config.ranks != 0 && config.ranks != sc.mesh.size())
    throw InputError(sc.file, "/mesh/shape",
                     "the mesh (" + sc.mesh.str() + ") has " + std::to_string(sc.mesh.size()) + " ranks, --ranks asks for " +
                         std::to_string(config.ranks));
  ResourceLimits limits = resource_limits();
  // The coordinator simulates once; so does every worker, the whole mesh each, at the same time.
  limits.processes = config.rank >= 0 ? 1 : static_cast<int>(std::min<int64_t>(sc.mesh.size() + 1, 1 << 20));
  check_resources(sc, options, limits);
  if (config.rank >= 0) {
    if (config.store.empty() && config.master_addr.empty())
      throw InputError("--rank", "", "a worker needs --store PATH or --master-addr HOST");
    return validate_worker(sc, options, config, std::cout);
  }
  try {
    return validate_coordinator(sc, options, config, std::cout);
  } catch (const SemanticError&) {
    throw;
  } catch (const InputError&) {
    throw;
  } catch (const std::runtime_error& e) {  // the coordinator could not start or watch its workers
    std::cerr << "meshsim: validate: " << e.what() << "\n";
    return kExitEngineFailure;
  }
}

}  // namespace meshsim::cli

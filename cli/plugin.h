// Plugins: shared libraries that register Functions into the stock `meshsim` (docs/cpp-api.md).
#pragma once

#include <string>
#include <vector>

#include "cli/commands.h"

namespace meshsim::cli {

// A plugin that cannot be loaded (exit 2): "plugin FILE: why".
class PluginError : public UsageError {
 public:
  PluginError(const std::string& file, const std::string& why) : UsageError("plugin " + file + ": " + why) {}
};

// Loads each plugin (dlopen) and calls its entry point with a PluginHost. Throws PluginError naming
// the plugin file (exit 2) when it cannot be opened, lacks the entry point, was built against
// another API version or refuses to load. Loaded plugins stay loaded for the life of the process.
// The absolute paths of every plugin loaded so far are put in MESHSIM_PLUGINS, so the processes
// meshsim starts of itself (validate's workers, check's -j workers) load them too.
void load_plugins(const std::vector<std::string>& paths);

// The plugins named by the environment variable MESHSIM_PLUGINS (colon-separated paths).
std::vector<std::string> plugins_from_environment();

}  // namespace meshsim::cli

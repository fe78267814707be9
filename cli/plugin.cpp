#include "cli/plugin.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "core/error.h"
#include "meshsim/meshsim.h"

namespace meshsim::cli {

namespace {

class Host : public PluginHost {
 public:
  int api_version() const override { return MESHSIM_API_VERSION; }
  void register_function(FunctionDef def) override { meshsim::register_function(std::move(def)); }
  void register_variance_tracking_strategy(const std::vector<StrategyTarget>& targets,
                                           VarianceStrategy strategy) override {
    meshsim::register_variance_tracking_strategy(targets, std::move(strategy));
  }
};

std::set<std::string>& loaded() {
  static std::set<std::string> paths;
  return paths;
}

void load_plugin(const std::string& path) {
  std::error_code ec;
  const std::string absolute = std::filesystem::absolute(path, ec).string();
  if (loaded().count(absolute)) return;
  if (!std::filesystem::exists(path, ec)) throw PluginError(path, "no such file");
  // A path without a slash would be searched for on the library path; the user named a file.
  void* handle = ::dlopen(absolute.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    throw PluginError(path, std::string("cannot load it: ") + (why ? why : "dlopen failed"));
  }
  using VersionFn = int (*)();
  using InitFn = int (*)(PluginHost&);
  auto version = reinterpret_cast<VersionFn>(::dlsym(handle, "meshsim_plugin_api_version"));
  auto init = reinterpret_cast<InitFn>(::dlsym(handle, "meshsim_plugin_init"));
  if (!version || !init)
    throw PluginError(path, "it defines no meshsim entry point (meshsim_plugin_api_version and meshsim_plugin_init; "
                     "define it with MESHSIM_PLUGIN(host) from meshsim/meshsim.h)");
  if (version() != MESHSIM_API_VERSION)
    throw PluginError(path, "built against meshsim API version " + std::to_string(version()) +
                                   ", this meshsim has version " + std::to_string(MESHSIM_API_VERSION) + "; rebuild it");
  Host host;
  int rc = 0;
  try {
    rc = init(host);
  } catch (const std::exception& e) {
    throw PluginError(path, std::string("its entry point raised: ") + first_line(e.what()));
  }
  if (rc != 0) throw PluginError(path, "its entry point refused to load (returned " + std::to_string(rc) + ")");
  loaded().insert(absolute);
  std::string all;
  for (const auto& p : loaded()) all += (all.empty() ? "" : ":") + p;
  ::setenv("MESHSIM_PLUGINS", all.c_str(), 1);
}

}  // namespace

void load_plugins(const std::vector<std::string>& paths) {
  for (const auto& p : paths) load_plugin(p);
}

std::vector<std::string> plugins_from_environment() {
  std::vector<std::string> out;
  const char* env = std::getenv("MESHSIM_PLUGINS");
  if (!env) return out;
  std::string s = env;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t colon = s.find(':', start);
    const std::string p = s.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (!p.empty()) out.push_back(p);
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return out;
}

}  // namespace meshsim::cli

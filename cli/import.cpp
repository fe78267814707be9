// meshsim import: runs tools/import/meshsim-import (Python, standard library only), which installs
// its system's pinned packages into a virtual environment under the build directory (or runs the
// user's own interpreter, --python) and writes the scenario (docs/import.md).
#include "cli/import.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

namespace meshsim::cli {

namespace {

namespace fs = std::filesystem;

std::string from_env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string();
}

// The entry script: MESHSIM_IMPORT_TOOL, else the source tree this meshsim was built from, else
// the installed copy.
std::string import_tool() {
  if (std::string t = from_env("MESHSIM_IMPORT_TOOL"); !t.empty()) return t;
  for (const std::string& dir : {std::string(MESHSIM_SOURCE_DIR) + "/tools/import",
                                std::string(MESHSIM_DATA_DIR) + "/meshsim/tools/import"}) {
    std::error_code ec;
    if (fs::exists(dir + "/meshsim-import", ec)) return dir + "/meshsim-import";
  }
  return "";
}

// Where the virtual environments live: MESHSIM_BUILD_DIR, else the build directory this meshsim
// was built in (when it is still there and writable), else ~/.cache/meshsim.
std::string venv_root() {
  if (std::string b = from_env("MESHSIM_BUILD_DIR"); !b.empty()) return b;
  std::error_code ec;
  if (fs::is_directory(MESHSIM_BINARY_DIR, ec) && access(MESHSIM_BINARY_DIR, W_OK) == 0) return MESHSIM_BINARY_DIR;
  if (std::string c = from_env("XDG_CACHE_HOME"); !c.empty()) return c + "/meshsim";
  if (std::string h = from_env("HOME"); !h.empty()) return h + "/.cache/meshsim";
  return fs::temp_directory_path(ec).string() + "/meshsim";
}

// This binary, for the importer's own `meshsim run`s (selftest, regenerate).
std::string self_path() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("meshsim") : p.string();
}

}  // namespace

int cmd_import(const std::vector<std::string>& args) {
  const std::string tool = import_tool();
  if (tool.empty()) {
    std::cerr << "meshsim import: tools/import/meshsim-import is not here (neither in " << MESHSIM_SOURCE_DIR
              << "/tools/import nor in " << MESHSIM_DATA_DIR
              << "/meshsim/tools/import); set MESHSIM_IMPORT_TOOL to its path\n";
    return 2;
  }
  std::vector<std::string> argv = {"python3", tool, "--build", venv_root(), "--meshsim", self_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_args;
  for (auto& a : argv) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  std::cout.flush();
  execvp("python3", c_args.data());
  std::cerr << "meshsim import: cannot run python3 (" << std::strerror(errno)
            << "); the importer needs Python 3 with venv (Debian's python3 and python3-venv)\n";
  return 2;
}

}  // namespace meshsim::cli

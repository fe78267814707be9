// Running a scenario from your own program: register the Functions, run, read the result.
#include <iostream>

#include "my_functions.h"

int main(int argc, char** argv) {
  meshsim::register_function(mine::scale_by());
  meshsim::register_function(mine::fused_all_reduce());
  meshsim::register_function(mine::scatter_rows());
  const std::string path = argc > 1 ? argv[1] : "plugin_functions.json";
  meshsim::RunResult r = meshsim::run_scenario_file(path);
  std::cout << path << ": " << r.status << " (exit " << r.exit_code << ")\n";
  if (!r.passed()) std::cout << r.message << "\n";
  // The result document is meshsim.result/1: here, the collectives the Functions performed.
  if (r.result.contains("collectives"))
    for (const auto& c : r.result["collectives"])
      std::cout << "  " << c["phase"].get<std::string>() << " " << c["op"].get<std::string>() << " over "
                << c["axis"].get<std::string>() << ": " << c["bytes"].get<int64_t>() << " B per rank\n";
  return r.exit_code;
}

// Exit 0 only when the scenario passes with the oracle checking the Function (status "pass").
#include <iostream>

#include "double_it.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: consumer SCENARIO\n";
    return 2;
  }
  meshsim::register_function(double_it());
  const meshsim::RunResult r = meshsim::run_scenario_file(argv[1]);
  std::cout << "consumer: " << r.status << " (exit " << r.exit_code << ")\n" << r.message << "\n";
  // Bad input is a result, never an exception.
  const meshsim::RunResult bad = meshsim::run_scenario_text("{", "broken.json");
  if (bad.exit_code != 2 || bad.message.find("broken.json") == std::string::npos) return 1;
  return r.status == "pass" ? 0 : 1;
}

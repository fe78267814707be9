// A meshsim of your own: your Functions built in, every subcommand of the stock command.
#include "my_functions.h"

int main(int argc, char** argv) {
  meshsim::register_function(mine::scale_by());
  meshsim::register_function(mine::fused_all_reduce());
  meshsim::register_function(mine::scatter_rows());
  return meshsim::main(argc, argv);
}

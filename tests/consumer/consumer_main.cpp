#include "double_it.h"

int main(int argc, char** argv) {
  meshsim::register_function(double_it());
  return meshsim::main(argc, argv);
}

// meshsim-torch, the full command: meshsim::main (cli/app.cpp, cli/tensor_commands.cpp) with the
// built-in Functions. `meshsim` (cli/front.cpp) hands it every command that computes with tensors.
#include "meshsim/meshsim.h"

int main(int argc, char** argv) { return meshsim::main(argc, argv); }

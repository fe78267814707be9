// The stock `meshsim` command: meshsim::main (cli/app.cpp) with the built-in Functions.
#include "meshsim/meshsim.h"

int main(int argc, char** argv) { return meshsim::main(argc, argv); }

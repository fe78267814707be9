// A plugin: `meshsim --plugin libmine_plugin.so run plugin_functions.json` runs these Functions
// in the stock command. It is built against meshsim/meshsim.h and libtorch only.
#include "my_functions.h"

MESHSIM_PLUGIN(host) {
  host.register_function(mine::scale_by());
  host.register_function(mine::fused_all_reduce());
  host.register_function(mine::scatter_rows());
  return 0;
}

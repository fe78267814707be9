// A plugin: `meshsim --plugin libmine_plugin.so run plugin_functions.json` runs these Functions
// in the stock command. It is built against meshsim/meshsim.h and libtorch only.
#include "my_functions.h"

MESHSIM_PLUGIN(host) {
  host.register_function(mine::scale_by());
  host.register_function(mine::fused_all_reduce());
  host.register_function(mine::scatter_rows());
  host.register_function(mine::fused_reduce_keep());
  host.register_function(mine::sum_and_difference());
  // A strategy for a Function the plugin did not write, through the one registry (seed 001): meshsim's
  // opaque_all_reduce_unregistered, whose output is invariant over the axis it reduces.
  host.register_variance_tracking_strategy(
      {meshsim::function_target("opaque_all_reduce_unregistered")}, [](const meshsim::VarianceInput& in) {
        meshsim::VarianceOutput out;
        out.variant = in.variant[0];
        out.variant.erase(in.attrs.at("axis").get<std::string>());
        return out;
      });
  return 0;
}

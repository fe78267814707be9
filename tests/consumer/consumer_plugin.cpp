#include "double_it.h"

MESHSIM_PLUGIN(host) {
  host.register_function(double_it());
  return 0;
}

// Test helper: every spec over a number of mesh axes from a set of per-axis placements.
#pragma once

#include <vector>

#include "core/placement.h"

namespace meshsim::testing_util {

// Every spec over `ndim` mesh axes whose per-axis placements come from `set`, in odometer order.
inline std::vector<Spec> specs_over(const std::vector<Placement>& set, int ndim) {
  std::vector<Spec> out = {{}};
  for (int a = 0; a < ndim; ++a) {
    std::vector<Spec> next;
    for (const auto& s : out)
      for (const auto& p : set) {
        Spec t = s;
        t.push_back(p);
        next.push_back(t);
      }
    out = next;
  }
  return out;
}

}  // namespace meshsim::testing_util

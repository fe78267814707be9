// A distributed tensor of the fake mesh: one libtorch tensor per rank, a global shape and a spec.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "core/layout.h"
#include "core/placement.h"

namespace meshsim {

struct DTensor {
  std::string name;
  Shape shape;  // global
  Spec spec;
  std::vector<at::Tensor> locals;  // one per rank, rank order

  bool requires_grad() const {
    for (const auto& t : locals)
      if (t.requires_grad()) return true;
    return false;
  }
};

// A gradient's tracked layout: its placements, and the divisor by which the locals hold the
// assembled global gradient (P(avg) primals: the local cotangent is scaled by 1/n).
struct GradSpec {
  Spec spec;
  int64_t divisor = 1;
  bool operator==(const GradSpec& o) const { return spec == o.spec && divisor == o.divisor; }
  bool operator!=(const GradSpec& o) const { return !(*this == o); }
};

}  // namespace meshsim

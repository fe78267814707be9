// Deterministic data: input values from the seed, local layouts from global values (and back),
// and hashes of local tensors for traces.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/ATen.h>

#include "core/mesh.h"
#include "core/scenario.h"
#include "sim/collectives.h"

namespace meshsim {

// splitmix64: one stream per component, derived from (seed, stream id).
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream);
  uint64_t next();
  int64_t uniform_int(int64_t lo, int64_t hi);  // inclusive
  double normal();

 private:
  uint64_t state_;
};

at::ScalarType scalar_type(DType d);

// A tensor of `shape` filled by `init`: int (small integers in [-4, 4]), ones, arange, randn.
at::Tensor make_init(const std::string& init, const Shape& shape, DType dtype, Rng& rng);

// The locals of a global value laid out by `spec`. With an `rng`, Partial axes are split unevenly
// with random integers (sum, avg: the parts reduce to the value; max, min: rank 0 holds the value
// and the others strictly less, or more), so a wrong rule cannot pass by coincidence. Without one,
// the coordinate-0 rank of each Partial group holds the value (n times it for avg), the others 0.
Locals distribute(const Mesh& mesh, const Spec& spec, const at::Tensor& global, Rng* rng);

// The global value the locals represent under `spec`. Replicated axes must hold equal locals; if
// they do not, `problem` (when given) gets a message and rank order's first holder wins.
at::Tensor assemble(const Mesh& mesh, const Spec& spec, const Locals& locals,
                    std::string* problem = nullptr);

// FNV-1a 64 over the shape and the bytes of a tensor, as 16 hex digits.
std::string tensor_hash(const at::Tensor& t);

}  // namespace meshsim

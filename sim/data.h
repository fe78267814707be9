// Deterministic data: input values from the seed, local layouts from global values (and back),
// and hashes of local tensors for traces.
#pragma once

#include <cstdint>
#include <optional>
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
// The DType of a float scalar type (double, float, bfloat16, half); nothing for another.
std::optional<DType> dtype_of(at::ScalarType t);

// On while the oracle computes a scenario that names a dtype below its run's (or runs in half
// precision) as the float64 reference: every float value is float64 (a `to` keeps it, a created
// value is made so); the comparison's tolerance is then the dtypes' (oracles/check.h). Per thread.
bool& float64_reference();

// A tensor of `shape` filled by `init`: int (small integers in [-4, 4]), ones, arange, randn.
at::Tensor make_init(const std::string& init, const Shape& shape, DType dtype, Rng& rng);
// An input's initial value, of its element type: float as make_init; int64 as make_init's
// integers, or ids uniform in [0, ids_high); bool: int draws a fair coin per element (the same
// stream), ones is all true, arange is true but at index 0.
at::Tensor make_input(const InputDecl& in, DType dtype, Rng& rng);

// The locals of a global value laid out by `spec`. With an `rng`, Partial axes are split unevenly
// with random integers (sum, avg: the parts reduce to the value; max, min: rank 0 holds the value
// and the others strictly less, or more), so a wrong rule cannot pass by coincidence. Without one,
// the coordinate-0 rank of each Partial group holds the value (n times it for avg), the others 0.
Locals distribute(const Mesh& mesh, const Spec& spec, const at::Tensor& global, Rng* rng);

// The global value the locals represent under `spec`. Replicated axes must hold equal locals; if
// they do not, `problem` (when given) gets a message and rank order's first holder wins.
at::Tensor assemble(const Mesh& mesh, const Spec& spec, const Locals& locals,
                    std::string* problem = nullptr);

// XXH64 of a tensor's bytes seeded with FNV-1a 64 of its shape, as 16 hex digits: equal hashes
// mean the same shape and the same bits.
std::string tensor_hash(const at::Tensor& t);

// The largest |a - b|: infinity where the shapes differ, NaN where a NaN or an infinity stands on
// one side only (a difference that is not a number is a mismatch). Where both sides hold NaN, or
// the same infinity, they agree (the mean of an empty tensor is NaN on the mesh and in the oracle).
double max_abs_diff(const at::Tensor& a, const at::Tensor& b);

// max_abs_diff(assemble(mesh, spec, locals), reference) without assembling: each distinct local
// against its block of the reference, in one pass over their data (issue #35 item 3). Only where
// that gives the same number and the same verdict: locals laid out by a spec without Partial or
// strided shards, float64 or float32, contiguous, in their layout's shapes, replicas equal bit for
// bit (NaN equal to NaN), and a contiguous float reference of the global shape. Otherwise nothing,
// and the caller assembles (which also explains a replica that differs).
std::optional<double> max_abs_diff_laid_out(const Mesh& mesh, const Spec& spec, const Locals& locals,
                                            const at::Tensor& reference);

// Whether an error `err` (max_abs_diff) is within `tol` relative to max(1, the largest finite
// magnitude of `reference`); tol 0 asks for no error at all, and NaN is never within.
bool within(double err, double tol, const at::Tensor& reference);

}  // namespace meshsim

// Where each rank's local tensor sits in the global tensor: torch.chunk sharding, nested when
// several mesh axes shard one tensor dim (outer mesh axes first). SEMANTICS.md section 1 and
// "Strided shards": SS(d,k) cuts the current extent of d into k equal pieces and keeps the rank's
// chunk of each, so its local is not one box.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/mesh.h"
#include "core/placement.h"

namespace meshsim {

using Shape = std::vector<int64_t>;

struct Chunk {
  int64_t offset = 0;
  int64_t size = 0;
};

// torch.chunk(n, k)[r]: c = ceil(n / k); rows [min(n, r*c), min(n, (r+1)*c)).
Chunk chunk_of(int64_t n, int64_t k, int64_t r);
// ceil(n / k), the padded chunk size collectives use.
int64_t padded_chunk(int64_t n, int64_t k);

struct LocalLayout {
  Shape shape;
  Shape offset;
};

// The local shape and offset of `rank` for a tensor of `global_shape` laid out by `spec` (which
// must have one placement per mesh axis and shard only existing dims, normalized: no negative
// dim; Partial and Replicate keep the dim whole). The shape is right for strided shards too; along
// a strided dim the local is not a box, and `offset` is the global index of its first element
// (local_indices gives every index).
LocalLayout local_layout(const Mesh& mesh, const Spec& spec, const Shape& global_shape, int64_t rank);

// Per dim, the global indices the local of `rank` holds, in local order (a box for plain specs,
// interleaved pieces along a strided dim). Same preconditions as local_layout, and every strided
// shard must divide evenly (check_strided).
std::vector<std::vector<int64_t>> local_indices(const Mesh& mesh, const Spec& spec, const Shape& global_shape,
                                                int64_t rank);

// Checks a spec against a mesh and a tensor rank; returns an empty string or a message. Negative
// dims in [-ndim, ndim) are accepted; an out-of-range dim is reported as written.
std::string check_spec(const Mesh& mesh, const Spec& spec, int64_t tensor_ndim);

// The spec with every negative shard dim wrapped by the tensor rank (S(-1) of a 2-D tensor is
// S(1)); throws std::invalid_argument, naming the placement as written, for a dim outside
// [-ndim, ndim).
Spec normalize_spec(const Spec& spec, int64_t ndim);

// Checks that every strided shard SS(d,k) of `spec` divides evenly for a tensor of
// `global_shape`, on every rank: at its mesh axis (size n), the extent N of d there (after the outer
// axes) must be a multiple of k and N/k a multiple of n. Returns an empty string or a message
// naming the placement, the mesh axis, the dim, its extent, k and n. Negative dims are wrapped
// first (an out-of-range one is reported). Plain specs always pass.
std::string check_strided(const Mesh& mesh, const Spec& spec, const Shape& global_shape);

int64_t numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[8, 16]"

}  // namespace meshsim

// Where each rank's local tensor sits in the global tensor: torch.chunk sharding, nested when
// several mesh axes shard one tensor dim (outer mesh axes first). SEMANTICS.md section 1.
#pragma once

#include <cstdint>
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
// must have one placement per mesh axis and shard only existing dims; Partial and Replicate keep
// the dim whole).
LocalLayout local_layout(const Mesh& mesh, const Spec& spec, const Shape& global_shape, int64_t rank);

// Checks a spec against a mesh and a tensor rank; returns an empty string or a message.
std::string check_spec(const Mesh& mesh, const Spec& spec, int64_t tensor_ndim);

int64_t numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[8, 16]"

}  // namespace meshsim

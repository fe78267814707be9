#include "core/layout.h"

#include <algorithm>

namespace meshsim {

int64_t padded_chunk(int64_t n, int64_t k) { return (n + k - 1) / k; }

Chunk chunk_of(int64_t n, int64_t k, int64_t r) {
  int64_t c = padded_chunk(n, k);
  int64_t begin = std::min(n, r * c);
  int64_t end = std::min(n, (r + 1) * c);
  return {begin, end - begin};
}

LocalLayout local_layout(const Mesh& mesh, const Spec& spec, const Shape& global_shape, int64_t rank) {
  LocalLayout out{global_shape, Shape(global_shape.size(), 0)};
  for (int a = 0; a < mesh.ndim(); ++a) {
    const Placement& p = spec.at(a);
    if (!p.is_shard()) continue;
    auto d = static_cast<size_t>(p.dim);
    Chunk ch = chunk_of(out.shape[d], mesh.axis_size(a), mesh.coord(rank, a));
    out.offset[d] += ch.offset;
    out.shape[d] = ch.size;
  }
  return out;
}

std::string check_spec(const Mesh& mesh, const Spec& spec, int64_t tensor_ndim) {
  if (static_cast<int>(spec.size()) != mesh.ndim())
    return "expected " + std::to_string(mesh.ndim()) + " placements (one per mesh axis), got " +
           std::to_string(spec.size());
  for (const auto& p : spec)
    if (p.is_shard() && p.dim >= tensor_ndim)
      return p.str() + " shards dim " + std::to_string(p.dim) + " of a tensor with " +
             std::to_string(tensor_ndim) + " dims";
  return {};
}

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace meshsim

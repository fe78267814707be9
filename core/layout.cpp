#include "core/layout.h"

#include <algorithm>
#include <set>
#include <stdexcept>

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
  // A strided shard's local is not one box: its first element is traced back through the stages
  // of its dim (a plain chunk maps local position p to offset + p, a strided one to
  // j * piece + c * sub + i for p = j * sub + i).
  struct Stage {
    bool strided;
    int64_t offset, piece, sub, coord;
  };
  std::vector<std::vector<Stage>> stages(global_shape.size());
  bool any_strided = false;
  for (int a = 0; a < mesh.ndim(); ++a) {
    const Placement& p = spec.at(a);
    if (!p.is_shard()) continue;
    auto d = static_cast<size_t>(p.dim);
    const int64_t n = mesh.axis_size(a), c = mesh.coord(rank, a);
    if (p.is_strided()) {
      // k pieces of N/k, each chunked over n: the local is k sub-chunks of N/k/n (even sizes,
      // check_strided).
      const int64_t piece = out.shape[d] / p.split, sub = piece / n;
      stages[d].push_back({true, 0, piece, sub, c});
      out.shape[d] = p.split * sub;
      any_strided = true;
      continue;
    }
    Chunk ch = chunk_of(out.shape[d], n, c);
    stages[d].push_back({false, ch.offset, 0, 0, 0});
    out.offset[d] += ch.offset;
    out.shape[d] = ch.size;
  }
  if (any_strided)
    for (size_t d = 0; d < stages.size(); ++d) {
      int64_t pos = 0;
      for (auto it = stages[d].rbegin(); it != stages[d].rend(); ++it)
        pos = it->strided ? (it->sub ? (pos / it->sub) * it->piece + it->coord * it->sub + pos % it->sub : 0)
                          : it->offset + pos;
      out.offset[d] = pos;
    }
  return out;
}

std::vector<std::vector<int64_t>> local_indices(const Mesh& mesh, const Spec& spec, const Shape& global_shape,
                                                int64_t rank) {
  std::vector<std::vector<int64_t>> idx(global_shape.size());
  for (size_t d = 0; d < global_shape.size(); ++d)
    for (int64_t i = 0; i < global_shape[d]; ++i) idx[d].push_back(i);
  for (int a = 0; a < mesh.ndim(); ++a) {
    const Placement& p = spec.at(a);
    if (!p.is_shard()) continue;
    auto& cur = idx.at(static_cast<size_t>(p.dim));
    const int64_t N = static_cast<int64_t>(cur.size()), n = mesh.axis_size(a), c = mesh.coord(rank, a);
    std::vector<int64_t> next;
    if (p.is_strided()) {
      const int64_t piece = N / p.split, sub = piece / n;
      for (int64_t j = 0; j < p.split; ++j)
        for (int64_t i = 0; i < sub; ++i) next.push_back(cur[static_cast<size_t>(j * piece + c * sub + i)]);
    } else {
      Chunk ch = chunk_of(N, n, c);
      next.assign(cur.begin() + ch.offset, cur.begin() + ch.offset + ch.size);
    }
    cur = std::move(next);
  }
  return idx;
}

std::string check_spec(const Mesh& mesh, const Spec& spec, int64_t tensor_ndim) {
  if (static_cast<int>(spec.size()) != mesh.ndim())
    return "expected " + std::to_string(mesh.ndim()) + " placements (one per mesh axis), got " +
           std::to_string(spec.size());
  for (const auto& p : spec)
    if (p.is_shard() && (p.dim >= tensor_ndim || p.dim < -tensor_ndim))
      return p.str() + " shards dim " + std::to_string(p.dim) + " of a tensor with " +
             std::to_string(tensor_ndim) + " dims";
  return {};
}

Spec normalize_spec(const Spec& spec, int64_t ndim) {
  Spec out = spec;
  for (auto& p : out) {
    if (!p.is_shard()) continue;
    if (p.dim >= ndim || p.dim < -ndim)
      throw std::invalid_argument(p.str() + " shards dim " + std::to_string(p.dim) + " of a tensor with " +
                                  std::to_string(ndim) + " dims (dims run from " + std::to_string(-ndim) +
                                  " to " + std::to_string(ndim - 1) + ")");
    if (p.dim < 0) p.dim += ndim;
  }
  return out;
}

std::string check_strided(const Mesh& mesh, const Spec& spec, const Shape& global_shape) {
  Spec norm;
  try {
    norm = normalize_spec(spec, static_cast<int64_t>(global_shape.size()));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  // The extents each dim can have on some rank after the axes so far (plain chunks may be uneven).
  std::vector<std::set<int64_t>> extents(global_shape.size());
  std::vector<bool> cut(global_shape.size(), false);  // whether an outer axis sharded the dim
  for (size_t d = 0; d < global_shape.size(); ++d) extents[d].insert(global_shape[d]);
  for (int a = 0; a < mesh.ndim() && a < static_cast<int>(norm.size()); ++a) {
    const Placement& p = norm[static_cast<size_t>(a)];
    if (!p.is_shard()) continue;
    auto& ext = extents[static_cast<size_t>(p.dim)];
    const int64_t n = mesh.axis_size(a), k = p.split;
    std::set<int64_t> next;
    for (int64_t N : ext) {
      if (p.is_strided()) {
        if (N % k != 0 || (N / k) % n != 0) {
          const std::string written = spec[static_cast<size_t>(a)].str();
          std::string why = N % k != 0 ? std::to_string(N) + " is not a multiple of " + std::to_string(k)
                                       : "a piece of " + std::to_string(N / k) + " is not a multiple of " + std::to_string(n);
          return written + " on mesh axis \"" + mesh.axes()[static_cast<size_t>(a)] + "\" (size " + std::to_string(n) +
                 ") needs dim " + std::to_string(p.dim) + " (extent " + std::to_string(N) +
                 (cut[static_cast<size_t>(p.dim)] ? " there, after the outer mesh axes" : "") + ") cut into " +
                 std::to_string(k) + " equal pieces, each a multiple of " + std::to_string(n) + ": " + why;
        }
        next.insert(N / n);
      } else {
        // Chunks take at most three sizes (full, one partial, empty), so three ranks stand for
        // all: the check costs the same on a mesh of 2^31 ranks as on one of 4.
        const int64_t q = (N + n - 1) / n;
        for (int64_t c : {int64_t{0}, q > 0 ? std::min(n - 1, N / q) : int64_t{0}, n - 1})
          next.insert(chunk_of(N, n, c).size);
      }
    }
    ext = std::move(next);
    cut[static_cast<size_t>(p.dim)] = true;
  }
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

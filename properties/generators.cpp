#include "properties/generators.h"

#include "core/layout.h"

namespace meshsim {
std::ostream& operator<<(std::ostream& os, const Placement& p) { return os << p.str(); }
std::ostream& operator<<(std::ostream& os, const Mesh& m) { return os << m.str(); }
}  // namespace meshsim

namespace meshsim::gen {

rc::Gen<Mesh> mesh() {
  return rc::gen::exec([] {
    const int ndim = *rc::gen::inRange(1, 4);
    std::vector<std::string> axes;
    std::vector<int64_t> sizes;
    for (int a = 0; a < ndim; ++a) {
      axes.push_back(std::string(1, static_cast<char>('a' + a)));
      sizes.push_back(*rc::gen::weightedOneOf<int64_t>({{15, rc::gen::inRange<int64_t>(1, 5)},
                                                        {1, rc::gen::just<int64_t>(8)}}));
    }
    return Mesh(axes, sizes);
  });
}

rc::Gen<Shape> shape(int64_t min_rank, int64_t max_rank) {
  return rc::gen::exec([=] {
    const auto rank = *rc::gen::inRange<int64_t>(min_rank, max_rank + 1);
    Shape s;
    for (int64_t d = 0; d < rank; ++d) s.push_back(*rc::gen::inRange<int64_t>(0, 8));
    return s;
  });
}

namespace {

std::vector<Placement> choices(int64_t tensor_rank, bool all) {
  std::vector<Placement> out = {Placement::replicate()};
  for (int64_t d = 0; d < tensor_rank; ++d) out.push_back(Placement::shard(d));
  out.push_back(Placement::partial(ReduceOp::Sum));
  out.push_back(Placement::reduced());
  out.push_back(Placement::partial(ReduceOp::Avg));
  if (all) {
    out.push_back(Placement::partial(ReduceOp::Max));
    out.push_back(Placement::partial(ReduceOp::Min));
  }
  return out;
}

}  // namespace

rc::Gen<Placement> differentiable_placement(int64_t tensor_rank) {
  return rc::gen::elementOf(choices(tensor_rank, false));
}

rc::Gen<Placement> any_placement(int64_t tensor_rank) {
  return rc::gen::elementOf(choices(tensor_rank, true));
}

Spec strided_now_and_then(const Mesh& mesh, Spec spec, const Shape& shape) {
  if (*rc::gen::inRange(0, 3) != 0) return spec;
  for (int a = 0; a < mesh.ndim(); ++a) {
    const Placement p = spec[static_cast<size_t>(a)];
    // Not over an axis of size 1, where a strided shard holds the whole dim (and would take the
    // rows' ties another way than a shard does: docs/testing.md, the unreachable relabel).
    if (!p.is_shard() || p.is_strided() || mesh.axis_size(a) == 1 || *rc::gen::arbitrary<bool>()) continue;
    int64_t inner = 1;
    for (int b = a + 1; b < mesh.ndim(); ++b)
      if (spec[static_cast<size_t>(b)].is_shard() && spec[static_cast<size_t>(b)].dim == p.dim) inner *= mesh.axis_size(b);
    const int64_t k = inner > 1 && *rc::gen::arbitrary<bool>() ? inner : 2;
    spec[static_cast<size_t>(a)] = Placement::strided_shard(p.dim, k);
    if (!check_strided(mesh, spec, shape).empty()) spec[static_cast<size_t>(a)] = p;
  }
  return spec;
}

rc::Gen<Spec> spec(const Mesh& mesh, const rc::Gen<Placement>& placement) {
  return rc::gen::container<Spec>(static_cast<size_t>(mesh.ndim()), placement);
}

nlohmann::json mesh_json(const Mesh& mesh) { return {{"axes", mesh.axes()}, {"shape", mesh.shape()}}; }

nlohmann::json spec_json(const Spec& spec) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : spec) out.push_back(p.str());
  return out;
}

}  // namespace meshsim::gen

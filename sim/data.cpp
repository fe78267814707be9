#include "sim/data.h"

#include <cmath>
#include <cstdio>

namespace meshsim {

Rng::Rng(uint64_t seed, uint64_t stream) : state_(seed * 0x9E3779B97F4A7C15ULL ^ (stream + 1) * 0xD1B54A32D192ED03ULL) {}

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

int64_t Rng::uniform_int(int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
}

double Rng::normal() {
  const double two_pi = 6.283185307179586;
  double u1 = (static_cast<double>(next() >> 11) + 1.0) / 9007199254740993.0;
  double u2 = static_cast<double>(next() >> 11) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2);
}

at::ScalarType scalar_type(DType d) { return d == DType::Float32 ? at::kFloat : at::kDouble; }

at::Tensor make_init(const std::string& init, const Shape& shape, DType dtype, Rng& rng) {
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor t;
  if (init == "ones") {
    t = at::ones(shape, opts);
  } else if (init == "arange") {
    t = at::arange(numel(shape), opts).reshape(shape);
  } else {
    std::vector<double> v(static_cast<size_t>(numel(shape)));
    for (auto& x : v) x = init == "randn" ? rng.normal() : static_cast<double>(rng.uniform_int(-4, 4));
    t = at::tensor(v, opts).reshape(shape);
  }
  return t.to(scalar_type(dtype));
}

namespace {

at::Tensor random_ints_like(const at::Tensor& t, Rng& rng, int64_t lo, int64_t hi) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (auto& x : v) x = static_cast<double>(rng.uniform_int(lo, hi));
  return at::tensor(v, at::TensorOptions().dtype(at::kDouble)).reshape(t.sizes()).to(t.scalar_type());
}

// The parts of `value` for the members of one Partial group.
std::vector<at::Tensor> partial_parts(const Placement& p, const at::Tensor& value, int64_t n, Rng* rng) {
  std::vector<at::Tensor> parts(static_cast<size_t>(n));
  if (!rng) {
    parts[0] = p.op == ReduceOp::Avg ? value * static_cast<double>(n) : value;
    for (int64_t k = 1; k < n; ++k) parts[k] = at::zeros_like(value);
    return parts;
  }
  if (p.op == ReduceOp::Max || p.op == ReduceOp::Min) {
    parts[0] = value;
    for (int64_t k = 1; k < n; ++k) {
      at::Tensor gap = random_ints_like(value, *rng, 1, 3);
      parts[k] = p.op == ReduceOp::Max ? value - gap : value + gap;
    }
    return parts;
  }
  at::Tensor rest = p.op == ReduceOp::Avg ? value * static_cast<double>(n) : value.clone();
  for (int64_t k = 1; k < n; ++k) {
    parts[k] = random_ints_like(value, *rng, -3, 3);
    rest = rest - parts[k];
  }
  parts[0] = rest;
  return parts;
}

// Calls f(group) for every group of ranks over `axis`.
template <class F>
void for_groups(const Mesh& mesh, int axis, F&& f) {
  for (const auto& g : mesh.groups(axis)) f(g);
}

}  // namespace

// The inverse of assemble: Partial axes are split innermost first (assemble reduces them
// outermost first), then Shard axes are chunked outermost first (nested torch.chunk).
Locals distribute(const Mesh& mesh, const Spec& spec, const at::Tensor& global, Rng* rng) {
  Locals cur(static_cast<size_t>(mesh.size()), global);
  for (int a = mesh.ndim() - 1; a >= 0; --a) {
    if (!spec[a].is_partial()) continue;
    for_groups(mesh, a, [&](const std::vector<int64_t>& g) {
      auto parts = partial_parts(spec[a], cur[g[0]], static_cast<int64_t>(g.size()), rng);
      for (size_t k = 0; k < g.size(); ++k) cur[g[k]] = parts[k];
    });
  }
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (!spec[a].is_shard()) continue;
    for_groups(mesh, a, [&](const std::vector<int64_t>& g) {
      for (size_t k = 0; k < g.size(); ++k)
        cur[g[k]] = chunk_piece(cur[g[k]], spec[a].dim, static_cast<int64_t>(g.size()), static_cast<int64_t>(k));
    });
  }
  return cur;
}

// Shard axes are gathered innermost first (nested chunks), Partial axes reduced outermost first
// (as a redistribution to Replicate plans them); then every rank holds the global value, and ranks
// that differ only on a Replicate or Reduced axis must hold the same one.
at::Tensor assemble(const Mesh& mesh, const Spec& spec, const Locals& locals, std::string* problem) {
  Locals cur = locals;
  auto combine = [&](int a, auto&& op) {
    for_groups(mesh, a, [&](const std::vector<int64_t>& g) {
      Locals group;
      for (auto r : g) group.push_back(cur[r]);
      at::Tensor t = op(group);
      for (auto r : g) cur[r] = t;
    });
  };
  for (int a = mesh.ndim() - 1; a >= 0; --a)
    if (spec[a].is_shard()) combine(a, [&](const Locals& g) { return at::cat(g, spec[a].dim); });
  for (int a = 0; a < mesh.ndim(); ++a)
    if (spec[a].is_partial()) combine(a, [&](const Locals& g) { return all_reduce(g, spec[a].op)[0]; });
  for (int a = 0; a < mesh.ndim() && problem && problem->empty(); ++a) {
    if (!spec[a].is_replicate()) continue;
    for_groups(mesh, a, [&](const std::vector<int64_t>& g) {
      for (auto r : g)
        if (problem->empty() && (cur[r].sizes() != cur[g[0]].sizes() || !at::equal(cur[r], cur[g[0]])))
          *problem = "locals differ across mesh axis \"" + mesh.axes()[a] + "\" where " + spec[a].str() +
                     " says they are equal";
    });
  }
  return cur[0];
}

std::string tensor_hash(const at::Tensor& t) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](const unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 1099511628211ULL;
    }
  };
  for (auto s : t.sizes()) mix(reinterpret_cast<const unsigned char*>(&s), sizeof(s));
  at::Tensor c = t.detach().contiguous();
  mix(static_cast<const unsigned char*>(c.data_ptr()), c.numel() * c.element_size());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace meshsim

#include "sim/rank_calls.h"

#include <string_view>
#include <unordered_map>

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include "core/ops.h"
#include "sim/local_ops.h"
#include "sim/vjps.h"

namespace meshsim {

namespace {

// Two ranks' calls are the same: the same operand data and geometry, the same local attributes.
bool same_call(const std::vector<Locals>& operands, const RankCalls& c, size_t r, size_t s) {
  for (const auto& l : operands) {
    const at::Tensor &x = l[r], &y = l[s];
    if (x.defined() != y.defined()) return false;
    if (!x.defined()) continue;
    if (x.data_ptr() != y.data_ptr() || x.scalar_type() != y.scalar_type() || !x.sizes().equals(y.sizes()) ||
        !x.strides().equals(y.strides()))
      return false;
  }
  const OpAttrs &a = c.of(r), &b = c.of(s);
  return &a == &b || (a.local_shape == b.local_shape && (a.range.has_value() == b.range.has_value()) &&
                      (!a.range || (a.range->offset == b.range->offset && a.range->size == b.range->size)));
}

// A hash of what same_call compares.
uint64_t call_hash(const std::vector<Locals>& operands, const OpAttrs& a, size_t r) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over words
  auto word = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (const auto& l : operands) {
    const at::Tensor& t = l[r];
    if (!t.defined()) {
      word(~0ull);
      continue;
    }
    word(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.data_ptr())));
    word(static_cast<uint64_t>(t.scalar_type()));
    for (int64_t e : t.sizes()) word(static_cast<uint64_t>(e));
  }
  if (a.local_shape)
    for (int64_t e : *a.local_shape) word(static_cast<uint64_t>(e));
  if (a.range) word(static_cast<uint64_t>(a.range->offset) * 31 + static_cast<uint64_t>(a.range->size));
  return h;
}

// The operand whose dim the op's per-rank kernel needs the rank's range of, when sharded:
// embedding's vocab rows (operand 1, dim 0), pick_target's classes (operand 0, dim 1).
std::optional<std::pair<size_t, int64_t>> ranged_operand(const std::string& op) {
  if (op == "embedding") return std::make_pair(size_t{1}, int64_t{0});
  if (op == "pick_target") return std::make_pair(size_t{0}, int64_t{1});
  return std::nullopt;
}

}  // namespace

RankCalls rank_calls(const std::string& op, const OpAttrs& attrs, const Mesh& mesh, const std::vector<Spec>& specs,
                     const std::vector<Shape>& shapes, const Spec& out_spec, const Shape& out_shape,
                     const std::vector<Locals>& operands) {
  const size_t R = static_cast<size_t>(mesh.size());
  const bool random = std::string_view(op_schema(op).family) == "random";
  const bool view = is_view_op(op);
  const auto ranged = ranged_operand(op);
  const bool ranged_sharded = ranged && shards_dim(specs[ranged->first], ranged->second);
  const bool per_rank = view || random || ranged_sharded;
  RankCalls c;
  c.attrs.push_back(with_global_shape(op, attrs, shapes.at(0)));
  if (per_rank) {
    c.attrs.resize(R, c.attrs[0]);
    for (size_t r = 0; r < R; ++r) {
      OpAttrs& a = c.attrs[r];
      if (view) a.local_shape = local_layout(mesh, out_spec, out_shape, static_cast<int64_t>(r)).shape;
      if (random) place_draw(a, mesh, out_spec, out_shape, static_cast<int64_t>(r));
      if (ranged_sharded) {
        const LocalLayout l = local_layout(mesh, specs[ranged->first], shapes[ranged->first], static_cast<int64_t>(r));
        a.range = Chunk{l.offset[ranged->second], l.shape[ranged->second]};
      }
    }
  }
  c.same_as.resize(R);
  std::unordered_multimap<uint64_t, size_t> seen;
  for (size_t r = 0; r < R; ++r) {
    c.same_as[r] = r;
    if (random || R == 1) continue;
    const uint64_t h = call_hash(operands, c.of(r), r);
    auto [lo, hi] = seen.equal_range(h);
    for (auto it = lo; it != hi; ++it)
      if (same_call(operands, c, r, it->second)) {
        c.same_as[r] = it->second;
        break;
      }
    if (c.same_as[r] == r) seen.emplace(h, r);
  }
  return c;
}

LocalGraphs local_graphs(const std::string& op, const RankCalls& calls, const std::vector<Locals>& operands,
                         const std::vector<bool>& needs) {
  const size_t R = calls.same_as.size();
  at::AutoGradMode mode(true);
  LocalGraphs g(R);
  for (size_t r = 0; r < R; ++r) {
    if (const size_t s = calls.same_as[r]; s != r) {
      g.leaves[r] = g.leaves[s];
      g.results[r] = g.results[s];
      continue;
    }
    for (size_t i = 0; i < operands.size(); ++i) g.leaves[r].push_back(operands[i][r].detach().requires_grad_(needs[i]));
    g.results[r] = local_op(op, calls.of(r), g.leaves[r]);
  }
  return g;
}

std::vector<std::vector<at::Tensor>> rank_vjps(const LocalGraphs& g, const std::vector<size_t>& wrt, const Locals& grads) {
  const size_t R = g.results.size();
  std::vector<std::vector<at::Tensor>> out(R, std::vector<at::Tensor>(wrt.size()));
  // Pass k takes, of each graph, the k-th rank holding it.
  std::vector<std::vector<size_t>> passes;
  std::unordered_map<const void*, size_t> holders;
  for (size_t r = 0; r < R; ++r) {
    if (!g.results[r].requires_grad()) continue;
    const size_t k = holders[g.results[r].unsafeGetTensorImpl()]++;
    if (k == passes.size()) passes.emplace_back();
    passes[k].push_back(r);
  }
  for (const auto& ranks : passes) {
    std::vector<at::Tensor> outputs, inputs, weights;
    for (size_t r : ranks) {
      outputs.push_back(g.results[r]);
      weights.push_back(grads[r]);
      for (size_t i : wrt) inputs.push_back(g.leaves[r][i]);
    }
    const auto got = torch::autograd::grad(outputs, inputs, weights, /*retain_graph=*/true, /*create_graph=*/false,
                                           /*allow_unused=*/true);
    for (size_t n = 0; n < ranks.size(); ++n)
      for (size_t j = 0; j < wrt.size(); ++j) out[ranks[n]][j] = got[n * wrt.size() + j];
  }
  return out;
}

std::vector<std::vector<at::Tensor>> closed_vjps(const ClosedForms& c, const std::vector<size_t>& wrt, const Locals& grads) {
  const size_t R = c.calls.same_as.size();
  at::AutoGradMode mode(false);
  std::vector<std::vector<at::Tensor>> out(R, std::vector<at::Tensor>(wrt.size()));
  std::vector<at::Tensor> xs(c.operands.size());
  for (size_t r = 0; r < R; ++r) {
    if (const size_t s = c.calls.same_as[r]; s != r) {
      const at::Tensor &g = grads[r], &h = grads[s];
      if (g.data_ptr() == h.data_ptr() && g.scalar_type() == h.scalar_type() && g.sizes().equals(h.sizes()) &&
          g.strides().equals(h.strides())) {
        for (size_t k = 0; k < wrt.size(); ++k) out[r][k] = out[s][k].detach();
        continue;
      }
    }
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = c.operands[i][r];
    const at::Tensor y = c.results.empty() ? at::Tensor() : c.results[r];
    out[r] = closed_vjp(c.op, c.calls.of(r), xs, y, grads[r], wrt);
  }
  return out;
}

Locals local_results(const std::string& op, const RankCalls& calls, const std::vector<Locals>& operands) {
  const size_t R = calls.same_as.size();
  at::AutoGradMode mode(false);
  Locals outs(R);
  std::vector<at::Tensor> xs(operands.size());
  for (size_t r = 0; r < R; ++r) {
    if (const size_t s = calls.same_as[r]; s != r) {
      outs[r] = outs[s].detach();  // a tensor object of its own: each rank's local gets its own gradient edge
      continue;
    }
    for (size_t i = 0; i < operands.size(); ++i) xs[i] = operands[i][r];
    outs[r] = local_op(op, calls.of(r), xs);
    // A fresh result (no autograd history: no grad mode) is the rank's own as it is. A view of an
    // operand (its autograd metadata would point at the operand), or an operand itself (a kernel
    // that is the identity), is detached: a tensor object whose gradient edge is its own.
    bool own = !outs[r].is_view();
    for (size_t i = 0; i < xs.size() && own; ++i) own = outs[r].unsafeGetTensorImpl() != xs[i].unsafeGetTensorImpl();
    if (!own) outs[r] = outs[r].detach();
  }
  return outs;
}

}  // namespace meshsim

#include "sim/rank_calls.h"

#include <string_view>
#include <unordered_map>

#include <c10/core/GradMode.h>

#include "core/ops.h"
#include "sim/local_ops.h"

namespace meshsim {

namespace {

// What makes a call: every operand's data and geometry, the attributes a rank's call may differ in.
using CallKey = std::vector<int64_t>;

struct CallKeyHash {
  size_t operator()(const CallKey& k) const noexcept {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

CallKey call_key(const std::vector<Locals>& operands, const OpAttrs& a, size_t r) {
  CallKey k;
  for (const auto& l : operands) {
    const at::Tensor& t = l[r];
    if (!t.defined()) {
      k.push_back(-1);
      continue;
    }
    k.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(t.data_ptr())));
    k.push_back(static_cast<int64_t>(t.scalar_type()));
    k.push_back(t.dim());
    for (int64_t s : t.sizes()) k.push_back(s);
    for (int64_t s : t.strides()) k.push_back(s);
  }
  if (a.local_shape) {
    k.push_back(static_cast<int64_t>(a.local_shape->size()));
    k.insert(k.end(), a.local_shape->begin(), a.local_shape->end());
  } else {
    k.push_back(-1);
  }
  if (a.range) {
    k.push_back(a.range->offset);
    k.push_back(a.range->size);
  } else {
    k.push_back(-1);
  }
  return k;
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
  RankCalls c;
  c.attrs.reserve(R);
  c.same_as.resize(R);
  const OpAttrs global = with_global_shape(op, attrs, shapes.at(0));
  const auto ranged = ranged_operand(op);
  std::unordered_map<CallKey, size_t, CallKeyHash> first;
  for (size_t r = 0; r < R; ++r) {
    OpAttrs a = global;
    if (is_view_op(op)) a.local_shape = local_layout(mesh, out_spec, out_shape, static_cast<int64_t>(r)).shape;
    if (random) place_draw(a, mesh, out_spec, out_shape, static_cast<int64_t>(r));
    if (ranged && shards_dim(specs[ranged->first], ranged->second)) {
      const LocalLayout l = local_layout(mesh, specs[ranged->first], shapes[ranged->first], static_cast<int64_t>(r));
      a.range = Chunk{l.offset[ranged->second], l.shape[ranged->second]};
    }
    c.same_as[r] = r;
    if (!random && R > 1) c.same_as[r] = first.emplace(call_key(operands, a, r), r).first->second;
    c.attrs.push_back(std::move(a));
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
    g.results[r] = local_op(op, calls.attrs[r], g.leaves[r]);
  }
  return g;
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
    outs[r] = local_op(op, calls.attrs[r], xs).detach();
  }
  return outs;
}

}  // namespace meshsim

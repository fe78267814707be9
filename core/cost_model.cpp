#include "core/cost_model.h"

namespace meshsim {

int64_t collective_bytes(StepKind kind, int64_t full_bytes, int64_t group_size) {
  if (group_size <= 1) return 0;
  const int64_t n = group_size;
  switch (kind) {
    case StepKind::AllGather:
    case StepKind::ReduceScatter:
    case StepKind::AllToAll:
      return full_bytes * (n - 1) / n;
    case StepKind::AllReduce:
      return 2 * full_bytes * (n - 1) / n;
    default:
      return 0;
  }
}

}  // namespace meshsim

namespace meshsim {

std::string grouped_digits(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (n < 0 ? "-" : "") + out;
}

MoveCost estimate_move(const Mesh& mesh, const Spec& from, const Spec& to, const std::vector<int64_t>& shape,
                       int64_t element_bytes) {
  MoveCost cost;
  int64_t numel = 1;
  for (int64_t e : shape) numel *= e;
  Spec now = from;
  for (const RedistStep& step : plan_redistribute(mesh, from, to)) {
    int64_t others = 1;  // the other axes that shard the tensor now: the group's tensor is one of their pieces
    for (int b = 0; b < mesh.ndim(); ++b)
      if (b != step.axis && now[static_cast<size_t>(b)].is_shard()) others *= mesh.axis_size(b);
    const int64_t full = (numel + others - 1) / others * element_bytes;
    const int64_t bytes = collective_bytes(step.kind, full, mesh.axis_size(step.axis));
    if (step.communicates()) cost.steps.push_back({step.kind, step.axis, bytes});
    cost.bytes += bytes;
    now[static_cast<size_t>(step.axis)] = step.to;
  }
  return cost;
}

}  // namespace meshsim

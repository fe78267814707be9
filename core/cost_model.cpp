#include "core/cost_model.h"

#include <algorithm>

#include "core/layout.h"

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

int64_t step_bytes_of(const Mesh& mesh, const RedistStep& step,
                      const std::function<std::vector<int64_t>(int64_t rank)>& local_shape, int64_t element_bytes) {
  if (!step.communicates()) return 0;
  const int64_t n = mesh.axis_size(step.axis);
  auto numel = [](const std::vector<int64_t>& s) {
    int64_t k = 1;
    for (int64_t e : s) k *= e;
    return k;
  };
  // Elements per index along `dim` (well defined when that dim is empty too).
  auto rest = [](const std::vector<int64_t>& s, int64_t dim) {
    int64_t r = 1;
    for (size_t d = 0; d < s.size(); ++d)
      if (static_cast<int64_t>(d) != dim) r *= s[d];
    return r;
  };
  int64_t most = 0;
  for (const auto& ranks : mesh.groups(step.axis)) {
    const std::vector<int64_t> first = local_shape(ranks[0]);
    int64_t full = numel(first) * element_bytes;  // all_reduce: the local tensor
    if (step.kind == StepKind::AllGather) {  // the widest piece, n times (padded chunks)
      int64_t widest = 0;
      for (auto r : ranks) {
        const std::vector<int64_t> s = local_shape(r);
        if (step.dim < static_cast<int64_t>(s.size())) widest = std::max(widest, s[static_cast<size_t>(step.dim)]);
      }
      full = n * widest * rest(first, step.dim) * element_bytes;
    } else if (step.kind == StepKind::ReduceScatter || step.kind == StepKind::AllToAll) {
      const int64_t d = step.kind == StepKind::ReduceScatter ? step.dim : step.split_dim;
      const int64_t extent = d < static_cast<int64_t>(first.size()) ? first[static_cast<size_t>(d)] : 0;
      full = n * padded_chunk(extent, n) * rest(first, d) * element_bytes;
    }
    most = std::max(most, collective_bytes(step.kind, full, n));
  }
  return most;
}

MoveCost estimate_move(const Mesh& mesh, const Spec& from, const Spec& to, const std::vector<int64_t>& shape,
                       int64_t element_bytes) {
  MoveCost cost;
  Spec now = from;
  for (const RedistStep& step : plan_redistribute(mesh, from, to)) {
    // Each rank's local shape before the step, as the run's own collectives count them.
    const int64_t bytes = step_bytes_of(
        mesh, step, [&](int64_t r) { return local_layout(mesh, now, shape, r).shape; }, element_bytes);
    if (step.communicates()) cost.steps.push_back({step.kind, step.axis, bytes});
    cost.bytes += bytes;
    now[static_cast<size_t>(step.axis)] = step.to;
  }
  return cost;
}

}  // namespace meshsim

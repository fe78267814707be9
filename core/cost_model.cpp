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

#include "sim/collectives.h"

#include <algorithm>

#include "core/cost_model.h"
#include "core/layout.h"
#include "core/mutants.h"

namespace meshsim {

namespace {

Locals shared(const at::Tensor& t, size_t n) {
  // Distinct tensor objects (each rank's autograd metadata is its own) over one storage.
  Locals out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(t.detach());
  return out;
}

at::Tensor reduce(const Locals& group, ReduceOp op) {
  at::Tensor acc = group[0].clone();
  for (size_t k = 1; k < group.size(); ++k) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc.add_(group[k]); break;
      case ReduceOp::Max: acc = at::maximum(acc, group[k]); break;
      case ReduceOp::Min: acc = at::minimum(acc, group[k]); break;
    }
  }
  if (op == ReduceOp::Avg) acc.div_(static_cast<double>(group.size()));
  return acc;
}

}  // namespace

at::Tensor chunk_piece(const at::Tensor& t, int64_t dim, int64_t n, int64_t coord) {
  Chunk c = chunk_of(t.size(dim), n, coord);
  if (mutant_on(Mutant::UnevenArraySplit)) {  // planted bug: numpy.array_split
    const int64_t size = t.size(dim), base = size / n, extra = size % n;
    c = {coord * base + std::min(coord, extra), base + (coord < extra ? 1 : 0)};
  }
  return t.narrow(dim, c.offset, c.size);
}

Locals all_gather(const Locals& group, int64_t dim) {
  return shared(at::cat(group, dim), group.size());
}

Locals all_reduce(const Locals& group, ReduceOp op) { return shared(reduce(group, op), group.size()); }

Locals reduce_scatter(const Locals& group, ReduceOp op, int64_t dim) {
  at::Tensor full = reduce(group, op);
  const auto n = static_cast<int64_t>(group.size());
  Locals out;
  for (int64_t k = 0; k < n; ++k) out.push_back(chunk_piece(full, dim, n, k));
  return out;
}

Locals all_to_all(const Locals& group, int64_t split_dim, int64_t concat_dim) {
  const auto n = static_cast<int64_t>(group.size());
  Locals out;
  for (int64_t k = 0; k < n; ++k) {
    std::vector<at::Tensor> pieces;
    for (int64_t s = 0; s < n; ++s) pieces.push_back(chunk_piece(group[s], split_dim, n, k));
    out.push_back(at::cat(pieces, concat_dim));
  }
  return out;
}

namespace {

Locals local_step(const RedistStep& step, const Locals& group) {
  const auto n = static_cast<int64_t>(group.size());
  Locals out;
  out.reserve(group.size());
  for (int64_t k = 0; k < n; ++k) {
    const at::Tensor& t = group[k];
    switch (step.kind) {
      case StepKind::LocalChunk:
        out.push_back(chunk_piece(t, step.dim, n, k));
        break;
      case StepKind::PartialFromReplicate:
        if (step.op != ReduceOp::Sum) out.push_back(t);
        else if (step.convention == PartialFromReplicate::Divide) out.push_back(t / static_cast<double>(n));
        else out.push_back(k == 0 ? t : at::zeros_like(t));
        break;
      case StepKind::PadToPartial: {
        int64_t extent = 0, offset = 0;
        for (int64_t s = 0; s < n; ++s) {
          if (s == k) offset = extent;
          extent += group[s].size(step.dim);
        }
        auto shape = t.sizes().vec();
        shape[step.dim] = extent;
        at::Tensor z = at::zeros(shape, t.options());
        z.narrow(step.dim, offset, t.size(step.dim)).copy_(t);
        out.push_back(z);
        break;
      }
      default:
        out.push_back(t);
    }
  }
  return out;
}

Locals group_step(const RedistStep& step, const Locals& group) {
  switch (step.kind) {
    case StepKind::AllGather: return all_gather(group, step.dim);
    case StepKind::AllReduce: return all_reduce(group, step.op);
    case StepKind::ReduceScatter: return reduce_scatter(group, step.op, step.dim);
    case StepKind::AllToAll: return all_to_all(group, step.split_dim, step.concat_dim);
    case StepKind::Relabel: return group;
    default: return local_step(step, group);
  }
}

}  // namespace

Locals apply_step(const Mesh& mesh, const RedistStep& step, const Locals& locals) {
  if (step.kind == StepKind::Relabel) return locals;
  Locals out(locals.size());
  for (const auto& ranks : mesh.groups(step.axis)) {
    Locals group;
    group.reserve(ranks.size());
    for (auto r : ranks) group.push_back(locals[r]);
    Locals result = group_step(step, group);
    for (size_t k = 0; k < ranks.size(); ++k) out[ranks[k]] = result[k];
  }
  return out;
}

int64_t step_bytes(const Mesh& mesh, const RedistStep& step, const Locals& locals) {
  if (!step.communicates()) return 0;
  const int64_t n = mesh.axis_size(step.axis);
  // Elements of `t` per index along `dim` (well defined when that dim is empty too).
  auto rest = [](const at::Tensor& t, int64_t dim) {
    int64_t r = 1;
    for (int64_t d = 0; d < t.dim(); ++d)
      if (d != dim) r *= t.size(d);
    return r;
  };
  int64_t most = 0;
  for (const auto& ranks : mesh.groups(step.axis)) {
    const at::Tensor& t = locals[ranks[0]];
    const int64_t elem = static_cast<int64_t>(t.element_size());
    int64_t full = t.numel() * elem;  // all_reduce
    if (step.kind == StepKind::AllGather) {
      int64_t widest = 0;
      for (auto r : ranks) widest = std::max(widest, locals[r].size(step.dim));
      full = n * widest * rest(t, step.dim) * elem;
    } else if (step.kind == StepKind::ReduceScatter || step.kind == StepKind::AllToAll) {
      int64_t d = step.kind == StepKind::ReduceScatter ? step.dim : step.split_dim;
      full = n * padded_chunk(t.size(d), n) * rest(t, d) * elem;
    }
    most = std::max(most, collective_bytes(step.kind, full, n));
  }
  return most;
}

}  // namespace meshsim

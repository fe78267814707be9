#include "sim/collectives.h"

#include <algorithm>
#include <random>
#include <cstring>

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

// The fast paths below read and write raw memory: they take plain CPU float64 or float32 locals,
// contiguous, of one dtype, outside autograd; anything else goes through the libtorch ops, which
// compute the same values.
bool plain(const at::Tensor& t, at::ScalarType dtype) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == dtype && t.is_contiguous() && !t.requires_grad() &&
         !t.is_conj() && !t.is_neg();
}

bool plain_group(const Locals& group) {
  if (group.empty()) return false;
  const at::ScalarType dtype = group[0].defined() ? group[0].scalar_type() : at::kDouble;
  if (dtype != at::kDouble && dtype != at::kFloat) return false;
  for (const auto& t : group)
    if (!plain(t, dtype)) return false;
  return true;
}

// The same view of the same storage (so the same values): replicated locals share storage.
bool same_view(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.has_storage() && b.has_storage() && a.is_alias_of(b) &&
         a.storage_offset() == b.storage_offset() && a.scalar_type() == b.scalar_type() &&
         a.sizes().equals(b.sizes()) && a.strides().equals(b.strides()) && a.is_conj() == b.is_conj() &&
         a.is_neg() == b.is_neg();
}

// acc = g[0] + g[1] + ... in rank order, element by element (so bit for bit what add_ in rank
// order gives), a block at a time so that the accumulator stays in cache.
template <class T>
void sum_in_rank_order(const Locals& group, at::Tensor& acc) {
  constexpr int64_t kBlock = 4096;
  const int64_t numel = acc.numel();
  T* out = acc.data_ptr<T>();
  std::vector<const T*> in;
  in.reserve(group.size());
  for (const auto& t : group) in.push_back(t.data_ptr<T>());
  for (int64_t b = 0; b < numel; b += kBlock) {
    const int64_t e = std::min(numel, b + kBlock);
    std::copy(in[0] + b, in[0] + e, out + b);
    for (size_t k = 1; k < in.size(); ++k) {
      const T* p = in[k];
      for (int64_t i = b; i < e; ++i) out[i] += p[i];
    }
  }
}

bool same_sizes(const Locals& group) {
  for (const auto& t : group)
    if (!t.sizes().equals(group[0].sizes())) return false;
  return true;
}

at::Tensor reduce(const Locals& group, ReduceOp op) {
  if (mutant_on(Mutant::Float32RandomReductionOrder) && group[0].scalar_type() == at::kFloat &&
      (op == ReduceOp::Sum || op == ReduceOp::Avg)) {
    Locals order = group;  // planted bug: the order of a float32 sum depends on a hidden random draw
    std::shuffle(order.begin(), order.end(), std::mt19937(std::random_device{}()));
    at::Tensor acc = order[0].clone();
    for (size_t k = 1; k < order.size(); ++k) acc.add_(order[k]);
    if (op == ReduceOp::Avg) acc.div_(static_cast<double>(order.size()));
    return acc;
  }
  if ((op == ReduceOp::Sum || op == ReduceOp::Avg) && plain_group(group) && same_sizes(group)) {
    at::Tensor acc = at::empty(group[0].sizes(), group[0].options());
    if (acc.scalar_type() == at::kDouble) sum_in_rank_order<double>(group, acc);
    else sum_in_rank_order<float>(group, acc);
    if (op == ReduceOp::Avg) acc.div_(static_cast<double>(group.size()));
    return acc;
  }
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

// at::cat(group, dim) by memcpy, for plain locals that agree on every dim but `dim`.
at::Tensor cat_plain(const Locals& group, int64_t dim) {
  const at::Tensor& first = group[0];
  const int64_t nd = first.dim();
  int64_t outer = 1, inner = 1, extent = 0;
  for (int64_t d = 0; d < dim; ++d) outer *= first.size(d);
  for (int64_t d = dim + 1; d < nd; ++d) inner *= first.size(d);
  for (const auto& t : group) extent += t.size(dim);
  auto shape = first.sizes().vec();
  shape[dim] = extent;
  at::Tensor out = at::empty(shape, first.options());
  const size_t es = first.element_size();
  auto* dst = static_cast<char*>(out.data_ptr());
  const size_t row = static_cast<size_t>(extent * inner) * es;  // one outer index of the output
  size_t offset = 0;
  for (const auto& t : group) {
    const size_t piece = static_cast<size_t>(t.size(dim) * inner) * es;
    const auto* src = static_cast<const char*>(t.data_ptr());
    if (piece)
      for (int64_t o = 0; o < outer; ++o) std::memcpy(dst + o * row + offset, src + o * piece, piece);
    offset += piece;
  }
  return out;
}

bool catable_plain(const Locals& group, int64_t dim) {
  if (!plain_group(group)) return false;
  const at::Tensor& first = group[0];
  if (dim < 0 || dim >= first.dim()) return false;
  for (const auto& t : group) {
    if (t.dim() != first.dim()) return false;
    for (int64_t d = 0; d < t.dim(); ++d)
      if (d != dim && t.size(d) != first.size(d)) return false;
  }
  return true;
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
  return shared(catable_plain(group, dim) ? cat_plain(group, dim) : at::cat(group, dim), group.size());
}

Locals all_reduce(const Locals& group, ReduceOp op) { return shared(reduce(group, op), group.size()); }

Locals reduce_scatter(const Locals& group, ReduceOp op, int64_t dim) {
  at::Tensor full = reduce(group, op);
  const auto n = static_cast<int64_t>(group.size());
  Locals out;
  out.reserve(group.size());
  for (int64_t k = 0; k < n; ++k) out.push_back(chunk_piece(full, dim, n, k));
  return out;
}

namespace {

// all_to_all when every member holds the same shape and the split is even: one stack and one
// permuted copy of the whole group (O(bytes)), rather than n * n narrowed pieces and n cats. The
// output of member k is slice k of one tensor: cat over s of chunk k (along split_dim) of member
// s, along concat_dim.
Locals all_to_all_even(const Locals& group, int64_t split_dim, int64_t concat_dim) {
  const auto n = static_cast<int64_t>(group.size());
  const at::Tensor& first = group[0];
  const int64_t nd = first.dim(), c = first.size(split_dim) / n;
  // stacked dims: s, then the local dims with split_dim replaced by (k, c).
  std::vector<int64_t> split_shape{n};
  std::vector<int64_t> pos(static_cast<size_t>(nd));  // position of local dim d in the split shape
  int64_t k_pos = 0;
  for (int64_t d = 0; d < nd; ++d) {
    if (d == split_dim) {
      k_pos = static_cast<int64_t>(split_shape.size());
      split_shape.push_back(n);
      split_shape.push_back(c);
      pos[d] = k_pos + 1;
    } else {
      pos[d] = static_cast<int64_t>(split_shape.size());
      split_shape.push_back(first.size(d));
    }
  }
  // output dims: k, then the local dims, with s just before the (chunked) concat dim.
  std::vector<int64_t> perm{k_pos}, out_shape{n};
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t size = d == split_dim ? c : first.size(d);
    if (d == concat_dim) {
      perm.push_back(0);
      out_shape.push_back(n * size);
    } else {
      out_shape.push_back(size);
    }
    perm.push_back(pos[d]);
  }
  at::Tensor all = at::stack(group, 0).reshape(split_shape).permute(perm).contiguous().reshape(out_shape);
  Locals out;
  out.reserve(group.size());
  for (int64_t k = 0; k < n; ++k) out.push_back(all.select(0, k));
  return out;
}

}  // namespace

Locals all_to_all(const Locals& group, int64_t split_dim, int64_t concat_dim) {
  const auto n = static_cast<int64_t>(group.size());
  if (plain_group(group) && same_sizes(group) && split_dim >= 0 && split_dim < group[0].dim() && concat_dim >= 0 &&
      concat_dim < group[0].dim() && group[0].size(split_dim) % n == 0)
    return all_to_all_even(group, split_dim, concat_dim);
  Locals out;
  out.reserve(group.size());
  for (int64_t k = 0; k < n; ++k) {
    std::vector<at::Tensor> pieces;
    pieces.reserve(group.size());
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
  // Offsets of the members' pieces along step.dim (PadToPartial).
  std::vector<int64_t> offsets;
  int64_t extent = 0;
  if (step.kind == StepKind::PadToPartial)
    for (int64_t s = 0; s < n; ++s) {
      offsets.push_back(extent);
      extent += group[s].size(step.dim);
    }
  at::Tensor zeros;  // rank0 convention: one zero tensor shared by the other members
  for (int64_t k = 0; k < n; ++k) {
    const at::Tensor& t = group[k];
    switch (step.kind) {
      case StepKind::LocalChunk:
        out.push_back(chunk_piece(t, step.dim, n, k));
        break;
      case StepKind::PartialFromReplicate:
        if (step.op != ReduceOp::Sum) out.push_back(t);
        else if (step.convention == PartialFromReplicate::Divide) {
          // Members that share one replicated local share its quotient too.
          if (k > 0 && same_view(t, group[k - 1])) out.push_back(out.back().detach());
          else out.push_back(t / static_cast<double>(n));
        } else if (k == 0) {
          out.push_back(t);
        } else {
          if (!zeros.defined() || !zeros.sizes().equals(t.sizes()) || zeros.scalar_type() != t.scalar_type() ||
              zeros.device() != t.device())
            zeros = at::zeros_like(t);
          out.push_back(zeros.detach());
        }
        break;
      case StepKind::RescalePartial:  // P(avg) <-> P(sum): times 1/n from avg, times n from sum
        out.push_back(step.op == ReduceOp::Avg ? t / static_cast<double>(n) : t * static_cast<double>(n));
        break;
      case StepKind::PadToPartial: {
        auto shape = t.sizes().vec();
        shape[step.dim] = extent;
        at::Tensor z = at::zeros(shape, t.options());
        z.narrow(step.dim, offsets[k], t.size(step.dim)).copy_(t);
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

#include "sim/collectives.h"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <cstring>
#include <type_traits>
#include <typeinfo>

#include "core/cost_model.h"
#include "core/error.h"
#include "core/layout.h"
#include "core/mutants.h"
#include "sim/communicator.h"

namespace meshsim {

namespace {

// A tensor over t's storage with the given geometry, made directly rather than through the
// dispatcher (detach, narrow and select cost about as much as copying a few KiB, and a
// collective over n ranks makes n of them). For locals outside autograd only: it shares t's
// version counter, as detach() does, and is not recorded as a view (nothing in meshsim writes a
// local in place). Only for what meshsim makes itself: a dense float64 or float32 CPU tensor whose
// impl is a plain TensorImpl (no subclass, no wrapper), so that copying its key set is all there is.
bool raw_viewable(const at::Tensor& t) {
  if (!t.defined()) return false;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return typeid(*impl) == typeid(c10::TensorImpl) && t.has_storage() && t.device().is_cpu() &&
         t.layout() == at::kStrided && (t.scalar_type() == at::kDouble || t.scalar_type() == at::kFloat) &&
         !t.requires_grad() && !t.is_conj() && !t.is_neg() && !t.is_inference();
}

at::Tensor raw_view(const at::Tensor& t, at::IntArrayRef sizes, at::IntArrayRef strides, int64_t offset) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(t.storage()), t.key_set(), t.dtype());
  impl->set_sizes_and_strides(sizes, strides, offset);
  impl->set_version_counter(t.unsafeGetTensorImpl()->version_counter());
  return at::Tensor(std::move(impl));
}

Locals shared(const at::Tensor& t, size_t n) {
  // Distinct tensor objects (each rank's autograd metadata is its own) over one storage.
  Locals out;
  out.reserve(n);
  const bool raw = raw_viewable(t);
  for (size_t i = 0; i < n; ++i) out.push_back(raw ? raw_view(t, t.sizes(), t.strides(), t.storage_offset()) : t.detach());
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

// out[i] += p[i]: element by element, so vectorizing does not change a single rounding; built
// for AVX2 as well where the compiler can (picked at load time), as libtorch's own kernels are.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MESHSIM_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MESHSIM_VECTOR_CLONES
#endif

MESHSIM_VECTOR_CLONES void add_into(double* __restrict out, const double* __restrict p, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) out[i + j] += p[i + j];
  for (; i < n; ++i) out[i] += p[i];
}

MESHSIM_VECTOR_CLONES void add_into(float* __restrict out, const float* __restrict p, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) out[i + j] += p[i + j];
  for (; i < n; ++i) out[i] += p[i];
}

// acc = g[0] + g[1] + ... in rank order, element by element (so bit for bit what add_ in rank
// order gives), a block at a time so that the accumulator stays in cache: the group's bytes are
// read once and the result written once.
template <class T>
void sum_in_rank_order(const Locals& group, at::Tensor& acc) {
  constexpr int64_t kBlock = 2048;
  const int64_t numel = acc.numel();
  T* out = acc.data_ptr<T>();
  std::vector<const T*> in;
  in.reserve(group.size());
  for (const auto& t : group) in.push_back(t.data_ptr<T>());
  for (int64_t b = 0; b < numel; b += kBlock) {
    const int64_t e = std::min(numel, b + kBlock);
    std::memcpy(out + b, in[0] + b, static_cast<size_t>(e - b) * sizeof(T));
    for (size_t k = 1; k < in.size(); ++k) add_into(out + b, in[k] + b, e - b);
  }
}

bool same_sizes(const Locals& group) {
  for (const auto& t : group)
    if (!t.sizes().equals(group[0].sizes())) return false;
  return true;
}

at::Tensor reduce(const Locals& in_rank_order, ReduceOp op) {
  Locals shuffled;
  if (mutant_on(Mutant::Float32RandomReductionOrder) && in_rank_order[0].scalar_type() == at::kFloat && is_linear(op)) {
    shuffled = in_rank_order;  // planted bug: the order of a float32 sum depends on a hidden random draw
    std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(std::random_device{}()));
  }
  const Locals& group = shuffled.empty() ? in_rank_order : shuffled;
  if (is_linear(op) && plain_group(group) && same_sizes(group)) {
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
      case ReduceOp::Norm:  // group_step reduces a norm's partial as a sum of powers
        throw std::logic_error("reduce: a norm's partial reaches an engine only as a sum of its powers");
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
  if (raw_viewable(t) && dim >= 0 && dim < t.dim()) {
    std::vector<int64_t> sizes = t.sizes().vec();
    sizes[dim] = c.size;
    return raw_view(t, sizes, t.strides(), t.storage_offset() + c.offset * t.stride(dim));
  }
  return t.narrow(dim, c.offset, c.size);
}

Locals all_gather(const Locals& group, int64_t dim) {
  return shared(catable_plain(group, dim) ? cat_plain(group, dim) : at::cat(group, dim), group.size());
}

Locals all_reduce(const Locals& group, ReduceOp op) { return shared(reduce(group, op), group.size()); }

at::Tensor reduce_partial(const Locals& group, const Placement& p) {
  if (!p.is_norm_partial()) return reduce(group, p.op);
  Locals powers;
  for (const auto& t : group) powers.push_back(at::pow(t, p.norm));
  return at::pow(reduce(powers, ReduceOp::Sum), 1.0 / p.norm);
}

Locals reduce_scatter(const Locals& group, ReduceOp op, int64_t dim) {
  at::Tensor full = reduce(group, op);
  const auto n = static_cast<int64_t>(group.size());
  Locals out;
  out.reserve(group.size());
  for (int64_t k = 0; k < n; ++k) out.push_back(chunk_piece(full, dim, n, k));
  return out;
}

namespace {

// Copies a strided block of `sizes` (strides in elements of T): memcpy where the innermost run is
// contiguous on both sides, an element loop otherwise (pieces may be a single element wide).
template <class T>
void copy_block(T* dst, const int64_t* dst_strides, const T* src, const int64_t* src_strides, const int64_t* sizes,
                int nd) {
  if (nd == 1) {
    const int64_t n = sizes[0], ds = dst_strides[0], ss = src_strides[0];
    if (ds == 1 && ss == 1) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(T));
    else
      for (int64_t i = 0; i < n; ++i) dst[i * ds] = src[i * ss];
    return;
  }
  for (int64_t i = 0; i < sizes[0]; ++i)
    copy_block(dst + i * dst_strides[0], dst_strides + 1, src + i * src_strides[0], src_strides + 1, sizes + 1, nd - 1);
}

// Row-major strides of `shape`, in elements.
std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> st(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) st[d] = st[d + 1] * shape[d + 1];
  return st;
}

// all_to_all for plain locals of one shape, split evenly: every output is written once, piece by
// piece (O(bytes) with n * n block copies, no per-piece tensor objects). Output k is cat over s
// of chunk k (along split_dim) of member s, along concat_dim: the same values as the general
// path below.
Locals all_to_all_even(const Locals& group, int64_t split_dim, int64_t concat_dim) {
  const auto n = static_cast<int64_t>(group.size());
  const at::Tensor& first = group[0];
  const int64_t c = first.size(split_dim) / n;
  std::vector<int64_t> piece = first.sizes().vec();  // one member's chunk, as it lands in an output
  piece[split_dim] = c;
  std::vector<int64_t> out_shape = piece;
  out_shape[concat_dim] *= n;
  const std::vector<int64_t> in_strides = strides_of(first.sizes().vec()), out_strides = strides_of(out_shape);
  // Small groups: one buffer for every output (one allocation). Large ones: a tensor per output,
  // as one buffer for the group would cross glibc's mmap threshold sooner (fresh pages cost
  // more than the copy).
  const int64_t es = static_cast<int64_t>(first.element_size());
  int64_t out_numel = 1;
  for (auto v : out_shape) out_numel *= v;
  Locals out;
  out.reserve(group.size());
  if (n * out_numel * es <= (int64_t{1} << 20)) {
    const at::Tensor all = at::empty({n * out_numel}, first.options());
    for (int64_t k = 0; k < n; ++k) out.push_back(raw_view(all, out_shape, out_strides, k * out_numel));
  } else {
    for (int64_t k = 0; k < n; ++k) out.push_back(at::empty(out_shape, first.options()));
  }
  // A piece's dims without those of size 1, trailing dims merged where they are contiguous in
  // both the piece and the output (longer runs).
  std::vector<int64_t> sizes, ss, ds;
  bool empty = false;
  for (size_t d = 0; d < piece.size(); ++d) {
    empty |= piece[d] == 0;
    if (piece[d] == 1) continue;
    if (!sizes.empty() && ss.back() == in_strides[d] * piece[d] && ds.back() == out_strides[d] * piece[d]) {
      sizes.back() *= piece[d];
      ss.back() = in_strides[d];
      ds.back() = out_strides[d];
      continue;
    }
    sizes.push_back(piece[d]);
    ss.push_back(in_strides[d]);
    ds.push_back(out_strides[d]);
  }
  // One contiguous run per piece (or a single element): copied inline, no recursion.
  const bool run = sizes.empty() || (sizes.size() == 1 && ss[0] == 1 && ds[0] == 1);
  const int64_t run_length = sizes.empty() ? 1 : sizes[0];
  // Elements are moved as same-sized integers (plain locals are float64 or float32). Outputs are
  // written in tiles of kTile members, so that each source is read once per tile and a tile's
  // outputs stay in cache (an all_to_all is a transpose of pieces).
  constexpr int64_t kTile = 64;
  auto scatter = [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    std::vector<const T*> srcs;
    std::vector<T*> dsts;
    srcs.reserve(group.size());
    dsts.reserve(group.size());
    for (const auto& t : group) srcs.push_back(static_cast<const T*>(t.data_ptr()));
    for (auto& t : out) dsts.push_back(static_cast<T*>(t.data_ptr()));
    const int64_t src_step = c * in_strides[split_dim], dst_step = piece[concat_dim] * out_strides[concat_dim];
    for (int64_t k0 = 0; k0 < n; k0 += kTile)
      for (int64_t s = 0; s < n; ++s)
        for (int64_t k = k0; k < std::min(n, k0 + kTile); ++k) {
          const T* src = srcs[s] + k * src_step;
          T* dst = dsts[k] + s * dst_step;
          if (!run) copy_block(dst, ds.data(), src, ss.data(), sizes.data(), static_cast<int>(sizes.size()));
          else if (run_length == 1) *dst = *src;
          else std::memcpy(dst, src, static_cast<size_t>(run_length) * sizeof(T));
        }
  };
  if (!empty) {
    if (es == 8) scatter(static_cast<uint64_t*>(nullptr));
    else scatter(static_cast<uint32_t*>(nullptr));
  }
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

SplitTable transposed(const SplitTable& sends) {
  SplitTable out(sends.size(), std::vector<int64_t>(sends.size(), 0));
  for (size_t k = 0; k < sends.size(); ++k)
    for (size_t s = 0; s < sends.size(); ++s) out[s][k] = sends[k].at(s);
  return out;
}

Locals all_to_all_split(const Locals& group, const SplitTable& sends) {
  const size_t n = group.size();
  std::vector<std::vector<int64_t>> offsets(n, std::vector<int64_t>(n + 1, 0));  // where s's piece for k starts
  for (size_t s = 0; s < n; ++s)
    for (size_t k = 0; k < n; ++k) offsets[s][k + 1] = offsets[s][k] + sends[s][k];
  Locals out;
  out.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    std::vector<at::Tensor> pieces;
    pieces.reserve(n);
    for (size_t s = 0; s < n; ++s) pieces.push_back(group[s].narrow(0, offsets[s][k], sends[s][k]));
    out.push_back(at::cat(pieces, 0));
  }
  return out;
}

namespace {

// Views `dim` of t as [a, b, rest] and returns it as [b, a, rest] (contiguous): with (a, b) =
// (members, pieces) it turns an all_gather's member-major result piece-major, with (pieces,
// members) a strided local member-major for a reduce_scatter.
at::Tensor swap_blocks(const at::Tensor& t, int64_t dim, int64_t a, int64_t b, const RedistStep& step) {
  const int64_t extent = t.size(dim);
  if (extent % (a * b) != 0)
    throw SemanticError(ErrorKind::ShapeMismatch,
                        std::string(step_kind_name(step.kind)) + " " + step.from.str() + " -> " + step.to.str() +
                            " over mesh axis " + std::to_string(step.axis) + ": dim " + std::to_string(dim) +
                            " has extent " + std::to_string(extent) + ", which is not a multiple of " +
                            std::to_string(a * b) + " (the strided shard's pieces must be even)");
  std::vector<int64_t> shape = t.sizes().vec();
  std::vector<int64_t> split(shape.begin(), shape.begin() + dim);
  split.push_back(a);
  split.push_back(b);
  split.push_back(extent / (a * b));
  split.insert(split.end(), shape.begin() + dim + 1, shape.end());
  return t.reshape(split).transpose(dim, dim + 1).contiguous().reshape(shape);
}

// The rank's sub-chunk (coordinate k of n) of each of the f pieces of t along dim, in piece order.
at::Tensor strided_chunk(const at::Tensor& t, const RedistStep& step, int64_t n, int64_t k) {
  const int64_t f = step.split_factor, extent = t.size(step.dim);
  if (extent % (f * n) != 0)
    throw SemanticError(ErrorKind::ShapeMismatch,
                        std::string("local_chunk ") + step.from.str() + " -> " + step.to.str() + " over mesh axis " +
                            std::to_string(step.axis) + ": dim " + std::to_string(step.dim) + " has extent " +
                            std::to_string(extent) + ", which " + std::to_string(f) + " pieces of " +
                            std::to_string(n) + " even chunks do not divide");
  const int64_t sub = extent / (f * n);
  std::vector<at::Tensor> parts;
  for (int64_t j = 0; j < f; ++j) parts.push_back(t.narrow(step.dim, (j * n + k) * sub, sub));
  return at::cat(parts, step.dim);
}

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
        out.push_back(step.split_factor > 1 ? strided_chunk(t, step, n, k) : chunk_piece(t, step.dim, n, k));
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
        if (step.split_factor > 1) {
          // A strided source: the member's sub-chunk of piece j lands at j * (n * sub) + k * sub.
          const int64_t f = step.split_factor, size = t.size(step.dim), sub = size / f;
          if (size % f != 0 || extent != n * size)
            throw SemanticError(ErrorKind::ShapeMismatch,
                                "pad_to_partial " + step.from.str() + " -> " + step.to.str() + " over mesh axis " +
                                    std::to_string(step.axis) + ": the members' locals along dim " +
                                    std::to_string(step.dim) + " must be equal multiples of " + std::to_string(f));
          for (int64_t j = 0; j < f; ++j)
            z.narrow(step.dim, (j * n + k) * sub, sub).copy_(t.narrow(step.dim, j * sub, sub));
        } else {
          z.narrow(step.dim, offsets[k], t.size(step.dim)).copy_(t);
        }
        out.push_back(z);
        break;
      }
      default:
        out.push_back(t);
    }
  }
  return out;
}

// An all_gather's result, member-major ([n, f, s] along dim), made piece-major ([f, n, s]).
// Members that share one result share its reorder too.
Locals piece_major(const RedistStep& step, const Locals& gathered) {
  const auto n = static_cast<int64_t>(gathered.size());
  Locals out;
  out.reserve(gathered.size());
  for (size_t k = 0; k < gathered.size(); ++k) {
    if (k > 0 && same_view(gathered[k], gathered[k - 1])) out.push_back(out.back().detach());
    else out.push_back(swap_blocks(gathered[k], step.dim, n, step.split_factor, step));
  }
  return out;
}

// Every member's strided local, piece-major ([f, n, s] along dim), made member-major ([n, f, s]),
// so that a plain reduce_scatter hands member k its sub-chunk of every piece.
Locals member_major(const RedistStep& step, const Locals& group) {
  const auto n = static_cast<int64_t>(group.size());
  Locals out;
  out.reserve(group.size());
  for (const auto& t : group) out.push_back(swap_blocks(t, step.dim, step.split_factor, n, step));
  return out;
}

// A norm's partial P(norm p) is reduced as PyTorch's _NormPartial does: every member's local to the
// power p, summed by the engine, and the sum to the power 1/p. The locals are norms (never
// negative), so local^p is |local|^p.
Locals norm_powers(const RedistStep& step, const Locals& group) {
  Locals out;
  out.reserve(group.size());
  for (const auto& t : group) out.push_back(at::pow(t, step.from.norm));
  return out;
}
Locals norm_root(const RedistStep& step, const Locals& sums) {
  Locals out;
  out.reserve(sums.size());
  for (const auto& t : sums) out.push_back(at::pow(t, 1.0 / step.from.norm));
  return out;
}

// Communicating steps go through the current engine (communicator.h); the rest are local. A
// strided step (split_factor > 1) reorders locally around the engine's plain collective, so every
// engine runs it unchanged.
Locals group_step(const RedistStep& step, const Ranks& ranks, const Locals& group) {
  Communicator& c = communicator();
  const bool strided = step.split_factor > 1;
  switch (step.kind) {
    case StepKind::AllGather:
      // Planted bug: the gathered pieces are left member-major (a plain shard's order).
      return strided && !mutant_on(Mutant::StridedGatheredPlain) ? piece_major(step, c.all_gather(ranks, group, step.dim))
                                                                 : c.all_gather(ranks, group, step.dim);
    case StepKind::AllReduce:
      if (step.op == ReduceOp::Norm) return norm_root(step, c.all_reduce(ranks, norm_powers(step, group), ReduceOp::Sum));
      return c.all_reduce(ranks, group, step.op);
    case StepKind::ReduceScatter:
      if (step.op == ReduceOp::Norm)
        return norm_root(step, c.reduce_scatter(ranks, norm_powers(step, strided ? member_major(step, group) : group),
                                                ReduceOp::Sum, step.dim));
      return c.reduce_scatter(ranks, strided ? member_major(step, group) : group, step.op, step.dim);
    case StepKind::AllToAll: return c.all_to_all(ranks, group, step.split_dim, step.concat_dim);
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
    Locals result = group_step(step, ranks, group);
    for (size_t k = 0; k < ranks.size(); ++k) out[ranks[k]] = result[k];
  }
  return out;
}

int64_t step_bytes(const Mesh& mesh, const RedistStep& step, const Locals& locals) {
  if (!step.communicates() || locals.empty()) return 0;
  return step_bytes_of(
      mesh, step, [&](int64_t r) { return locals[static_cast<size_t>(r)].sizes().vec(); },
      static_cast<int64_t>(locals[0].element_size()));
}

}  // namespace meshsim

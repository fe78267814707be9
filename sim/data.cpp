#include "sim/data.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <unordered_map>

#include <xxhash.h>

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

at::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::Float64: return at::kDouble;
    case DType::Float32: return at::kFloat;
    case DType::BFloat16: return at::kBFloat16;
    case DType::Float16: return at::kHalf;
  }
  return at::kDouble;
}

std::optional<DType> dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return DType::Float64;
    case at::kFloat: return DType::Float32;
    case at::kBFloat16: return DType::BFloat16;
    case at::kHalf: return DType::Float16;
    default: return std::nullopt;
  }
}

bool& float64_reference() {
  static thread_local bool on = false;
  return on;
}

at::Tensor make_init(const std::string& init, const Shape& shape, DType dtype, Rng& rng) {
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor t;
  if (init == "ones") {
    t = at::ones(shape, opts);
  } else if (init == "arange") {
    t = at::arange(numel(shape), opts).reshape(shape);
  } else {
    // Filled in place, row-major, one draw per element (the stream of uniform_int(-4, 4), with
    // the range a constant so that the modulo is a multiplication).
    t = at::empty(shape, opts);
    double* p = t.data_ptr<double>();
    const int64_t n = t.numel();
    if (init == "randn")
      for (int64_t i = 0; i < n; ++i) p[i] = rng.normal();
    else
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<double>(-4 + static_cast<int64_t>(rng.next() % 9u));
  }
  return t.to(scalar_type(dtype));
}

at::Tensor make_input(const InputDecl& in, DType dtype, Rng& rng) {
  if (in.init == "values") {  // the value written out: no draw from the input's stream
    at::Tensor t = at::tensor(in.values, at::TensorOptions().dtype(at::kDouble)).reshape(in.shape);
    if (in.dtype == ElementType::Float) return t.to(scalar_type(in.float_dtype.value_or(dtype)));
    return t.to(in.dtype == ElementType::Bool ? at::kBool : at::kLong);
  }
  if (in.dtype == ElementType::Float) return make_init(in.init, in.shape, in.float_dtype.value_or(dtype), rng);
  at::Tensor t;
  if (in.init == "ids" || (in.dtype == ElementType::Bool && in.init == "int")) {
    const int64_t high = in.init == "ids" ? in.ids_high : 2;
    t = at::empty(in.shape, at::TensorOptions().dtype(at::kLong));
    int64_t* p = t.data_ptr<int64_t>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = rng.uniform_int(0, high - 1);
  } else {
    t = make_init(in.init, in.shape, DType::Float64, rng).to(at::kLong);
  }
  return in.dtype == ElementType::Bool ? t.to(at::kBool) : t;
}

namespace {

at::Tensor random_ints_like(const at::Tensor& t, Rng& rng, int64_t lo, int64_t hi) {
  at::Tensor out = at::empty(t.sizes(), at::TensorOptions().dtype(at::kDouble));
  double* p = out.data_ptr<double>();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) p[i] = static_cast<double>(rng.uniform_int(lo, hi));
  return out.to(t.scalar_type());
}

// The parts of `value` for the members of one Partial group.
std::vector<at::Tensor> partial_parts(const Placement& p, const at::Tensor& value, int64_t n, Rng* rng) {
  std::vector<at::Tensor> parts(static_cast<size_t>(n));
  if (p.is_norm_partial()) {  // PyTorch's _NormPartial: value / n^(1/p) on each (a norm: never negative)
    for (auto& part : parts) part = value / std::pow(static_cast<double>(n), 1.0 / p.norm);
    return parts;
  }
  if (!rng) {
    // The coordinate-0 rank holds the value; the others hold what leaves the reduction unchanged
    // (zeros for sum and avg, the value itself for max and min).
    const bool extremum = p.op == ReduceOp::Max || p.op == ReduceOp::Min;
    parts[0] = p.op == ReduceOp::Avg ? value * static_cast<double>(n) : value;
    for (int64_t k = 1; k < n; ++k) parts[k] = extremum ? value : at::zeros_like(value);
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

// SS(dim, split) over a group of n: member k's local is its sub-chunk of each of the `split`
// pieces of t, concatenated in piece order (even sizes: check_strided).
at::Tensor strided_piece(const at::Tensor& t, int64_t dim, int64_t split, int64_t n, int64_t k) {
  const int64_t extent = t.size(dim);
  TORCH_CHECK(extent % split == 0 && (extent / split) % n == 0, "a strided shard SS(", dim, ",", split,
              ") over ", n, " ranks needs an extent that ", split, " * ", n, " divides, got ", extent);
  const int64_t piece = extent / split, sub = piece / n;
  std::vector<at::Tensor> parts;
  for (int64_t j = 0; j < split; ++j) parts.push_back(t.narrow(dim, j * piece + k * sub, sub));
  return at::cat(parts, dim);
}

// The inverse over one group: piece j of the result is the members' j-th sub-chunks in group order.
at::Tensor strided_join(const Locals& group, int64_t dim, int64_t split) {
  std::vector<at::Tensor> parts;
  for (int64_t j = 0; j < split; ++j)
    for (const auto& t : group) {
      TORCH_CHECK(t.size(dim) % split == 0 && t.size(dim) == group[0].size(dim), "the locals of a strided shard SS(",
                  dim, ",", split, ") must have one extent along dim ", dim, " that ", split, " divides");
      const int64_t sub = t.size(dim) / split;
      parts.push_back(t.narrow(dim, j * sub, sub));
    }
  return at::cat(parts, dim);
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
    // Groups that differ only on Replicate or Reduced axes are replicas: they draw the same parts.
    const uint64_t axis_seed = rng ? rng->next() : 0;
    for_groups(mesh, a, [&](const std::vector<int64_t>& g) {
      std::vector<int64_t> key = mesh.coords(g[0]);
      for (int b = 0; b < mesh.ndim(); ++b)
        if (spec[b].is_replicate()) key[b] = 0;
      Rng replica_rng(axis_seed, static_cast<uint64_t>(mesh.rank_of(key)));
      auto parts = partial_parts(spec[a], cur[g[0]], static_cast<int64_t>(g.size()), rng ? &replica_rng : nullptr);
      for (size_t k = 0; k < g.size(); ++k) cur[g[k]] = parts[k];
    });
  }
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (!spec[a].is_shard()) continue;
    for_groups(mesh, a, [&](const std::vector<int64_t>& g) {
      const auto n = static_cast<int64_t>(g.size());
      for (size_t k = 0; k < g.size(); ++k)
        cur[g[k]] = spec[a].is_strided()
                        ? strided_piece(cur[g[k]], spec[a].dim, spec[a].split, n, static_cast<int64_t>(k))
                        : chunk_piece(cur[g[k]], spec[a].dim, n, static_cast<int64_t>(k));
    });
  }
  return cur;
}

namespace {

// Equal shapes and values, NaN equal to NaN: replicas of a NaN (the mean of an empty tensor)
// hold the same value.
bool same_local(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  if (a.is_same(b) || at::equal(a, b)) return true;
  if (!a.is_floating_point() || !b.is_floating_point()) return false;
  return at::eq(a, b).logical_or(at::isnan(a).logical_and(at::isnan(b))).all().item<bool>();
}

}  // namespace

// Ranks that differ only on a Replicate or Reduced axis must hold equal locals (checked first, on
// the locals themselves); then Shard axes are gathered innermost first (nested chunks; a strided
// shard interleaves its members' sub-chunks piece by piece) and Partial
// axes reduced outermost first (as a redistribution to Replicate plans them).
at::Tensor assemble(const Mesh& mesh, const Spec& spec, const Locals& locals, std::string* problem) {
  for (int a = 0; a < mesh.ndim() && problem && problem->empty(); ++a) {
    if (!spec[a].is_replicate()) continue;
    for_groups(mesh, a, [&](const std::vector<int64_t>& g) {
      for (auto r : g)
        if (problem->empty() && !same_local(locals[r], locals[g[0]]))
          *problem = "ranks " + std::to_string(g[0]) + " and " + std::to_string(r) + " hold different locals across mesh axis \"" +
                     mesh.axes()[a] + "\" where " + spec[a].str() + " says they are equal";
    });
  }
  Locals cur = locals;
  // Once an axis is combined, the groups of the next axis are copies of each other (every group of
  // the next axis holds the same combined tensors): a group whose members are those of a group
  // already combined takes its result. Combining every group again cost the groups of that axis
  // times a global each, held until the end: a 4096-rank run's assembly of a [P(sum), S(0)]
  // value held 256 copies of its global (issue #35 item 5).
  auto combine = [&](int a, auto&& op) {
    std::map<std::vector<const void*>, at::Tensor> done;
    for_groups(mesh, a, [&](const std::vector<int64_t>& g) {
      Locals group;
      std::vector<const void*> key;
      for (auto r : g) {
        group.push_back(cur[r]);
        key.push_back(cur[r].unsafeGetTensorImpl());
      }
      auto it = done.find(key);
      if (it == done.end()) it = done.emplace(std::move(key), op(group)).first;
      for (auto r : g) cur[r] = it->second;
    });
  };
  for (int a = mesh.ndim() - 1; a >= 0; --a)
    if (spec[a].is_shard())
      combine(a, [&](const Locals& g) {
        return spec[a].is_strided() ? strided_join(g, spec[a].dim, spec[a].split) : at::cat(g, spec[a].dim);
      });
  for (int a = 0; a < mesh.ndim(); ++a)
    if (spec[a].is_partial()) combine(a, [&](const Locals& g) { return reduce_partial(g, spec[a]); });
  return cur[0];
}

namespace {

uint64_t fnv1a(uint64_t h, const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

std::string hash_bytes(const at::Tensor& t) {
  uint64_t h = 1469598103934665603ULL;
  for (auto s : t.sizes()) h = fnv1a(h, reinterpret_cast<const unsigned char*>(&s), sizeof(s));
  const at::Tensor c = t.is_contiguous() ? t : t.detach().contiguous();
  const auto* data = static_cast<const unsigned char*>(c.data_ptr());
  const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
  h = XXH64(data, n, h);  // xxHash from libxxhash-dev
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Hashes already computed, by view. Replicated locals share one storage across the ranks of a
// group (collectives.h), so an event over n ranks hashes a shared result once, not n times (at
// 4096 ranks, hashing an all_gather's result per rank would be quadratic). Entries are found by
// the view's first byte; one is valid while its storage lives (a weak reference: the StorageImpl
// cannot be freed and its address reused while the entry exists) and the view's version counter,
// which every in-place write bumps, is unchanged.
struct HashMemo {
  struct Entry {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    const c10::StorageImpl* impl;
    int64_t offset;
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype;
    int64_t version;
    std::string hash;

    bool matches(const at::Tensor& t) const {
      return impl == t.storage().unsafeGetStorageImpl() && offset == t.storage_offset() &&
             dtype == t.scalar_type() && version == t._version() && t.sizes().equals(sizes) &&
             t.strides().equals(strides);
    }
  };
  std::unordered_multimap<const void*, Entry> entries;
  // Few entries: a weak reference keeps its StorageImpl object (not the data) alive, and many of
  // them scattered through the heap fragment it (at 4096 ranks, 64 Ki entries cost 100 MiB of
  // peak memory, 4 Ki entries nothing). Reuse within an event, which is what the memo is for,
  // needs one entry per distinct shared local.
  static constexpr size_t kMaxEntries = 4096;

  void sweep() {
    for (auto it = entries.begin(); it != entries.end();) it = it->second.storage.expired() ? entries.erase(it) : std::next(it);
    if (entries.size() > kMaxEntries / 2) entries.clear();
  }
};

}  // namespace

// FNV-1a 64 of the shape seeds XXH64 of the bytes (row-major). A tensor's hash is kept with its
// view until the storage dies or is written.
std::string tensor_hash(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.is_inference() || t.numel() == 0) return hash_bytes(t);
  thread_local HashMemo memo;
  const void* key = t.data_ptr();
  auto range = memo.entries.equal_range(key);
  for (auto it = range.first; it != range.second;) {
    if (it->second.storage.expired()) {  // its storage died: the address may hold another now
      it = memo.entries.erase(it);
      continue;
    }
    if (it->second.matches(t)) return it->second.hash;
    ++it;
  }
  if (memo.entries.size() >= HashMemo::kMaxEntries) memo.sweep();
  std::string h = hash_bytes(t);
  memo.entries.emplace(key, HashMemo::Entry{t.storage().getWeakStorageImpl(), t.storage().unsafeGetStorageImpl(),
                                            t.storage_offset(), t.sizes().vec(), t.strides().vec(), t.scalar_type(),
                                            t._version(), h});
  return h;
}

namespace {

// Comparisons run over slices of this many elements: each needs a few temporaries the size of
// its operands, and a tensor of 10^8 elements must not need several copies of itself
// (docs/performance.md, "Memory: one large tensor").
constexpr int64_t kSlice = int64_t{1} << 20;

// `t` flattened, sharing its storage where it can.
at::Tensor flat(const at::Tensor& t) { return t.detach().reshape({-1}); }

}  // namespace

namespace {

// The comparisons on the data itself, for the float tensors nearly every check compares: one pass,
// no temporaries, no libtorch call per slice (a checked run compares every value and gradient, and
// the tensor path made about 18 small libtorch calls for each). Other dtypes, and views that are
// not contiguous, take the tensor path below; both give the same number.
template <typename A, typename B>
double max_abs_diff_of(const A* x, const B* y, int64_t n) {
  double worst = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(x[i]), v = static_cast<double>(y[i]);
    if (u == v || (std::isnan(u) && std::isnan(v))) continue;
    const double d = std::fabs(u - v);  // NaN when one side is NaN, or for inf - inf
    if (std::isnan(d)) return std::numeric_limits<double>::quiet_NaN();
    worst = std::max(worst, d);
  }
  return worst;
}

bool plain_float(const at::Tensor& t) {
  return t.device().is_cpu() && t.is_contiguous() && !t.is_conj() && !t.is_neg() &&
         (t.scalar_type() == at::kDouble || t.scalar_type() == at::kFloat);
}

template <typename A>
double max_abs_diff_with(const A* x, const at::Tensor& b, int64_t n) {
  return b.scalar_type() == at::kDouble ? max_abs_diff_of(x, b.data_ptr<double>(), n)
                                        : max_abs_diff_of(x, b.data_ptr<float>(), n);
}

template <typename T>
double largest_finite_of(const T* r, int64_t n) {
  double largest = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = std::fabs(static_cast<double>(r[i]));
    if (std::isfinite(v)) largest = std::max(largest, v);
  }
  return largest;
}

}  // namespace

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return std::numeric_limits<double>::infinity();
  if (a.numel() == 0) return 0.0;
  if (plain_float(a) && plain_float(b))
    return a.scalar_type() == at::kDouble ? max_abs_diff_with(a.data_ptr<double>(), b, a.numel())
                                          : max_abs_diff_with(a.data_ptr<float>(), b, a.numel());
  const at::Tensor fa = flat(a), fb = flat(b);
  double worst = 0.0;
  for (int64_t start = 0; start < fa.numel(); start += kSlice) {
    const int64_t n = std::min(kSlice, fa.numel() - start);
    const at::Tensor x = fa.narrow(0, start, n).to(at::kDouble), y = fb.narrow(0, start, n).to(at::kDouble);
    const at::Tensor agree = at::eq(x, y).logical_or(at::isnan(x).logical_and(at::isnan(y)));
    const at::Tensor diff = at::where(agree, at::zeros_like(x), (x - y).abs());
    if (at::isnan(diff).any().item<bool>()) return std::numeric_limits<double>::quiet_NaN();
    worst = std::max(worst, diff.max().item<double>());
  }
  return worst;
}

namespace {

// max_abs_diff_of over a block of `ref` (contiguous, of `ref_sizes`) at `offset` of `sizes`, against
// `x` holding the block contiguously: one run per innermost row.
template <typename A, typename B>
double block_diff(const A* x, const B* ref, const std::vector<int64_t>& ref_sizes, const std::vector<int64_t>& offset,
                  const std::vector<int64_t>& sizes) {
  const size_t nd = sizes.size();
  if (nd == 0) return max_abs_diff_of(x, ref, 1);
  std::vector<int64_t> stride(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * ref_sizes[d];
  const int64_t row = sizes[nd - 1];
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < nd; ++d) rows *= sizes[d];
  std::vector<int64_t> at(nd, 0);  // the row's index within the block, outer dims
  double worst = 0.0;
  for (int64_t k = 0; k < rows; ++k) {
    int64_t pos = offset[nd - 1];
    for (size_t d = 0; d + 1 < nd; ++d) pos += (offset[d] + at[d]) * stride[d];
    const double e = max_abs_diff_of(x + k * row, ref + pos, row);
    if (std::isnan(e)) return e;
    worst = std::max(worst, e);
    for (size_t d = nd - 1; d-- > 0;) {  // the next row
      if (++at[d] < sizes[d]) break;
      at[d] = 0;
    }
  }
  return worst;
}

// Bit-for-bit equal data, NaN equal to NaN (assemble's replica check).
template <typename T>
bool same_values(const T* a, const T* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!(a[i] == b[i] || (std::isnan(static_cast<double>(a[i])) && std::isnan(static_cast<double>(b[i]))))) return false;
  return true;
}

}  // namespace

std::optional<double> max_abs_diff_laid_out(const Mesh& mesh, const Spec& spec, const Locals& locals,
                                            const at::Tensor& reference) {
  if (!plain_float(reference) || static_cast<int64_t>(locals.size()) != mesh.size() || locals.empty()) return std::nullopt;
  for (const auto& p : spec)
    if (p.is_partial() || p.is_strided()) return std::nullopt;
  const at::ScalarType dtype = locals[0].scalar_type();
  for (const auto& t : locals)
    if (!t.defined() || !plain_float(t) || t.scalar_type() != dtype) return std::nullopt;
  const Shape global = reference.sizes().vec();
  // The first rank holding each block, and its layout.
  std::map<std::vector<int64_t>, size_t> holder;
  double worst = 0.0;
  for (size_t r = 0; r < locals.size(); ++r) {
    const LocalLayout l = local_layout(mesh, spec, global, static_cast<int64_t>(r));
    const at::Tensor& t = locals[r];
    if (!t.sizes().equals(l.shape)) return std::nullopt;
    std::vector<int64_t> block = l.offset;
    block.insert(block.end(), l.shape.begin(), l.shape.end());
    auto [it, first] = holder.emplace(std::move(block), r);
    if (!first) {  // a replica: equal to the block's first holder, as assemble checks
      const at::Tensor& h = locals[it->second];
      if (h.data_ptr() == t.data_ptr()) continue;
      const bool same = dtype == at::kDouble ? same_values(h.data_ptr<double>(), t.data_ptr<double>(), t.numel())
                                             : same_values(h.data_ptr<float>(), t.data_ptr<float>(), t.numel());
      if (!same) return std::nullopt;
      continue;
    }
    if (t.numel() == 0) continue;
    double e = 0.0;
    if (dtype == at::kDouble) {
      e = reference.scalar_type() == at::kDouble
              ? block_diff(t.data_ptr<double>(), reference.data_ptr<double>(), global, l.offset, l.shape)
              : block_diff(t.data_ptr<double>(), reference.data_ptr<float>(), global, l.offset, l.shape);
    } else {
      e = reference.scalar_type() == at::kDouble
              ? block_diff(t.data_ptr<float>(), reference.data_ptr<double>(), global, l.offset, l.shape)
              : block_diff(t.data_ptr<float>(), reference.data_ptr<float>(), global, l.offset, l.shape);
    }
    if (std::isnan(e)) return e;
    worst = std::max(worst, e);
  }
  return worst;
}

bool within(double err, double tol, const at::Tensor& reference) {
  if (std::isnan(err)) return false;
  if (tol == 0.0) return err == 0.0;
  // Relative to the largest finite magnitude of the reference (an infinity would excuse anything).
  if (plain_float(reference)) {
    const double largest = reference.scalar_type() == at::kDouble
                               ? largest_finite_of(reference.data_ptr<double>(), reference.numel())
                               : largest_finite_of(reference.data_ptr<float>(), reference.numel());
    return err <= tol * std::max(1.0, largest);
  }
  const at::Tensor ref = flat(reference);
  double largest = 0.0;
  for (int64_t start = 0; start < ref.numel(); start += kSlice) {
    const at::Tensor r = ref.narrow(0, start, std::min(kSlice, ref.numel() - start)).to(at::kDouble);
    const at::Tensor finite = r.masked_select(at::isfinite(r));
    if (finite.numel()) largest = std::max(largest, finite.abs().max().item<double>());
  }
  return err <= tol * std::max(1.0, largest);
}

}  // namespace meshsim

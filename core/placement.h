// Placements of one tensor over one mesh axis, and specs (one placement per mesh axis).
// SEMANTICS.md section 1. Canonical spellings: S(0), SS(0,2), R, P(sum), P(avg), P(max), P(min), Rd,
// and P(norm2) (P(normP) for a p-norm's partial, PyTorch's _NormPartial(p)).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshsim {

// Norm: the partial of a p-norm (Placement::norm holds p, finite and not 0): the global value is
// (sum over the ranks of local^p)^(1/p), reduced as an all_reduce(sum) of local^p followed by the
// p-th root (PyTorch's _NormPartial). Only a vector norm over a sharded dim makes one.
enum class ReduceOp { Sum, Avg, Max, Min, Norm };

// "sum", "avg", "max", "min", "norm" (a Placement's str() adds a norm's p: P(norm2)).
const char* reduce_op_name(ReduceOp op);
// Sum and avg are linear (differentiable, and commute with sums); max, min and norm are not.
inline bool is_linear(ReduceOp op) { return op == ReduceOp::Sum || op == ReduceOp::Avg; }
// Parses "sum" | "avg" | "max" | "min"; throws std::invalid_argument otherwise (a norm's partial
// is parsed by parse_placement, with its p).
ReduceOp parse_reduce_op(std::string_view text);
// A norm's p as its placement prints it: the shortest decimal that reads back ("2", "1.5", "-1").
std::string norm_p_str(double p);

struct Placement {
  enum class Kind { Shard, Replicate, Partial, Reduced };

  Kind kind = Kind::Replicate;
  int64_t dim = 0;               // Shard only; negative counts from the end until normalize_spec
  ReduceOp op = ReduceOp::Sum;   // Partial only
  // Shard only: > 1 makes a strided shard SS(dim, split), PyTorch's _StridedShard(dim, split_factor):
  // the dim is cut into `split` equal pieces and the rank holds its torch.chunk of every piece,
  // concatenated in piece order (SEMANTICS.md, "Strided shards").
  int64_t split = 1;
  // Partial(Norm) only: the norm's p (finite, not 0).
  double norm = 0;

  static Placement shard(int64_t dim) { return {Kind::Shard, dim, ReduceOp::Sum, 1}; }
  // split 1 is the plain shard S(dim).
  static Placement strided_shard(int64_t dim, int64_t split) { return {Kind::Shard, dim, ReduceOp::Sum, split}; }
  static Placement replicate() { return {Kind::Replicate, 0, ReduceOp::Sum, 1}; }
  static Placement partial(ReduceOp op = ReduceOp::Sum) { return {Kind::Partial, 0, op, 1}; }
  static Placement reduced() { return {Kind::Reduced, 0, ReduceOp::Sum, 1}; }
  // P(normP): the partial of a p-norm (p finite and not 0).
  static Placement partial_norm(double p) { return {Kind::Partial, 0, ReduceOp::Norm, 1, p}; }

  // True for plain and strided shards alike.
  bool is_shard() const { return kind == Kind::Shard; }
  bool is_strided() const { return kind == Kind::Shard && split > 1; }
  bool is_partial() const { return kind == Kind::Partial; }
  bool is_reduced() const { return kind == Kind::Reduced; }
  // Rd is a subclass of R: anything that asks "is this replicated?" gets yes for both.
  bool is_replicate() const { return kind == Kind::Replicate || kind == Kind::Reduced; }
  bool is_plain_replicate() const { return kind == Kind::Replicate; }

  bool is_norm_partial() const { return kind == Kind::Partial && op == ReduceOp::Norm; }

  // Canonical spelling: S(0), SS(0,2) (no space), R, P(sum), P(norm2), Rd.
  std::string str() const;
  // PyTorch spelling: Shard(dim=0), _StridedShard(dim=0, split_factor=2), Replicate(), Partial(sum),
  // _NormPartial(2), Reduced().
  std::string pytorch_str() const;

  bool operator==(const Placement& o) const {
    if (kind != o.kind) return false;
    if (kind == Kind::Shard) return dim == o.dim && split == o.split;
    if (kind == Kind::Partial) return op == o.op && (op != ReduceOp::Norm || norm == o.norm);
    return true;
  }
  bool operator!=(const Placement& o) const { return !(*this == o); }
};

// Accepts both spellings and PyTorch's: S(0), Shard(0), Shard(dim=0), SS(0,2), SS(0, 2),
// _StridedShard(0, 2), _StridedShard(dim=0, split_factor=2) (or StridedShard(...)), R, Replicate(),
// P(sum), Partial(), Partial(sum), Partial(reduce_op=sum), P(norm2), _NormPartial(2),
// _NormPartial(norm_type=2), Rd, Reduced() (a norm's p: a finite number, not 0). Shard dims may be negative
// (-64..64, counted from the end: normalize_spec in core/layout.h wraps them by the tensor's rank);
// a split factor must be in 1..65536, and SS(d,1) is read as S(d). Throws std::invalid_argument.
Placement parse_placement(std::string_view text);

// One placement per mesh axis, in the order of the mesh's axes.
using Spec = std::vector<Placement>;
// "[S(0), R]"
std::string spec_str(const Spec& spec);

// Every placement with shard dims in [0, max_dim), in a fixed order: S(0..), R, P(sum), P(avg),
// P(max), P(min), Rd. For exhaustive tests. (Not P(norm p): only a vector norm makes one.)
std::vector<Placement> all_placements(int64_t max_dim);
// all_placements(max_dim) followed by SS(d, split) for d in [0, max_dim).
std::vector<Placement> all_placements_with_strided(int64_t max_dim, int64_t split);

// Whether some mesh axis of `spec` shards tensor dim `dim` (plainly or strided).
bool shards_dim(const Spec& spec, int64_t dim);

}  // namespace meshsim

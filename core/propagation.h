// Sharding propagation for DTensor ops (SEMANTICS.md section 4), as data: every op family has a
// table of per-axis rows written in a text form that prints and parses back, e.g.
// "S(1), S(0) -> P(sum)". An op's inputs are redistributed to the cheapest row of each axis when
// no row matches as they are (a single operand that fits no row is replicated, as DTensor does).
// Reduced (Rd) is read as R by the rows; the Rd label of an output is restored by the policy in
// reduced_policy.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/layout.h"
#include "core/mesh.h"
#include "core/placement.h"
#include "core/scenario.h"

namespace meshsim {

// One row of a per-axis rule table: operand placements -> output placement.
struct RuleRow {
  std::vector<Placement> ins;
  Placement out;
  // The row as its table writes it, shard dims by role: "S(d), S(d) -> S(d)" for every dim d
  // alike, "S(dim) -> P(sum)" for the reduced dim. Rule coverage counts rows by this text. Interned
  // (it lives as long as the program): rows are copied at every op and backward step, it is not.
  std::string_view rule;

  std::string str() const;  // "S(0), R -> S(0)"
  static RuleRow parse(const std::string& text);  // throws std::invalid_argument
};

// Op attributes the rules need (from the scenario's op object). Dims may be negative, counted
// from the end as in PyTorch; the rules wrap them by the operand's rank.
struct OpAttrs {
  std::optional<int64_t> dim;  // sum, mean, amax, amin (absent: every dim); softmax, cat, stack, narrow,
                               // unflatten, unsqueeze, squeeze (absent: every size-1 dim)
  std::vector<int64_t> dims;   // sum, mean, amax, amin: `dim` given as a list ([]: every dim); permute
  bool dims_given = false;     // `dims` holds the reduced dims (a list was given)
  bool keepdim = false;        // sum, mean, amax, amin
  double value = 1.0;          // scale; binary ops: the scalar operand (then `scalar` is set)
  bool scalar = false;         // binary ops: the second operand is the constant `value`
  int64_t dim0 = 0, dim1 = 0;  // transpose
  std::vector<int64_t> shape;  // view, reshape, expand (-1: inferred, or kept by expand)
  std::vector<int64_t> sizes;  // unflatten
  int64_t start_dim = 0, end_dim = -1;  // flatten
  int64_t start = 0, length = 0;        // narrow
  int64_t split_size = 0, chunks = 0;   // split {size}, chunk {chunks} (split {sizes} uses `sizes`)
  bool tanh = false;                 // gelu {approximate: tanh}
  double exponent = 1.0;             // pow
  int64_t diagonal = 0;              // tril, triu
  std::vector<int64_t> normalized_shape;  // layer_norm, rms_norm: the trailing dims normalized
  std::optional<double> eps;         // layer_norm (absent: 1e-5), rms_norm (absent: the dtype's epsilon)
  bool sum_reduction = false;        // cross_entropy, nll_loss {reduction: sum} (mean otherwise)
  bool no_reduction = false;         // cross_entropy, nll_loss {reduction: none}: each row's loss
  double label_smoothing = 0.0;      // cross_entropy {label_smoothing}
  std::optional<int64_t> ignore_index;  // cross_entropy, nll_loss, pick_target, count_targets
  double fill = 0.0;                 // masked_fill, full: `value` (may be +-inf)
  int64_t k = 1;                     // topk: how many
  bool largest = true;               // topk {largest}
  bool descending = false;           // sort, argsort {descending}
  bool float32 = false;              // count_targets: the run's float dtype is float32
  double ord = 2.0;                  // linalg_vector_norm: the norm's order (+-inf allowed)
  std::optional<DType> dtype;        // to: the dtype cast to
  double p = 0.5;                    // dropout: the probability of a zero
  bool training = true;              // dropout {training: false}: the identity
  std::optional<double> clamp_min, clamp_max;  // clamp {min, max} (absent: no bound there)
  int64_t num_classes = 0;           // one_hot
  int64_t minlength = 0;             // bincount
  int64_t repeats = 1;               // repeat_interleave: the copies of each entry
  bool is_causal = false;            // scaled_dot_product_attention: query i attends to keys j <= i
  std::optional<double> attn_scale;  // scaled_dot_product_attention {scale} (absent: 1/sqrt(d))
  bool enable_gqa = false;           // scaled_dot_product_attention: k and v of fewer heads
  // dropout, rand, randn: what their values are drawn from (core/random.h). The stream's name (the
  // op's `stream`, else its result's name) from the op; the run's seed (plus the rank, for local
  // code whose generator is seeded by rank) and a training step's step and microbatch set by the
  // runtime and the oracle. On a rank, `indices` holds per dim the global indices its local holds
  // and `global` the global shape (set by the runtime from the result's layout); empty: the operand
  // is the whole tensor (the oracle; local code, whose generator knows no layout).
  struct Draw {
    std::string stream;
    uint64_t seed = 0;
    int64_t step = -1, microbatch = -1;
    std::vector<std::vector<int64_t>> indices;
    std::vector<int64_t> global;
  } draw;
  // embedding (operand 1, dim 0: vocab rows) and pick_target (operand 0, dim 1: classes) on a
  // rank whose table is sharded there: the part of that dim the rank holds. Ids and targets
  // outside it give zeros (PyTorch's _MaskPartial). Set by the runtime (or a local_map body's
  // `axis`); absent: the whole dim.
  std::optional<Chunk> range;
  // mean: the number of global elements each output element averages. Set by with_global_shape()
  // for the per-rank op, which then computes local_sum / mean_divisor: over a sharded dim the ranks'
  // results add up to the global mean (the rows make that shard P(sum)), even for uneven shards.
  // Absent (the single-device oracle, whose operand is the global tensor): at::mean.
  std::optional<int64_t> mean_divisor;
  // mean under semantics pytorch (core/semantics.h, mean_partial_avg): a shard of a reduced dim
  // gives P(avg) and each rank computes its local mean (its gradient still divides by the global
  // count, as autograd's MeanBackward does with the global sizes).
  bool local_mean = false;
  // View ops on a rank: the local shape of the result (set by the runtime from the output's
  // layout); absent: the global shape the op describes.
  std::optional<std::vector<int64_t>> local_shape;

  // Every field as text, for messages. A new field joins str() and key() both.
  std::string str() const;
  // Every field as bytes: the key of the runtime's cache of sharding decisions, made on every op
  // (str()'s text formatting was a sixth of a small op's time; issue #35 item 2).
  std::string key() const;
};

// `attrs` with what the per-rank local op `op` needs from the global operand shape `global_in`
// (the shape of operand 0): for mean, mean_divisor, the product of the global extents of the
// reduced dims; every other op needs nothing (attrs as given). Call it after propagate() (which
// checks the dims) and pass the result to local_op().
OpAttrs with_global_shape(const std::string& op, const OpAttrs& attrs, const Shape& global_in);

// The op families, in the order their tables are written, each with its ops (alphabetical).
struct RuleFamily {
  std::string name;
  std::vector<std::string> ops;
  size_t arity = 1;  // operands of each op; 0: any number (cat, stack)
};
const std::vector<RuleFamily>& rule_families();

// The rows of an op for operands of the given ranks, in their stated order (earlier rows win ties).
// Throws SemanticError: UnsupportedOp for an op without a family, ShapeMismatch for a dim out of
// range.
std::vector<RuleRow> rule_rows(const std::string& op, const std::vector<int64_t>& ranks,
                               const OpAttrs& attrs);
// The same for operands of the given shapes (broadcasting, views and matmuls depend on them).
std::vector<RuleRow> rule_rows_for(const std::string& op, const std::vector<Shape>& shapes, const OpAttrs& attrs);

// split and chunk along `dim` (0 when absent) of an extent: each piece's (offset, size), as
// torch.split (sizes, or pieces of split_size, the last shorter) and torch.chunk (pieces of
// ceil(extent / chunks), so possibly fewer than chunks; an empty dim gives one empty piece) cut
// them. They run as one narrow per piece. Throws SemanticError(ShapeMismatch) naming the op.
std::vector<Chunk> split_pieces(const std::string& op, const OpAttrs& attrs, int64_t extent);

// The view ops (view, reshape, flatten, unflatten, squeeze, unsqueeze, expand): their per-rank
// result shape is the local layout of the output, which the runtime passes as local_shape.
bool is_view_op(const std::string& op);

// The attributes of a scenario op (its JSON fields), as the rules and kernels take them.
OpAttrs op_attrs(const OpDecl& decl);

// The shape of an op's result; throws SemanticError(ShapeMismatch) naming the op.
Shape infer_shape(const std::string& op, const std::vector<Shape>& in_shapes, const OpAttrs& attrs);

struct ShardingDecision {
  std::vector<Spec> in_specs;  // what every operand must be redistributed to (== given if it fits)
  Spec out_spec;               // before the Rd label is restored
  Shape out_shape;
  std::vector<std::string> rows;  // per mesh axis, "op: row text" of the row chosen
};

// Chooses, per mesh axis, the row that the operands fit as they are; else, for an op of one
// operand, the row taking R (DTensor's pointwise, reduction and softmax strategies replace a
// placement they cannot take by Replicate: a Partial operand of exp is all_reduced, not
// reduce_scattered, and a shard of the softmax dim is all_gathered); else the row reached at the
// lowest communication cost (cost model bytes, then operands changed; ties go to the earlier row).
// Illegal transitions (S -> P, P(a) -> P(b)) are never chosen.
ShardingDecision propagate(const std::string& op, const Mesh& mesh, const std::vector<Spec>& specs,
                           const std::vector<Shape>& shapes, const OpAttrs& attrs);

// A decision's arguments as bytes (no text formatting: it was a sixth of a small op's time): the
// attributes (OpAttrs::key), the op, each operand's spec and shape. The key of the runtime's cache
// of decisions per run and, with the mesh and the planted bug, of the rules' own per thread:
// propagate(), explain_propagation() and backward_rule() are pure functions of their arguments and
// the planted bug, so each result (and the rule coverage it records) is remembered, and a property
// run, whose every case is a new scenario and a new Runtime, decides each distinct op once.
std::string decision_key(const std::string& op, const OpAttrs& attrs, const std::vector<Spec>& specs,
                         const std::vector<Shape>& shapes);
void append_key_word(std::string& key, int64_t v);
void append_key_spec(std::string& key, const Spec& spec);

// Backward: the placement of the gradient contribution an op gives operand `input`, per axis,
// read from the family's table with the gradient in one operand slot (rules/common.h says which),
// given the operands' forward specs (after redistribution), the output spec and the placement of
// the incoming gradient. `grad_in` may be changed to the placement the rule needs (the caller
// redistributes the incoming gradient first); the result is the contribution's placement.
struct BackwardDecision {
  Spec grad_in;   // what the incoming gradient must be
  Spec grad_out;  // the natural placement of the contribution to operand `input`
};
BackwardDecision backward_rule(const std::string& op, const Mesh& mesh,
                               const std::vector<Spec>& in_specs, const Spec& out_spec,
                               const std::vector<Shape>& shapes, const OpAttrs& attrs,
                               const Spec& grad_in, size_t input);

}  // namespace meshsim

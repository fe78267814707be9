// The math of each op on plain tensors: what one rank computes on its locals, and what the
// single-device oracle computes on global tensors.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "core/ops.h"
#include "core/propagation.h"
#include "core/scenario.h"

namespace meshsim {

// The op's kernel (sim/kernels.cpp: a table indexed by the op's id) on `xs`. Throws
// SemanticError(UnsupportedOp) for an op without one (one the runtime handles itself, or none).
at::Tensor local_op(OpId op, const OpAttrs& attrs, const std::vector<at::Tensor>& xs);
// The same by name: one lookup in the op catalog, then the table.
at::Tensor local_op(const std::string& op, const OpAttrs& attrs, const std::vector<at::Tensor>& xs);

// Whether the op has a kernel row. The table is checked against the catalog at its first use (every
// op with `kernel` has a row, no row names another op): std::logic_error naming the op otherwise.
bool has_kernel(OpId op);

// The reduced dims of a reduction (sum, mean, amax, amin) of `x`: a list, one dim, or every dim
// (none given, or an empty list), wrapped into [0, rank).
std::vector<int64_t> reduced_dims(const at::Tensor& x, const OpAttrs& attrs);

// The second operand of a binary op: the tensor, or (its scalar form: one operand) the scalar
// `value` as a 0-d tensor of the first's options.
at::Tensor second_operand(const OpAttrs& attrs, const std::vector<at::Tensor>& xs);
// The normalized (trailing) dims of a norm (layer_norm, rms_norm) of `x`.
std::vector<int64_t> normalized_dims(const at::Tensor& x, const OpAttrs& attrs);
// rms_norm's eps: the attribute, else the dtype's machine epsilon (torch.nn.functional.rms_norm
// with eps=None).
double rms_norm_eps(const at::Tensor& x, const OpAttrs& attrs);
// A vocab- or class-parallel table on a rank: the ids in its range, shifted to local rows (0 for
// the others), and the mask of those in range (the planted bug vocab_lookup_unmasked clamps and
// masks nothing).
std::pair<at::Tensor, at::Tensor> local_ids(const at::Tensor& ids, const Chunk& range);
// pick_target's targets: the mask of those kept (not ignore_index; in the rank's class range,
// when it has one) and the column each picks (0 where not kept).
std::pair<at::Tensor, at::Tensor> picked_targets(const at::Tensor& target, const OpAttrs& attrs);

// split and chunk run as one narrow per piece (core/propagation.h, split_pieces): the narrow's
// attributes of each piece for an operand of `shape`. Throws SemanticError(ShapeMismatch) naming
// the op's JSON path when the pieces are not as many as its `outs`.
std::vector<OpAttrs> split_as_narrows(const OpDecl& decl, const std::vector<int64_t>& shape);
bool is_split_op(const std::string& op);

// The global value a creation op (zeros, ones, full, arange) makes: its `shape`, its `dtype`
// (float: the run's), `value` for full; arange counts start, start + step, ... (0, 1, ... by
// default) in row-major order.
at::Tensor created_value(const OpDecl& op, DType run_dtype);

// The random ops (dropout, rand, randn; docs/semantics.md, "Randomness"). Each element of a block of
// `shape` is drawn at its global row-major index: attrs.draw's indices per dim in its global shape,
// or, where those are empty, the block's own index (the block is the whole tensor), from the stream
// random_stream_key(seed, stream, step, microbatch) (core/random.h).
// rand: uniform in [0, 1); randn: standard normal; of `type`.
at::Tensor drawn_block(const OpAttrs& attrs, const std::vector<int64_t>& shape, bool normal, at::ScalarType type);
// dropout's factor per element: 1 / (1 - p) where kept, 0 where dropped (all 0 for p = 1).
at::Tensor dropout_factor(const OpAttrs& attrs, const std::vector<int64_t>& shape, at::ScalarType type);
// A random op's draw on `rank` for a result of global shape `global` laid out by `spec`: the
// global indices its local holds (core/layout.h, local_indices), and the planted bugs of the class
// (dropout_shard_offset_ignored: the local drawn as if it were the whole tensor;
// dropout_replicas_rank_seeded: the rank's seed is the run's plus its rank).
void place_draw(OpAttrs& attrs, const Mesh& mesh, const Spec& spec, const std::vector<int64_t>& global, int64_t rank);
// rand or randn of `op` (its shape and stream) on every rank of `mesh` laid out by `spec`, with the
// run's `seed`; the locals.
std::vector<at::Tensor> drawn_locals(const OpDecl& op, const Mesh& mesh, const Spec& spec, uint64_t seed, DType dtype);
// The same value whole (the single-device oracle's).
at::Tensor drawn_value(const OpDecl& op, uint64_t seed, DType dtype);

}  // namespace meshsim

// The sharding rules' insides, shared by their files (not a public header; core/propagation.h is).
// Each op family's table and backward function lives in the file of its group:
//   rules/common.cpp        the row text (parse_rows, S()), the row cost, the backward helpers
//   rules/pointwise.cpp     linear_binary, linear_unary, nonlinear_unary, mul, div,
//                           integer_binary, cast, detach, where, masked_fill, triangle
//   rules/matmul.cpp        mm, matmul (bmm, matmul as einsums)
//   rules/views.cpp         transpose, permute, view, expand, narrow
//   rules/joins.cpp         cat, stack (and split_pieces, split and chunk as narrows)
//   rules/reductions.cpp    reduction (sum, mean), amax, amin, softmax, scan (cumsum), item
//   rules/norms_losses.cpp  norm (layer_norm, rms_norm), vector_norm (linalg_vector_norm),
//                           pick_target, count_targets
//   rules/embedding.cpp     embedding
//   rules/counts.cpp        one_hot, bincount
//   rules/indexing.cpp      index (gather, index_select), scatter (scatter, scatter_add, index_add)
//   rules/selection.cpp     select (max, min, sort, topk), select_index (argmax, argmin,
//                           argsort), compare (eq, ne, lt, le, gt, ge, logical_and/not/or)
//   rules/attention.cpp     repeat, repeat_interleave, attention (scaled_dot_product_attention)
//   rules/registry.cpp      the registry: one entry per family, in the order of rule_families()
//   rules/coverage.cpp      propagation_coverage(): every key the tables can give
//   op_attrs.cpp            op_attrs(), OpAttrs::str(), the attributes resolved for an operand
//   shapes.cpp              infer_shape()
//   propagation.cpp         the row text form, rule_families(), rule_rows(), propagate(),
//                           backward_rule()
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/layout.h"
#include "core/mesh.h"
#include "core/placement.h"
#include "core/propagation.h"
#include "core/redistribute.h"

namespace meshsim::rules {

// ---------------------------------------------------------------------------------------------
// Row text form

// The one copy of a rule text, for RuleRow::rule (interned once per text, at parse time).
std::string_view intern_rule(const std::string& text);

// ---------------------------------------------------------------------------------------------
// Attributes (op_attrs.cpp)

std::string list_str(const std::vector<int64_t>& v);

// `attrs` with every dim the op uses wrapped into [0, rank) (rank + 1 for unsqueeze and stack,
// which name a dim of the result); out of range is ShapeMismatch naming the operand (`operand`:
// its shape, or its rank when only that is known). A reduction's dims end up in `dims`
// (dims_given), sorted and distinct, whether one dim or a list was given.
OpAttrs resolved(const std::string& op, const OpAttrs& attrs, int64_t rank, const std::string& operand);

bool reduces(const OpAttrs& resolved_attrs, int64_t d);

// The number of reduced dims before `d` (what a kept dim moves down by without keepdim).
int64_t reduced_before(const OpAttrs& resolved_attrs, int64_t d);

// ---------------------------------------------------------------------------------------------
// The tables, by op family, in the order of rule_families(). Rows are written as text so that they
// print and parse back; within a table, earlier rows win ties. A table is built for the operands'
// shapes and the result's (broadcasting, views and matmuls map dims by shape).

// What a table is built for: the operands' shapes, the result's, and the attributes (resolved).
struct RowCtx {
  const std::vector<Shape>& shapes;
  const Shape& out;
  const OpAttrs& a;
  std::string_view op = {};  // the view tables map squeeze's and unsqueeze's dims by the op
  int64_t rank() const { return static_cast<int64_t>(shapes.at(0).size()); }
};

// A row's text and, when its table writes it by role (S(d)), that form.
struct RowText {
  std::string text, rule;
  RowText(std::string t) : text(std::move(t)) {}  // NOLINT: a fixed row is its own rule
  RowText(const char* t) : text(t) {}             // NOLINT
  RowText(std::string t, std::string r) : text(std::move(t)), rule(std::move(r)) {}
};

// Rows are parsed once per text: every op's forward and every backward step per axis asks for
// its family's table again.
std::vector<RuleRow> parse_rows(const std::vector<RowText>& texts);

std::string S(int64_t d);

std::string joined(const std::vector<std::string>& parts);

// The dim of operand `s` aligned with dim `d` of the broadcast result `out` (PyTorch's trailing
// alignment), or -1 where the operand is broadcast: it lacks the dim, or has size 1 against a
// larger extent.
int64_t aligned(const Shape& s, const Shape& out, int64_t d);

// Every Partial passes through an op that only moves or copies elements (views, permute, cat,
// narrow), as replicas do.
void moved_elements_rows(std::vector<RowText>& t, size_t arity = 1);

// The rows every pointwise op has (pointwise.cpp).
std::vector<RuleRow> pointwise_rows(const RowCtx& c, const std::vector<std::string>& own);

// ---------------------------------------------------------------------------------------------
// Row cost

Placement as_rule_input(const Placement& p);

bool same_for_rule(const Placement& given, const Placement& wanted);

// The step that brings `from` to `to` on one axis as the row cost counts it (all_gather from a
// shard to anything but a shard, all_to_all between shards, reduce_scatter or all_reduce from a
// Partial, local_chunk or partial_from_replicate from a replica, relabel when they are the same for
// the rules) and its bytes per rank (core/cost_model.h) for an operand of `bytes` in full; bytes is
// -1 when the transition is illegal.
struct AxisMove {
  StepKind kind = StepKind::Relabel;
  int64_t bytes = 0;
};
AxisMove axis_move(const Placement& from, const Placement& to, int64_t n, int64_t bytes, bool gradient);

// (bytes moved, operands changed) to bring the operands `given` to a row's operands `want`; bytes
// is -1 when a transition is illegal. A row the operands fit as they are costs (0, 0).
std::pair<int64_t, int64_t> row_cost(const std::vector<Placement>& given, const std::vector<Placement>& want,
                                     int64_t n, const std::vector<int64_t>& bytes, bool gradient);

// ---------------------------------------------------------------------------------------------
// Backward, per family and mesh axis
//
// Every contribution is linear in the incoming gradient g, so each family's backward is a table
// again, with g in one operand slot:
//   linear binary (add, sub):   +-g, laid out as g; summed over the dims the operand is broadcast
//                               over, where a shard of such a dim gives P(sum).
//   linear unary (neg, scale), transpose, permute, views, narrow: the op's own table (a view's
//                               and permute's inverse) applied to g.
//   non-linear unary, softmax:  f'(x) * g and y * (g - sum(g * y, dim)) are pointwise products
//                               with the forward operand: the mul table, x fixed, g the other.
//   mul:                        dA = g * B, dB = A * g: the mul table (for the result's shape and
//                               the other operand's), the other operand fixed; then summed over
//                               the operand's broadcast dims.
//   div:                        dx = g / y: the div table, y fixed; dy = -g * x / y^2: the mul
//                               table, x fixed (y is R or sharded like x in every div row).
//   mm:                         dA = g @ B^T, dB = A^T @ g: the mm table, the other transposed.
//   bmm, matmul:                the einsum g, B -> A (and A, g -> B): a label A lacks (n, and a
//                               batch dim A is broadcast over) is summed, so its shards give P(sum).
//   reduction, amax, amin:      g expanded back to x's shape: a shard of x stays a shard.
//   expand:                     g summed over the expanded dims: a shard of one gives P(sum).
//   cat, stack:                 each operand's slice of g: a shard of another dim stays.

// One mesh axis of a backward step.
struct AxisGrad {
  std::vector<Placement> ins;  // the operands' forward placements (after redistribution)
  Placement out;               // the output's placement (Rd restored)
  Placement g;                 // the incoming gradient's
  size_t input = 0;            // the operand whose contribution is asked for
  int64_t n = 1, bytes = 0, rank = 0;
  OpAttrs attrs;               // dims resolved
  std::vector<Shape> shapes;   // the operands'
  Shape out_shape;
  std::string op;

  Placement operand(size_t i) const { return as_rule_input(ins.at(i)); }
  RowCtx ctx() const { return {shapes, out_shape, attrs, op}; }
};
// A backward step on one axis: what the incoming gradient must be, the contribution's placement,
// and the rule read (the table and its row, "mul S(d), S(d) -> S(d)"; or a branch), for coverage.
struct Grad {
  Placement in, out;
  const char* table = nullptr;  // null for a branch of a family without a table
  std::string_view row;
  std::string suffix = {};      // a step after the row: " then summed over a broadcast dim"

  std::string rule() const {
    return (table ? std::string(table) + " " : std::string()) + std::string(row) + suffix;
  }
};

// Among the rows of `table` whose operand `1 - g_pos` is `fixed` (any row when `fixed` is null),
// the one the incoming gradient reaches most cheaply in slot `g_pos`; ties go to the earlier row.
Grad gradient_row(const char* table, const std::vector<RuleRow>& rows, size_t g_pos, const Placement* fixed,
                  const AxisGrad& x);

Grad own_table(const char* table, const std::vector<RuleRow>& rows, const AxisGrad& x);

// An operand without a gradient (a condition, a mask, ids, targets): never asked for one.
[[noreturn]] void no_gradient(const AxisGrad& x, const char* what);

// ---------------------------------------------------------------------------------------------
// The families' tables and backward functions, by file (the registry names them)

// pointwise.cpp
std::vector<RuleRow> linear_binary_rows(const RowCtx& c);
std::vector<RuleRow> linear_unary_rows(const RowCtx& c);
std::vector<RuleRow> nonlinear_unary_rows(const RowCtx& c);
std::vector<RuleRow> random_rows(const RowCtx& c);
std::vector<RuleRow> mul_rows(const RowCtx& c);
std::vector<RuleRow> div_rows(const RowCtx& c);
std::vector<RuleRow> integer_binary_rows(const RowCtx& c);
std::vector<RuleRow> cast_rows(const RowCtx& c);
std::vector<RuleRow> detach_rows(const RowCtx& c);
std::vector<RuleRow> where_rows(const RowCtx& c);
std::vector<RuleRow> masked_fill_rows(const RowCtx& c);
std::vector<RuleRow> triangle_rows(const RowCtx& c);
Grad add_gradient(const AxisGrad& x);
Grad linear_unary_gradient(const AxisGrad& x);
Grad times_operand(const AxisGrad& x);  // non-linear unary, softmax: g times the operand
Grad mul_gradient(const AxisGrad& x);
Grad div_gradient(const AxisGrad& x);
Grad integer_gradient(const AxisGrad& x);
Grad cast_gradient(const AxisGrad& x);
Grad where_gradient(const AxisGrad& x);
Grad masked_fill_gradient(const AxisGrad& x);
Grad triangle_gradient(const AxisGrad& x);
Grad no_gradient_result(const AxisGrad& x);  // detach, item: never asked (their results need no gradient)

// matmul.cpp
std::vector<RuleRow> mm_rows();
std::vector<RuleRow> mm_rows(const RowCtx&);
std::vector<RuleRow> matmul_rows(const RowCtx& c);
Grad mm_gradient(const AxisGrad& x);
Grad matmul_gradient(const AxisGrad& x);

// views.cpp
std::vector<RuleRow> transpose_rows(const RowCtx& c);
std::vector<RuleRow> permute_rows(const RowCtx& c);
std::vector<RuleRow> view_rows(const RowCtx& c);
std::vector<RuleRow> expand_rows(const RowCtx& c);
std::vector<RuleRow> narrow_rows(const RowCtx& c);
Grad transpose_gradient(const AxisGrad& x);
Grad permute_gradient(const AxisGrad& x);
Grad view_gradient(const AxisGrad& x);
Grad expand_gradient(const AxisGrad& x);
Grad narrow_gradient(const AxisGrad& x);

// The input dims of `in_shape` whose view group (view_groups) holds different elements on some
// rank under `in_spec` and `out_spec`: a kept shard of a group's leading dim is the same elements
// on both sides only where the chunks line up (always for even shards; for uneven ones, where the
// inner extent times the chunk boundaries agree).
std::set<int64_t> view_layout_mismatches(const Mesh& mesh, const Spec& in_spec, const Spec& out_spec,
                                         const Shape& in_shape, const Shape& out_shape, std::string_view op,
                                         const OpAttrs& attrs);

// joins.cpp
std::vector<RuleRow> cat_rows(const RowCtx& c);
std::vector<RuleRow> stack_rows(const RowCtx& c);
Grad cat_gradient(const AxisGrad& x);
Grad stack_gradient(const AxisGrad& x);

// reductions.cpp
std::vector<RuleRow> reduction_rows(const RowCtx& c);
std::vector<RuleRow> amax_rows(const RowCtx& c);
std::vector<RuleRow> amin_rows(const RowCtx& c);
std::vector<RuleRow> softmax_rows(const RowCtx& c);
std::vector<RuleRow> scan_rows(const RowCtx& c);
std::vector<RuleRow> item_rows(const RowCtx& c);
Grad reduction_gradient(const AxisGrad& x);
Grad scan_gradient(const AxisGrad& x);

// norms_losses.cpp
std::vector<RuleRow> norm_rows(const RowCtx& c);
std::vector<RuleRow> vector_norm_rows(const RowCtx& c);
Grad vector_norm_gradient(const AxisGrad& x);
std::vector<RuleRow> pick_target_rows(const RowCtx&);
std::vector<RuleRow> count_targets_rows(const RowCtx& c);
Grad norm_gradient(const AxisGrad& x);
Grad pick_target_gradient(const AxisGrad& x);
Grad count_targets_gradient(const AxisGrad& x);

// embedding.cpp
std::vector<RuleRow> embedding_rows(const RowCtx& c);
Grad embedding_gradient(const AxisGrad& x);

// indexing.cpp
std::vector<RuleRow> index_rows(const RowCtx& c);
Grad index_gradient(const AxisGrad& x);
std::vector<RuleRow> scatter_rows(const RowCtx& c);
Grad scatter_gradient(const AxisGrad& x);

// attention.cpp
std::vector<RuleRow> repeat_rows(const RowCtx& c);
std::vector<RuleRow> repeat_interleave_rows(const RowCtx& c);
std::vector<RuleRow> attention_rows(const RowCtx& c);
Grad repeat_gradient(const AxisGrad& x);
Grad repeat_interleave_gradient(const AxisGrad& x);
Grad attention_gradient(const AxisGrad& x);

// The mesh axes of a decision whose kept shard does not line up with the operand's chunks: for
// repeat_interleave, a shard of its dim where a rank's chunk repeated is not its chunk of the
// result; for attention with grouped-query heads, a shard of the heads where a rank's q heads are
// not the groups of its k and v heads. Empty for every other family; propagate() replaces such an
// axis's row by the family's all-R row (the operands gathered there first).
std::vector<int> layout_misaligned_axes(const std::string& family, const Mesh& mesh, const std::vector<Spec>& in_specs,
                                        const Spec& out_spec, const std::vector<Shape>& shapes, const Shape& out_shape,
                                        const OpAttrs& a);

// counts.cpp
std::vector<RuleRow> one_hot_rows(const RowCtx& c);
std::vector<RuleRow> bincount_rows(const RowCtx& c);
Grad counts_gradient(const AxisGrad& x);

// selection.cpp
std::vector<RuleRow> select_rows(const RowCtx& c);
std::vector<RuleRow> compare_rows(const RowCtx& c);
Grad select_gradient(const AxisGrad& x);
Grad select_index_gradient(const AxisGrad& x);
Grad compare_gradient(const AxisGrad& x);

// ---------------------------------------------------------------------------------------------
// The registry (registry.cpp): one entry per family, in the order of rule_families().

struct Family {
  RuleFamily names;
  size_t arity;  // 0: any number
  std::vector<RuleRow> (*rows)(const RowCtx&);
  Grad (*backward)(const AxisGrad&);
};

const std::vector<Family>& registry();

// The family of an op; throws SemanticError(UnsupportedOp) for an op without one.
const Family& family_of(const std::string& op);

}  // namespace meshsim::rules

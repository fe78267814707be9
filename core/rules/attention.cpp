// Attention and its friends: repeat (Tensor.repeat), repeat_interleave, attention
// (scaled_dot_product_attention). The layout check of the kept shards that line up only for some
// extents (repeat_interleave's dim, grouped-query heads) is layout_misaligned_axes().
#include <string>
#include <vector>

#include "core/layout.h"
#include "core/mutants.h"
#include "core/rules/common.h"

namespace meshsim::rules {

// repeat {sizes}: Tensor.repeat tiles x sizes[i] times along dim i; leading sizes add new dims
// (their copies replicated). PyTorch's dim_repeat (torch/distributed/tensor/_ops/_view_ops.py)
// maps a dim repeated once to itself, so its shard stays (moved by the new dims), and a dim
// repeated more often to Repeat, which no shard passes: the dim is gathered first (a rank's tile
// of its chunk is not a chunk of the tiles). Only copies of elements, so every Partial passes.
std::vector<RuleRow> repeat_rows(const RowCtx& c) {
  std::vector<RowText> t;
  const auto pad = static_cast<int64_t>(c.a.sizes.size()) - c.rank();
  for (int64_t d = 0; d < c.rank(); ++d)
    if (pad >= 0 && c.a.sizes[static_cast<size_t>(d + pad)] == 1)
      t.emplace_back(S(d) + " -> " + S(d + pad), pad == 0 ? "S(d) -> S(d), a dim repeated once"
                                                          : "S(d) -> S(d + new dims), a dim repeated once");
  moved_elements_rows(t);
  return parse_rows(t);
}

// repeat_interleave {repeats, dim}: entry i of `dim` becomes entries [i * repeats, (i + 1) *
// repeats). Another dim's shard stays. A shard of `dim` stays too where each rank's chunk of the
// result is its own entries' copies: chunk c of n entries over k ranks (torch.chunk) repeated is
// chunk c of n * repeats only where the chunk sizes scale (ceil(n / k) * repeats == ceil(n *
// repeats / k), e.g. k divides n); elsewhere propagate() gathers the dim first
// (layout_misaligned_axes). PyTorch has no strategy of its own: aten.repeat_interleave.self_int
// decomposes into unsqueeze, expand and flatten (aten/src/ATen/native/Repeat.cpp), whose view rules
// keep the shard of the flattened group's leading dim (an uneven one is refused). Copies of elements, so
// every Partial passes.
std::vector<RuleRow> repeat_interleave_rows(const RowCtx& c) {
  std::vector<RowText> t;
  for (int64_t d = 0; d < c.rank(); ++d)
    t.emplace_back(S(d) + " -> " + S(d), d == *c.a.dim ? "S(dim) -> S(dim), each entry's copies on its rank"
                                                      : "S(d) -> S(d), another dim than the repeated one");
  moved_elements_rows(t);
  return parse_rows(t);
}

namespace {

// The placement of the mask operand in a row that shards the scores' dim `d` ([b, h, sq, sk]):
// the mask's aligned dim, or R where it broadcasts there.
std::string mask_placement(const RowCtx& c, int64_t d) {
  const Shape &q = c.shapes.at(0), &k = c.shapes.at(1);
  const Shape scores = {q.at(0), q.at(1), q.at(2), k.at(2)};
  const int64_t m = aligned(c.shapes.at(3), scores, d);
  return m >= 0 ? S(m) : "R";
}

}  // namespace

// scaled_dot_product_attention (q, k, v, attn_mask?): PyTorch's strategies for the flash and the
// efficient kernels (torch/distributed/tensor/_ops/_matrix_ops.py,
// _scaled_dot_product_flash_attention_base_strategies and _efficient_): all replicated; q, k and v
// sharded alike on the heads (S(1), tensor parallelism) or on the batch (S(0)), the mask (its
// attn_bias) sharded as they are where it has the dim, else replicated. A shard of a sequence or a
// head dim (q's sq, k's and v's sk, d) is gathered first: each query needs every key. PyTorch's
// sequence rows (q, k, v all S(2)) are installed only inside context_parallel()
// (torch/distributed/tensor/experimental/_context_parallel/_sharding_rules.py: "Shard(2) is not a
// valid sharding for SDPA without CP enabled"), whose ring attention exchanges the k and v blocks;
// meshsim has no ring attention and no such row. Not linear in q or k: a Partial is reduced first.
// With enable_gqa, a shard of the heads stays only where each rank's q heads are the groups of its
// k and v heads (layout_misaligned_axes).
// Planted bug (sdpa_sequence_shard_local): the context-parallel row without the ring, q, k, v
// S(2) -> S(2), each rank attending only to its own block of keys (its causal mask from local
// positions).
std::vector<RuleRow> attention_rows(const RowCtx& c) {
  const bool mask = c.shapes.size() > 3;
  auto row = [&](const std::string& p, int64_t d) {
    return p + ", " + p + ", " + p + (mask ? ", " + (d < 0 ? std::string("R") : mask_placement(c, d)) : "") + " -> " + p;
  };
  std::vector<RowText> t;
  t.emplace_back(row("S(0)", 0), "q, k, v S(0) -> S(0), the batch");
  t.emplace_back(row("S(1)", 1), "q, k, v S(1) -> S(1), the heads");
  t.emplace_back(row("R", -1), "q, k, v R -> R");
  if (mutant_on(Mutant::SdpaSequenceShardLocal) && !mask)
    t.emplace_back(row("S(2)", 2), "q, k, v S(2) -> S(2), the sequence (planted bug)");
  return parse_rows(t);
}

// ---------------------------------------------------------------------------------------------
// The layout check

std::vector<int> layout_misaligned_axes(const std::string& family, const Mesh& mesh, const std::vector<Spec>& in_specs,
                                        const Spec& out_spec, const std::vector<Shape>& shapes, const Shape& out_shape,
                                        const OpAttrs& a) {
  int64_t dim = -1;  // the operand dim whose shards must line up
  bool bad = false;
  if (family == "repeat_interleave") {
    dim = *a.dim;
    for (int64_t r = 0; r < mesh.size() && !bad; ++r) {
      const LocalLayout li = local_layout(mesh, in_specs[0], shapes[0], r), lo = local_layout(mesh, out_spec, out_shape, r);
      bad = li.offset[dim] * a.repeats != lo.offset[dim] || li.shape[dim] * a.repeats != lo.shape[dim];
    }
  } else if (family == "attention" && shapes.at(1).at(1) != shapes.at(0).at(1) && shapes[1][1] > 0) {
    dim = 1;  // the heads: q's h = g * hk
    const int64_t g = shapes[0][1] / shapes[1][1];
    for (int64_t r = 0; r < mesh.size() && !bad; ++r) {
      const LocalLayout lq = local_layout(mesh, in_specs[0], shapes[0], r), lk = local_layout(mesh, in_specs[1], shapes[1], r);
      bad = lq.offset[1] != lk.offset[1] * g || lq.shape[1] != lk.shape[1] * g;
    }
  }
  std::vector<int> axes;
  for (int ax = 0; bad && ax < mesh.ndim(); ++ax)
    if (in_specs[0][ax].is_shard() && in_specs[0][ax].dim == dim) axes.push_back(ax);
  return axes;
}

// ---------------------------------------------------------------------------------------------
// Backward

// repeat: g summed over the copies. Its table read from the result back to the operand: a dim
// repeated once keeps its shard (moved back by the new dims), the Partials pass.
Grad repeat_gradient(const AxisGrad& x) {
  std::vector<RowText> t;
  const auto pad = static_cast<int64_t>(x.attrs.sizes.size()) - x.rank;
  for (int64_t d = 0; d < x.rank; ++d)
    if (pad >= 0 && x.attrs.sizes[static_cast<size_t>(d + pad)] == 1)
      t.emplace_back(S(d + pad) + " -> " + S(d), "S(d) -> S(d), a dim repeated once");
  moved_elements_rows(t);
  return own_table("repeat back", parse_rows(t), x);
}

// repeat_interleave: g summed over each entry's copies, a shard kept as the forward kept it.
Grad repeat_interleave_gradient(const AxisGrad& x) {
  return own_table("repeat_interleave back", repeat_interleave_rows(x.ctx()), x);
}

// scaled_dot_product_attention: dq, dk and dv are computed where the forward was (the kernel's VJP
// on each rank), linear in g: a shard of the batch or the heads gives each operand's gradient
// sharded alike; replicated operands take g replicated, or P(sum), which passes (a sum of the
// ranks' VJPs of their parts of g). The mask has no gradient.
Grad attention_gradient(const AxisGrad& x) {
  if (x.input == 3) no_gradient(x, "the attn_mask");
  const Placement out = as_rule_input(x.out);
  if (out.is_shard()) return {out, x.operand(x.input), nullptr, "q, k, v S(d): g laid out as the output, S(d)"};
  if (x.g.is_partial() && x.g.op == ReduceOp::Sum)
    return {x.g, x.g, nullptr, "q, k, v replicated: g P(sum), P(sum)"};
  return {Placement::replicate(), Placement::replicate(), nullptr, "q, k, v replicated: g replicated, R"};
}

}  // namespace meshsim::rules

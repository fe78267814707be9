// The pointwise families: linear_binary, linear_unary, nonlinear_unary, random, mul, div, integer_binary,
// cast, detach, where, masked_fill, triangle.
#include <string>
#include <vector>

#include "core/mutants.h"
#include "core/rules/common.h"

namespace meshsim::rules {

// The rows every pointwise op has: a shard of a result dim passes through when every operand that
// has the dim is sharded on it alike, an operand broadcast over it being replicated (PyTorch's
// pointwise strategy); replicas stay replicas; then the family's own rows (`own`, one per
// Partial pattern; any number of operands alike).
std::vector<RuleRow> pointwise_rows(const RowCtx& c, const std::vector<std::string>& own) {
  std::vector<RowText> t;
  const auto n = c.shapes.size();
  for (int64_t d = 0; d < static_cast<int64_t>(c.out.size()); ++d) {
    std::vector<std::string> ins, roles;
    for (const auto& s : c.shapes) {
      const int64_t k = aligned(s, c.out, d);
      ins.push_back(k < 0 ? "R" : S(k));
      roles.push_back(k < 0 ? "R" : "S(d)");
    }
    t.emplace_back(joined(ins) + " -> " + S(d), joined(roles) + " -> S(d)");
  }
  t.emplace_back(joined(std::vector<std::string>(n, "R")) + " -> R");
  t.insert(t.end(), own.begin(), own.end());
  return parse_rows(t);
}

// Pointwise linear binary ops (add, sub): Partial sum and avg are linear. A Replicate operand
// meets a Partial one by becoming Partial (divide or rank0).
std::vector<RuleRow> linear_binary_rows(const RowCtx& c) {
  return pointwise_rows(c, {"P(sum), P(sum) -> P(sum)", "P(avg), P(avg) -> P(avg)"});
}

// Pointwise linear unary ops (neg, scale): every placement but P(max) and P(min) (which neg and a
// negative scale would swap) passes through.
std::vector<RuleRow> linear_unary_rows(const RowCtx& c) {
  return pointwise_rows(c, {"P(sum) -> P(sum)", "P(avg) -> P(avg)"});
}

// Pointwise non-linear unary ops (exp, relu, sin, tanh): shards and replicas only; a Partial
// operand is replicated first (an all_reduce).
std::vector<RuleRow> nonlinear_unary_rows(const RowCtx& c) { return pointwise_rows(c, {}); }

// dropout: elementwise on its operand's layout, as PyTorch's random_op_strategy
// (_ops/_random_ops.py) keeps the operand's spec for native_dropout: a shard stays a shard (its
// mask the global mask's piece), replicas stay replicas (every replica the same mask). PyTorch
// raises for a Partial operand ("with Partial is not supported yet"); here the planner reduces it
// first (an all_reduce), as for a non-linear op: docs/semantics.md, "Randomness".
std::vector<RuleRow> random_rows(const RowCtx& c) { return pointwise_rows(c, {}); }

// to (a cast): every placement passes through, a Partial of any kind included, as PyTorch's
// strategy for aten._to_copy (propagate_single_input_strategy in _ops/_tensor_ops.py) keeps the
// operand's spec. The ranks' casts reduce to the cast of the reduction up to rounding (exactly for
// P(max), P(min): rounding is monotone).
std::vector<RuleRow> cast_rows(const RowCtx& c) {
  return pointwise_rows(c, {"P(sum) -> P(sum)", "P(avg) -> P(avg)", "P(max) -> P(max)", "P(min) -> P(min)"});
}

// detach: the operand's locals as they are, without gradient; every placement passes, a Partial of
// any kind included, as PyTorch's DTensor keeps the operand's spec for aten.detach (its
// default_strategy, _ops/_tensor_ops.py).
std::vector<RuleRow> detach_rows(const RowCtx& c) {
  return pointwise_rows(c, {"P(sum) -> P(sum)", "P(avg) -> P(avg)", "P(max) -> P(max)", "P(min) -> P(min)"});
}

// Pointwise multiply: a Partial operand is linear only against a Replicate one.
std::vector<RuleRow> mul_rows(const RowCtx& c) {
  return pointwise_rows(c, {"P(sum), R -> P(sum)", "R, P(sum) -> P(sum)", "P(avg), R -> P(avg)", "R, P(avg) -> P(avg)"});
}

// Pointwise divide x / y: linear in the numerator only, so Partial only there.
std::vector<RuleRow> div_rows(const RowCtx& c) { return pointwise_rows(c, {"P(sum), R -> P(sum)", "P(avg), R -> P(avg)"}); }

// floor_divide and remainder of int64 data: pointwise, linear in neither operand (the ranks'
// quotients of a sum are not the quotient of the sum), so shards and replicas only (int64 data is
// never Partial). PyTorch lists both among its pointwise ops (_pointwise_ops.py), whose strategy
// keeps a Partial only for the linear ones.
std::vector<RuleRow> integer_binary_rows(const RowCtx& c) { return pointwise_rows(c, {}); }

// where(cond, x, y): pointwise over three operands (broadcast); linear in x and y together, so
// Partial x and y of one kind stay Partial against a replicated condition.
std::vector<RuleRow> where_rows(const RowCtx& c) {
  return pointwise_rows(c, {"R, P(sum), P(sum) -> P(sum)", "R, P(avg), P(avg) -> P(avg)"});
}

// masked_fill(x, mask) {value}: pointwise, the mask broadcast to x; not linear (n ranks' fills add
// up to n times the value), so a Partial x is reduced first.
std::vector<RuleRow> masked_fill_rows(const RowCtx& c) { return pointwise_rows(c, {}); }

// tril / triu {diagonal}: which elements are kept depends on their global row and column, so the
// last two dims are whole on every rank (a shard there is gathered first); a leading (batch) dim
// keeps its shard; linear, so Partial passes through.
std::vector<RuleRow> triangle_rows(const RowCtx& c) {
  std::vector<RowText> t;
  for (int64_t d = 0; d + 2 < c.rank(); ++d) t.emplace_back(S(d) + " -> " + S(d), "S(d) -> S(d), d a batch dim");
  t.emplace_back("R -> R");
  t.emplace_back("P(sum) -> P(sum)");
  t.emplace_back("P(avg) -> P(avg)");
  return parse_rows(t);
}

// ---------------------------------------------------------------------------------------------
// Backward

namespace {

// A result-shaped contribution summed to the shape of operand `input` (broadcast dims summed):
// a shard of a dim the operand is broadcast over becomes P(sum).
Grad summed_to_operand(Grad g, const AxisGrad& x) {
  if (!g.out.is_shard()) return g;
  const int64_t k = aligned(x.shapes.at(x.input), x.out_shape, g.out.dim);
  if (k >= 0) {
    g.out = Placement::shard(k);
  } else {
    // Planted bug: the ranks' partial sums are taken for the whole (no all_reduce follows).
    g.out = mutant_on(Mutant::BroadcastGradNotSummed) ? Placement::replicate() : Placement::partial(ReduceOp::Sum);
    g.suffix = " then summed over a broadcast dim";
  }
  return g;
}

// The product of g (the result's shape) and the other operand (its own shape) in a binary
// pointwise table, g in the slot of `input`, then summed to the operand's shape.
Grad product_gradient(const char* table, std::vector<RuleRow> (*rows)(const RowCtx&), size_t g_pos,
                      const AxisGrad& x) {
  std::vector<Shape> shapes = x.shapes;
  shapes.at(g_pos) = x.out_shape;
  const Placement other = x.operand(1 - g_pos);
  return summed_to_operand(gradient_row(table, rows({shapes, x.out_shape, x.attrs}), g_pos, &other, x), x);
}

}  // namespace

Grad add_gradient(const AxisGrad& x) {
  return summed_to_operand({x.g, x.g, nullptr, "+-g, laid out as g"}, x);
}

Grad linear_unary_gradient(const AxisGrad& x) { return own_table("linear_unary", linear_unary_rows(x.ctx()), x); }

// to: the incoming gradient cast back to the operand's dtype, laid out as it came.
Grad cast_gradient(const AxisGrad& x) { return {x.g, x.g, nullptr, "g cast to x's dtype, laid out as g"}; }

Grad times_operand(const AxisGrad& x) {
  const Placement fixed = x.operand(0);
  const std::vector<Shape> shapes{x.shapes.at(0), x.shapes.at(0)};
  return gradient_row("mul", mul_rows({shapes, x.shapes.at(0), x.attrs}), 1, &fixed, x);
}

Grad mul_gradient(const AxisGrad& x) { return product_gradient("mul", mul_rows, x.input, x); }

Grad div_gradient(const AxisGrad& x) {
  return x.input == 0 ? product_gradient("div", div_rows, 0, x) : product_gradient("mul", mul_rows, 1, x);
}

// where: the incoming gradient where the condition picks the operand, zeros elsewhere (linear in
// g, laid out as g), then summed over the operand's broadcast dims.
Grad integer_gradient(const AxisGrad& x) { no_gradient(x, "an int64 result"); }

Grad where_gradient(const AxisGrad& x) {
  if (x.input == 0) no_gradient(x, "the condition");
  return summed_to_operand({x.g, x.g, nullptr, "g where picked, laid out as g"}, x);
}

Grad masked_fill_gradient(const AxisGrad& x) {
  if (x.input == 1) no_gradient(x, "the mask");
  return {x.g, x.g, nullptr, "g zeroed where filled, laid out as g"};
}

Grad triangle_gradient(const AxisGrad& x) { return own_table("triangle", triangle_rows(x.ctx()), x); }

Grad no_gradient_result(const AxisGrad& x) { no_gradient(x, "a result without gradient (detach, item)"); }

}  // namespace meshsim::rules

// Sharding propagation for DTensor ops (SEMANTICS.md section 4), as data: every op family has a
// table of per-axis rows written in a text form that prints and parses back, e.g.
// "S(1), S(0) -> P(sum)". An op's inputs are redistributed to the cheapest row of each axis when
// no row matches as they are. Reduced (Rd) is read as R by the rows; the Rd label of an output is
// restored by the policy in reduced_policy.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
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

  std::string str() const;  // "S(0), R -> S(0)"
  static RuleRow parse(const std::string& text);  // throws std::invalid_argument
};

// Op attributes the rules need (from the scenario's op object).
struct OpAttrs {
  std::optional<int64_t> dim;  // sum, mean
  bool keepdim = false;        // sum, mean
};

// The rows of an op for operands of the given ranks, in their stated order (earlier rows win ties).
std::vector<RuleRow> rule_rows(const std::string& op, const std::vector<int64_t>& ranks,
                               const OpAttrs& attrs);

// The shape of an op's result; throws SemanticError(ShapeMismatch) naming the op.
Shape infer_shape(const std::string& op, const std::vector<Shape>& in_shapes, const OpAttrs& attrs);

struct ShardingDecision {
  std::vector<Spec> in_specs;  // what every operand must be redistributed to (== given if it fits)
  Spec out_spec;               // before the Rd label is restored
  Shape out_shape;
  std::vector<std::string> rows;  // per mesh axis, "op: row text" of the row chosen
};

// Chooses, per mesh axis, the row that the operands fit as they are, else the row reached at the
// lowest communication cost (cost model bytes; ties go to the earlier row). Illegal transitions
// (S -> P, P(a) -> P(b)) are never chosen.
ShardingDecision propagate(const std::string& op, const Mesh& mesh, const std::vector<Spec>& specs,
                           const std::vector<Shape>& shapes, const OpAttrs& attrs);

// Backward: the placement of the gradient contribution an op gives operand `input`, per axis,
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

// Why propagation chose what it chose: for one op, per mesh axis, every row of the op's table with
// what it would cost to bring the operands there and why it won or lost (`meshsim explain`,
// docs/semantics.md "How a rule row is chosen"). core/propagation.cpp implements it with the code
// propagate() runs: both go through one chooser, so the explanation's decision is propagate()'s.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/layout.h"
#include "core/mesh.h"
#include "core/placement.h"
#include "core/propagation.h"

namespace meshsim {

// One row of the op's table on one mesh axis, as a candidate for the operands given there.
struct RowCandidate {
  std::string row;              // "S(1), S(0) -> P(sum)" (RuleRow::str())
  std::string rule;             // the row as its table writes it, by role: "S(d), S(d) -> S(d)"
  std::vector<Placement> ins;   // the row's operand placements
  Placement out;                // the row's result
  // The cost of bringing the operands to `ins` on this axis, as row_cost counts it: bytes per rank
  // by the cost model (core/cost_model.h) on each operand's full tensor at 8 bytes an element, and
  // the number of operands that change. bytes is -1 when a transition is illegal (legal false).
  int64_t bytes = 0;
  int64_t changed = 0;
  bool legal = true;
  bool chosen = false;
  // Each operand that would move, in words: "operand 1 S(1) -> R: all_gather, 256 B"; or, for an
  // illegal one, "operand 0 S(0) -> P(sum): illegal (...)". Empty: the operands fit as they are.
  std::vector<std::string> moves;
  // Why it won or lost: "fits the operands as they are", "costs more (512 B vs 256 B)",
  // "gives P(max), which has no cotangent", "illegal: operand 0 S(0) -> P(sum)", "tie at equal
  // cost, an earlier row won", "the view's layout does not line up: replaced by R", ...
  std::string verdict;
};

// How the row of an axis was chosen (propagation.h states the order).
inline constexpr const char* kHowExactFit = "exact fit";
inline constexpr const char* kHowOneOperand = "one operand: replicate";
inline constexpr const char* kHowReplicateFirst = "norm: replicate first";
inline constexpr const char* kHowCheapest = "cheapest";
inline constexpr const char* kHowViewFixUp = "view fix-up";
inline constexpr const char* kHowLayoutFixUp = "layout fix-up";  // repeat_interleave, grouped-query attention
inline constexpr const char* kHowNoneLegal = "no legal row";

struct AxisExplanation {
  int axis = 0;
  std::string axis_name;
  int64_t axis_size = 1;
  std::vector<Placement> given;  // the operands' placements on this axis, as given
  std::string how;               // one of the kHow* texts
  int chosen = -1;               // index into candidates of the row chosen (-1: none legal)
  std::vector<RowCandidate> candidates;  // every row of the table, in its stated order
};

struct PropagationExplanation {
  std::string op;
  std::vector<AxisExplanation> axes;
  // propagate()'s decision for the same arguments (its rows included). Incomplete when `error` is
  // set: then propagate() throws SemanticError(IllegalRedistribute) with `error` as its message,
  // and the axes are explained up to the one without a legal row.
  ShardingDecision decision;
  std::string error;
};

// The explanation of propagate(op, mesh, specs, shapes, attrs): the same decision, with every
// candidate row per axis. Throws what propagate() throws (UnsupportedOp, ShapeMismatch) except
// for an axis without a legal row, which it reports in `error`. Records no rule coverage.
PropagationExplanation explain_propagation(const std::string& op, const Mesh& mesh, const std::vector<Spec>& specs,
                                           const std::vector<Shape>& shapes, const OpAttrs& attrs);

// One operand's move on one axis in words, as the explanation writes it: "S(1) -> R: all_gather,
// 256 B", "R -> S(0): local_chunk, no communication", "S(0) -> P(sum): illegal (...)"; `full_bytes`
// is the operand's full tensor in bytes.
std::string describe_move(const Placement& from, const Placement& to, int64_t axis_size, int64_t full_bytes);

}  // namespace meshsim

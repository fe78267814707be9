// The op catalog: one declaration per op, read by every layer. An op's name, operands and their
// types, attributes with their types and defaults, results, rule family, exactness on integer data,
// where a scenario may use it, how the property generators draw it, and a one-line description for
// the docs. The scenario reader checks ops against it, the propagation registry takes each op's
// family from it, sim's kernels and the properties' definitions are tables indexed by its ids,
// the generators draw ops by class from it, and `meshsim ops` prints it (docs/scenario-format.md's
// op table is generated from that). Adding an op: a row in ops.cpp, a kernel row in sim (and a
// definition row in properties), and a rule family if it has none yet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshsim {

// An op's compact id: its index in op_catalog(). Fixed by the build (the catalog's order).
using OpId = uint16_t;

// How an attribute is spelled in a scenario. NumberOrInf: a number or one of the strings "inf" and
// "-inf" (JSON has no infinity).
enum class AttrType { Int, Ints, IntOrInts, Number, NumberOrInf, Bool, Spec, Axis, String, Any };
const char* attr_type_name(AttrType t);  // "int", "int[]", "int|int[]", "number", ...

struct AttrSchema {
  const char* key;
  AttrType type;
  bool required = false;
  const char* default_value = nullptr;  // as the docs print it; null: no default (absent means absent)
  std::vector<const char*> choices = {};  // a String attribute's spellings; empty: any
};

// An operand's element type. Float: the run's float dtype (it may require grad).
// Number: float or int64 (integer arithmetic), never bool; the operands of a Number op are of one type.
enum class OperandType { Float, Int64, Bool, Any, Number };
const char* operand_type_name(OperandType t);  // "float", "int64", "bool", "any", "number"

struct OperandSchema {
  const char* name;
  OperandType type = OperandType::Float;
  bool optional = false;  // may be left off (linear's bias); only the last ones
  bool repeated = false;  // the last operand may repeat (cat, stack, local_map, call)
};

// Where a scenario may use an op (bits).
enum Scope : unsigned {
  kProgram = 1,    // a DTensor program, and its local code (between to_local and from_local)
  kBody = 2,       // a local_map body (its values are LTensors)
  kReference = 4,  // a local_map's reference (global tensors, for the oracle)
  kInternal = 8,   // not in scenarios: an op the runtime decomposes others into
};

// How the property generators (properties/) draw an op. An op of a drawn class is drawn by the
// generators of that class without naming it there.
enum class GenClass {
  None,          // drawn by a generator of its own (named there) or not at all
  Unary,         // pointwise, one float operand, no attributes required: exp, tanh, relu, sin, ...
  UnaryLayer,    // pointwise, the transformer layers' ones: abs, gelu, log, pow, rsqrt, sigmoid, ...
  Binary,        // pointwise, two float operands of one shape, linear in neither: add, sub, mul
  Reduction,     // sum, mean over dims
  Extremum,      // amax, amin over dims
  Triangle,      // tril, triu {diagonal}
  Norm,          // layer_norm, rms_norm
  Loss,          // cross_entropy, nll_loss
  Creation,      // zeros, ones, full, arange
  Split,         // split, chunk
  Compare,       // eq, ne, lt, le, gt, ge: two operands of one type (or a scalar value), a bool result
  Select,        // max, min, sort, topk along a dim: values, the gradient to the picked positions
  SelectIndex,   // argmax, argmin, argsort along a dim: int64 indices, no gradient
  Reshape,       // view, reshape to a drawn shape
  VectorNorm,    // linalg_vector_norm {ord, dim, keepdim}: a reduction, not linear
  RandomCreation,  // rand, randn: creation ops whose values are drawn (the programs' creation case draws
                   // Creation alone: their values are not small integers)
};
const char* gen_class_name(GenClass c);

// The range of a value for the generators: |y| <= bound, and y >= floor where floor > 0 (a
// positive value: a divisor, the operand of log or sqrt).
struct ValueRange {
  double bound = 0;
  double floor = 0;
};

// What the generators need to know of a pointwise op to keep generated data finite and exact
// enough (properties/program_parts.h): how large an operand may be, whether it must be positive,
// whether the op has a kink (where a value rounded otherwise on the mesh changes the gradient),
// and the range of its result from its operand's (attributes: the op's, drawn).
struct ValueRules {
  double operand_limit = 0;       // 0: the generators' general limit
  bool needs_positive = false;    // log, sqrt, rsqrt, pow: drawn on a positive operand
  bool kink = false;              // relu, abs
  ValueRange (*range)(ValueRange x, const nlohmann::json& attrs) = nullptr;  // null: not drawn by class
  // Attributes the generators draw for it: each key with the values to draw from (JSON).
  std::vector<std::pair<const char*, const char*>> draws = {};
};

struct OpSchema {
  OpId id = 0;
  const char* name;
  std::vector<OperandSchema> operands;
  std::vector<AttrSchema> attrs;
  // 1, or 0: as many as the op's `outs` names (split, chunk) or its returns (local_map).
  int results = 1;
  // The propagation rule family (core/rules/registry.cpp) that places its result; empty for ops
  // the runtime handles itself (redistribute, local_map, collectives, creation, local code's ends,
  // split and chunk as narrows, and ops it decomposes: linear, cross_entropy, nll_loss).
  const char* family = "";
  // Integer operands give integer results (sums, products and moves of data), so that the mesh and
  // the oracle agree bit for bit whatever the order of the sums and the comparison allows no
  // difference at all. Claimed only where it was shown (the oracle's list before the catalog): the
  // masks, lookups, creation and split ops move data exactly too, but are not claimed yet.
  bool exact = false;
  // A per-rank kernel in sim (a row of sim/kernels.cpp) and a definition in properties.
  bool kernel = true;
  unsigned scopes = kProgram | kBody | kReference;
  // An op of local code (LTensor level): the collectives and `call`, not DTensor ops (known_ops()).
  bool local_code = false;
  GenClass gen = GenClass::None;
  ValueRules values = {};
  const char* summary = "";
  // The element type of the result where the op fixes it (Bool: comparisons and logic; Int64:
  // argmax, argmin, argsort): never differentiable. Any: the operands' (float for the float ops).
  OperandType result = OperandType::Any;
  // false: the result never requires grad whatever its operands (detach, item), as a bool or int64
  // result's; the op's rule family has no backward.
  bool differentiable = true;
  // A binary op whose second operand may be the scalar attribute `value` instead.
  bool scalar_second() const;
  int min_args() const;  // fewest tensor operands (a scalar `value` aside)
  int max_args() const;  // most; -1: any number
  const AttrSchema* attr(std::string_view key) const;
};

// Every op, in alphabetical order (ids follow it).
const std::vector<OpSchema>& op_catalog();
inline size_t op_count() { return op_catalog().size(); }

// The op of a name; null when there is none.
const OpSchema* find_op(std::string_view name);
// The op of a name; throws SemanticError(UnsupportedOp) when there is none.
const OpSchema& op_schema(std::string_view name);
OpId op_id(std::string_view name);
inline const OpSchema& op_schema(OpId id) { return op_catalog().at(id); }

// A per-op table of the layers keyed by the catalog (sim's kernels, the properties' definitions)
// indexed by OpId: `names` holds each row's op, the result each op's row (its index in `names`,
// -1 for none). Checked against the catalog: every op with `kernel` has a row, and each row names
// such an op, once; otherwise std::logic_error naming the op, the rows' `file` and `what` they are
// ("kernel", "definition"). A failure is the build's (a row or a catalog entry forgotten).
std::vector<int> rows_by_op_id(const std::vector<const char*>& names, const char* file, const char* what);
// The same for an array of rows that name their op (`Row::op`): each op's row, or null.
template <class Row, size_t N>
std::vector<const Row*> rows_by_op_id(const Row (&rows)[N], const char* file, const char* what) {
  std::vector<const char*> names;
  for (const Row& row : rows) names.push_back(row.op);
  std::vector<const Row*> out;
  for (int i : rows_by_op_id(names, file, what)) out.push_back(i < 0 ? nullptr : &rows[i]);
  return out;
}

// The names of the ops of a generator class, in catalog order.
const std::vector<std::string>& ops_of_class(GenClass c);

// An op's signature as the docs write it: operands `x, target: int64, bias?, xs...`; attributes
// `dim?: int = 0, approximate?: none|tanh = none`.
std::string operands_signature(const OpSchema& s);
std::string attrs_signature(const OpSchema& s);

// The catalog as data: meshsim.ops/1 (`meshsim ops --json`), and the docs' op table in Markdown.
nlohmann::json op_catalog_json();
std::string op_catalog_markdown();

}  // namespace meshsim

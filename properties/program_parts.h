// The pieces the program generators share (programs.cpp, local_map_programs.cpp): scenario JSON
// helpers, the small meshes and options they draw, and the bounds that keep generated data exact
// or well-conditioned.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/layout.h"
#include "core/mesh.h"
#include "core/ops.h"
#include "core/placement.h"

namespace meshsim::gen::parts {

using json = nlohmann::json;

// An op of a scenario's program (`extra`: its attributes) and an input declaration.
json op(const std::string& out, const std::string& name, std::vector<std::string> args, json extra = json::object());
json input(const std::string& name, const Shape& shape, const Spec& spec, bool grad, bool randn);
// An input without a gradient of element type "bool" (init int: a fair coin per element) or "int64"
// (ids in [0, high), `high` > 0); its spec has no Partial (S, R or Rd on each axis).
json typed_input(const std::string& name, const Shape& shape, const Spec& spec, const std::string& dtype,
                 int64_t high = 0);
// `spec` with every Partial replaced by R: the placements a bool or int64 value may have.
Spec without_partial(Spec spec);

// The global values of an int64 input {"ids": high}, as the run makes them: stream `index` (the
// input's position in the scenario) of the run's `seed` (sim/data.cpp).
std::vector<int64_t> drawn_ids(uint64_t seed, size_t index, const Shape& shape, int64_t high);
// An ignore_index for these targets: one of their values, never the only one (so that a mean over
// the targets kept has a divisor); nothing when every target is alike.
std::optional<int64_t> ignore_index_for(const std::vector<int64_t>& targets, int64_t pick);

// A small mesh: 1-2 axes of sizes 1-4, and now and then 3 axes of sizes 1-2 (the ops' cost grows
// with ranks; larger 3-axis meshes are exercised by the redistribution properties).
Mesh small_mesh();

// `base` with the run options drawn: redistribute mode, Reduced policy (intersection, union),
// R -> P(sum) convention, seed.
json draw_options(json base);

// Drops the ops of `ops` whose results do not reach `live` (dead code), so that a counterexample
// shows only the ops that matter.
json live_ops(const json& ops, std::set<std::string> live);

// Generated data are small integers (|x| <= 4); every value carries a bound on its magnitude so
// that no drawn op overflows or loses the exactness the comparisons rely on: an op whose result
// could exceed kMaxBound is not drawn. A value that has been rounded (an op that rounds on integer
// data made it or its operands) stays within kMaxRoundedBound, and the transcendental ops take
// small operands only: the mesh and the oracle round in different orders, and the comparisons
// allow 1e-12 relative to the result, so rounding errors of large intermediate values (or sin of a
// large one) would be reported as a wrong rule.
inline constexpr double kInputBound = 4.0;
inline constexpr double kMaxBound = 1e6;
inline constexpr double kMaxRoundedBound = 1e3;

struct Operand {
  double bound;
  bool rounded;
};
// Whether op `name` may be drawn on operands of these bounds with a result of bound `bound`;
// `rounded` receives whether the result is rounded.
bool within_bounds(const std::string& name, const json& extra, const std::vector<Operand>& xs, double bound,
                   bool& rounded);
// Whether a mesh makes integer data round: an axis size that is not a power of two divides inexactly
// (P(avg), R -> P(sum) divided); the oracle then compares within 1e-12 (oracles/check.cpp), and
// every generated value counts as rounded (so, for one, relu never meets a value the oracle has at
// exactly 0 and the mesh at 1e-17).
bool mesh_rounds(const Mesh& mesh);
// What the op catalog (core/ops.h, ValueRules) says of an op's values, for the generators.
// The largest operand bound an op takes (exp, softmax, sin, tanh take small ones).
double operand_limit(const std::string& name);
// Whether an op has a kink at 0 (relu, abs): it never takes a rounded operand, and the
// single-op property gives it randn data.
bool has_kink(const std::string& name);
// The ops that need a positive operand (log, sqrt, rsqrt, pow: the generators give them one with a
// known positive floor, made by exp where there is none).
bool needs_positive(const std::string& name);
// The range of a pointwise op's result (bound, and floor > 0 where it is known positive) on an
// operand of range `x`, with the op's drawn attributes; a bound of infinity when the op cannot
// take it (or the catalog gives it no range).
ValueRange result_range(const std::string& name, const json& attrs, ValueRange x);

// One op of a generator class, uniformly (the catalog's order: a new op of the class is drawn).
std::string op_of(GenClass c);
// The attributes the catalog says to draw for an op (ValueRules::draws): a required one always, an
// optional one half the time (absent, it takes its default), each an element of its JSON list.
json drawn_attrs(const std::string& name);
// How many of an op's operands may be left off (a norm's weight and bias).
int optional_operands(const std::string& name);

}  // namespace meshsim::gen::parts

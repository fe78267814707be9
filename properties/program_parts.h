// The pieces the program generators share (programs.cpp, local_map_programs.cpp): scenario JSON
// helpers, the small meshes and options they draw, and the bounds that keep generated data exact
// or well-conditioned.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/layout.h"
#include "core/mesh.h"
#include "core/placement.h"

namespace meshsim::gen::parts {

using json = nlohmann::json;

// An op of a scenario's program (`extra`: its attributes) and an input declaration.
json op(const std::string& out, const std::string& name, std::vector<std::string> args, json extra = json::object());
json input(const std::string& name, const Shape& shape, const Spec& spec, bool grad, bool randn);

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
// The largest operand bound an op takes (exp, softmax, sin, tanh take small ones).
double operand_limit(const std::string& name);

}  // namespace meshsim::gen::parts

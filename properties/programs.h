// Well-typed random programs, drawn by type so that almost all are legal, as scenario JSON.
// Every draw shrinks: the op count toward 1, meshes toward one small axis, shapes toward small.
#pragma once

#include <nlohmann/json.hpp>
#include <rapidcheck.h>

namespace meshsim::gen {

struct ProgramOptions {
  int max_ops = 8;
  bool float32_randn = false;  // float32 with randn inputs (for the determinism property)
};

// A DTensor program: inputs a [m, k], b [k, n], d [m, k] (with gradients) and c [m, n] with random
// differentiable placements; 1..max_ops ops among mm, add, sub, mul, sum and redistribute (to
// non-Partial targets, always legal), then loss = sum of the last value (times c when shapes
// allow). Options drawn: redistribute mode, Reduced policy (intersection, union), R -> P(sum).
nlohmann::json dtensor_program(const ProgramOptions& o = {});

// A local_map program: the body is drawn with a DTensor reading of every body value (S(d) or
// P(sum) are variant, R invariant, Rd reduced) so that its `reference` is the same program on
// global tensors with every collective the identity. Body ops: mul, add, mm with a direct row,
// all_reduce (or the opaque all_reduce Function) on a P(sum) axis, all_gather to reduced or to
// varying on an S(d) axis, reduce_scatter on a P(sum) axis, all_to_all between shards, and the
// rank-local Function local_square. When `twin` is given it receives the same program in
// DTensor mode (collectives become redistributions), for the agreement property.
nlohmann::json local_map_program(const ProgramOptions& o = {}, nlohmann::json* twin = nullptr);

}  // namespace meshsim::gen

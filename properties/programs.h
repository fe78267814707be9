// Well-typed random programs, drawn by type so that almost all are legal, as scenario JSON.
// Every draw shrinks: the op count toward 1, meshes toward one small axis, shapes toward small.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <rapidcheck.h>

namespace meshsim::gen {

struct ProgramOptions {
  int max_ops = 8;
  bool float32_randn = false;  // float32 with randn inputs (for the determinism property)
  bool even = false;           // DTensor programs: every extent a multiple of every axis size;
                               // local_map programs: the inputs' extents multiples of the mesh's size
  bool reduced = false;        // DTensor programs: input a is Rd over one axis at least
};

// A DTensor program: inputs a [m, k], b [k, n], d [m, k] (with gradients, any differentiable
// placement) and c [m, n] (no gradient, any placement: P(max) and P(min) too, forward-only); 1..max_ops
// ops drawn among every DTensor op of the file format with their attributes (dims negative too,
// keepdim, every-dim reductions, scales negative and zero, transposes of sharded dims, division by
// positive values) and redistributions to every target legal from where the value is (P(max) and
// P(min) only off the backward path); then loss = sum of the last value (times c when shapes
// allow). The generator follows each value's placement by the rows and the drawn Reduced policy,
// and a bound on its magnitude, so that drawn programs are legal and their data stay exact
// integers or well-conditioned. Meshes of 1-3 axes (uneven and empty shards; nested shards of one
// dim). Options drawn: redistribute mode, Reduced policy (intersection, union), R -> P(sum).
// The transformer-layer ops too: the non-linear pointwise ones (log, sqrt, rsqrt, pow of a value known
// positive, exp made where there is none), where and masked_fill with bool inputs, tril/triu,
// causal masks of ones + tril/triu filled with -inf and followed by softmax, the norms with and
// without weight and bias, embedding of int64 ids (inputs, zeros or arange) into tables of even
// and uneven vocab splits, log_softmax (loss parallel over a sharded dim), cross_entropy and
// nll_loss against int64 targets (both reductions, an ignore_index among the targets, never all
// of them), and the creation ops in random placements; the inputs these draw follow a, b, c, d.
// The ops of a generator class (core/ops.h: GenClass) are drawn by class from the op catalog, the
// pointwise ones with the attributes and value ranges of their ValueRules, so a new op of a drawn
// class is drawn here (and by local_map_program and single_op_program) without a change here; any
// other op added to the file format joins this generator (and local_map_program) in the same change.
nlohmann::json dtensor_program(const ProgramOptions& o = {});

// One op of the file format (drawn among all, with its attributes) on operands laid out in every
// placement per axis, P(max) and P(min) included (those operands without a gradient), then
// loss = sum(op * c) with c of the result's shape in a random differentiable placement: every
// row of every table meets operands of every kind, as DTensor's strategy validation does. A
// divisor is initialized to ones (no zero, split unevenly over its Partial axes); log, sqrt, rsqrt
// and pow read exp of their input laid out again as drawn; bool and int64 operands (masks, ids,
// targets) are S, R or Rd; pick_target and count_targets run as nll_loss or cross_entropy.
nlohmann::json single_op_program();

// A local_map program: the body is drawn with a DTensor reading of every body value (S(d) or
// P(sum) are variant, R invariant, Rd reduced) so that its `reference` is the same program on
// global tensors with every collective the identity. Body ops: every DTensor op (each where the
// local result is the global op's under the value's reading: non-linear ops and softmax of values
// with no Partial axis, mean and softmax over dims no axis shards, division by positive values),
// all_reduce (or the opaque all_reduce Function) on a P(sum) axis, all_gather to reduced or to
// varying on an S(d) axis, reduce_scatter on a P(sum) axis, all_to_all between shards,
// mark_varying of an invariant axis, and the rank-local Function local_square; the transformer-layer ops
// (non-linear ops, log_softmax and norms of values with no Partial axis over unsharded dims,
// tril/triu, where and masked_fill with a bool region arg, embedding {axis, vocab} and nll_loss
// {axis, classes} vocab- and class-parallel, cross_entropy) with their int64 and bool region args
// after x, w, z. When `twin` is given it receives the same program in
// DTensor mode (collectives become redistributions), for the agreement property.
// When `labels` is given it receives, per body value the program draws, the variant and reduced
// axes the LTensor rules give it (SEMANTICS.md section 5, written out by the generator's own model).
struct BodyLabels {
  std::vector<std::string> variant, reduced;
  bool operator==(const BodyLabels& o) const { return variant == o.variant && reduced == o.reduced; }
};
nlohmann::json local_map_program(const ProgramOptions& o = {}, nlohmann::json* twin = nullptr,
                                 std::map<std::string, BodyLabels>* labels = nullptr);

// DTensor-mode local code: x [2-D, 1-5 each] laid out S(d), R or P(sum) over a mesh of 1-2 axes
// (sizes 1-4), optionally w [1] replicated (both with gradients); to_local of each, a chain of local
// ops (neg, exp, relu, scale, add and mul with w or another P(sum) value, sum {dim}), explicit
// collectives (all_reduce, all_gather, mark_varying of w), from_local and loss = sum. `correct` is the
// generator's own verdict: whether the local code is a right SPMD program for the placements
// from_local asserts (the run must then pass) or a user bug (it must then fail: a wrong value or
// gradient), with `why`. Only program shapes whose verdict the model knows for every draw are drawn
// (properties/local_code_programs.cpp lists them).
struct LocalCodeCase {
  nlohmann::json doc;
  bool correct = true;
  std::string why;
};
LocalCodeCase local_code_program();

}  // namespace meshsim::gen

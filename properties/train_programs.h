// Training steps in the property suite (core/train.h): random multi-step programs, and the
// property that runs them against the oracle after every step.
#pragma once

#include <nlohmann/json.hpp>

namespace meshsim::gen {

// A two-layer MLP (x [m, k] scaled by 1/8, w1 [k, h], b [h], w2 [h, n]; loss sum(y) or sum(y * y))
// on a mesh of 1-2 axes of sizes 1-3 (uneven and empty shards), the data S(0), S(1) or R per axis,
// each parameter R or S(d) per axis (gathered first to Rd or R now and then, FSDP's way), with
// `train`: 1-3 steps, 1-3 microbatches (fresh data each, or the same; x cut from the step's batch now and then), a learning rate or one per
// step, sgd (momentum, dampening, nesterov, weight decay) or adamw, the optimizer states of a
// parameter laid out as itself or drawn (ZeRO: sharded where the parameter is replicated), and
// clip_grad_norm (norm 1, 2, 3 or inf, of all or some parameters, the DTensor norm or the user's
// all_reduce over exactly the axes that shard the clipped gradients, where one such set exists).
nlohmann::json train_program();

}  // namespace meshsim::gen

namespace meshsim {

// The property: every parameter, optimizer state and total norm equals the oracle's after every step.
void train_equivalence();

}  // namespace meshsim

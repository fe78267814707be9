// The run's random numbers (docs/semantics.md, "Randomness"): a counter-based generator. The value
// of element `index` (a global tensor's row-major linear index) of a random op is a function of the
// run's seed, the op's stream and that index alone, so that a value drawn piece by piece on a mesh
// (each rank its local's global indices) is the value one device draws whole, whatever the layout.
// PyTorch's DTensor keeps the same invariance with its offset-based RNG tracker (each shard's
// Philox offset from its position in the global tensor); the values themselves are meshsim's own.
#pragma once

#include <cstdint>
#include <string_view>

namespace meshsim {

// A random op's stream: the run's seed with the op's stream name (its `stream`, or its result's
// name), and, in training steps, the step and microbatch (-1: none).
uint64_t random_stream_key(uint64_t seed, std::string_view stream, int64_t step = -1, int64_t microbatch = -1);

// The stream's uniform value at `index`: a multiple of 2^-53 in [0, 1).
double uniform_at(uint64_t key, uint64_t index);

// The stream's standard normal value at `index` (Box-Muller of the uniforms at 2 index and
// 2 index + 1 of the stream's normal sub-stream).
double normal_at(uint64_t key, uint64_t index);

// dropout's keep decision at `index`: kept where uniform_at(key, index) < 1 - p (a fraction 1 - p of
// the elements on average); p >= 1 keeps none, p <= 0 every one.
bool dropout_keeps(uint64_t key, uint64_t index, double p);

}  // namespace meshsim

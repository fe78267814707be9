// `meshsim check --emit DIR --cases N`: the property generators' programs written as scenario
// files, for other tools to run (tools/crosscheck runs them on PyTorch DTensor and JAX shard_map).
// The same seed and build write the same files.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace meshsim::cli {

struct EmitArgs {
  std::string dir;
  int cases = 100;
  uint64_t seed = 0;
  std::vector<std::string> generators;  // empty: all of them, in turn
};

// Writes DIR/NNNN-GENERATOR.json for each case (generators in turn: dtensor, dtensor_even,
// single_op, local_map, local_code, or those named in `generators`, local_map_even among them;
// sizes spread over 10..100) and DIR/emitted.json, the manifest
// (meshsim.emit/1: the seed, and per case its file, generator, size and key). Returns 0; an unknown generator is a UsageError naming the known ones.
int cmd_emit(const EmitArgs& args, std::ostream& out);

}  // namespace meshsim::cli

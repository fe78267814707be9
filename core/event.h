// A trace event (DESIGN.md, contract 4): one op, redistribution step or collective of a run, in
// order, with its specs and a hash of every local tensor it produced. Pure data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshsim {

struct Event {
  int64_t seq = 0;
  std::string phase;  // "forward" | "backward"
  // "input" | "op" | "redistribute" | "collective" | "local" | "seed" | "grad"
  std::string kind;
  std::string name;   // op name, step name ("all_gather"), or input name
  std::string value;  // the value produced, or whose gradient is produced
  std::vector<std::string> args;      // operand value names
  std::vector<std::string> in_specs;  // "[S(0)]" per operand
  std::string out_spec;               // "[Rd]"
  std::string axis;                   // mesh axis name for collectives and steps
  int64_t bytes = 0;                  // per rank, cost model
  std::vector<std::vector<int64_t>> local_shapes;  // per rank
  std::vector<std::string> hashes;    // per rank, hex of the local tensor's bytes
  std::string note;                   // free text, e.g. "grad hook: P(sum) -> R"
  // Set where the planner, not the program, asked for this step: why (the op, the operand and the
  // placements no rule took, the row chosen). Empty for the program's own redistributions and
  // collectives and for the gradient contract (the hook). An annotation of the run: written to
  // traces when set, but not compared by replay (traces written before it existed replay alike).
  std::string implicit;

  // Every field but the `implicit` annotation.
  bool operator==(const Event& o) const {
    return seq == o.seq && phase == o.phase && kind == o.kind && name == o.name &&
           value == o.value && args == o.args && in_specs == o.in_specs &&
           out_spec == o.out_spec && axis == o.axis && bytes == o.bytes &&
           local_shapes == o.local_shapes && hashes == o.hashes && note == o.note;
  }
  bool operator!=(const Event& o) const { return !(*this == o); }
};

}  // namespace meshsim

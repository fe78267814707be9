// An imported program's recorded choices (what PyTorch's sharding propagation chose: each op's
// result placements and the operands it redistributed, and its backward's collectives) against
// meshsim's own run of the same program (docs/import.md, "What PyTorch chose").
#pragma once

#include <nlohmann/json.hpp>

#include "core/scenario.h"

namespace meshsim {

// meshsim.result/1's placements of a spec: ["S(0)", "R"].
nlohmann::json placements_json(const Spec& spec);

// The result's `recorded` (null when the scenario neither was imported nor records a choice):
// `compared` counts, `bytes` (the recorded moves by meshsim's cost model; meshsim's own forward
// moves), and `differences`, each with its `kind` (placement, move, backward_collectives), the
// op's JSON path and source, both sides, and a `message` line. `result` is the run's result with
// its values, implicit and communication; R and Rd count as the same choice. Bytes are in the
// run's dtype (`options`).
nlohmann::json recorded_json(const Scenario& sc, const RunOptions& options, const nlohmann::json& result);

// Adds the user's source (`source`: module, file, line, code) to the result's first_divergence and
// mismatches where the op or value that failed has one, and to their messages ("[llama.py:57
// (layers.0.attention.wq)]"). Nothing changes for a scenario without sources.
void attach_sources(const Scenario& sc, nlohmann::json& result);

}  // namespace meshsim

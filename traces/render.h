// The dataflow diagram of a trace, in Graphviz DOT: a "forward" cluster (one node per value and
// per op, every redistribution step on the path), a "backward" cluster (seed, gradient
// contributions, backward collectives, input gradients; dashed edges), a legend of the collective
// colors, and a red note when the run failed.
#pragma once

#include <string>

#include "traces/trace.h"

namespace meshsim {

// Deterministic DOT text, a pure function of the trace: node ids come from value names ("v:wf") and
// event seqs ("e7"), nodes and edges follow the order of the events.
std::string render_dot(const Trace& trace);

// By the extension of out_path: .dot writes the DOT text, .svg and .png lay it out with libgvc.
// Unknown extension or unwritable file: InputError(out_path, "", ...).
void render_to_file(const Trace& trace, const std::string& out_path);

}  // namespace meshsim

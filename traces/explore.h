// meshsim explore: one self-contained HTML page to explore a run (docs/gallery.md, "The explorer").
//
// The page holds a model of the run as JSON (explore_model) and the explorer's script and style,
// written in traces/explore/ and inlined at build time (traces/CMakeLists.txt); it loads nothing
// at view time. Its graphs are laid out here, by Graphviz's dot (the renderer's layout_dot), and
// embedded as SVG: the whole forward program folded by layer (render.h, "Layers": an op's `group`,
// its module, or its name's numbered prefix), one node per layer, and each layer's own ops, shown
// when the page expands its fold. The script reads the node names dot writes into each node's
// <title> ("e17" an op event, "v:x" an input, "g2" layer 2, "x:y" a value made outside the layer).
//
// Everything is a pure function of the traces (and the recorded values): the same input gives the
// same bytes.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "traces/trace.h"

namespace meshsim {

struct ExploreRun {
  std::string file;  // where the trace came from, for the page's title
  Trace trace;
  // Recorded values (read_recorded_values): name -> {"value", "oracle", "grad", "oracle_grad"},
  // each {"shape", "dtype", "head": the first elements, "elements"}; null when none.
  nlohmann::json recorded;
};

// At most this many elements of a recorded tensor go into the page.
inline constexpr size_t kExploreRecordedElements = 64;
// A graph of more nodes is not laid out (dot would take minutes); the page says so and keeps its
// search, steps and tables.
inline constexpr size_t kExploreMaxGraphNodes = 2500;

// The model of one run: mesh, status and failure, values (spec, shapes, each rank's local shape as
// runs of ranks alike, gradient and cotangent, layer), events, layers, the graphs' SVG.
nlohmann::json explore_model(const ExploreRun& run);

// The DOT text of the graphs before dot lays them out: the overview, then each layer's (for tests:
// STYLE.md compares DOT text, not SVG).
std::vector<std::string> explore_dot_texts(const Trace& trace);

// What differs between two runs of one program: values (spec, local shapes, local contents,
// gradient placements) and collectives (kind, axis, bytes per value and phase).
nlohmann::json explore_diff(const ExploreRun& a, const ExploreRun& b);

// The whole page: one run, or two side by side (the second compared with the first).
std::string explore_html(const std::vector<ExploreRun>& runs);

// DIR/index.json of `meshsim run --values DIR` (cli/values.h) and the .npy files it lists: the
// first kExploreRecordedElements elements of each. InputError naming the file and JSON path when
// the index or a file it lists is unreadable or malformed.
nlohmann::json read_recorded_values(const std::string& dir);

}  // namespace meshsim

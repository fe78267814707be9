// Diagrams of a trace, in Graphviz DOT, laid out to SVG or PNG with libgvc.
//
// The logical view (the default) teaches placement flow: a "forward" cluster with one node per
// value (name, global shape, spec or LTensor sets, local shape), one node per op (with the rule row
// chosen per mesh axis), and every step of every redistribution on the path from its operand; a
// "backward" cluster (seed, gradient contributions, backward steps, and each input gradient with
// its tracked placement and the cotangent it should have; dashed edges). Each collective kind has
// one shape and one color; the edge leaving a collective is drawn in its color and labelled with
// the bytes it moves per rank. A legend explains the styles.
//
// The rank view draws the same run once per rank: one cluster per rank, nested by mesh axes (a
// cluster per coordinate of the first axis holding clusters per coordinate of the second, ...),
// each value and gradient with its local shape on that rank, and one node per group of every
// collective connecting the ranks of that group. A mesh of more than kRankViewMaxRanks ranks is
// collapsed to a representative sub-mesh (the first 4 coordinates of a 1-axis mesh, the first 2
// of each of the first 4 axes otherwise, so at most 16 ranks) and a node "... and N more ranks
// like these".
//
// Verdicts, in both views: a value or gradient named by a line of the result's "failures"
// ("y: ...", "grad w: ...", "w: gradient is ...") gets a red border and its error text (in the
// rank view, a "rank N holds ..." failure marks that rank's node only); a failing run has a red
// note with its failed checks; an error run a red note with the error's kind and message, and,
// when the run stopped before its first event, the scenario's program as written.
#pragma once

#include <cstdint>
#include <string>

#include "traces/trace.h"

namespace meshsim {

enum class RenderView { Logical, Ranks };

// "logical" | "ranks"; throws std::invalid_argument otherwise.
RenderView parse_render_view(const std::string& text);
const char* render_view_name(RenderView view);

// The rank view draws every rank of a mesh up to this size and collapses larger meshes.
inline constexpr int64_t kRankViewMaxRanks = 16;

// Deterministic DOT text, a pure function of the trace and the view: node ids come from value
// names ("v:wf") and event seqs ("e7"; "r3:e7" per rank and "e7:g0" per collective group in the
// rank view), nodes and edges follow the order of the events.
std::string render_dot(const Trace& trace, RenderView view = RenderView::Logical);

// Lays DOT text out with libgvc's dot engine and renders it as `format` ("svg" or "png").
// Failure: InputError(what, "", ...).
std::string layout_dot(const std::string& dot, const std::string& format,
                       const std::string& what = "diagram");

// By the extension of out_path: .dot writes the DOT text, .svg and .png lay it out with libgvc.
// Unknown extension or unwritable file: InputError(out_path, "", ...).
void render_to_file(const Trace& trace, const std::string& out_path,
                    RenderView view = RenderView::Logical);

}  // namespace meshsim

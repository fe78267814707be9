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
// The rank view draws where the data lives: each value and gradient with its local shape, in one
// cluster per class of ranks alike, and one node per collective and group of ranks it joins.
// Ranks are alike when every event gives them the same local shape, the same values fail on
// them, and every collective puts them in groups of the same classes (refined to a fixed point,
// so each class meets one node per collective); a class is drawn once, labelled with its ranks
// and, when they form a sub-mesh, its coordinates ("ranks 0–2, 4–6 (6 alike)", "dp=*, tp=0,1,2").
// An 8-rank dp x tp mesh thus draws its 1 to 4 distinct behaviours, not 8 columns (8000 px wide
// before). While every class has one coordinate on the leading axes, clusters per coordinate of
// those axes nest the classes (on dp=2 x tp=2 with four distinct ranks: "dp = 0" holds ranks 0
// and 1). Classes go left to right by their first rank; their nodes are named after it ("r4:v:x").
// A mesh of more than kRankViewMaxRanks ranks is first collapsed to a representative sub-mesh
// (the first 4 coordinates of a 1-axis mesh, the first 2 of each of the first 4 axes otherwise,
// so at most 16 ranks, plus up to 4 ranks a failure names) and a node "... and N more ranks like
// these".
//
// Verdicts, in both views: a value or gradient named by a line of the result's "failures"
// ("y: ...", "grad w: ...", "w: gradient is ...") gets a red border and its error text (in the
// rank view, a "rank N holds ..." failure marks the node of rank N's class only, a class of the
// ranks failing on that value, and its text names the rank); a failing run has a red note with
// its failed checks; an error run a red note with the error's kind and message, and, when the
// run stopped before its first event, the scenario's program as written.
//
// Large programs: a diagram whose layout size is over kRenderMaxLayoutSize is collapsed, in both
// views and in DOT as in SVG and PNG (the DOT text is what dot lays out). Each run of 4 or more repetitions of a
// pattern of up to 32 events (ops with their redistribution steps; in the backward, gradients and
// steps) keeps its first and last repetitions and folds the others into one node, "×4,998
// repetitions folded", with the pattern and the ops it holds; runs of folded runs fold again. If
// the diagram is still too large, the middle of each long phase becomes one node, "⋮ N events not
// drawn", with counts of what it holds. The title says the diagram is collapsed and how many ops
// (and backward events) were folded. Failing values do not repeat, so they stay drawn where the
// budget allows; a fold that holds some says so in red. The program as written (a run that stopped
// before its first event) keeps its first and last 150 ops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "traces/trace.h"

namespace meshsim {

enum class RenderView { Logical, Ranks };

// "logical" | "ranks"; throws std::invalid_argument otherwise.
RenderView parse_render_view(const std::string& text);
const char* render_view_name(RenderView view);

// The rank view draws every rank of a mesh up to this size and collapses larger meshes.
inline constexpr int64_t kRankViewMaxRanks = 16;

// The largest layout size drawn in full: nodes, plus one for every rank a long edge crosses (dot
// lays those out as virtual nodes). dot's time grows much faster than the size: on one core, a
// diagram of size 2,800 took 0.7 s, 4,900 took 5 s, 10,900 took 75 s, and 20,000-op programs
// crashed it (docs/gallery.md, "Large programs"); the bundled examples are 1,700 at most.
inline constexpr size_t kRenderMaxLayoutSize = 3000;

// Layers (render --fold): a program's layer is the `group` its op or input names (the scenario's
// own layers, docs/scenario-format.md), else the module it came from, cut after its first
// numbered part (an imported op of module "layers.0.attention.wq" is in layer "layers.0"; an
// unnumbered module is its own layer: "tok_embeddings"), else the value name's shortest prefix that
// ends in a number and is followed by '_' or '.' ("l0_wq_g" and "l0_h1" are in "l0",
// "blocks.3.attn" in "blocks.3") when at least two layers share its stem ("l0" and "l1"). An input
// is in the layer of its name; a value the runtime made for an operand ("y.arg1") in y's; a
// local_map body's values in the local_map's. A layer holds at least kMinLayerOps ops. Folded,
// each layer is one box in the forward and one in the backward: its ops, values and steps, with
// its collectives summed per kind and mesh axis (count, bytes per rank) and its failures counted.
// Folding is the default (FoldMode::Auto) when the diagram drawn in full has more than
// kFoldAboveNodes nodes and the program has layers; a folded diagram still too large for dot
// collapses as below.
enum class FoldMode { Auto, Always, Never };

// Above this many nodes in full (about 6,000 px tall at 96 dpi), Auto folds by layer. The bundled
// examples have 40 to 440; the two transformer steps (328 to 440) fold, the others do not.
inline constexpr size_t kFoldAboveNodes = 250;
inline constexpr int64_t kMinLayerOps = 2;

struct RenderOptions {
  RenderView view = RenderView::Logical;
  FoldMode fold = FoldMode::Auto;
  // "FROM..TO" (render --ops): only the ops program[FROM] to program[TO], both included, each end an
  // index into the scenario's program or the name of a value an op makes; an empty end is the
  // program's first or last op. Drawn: those ops with their redistribution steps, the inputs they
  // read, and the backward events of their values and inputs; a value made outside the range is a
  // gray node "outside --ops". "" draws the whole program.
  std::string ops;
};

// Checks a --ops range against the trace's program: returns the first and last op index, or
// throws std::invalid_argument with a message that names the range as written.
std::pair<size_t, size_t> parse_op_range(const Trace& trace, const std::string& range);

// Deterministic DOT text, a pure function of the trace and the view: node ids come from value
// names ("v:wf") and event seqs ("e7"; "r3:e7" per rank and "e7:g0" per collective group in the
// rank view), nodes and edges follow the order of the events.
std::string render_dot(const Trace& trace, RenderView view = RenderView::Logical);
std::string render_dot(const Trace& trace, const RenderOptions& options);

// Lays DOT text out with libgvc's dot engine and renders it as `format` ("svg" or "png").
// Failure: InputError(what, "", ...).
std::string layout_dot(const std::string& dot, const std::string& format,
                       const std::string& what = "diagram");

// By the extension of out_path: .dot writes the DOT text, .svg and .png lay it out with libgvc.
// Unknown extension or unwritable file: InputError(out_path, "", ...).
void render_to_file(const Trace& trace, const std::string& out_path,
                    RenderView view = RenderView::Logical);
void render_to_file(const Trace& trace, const std::string& out_path, const RenderOptions& options);

}  // namespace meshsim

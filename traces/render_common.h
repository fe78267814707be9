// The renderer's insides, shared by its files (not a public header; traces/render.h is):
//   render_common.cpp  DOT text, styles, the facts a diagram needs besides the events, and the
//                      size of a drawn body for dot
//   render_logical.cpp the logical view
//   render_ranks.cpp   the rank view
//   render_fit.cpp     diagrams that fit a screen: layers and their boxes, the blocks of the rank
//                      view, --ops ranges
//   render.cpp         the frame of a diagram (title, status note, legend, the program as
//                      written), which events a diagram too large for dot folds, layout with
//                      libgvc, and the public functions
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/mesh.h"
#include "traces/trace.h"

namespace meshsim::render_detail {

using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// DOT text
// ---------------------------------------------------------------------------------------------

using Attrs = std::vector<std::pair<std::string, std::string>>;

// An attribute value written as an HTML-like label <...> (html is already escaped).
std::string html_value(const std::string& html);
// A DOT string literal: quotes and backslashes escaped, newlines as DOT line breaks.
std::string quote(const std::string& text);
// " [key="value", key=<html>]"
std::string attr_list(const Attrs& attrs);
// Text inside an HTML-like label: markup characters escaped, newlines as line breaks.
std::string esc(const std::string& text);

inline constexpr const char* kFont = "Helvetica";
inline constexpr const char* kMono = "Courier";
inline constexpr const char* kGray = "#666666";
inline constexpr const char* kLightGray = "#8c8c8c";
inline constexpr const char* kRed = "#d7191c";
// The word "implicit" on a step the planner inserted.
inline constexpr const char* kImplicitMark = "#b15928";
inline constexpr const char* kGreen = "#1a9641";
inline constexpr const char* kBackwardEdge = "#9e4a73";
inline constexpr const char* kBr = "<BR/>";
inline constexpr const char* kFoldInk = "#7a6a3a";  // a collapsed diagram's folds and title line

// <FONT ...>html</FONT>; html is already escaped.
std::string font(const std::string& html, const std::string& color, int size = 0, const std::string& face = "");
std::string bold(const std::string& text);
std::string mono(const std::string& text, const std::string& color = "#08306b", int size = 0);
std::string small(const std::string& text, const std::string& color = kGray, int size = 8);

// Words joined into lines of at most `width` characters (a longer word gets its own line).
std::vector<std::string> wrap(const std::string& text, size_t width);
// Red lines "✗ message", wrapped.
std::string error_lines(const std::vector<std::string>& messages, size_t width = 40);

std::string shape_str(const std::vector<int64_t>& shape);
// "384 B", "1.5 KiB", "2 MiB"
std::string bytes_str(int64_t bytes);
std::string show(const json& v);
// ["S(0)", "R"] -> "[S(0), R]"; anything else -> "".
std::string spec_of_json(const json& placements);
std::vector<int64_t> ints_of_json(const json& v, bool* ok);

// ---------------------------------------------------------------------------------------------
// Styles: one row per collective kind, one per node role
// ---------------------------------------------------------------------------------------------

struct StepStyle {
  const char* name;
  const char* fill;
  const char* line;  // border, edge and byte-label color
};
inline constexpr StepStyle kCollectives[] = {
    {"all_gather", "#b8e3b0", "#1b7837"},
    {"reduce_scatter", "#fdd0a2", "#d94801"},
    {"all_reduce", "#d9c8ea", "#6a3d9a"},
    {"all_to_all", "#b3d7ee", "#1f68b4"},
};
inline constexpr StepStyle kLocalStep = {"local step", "#ececec", "#737373"};

const StepStyle& step_style(const std::string& name);
bool is_collective_name(const std::string& name);

enum class Role { Input, Value, Implicit, Op, Seed, Grad, InputGrad, Ghost };

Attrs node_attrs(Role role, const std::string& html_label, bool failing = false, const Attrs& extra = {});
Attrs step_attrs(const std::string& name, const std::string& html_label, const Attrs& extra = {});
// The style of an edge leaving a step: a collective's edge is bold, in its color.
Attrs step_out_edge(const Event& e, bool with_bytes);

std::string node_line(const std::string& id, const Attrs& attrs, const std::string& indent = "    ");
// The nodes of a drawn body (its " [label=" lines).
size_t count_nodes(const std::string& body);
// dot's work on a body of `nodes` nodes: the nodes and the virtual nodes its long edges cross.
size_t layout_size(const std::string& body, size_t nodes);
// A cluster of `body` (nothing when the body is empty).
std::string cluster(const std::string& name, const Attrs& attrs, const std::string& body,
                    const std::string& indent = "  ");

// ---------------------------------------------------------------------------------------------
// What the diagram needs to know besides the events: mesh, shapes, gradients, verdicts
// ---------------------------------------------------------------------------------------------

// An LTensor's spec in a trace ("variant=[...] reduced=[...]"), not a DTensor placement list.
bool is_ltensor_spec(const std::string& spec);

struct Facts {
  std::string name = "trace";
  Mesh mesh{{"rank"}, {1}};
  bool mesh_from_scenario = false;
  std::string status;  // "" (no result), pass, unchecked, fail, error
  std::vector<std::string> passed_checks, failed_checks, unchecked_checks;  // unchecked: null, not (fully) run
  std::string error_kind, error_message;
  std::map<std::string, std::vector<int64_t>> global_shape;
  std::map<std::string, std::pair<std::string, std::string>> grads;  // name -> tracked, cotangent
  // Failures attached to a node, and those that name no node of the diagram.
  std::map<std::string, std::vector<std::string>> value_errors, grad_errors;
  std::map<std::string, std::map<int64_t, std::vector<std::string>>> rank_errors;
  std::set<std::string> dtensor_values;  // values drawn at least once as a DTensor
  std::vector<std::string> all_failures, other_failures;
  std::string first_divergence;  // the result's first_divergence, in one line ("" when none)
  json program = json::array();  // the scenario's program, for implicit operands and sketches
  json inputs = json::array();
  // Imported programs: where the user's code made each value ("llama.py:57", its module and
  // line of code for the tooltip).
  struct Source {
    std::string where, detail;
  };
  std::map<std::string, Source> sources;
  // What a value the events never made is called: a trace cut by --ops says where it comes from.
  std::string ghost_note = "not in the trace";
  std::string range_line;  // --ops: which ops are drawn, for the title ("" for all)
};

Facts facts_of(const Trace& t);

// The red note of a failed or erroneous run (its first divergence first, then its failures; all of
// them, or those no node of the diagram shows); empty for a pass.
std::string status_note(const Facts& f, bool list_all_failures);

// The name an op event is drawn under: its own, but local code's ends, which run as a local_map's
// enter and leave do, are drawn as the program wrote them (to_local, from_local).
std::string drawn_name(const Facts& f, const Event& e);

// Whether a value name is one the runtime made for an op's operand ("y.arg1", "y.in0.dp").
bool is_implicit(const std::string& name);
// The operand a redistributed implicit value ("y.arg1", "y.in1") stands for: argument 1 of the
// program op producing y; "" for the others.
std::string implicit_source(const Facts& f, const std::string& name);
// "w as operand 1 of y", "operand 1 of y, over dp"
std::string implicit_text(const Facts& f, const std::string& name);

// "mm: S(0), R -> S(0); mm: R, S(1) -> S(1)" -> one line per mesh axis, "dp: S(0), R → S(0)".
std::vector<std::string> rule_lines(const Event& e, const Mesh& mesh);
// "grad hook: [P(sum)] -> cotangent of [R]" -> "grad hook"
std::string note_tag(const std::string& note);
// "[S(0)] → [R]", or "[R]" when the step does not record its source.
std::string transition(const Event& e);
std::string step_label(const Event& e);
// Local shapes as text: "[2, 16]" when every rank agrees, "[3, 4] / [2, 4]" otherwise.
std::string local_shapes_str(const Event& e);

inline std::string event_id(const Event& e) { return "e" + std::to_string(e.seq); }
inline std::string value_id(const std::string& name) { return "v:" + name; }

// The redistribution steps waiting for the op that consumes `value`, removed from `pending`
// (both views draw a chain of steps where its consumer is drawn).
std::vector<const Event*> take_pending(std::map<std::string, std::vector<const Event*>>& pending,
                                       const std::string& value);

// ---------------------------------------------------------------------------------------------
// Collapsing a diagram too large for dot's layout (render.cpp)
// ---------------------------------------------------------------------------------------------

// Events drawn as one node. A repeat fold holds the middle repetitions of a run of a repeated
// pattern (its first and last repetitions stay drawn, around it); an elision holds the middle of
// a phase that is still too long once its runs are folded.
struct Fold {
  bool elided = false;
  bool backward = false;
  size_t first = 0, end = 0;  // the events [first, end) of the trace, by position
  int64_t repetitions = 0;    // a repeat fold: the run's repetitions, drawn ones included
  int64_t folded_repetitions = 0;
  std::string pattern;        // a repeat fold: one repetition, "add → mul"
  int64_t ops = 0;            // folded forward ops (events of kind "op")
  int64_t events = 0;         // folded events
  int64_t failing = 0;        // folded values and input gradients that fail a check
  std::vector<std::pair<std::string, int64_t>> names;  // an elision: what it holds, most first
  // A layer fold (render --fold): its heading ("layer l0", "loss = cross_entropy, decomposed"), and its collectives summed per "kind axis":
  // how many, and their bytes per rank.
  std::string layer;
  int64_t inputs = 0;  // a layer fold: the inputs it holds
  std::map<std::string, std::pair<int64_t, int64_t>> collectives;
};

struct Collapse {
  std::vector<Fold> folds;
  std::vector<int> fold_of;     // per event of the trace: its fold, or -1; empty when none
  int64_t ops = 0;              // forward ops in the trace
  int64_t ops_folded = 0;
  int64_t backward_events = 0;  // events of the backward phase
  int64_t backward_folded = 0;
  size_t drawn = 0;             // events and folds drawn
  std::vector<std::string> layers;  // folded by layer: the layers, in program order
  int64_t decomposed = 0;           // folded by layer: the decomposed ops folded too

  bool active() const { return !folds.empty(); }
  int at(size_t event) const { return fold_of.empty() ? -1 : fold_of[event]; }
};

// Folds every run of at least 4 repetitions of a pattern of up to 32 events (a run of runs too:
// three passes), then elides the middle of the longest phases until at most `max_drawn` events
// and folds are drawn. Values and gradients that fail a check never repeat, so they stay drawn
// while the budget allows.
Collapse plan_collapse(const Trace& t, const Facts& f, size_t max_drawn);

// One fold per layer and phase (render.h, "Layers"); inactive when the program has no layers.
Collapse plan_layer_folds(const Trace& t, const Facts& f);

// A layer's box, and the title's lines on a diagram folded by layer.
Attrs layer_fold_attrs(const Fold& fold, const Attrs& extra);
std::string layer_fold_lines(const Collapse& c);

// The rank view's picture of where the ranks `ranks` (of a class of ranks alike; `shown` are every
// rank drawn) sit in a DTensor of spec `spec_text` and shape `global`: HTML table rows, or "" when
// there is nothing to draw (a tensor no placement shards, a strided shard, an LTensor).
std::string block_picture(const Mesh& mesh, const std::string& spec_text, const std::vector<int64_t>& global,
                          const std::vector<int64_t>& ranks, const std::vector<int64_t>& shown,
                          const std::vector<int64_t>& rep_local);

// The trace of the ops program[first] to program[last] (render.h, RenderOptions::ops).
Trace trace_in_range(const Trace& t, size_t first, size_t last);

inline std::string fold_id(int fold) { return "fold" + std::to_string(fold); }
// The node of a fold: what it holds, how many ops, and what was drawn around it.
Attrs fold_attrs(const Fold& fold, const Attrs& extra = {});
// "4,998"
std::string count_str(int64_t n);

// ---------------------------------------------------------------------------------------------
// The views: the body of the graph (clusters, nodes, edges) between the frame's parts
// ---------------------------------------------------------------------------------------------

// With an active collapse, the events of a fold draw its node instead of theirs, and every edge
// of theirs ends at it.
std::string logical_view(const Trace& trace, const Facts& facts, const Collapse& collapse);

struct RankViewText {
  std::string body;
  std::string view_line;  // under the title: how many ranks, and how they are drawn
};
RankViewText rank_view(const Trace& trace, const Facts& facts, const Collapse& collapse);

}  // namespace meshsim::render_detail

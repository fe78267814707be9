// The frame of a diagram (title, status note, legend, the program as written), layout with libgvc,
// and the public functions of render.h; the views live in render_logical.cpp and render_ranks.cpp.
#include "traces/render.h"

#include <graphviz/gvc.h>

#include <fstream>
#include <memory>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "traces/render_common.h"

namespace meshsim {

using namespace render_detail;

namespace {

// ---------------------------------------------------------------------------------------------
// Title, note, legend
// ---------------------------------------------------------------------------------------------

std::string title(const Trace& t, const Facts& f, const std::string& view_line) {
  std::vector<std::string> items = {"mesh " + f.mesh.str()};
  if (t.options.is_object()) {
    for (const auto& item : t.options.items()) {
      if (item.value() != "" && !item.value().is_null()) items.push_back(item.key() + "=" + show(item.value()));
    }
  }
  items.push_back("meshsim " + t.version);
  std::string line, lines;
  for (const auto& item : items) {
    if (!line.empty() && line.size() + 3 + item.size() > 80) {
      lines += kBr + font(esc(line), kGray, 10);
      line.clear();
    }
    line += (line.empty() ? "" : " \u00b7 ") + item;
  }
  if (!line.empty()) lines += kBr + font(esc(line), kGray, 10);
  std::string verdict;
  if (f.status == "pass") {
    std::string checks;
    for (const auto& c : f.passed_checks) checks += (checks.empty() ? "" : " \u00b7 ") + c;
    verdict = font(esc("\u2713 pass" + (checks.empty() ? "" : ": " + checks)), kGreen, 11);
  } else if (f.status == "unchecked") {
    std::string checks;
    for (const auto& c : f.unchecked_checks) checks += (checks.empty() ? "" : ", ") + c;
    verdict = font(esc("? unchecked (no oracle value)" + (checks.empty() ? "" : ": " + checks)), kGray, 11);
  } else if (f.status == "fail") {
    std::string checks;
    for (const auto& c : f.failed_checks) checks += (checks.empty() ? "" : ", ") + c;
    verdict = font(bold("\u2717 fail" + (checks.empty() ? "" : ": " + checks)), kRed, 11);
  } else if (f.status == "error") {
    verdict = font(bold("\u2717 error" + (f.error_kind.empty() ? "" : ": " + f.error_kind)), kRed, 11);
  }
  std::string out = font(bold(f.name), "", 16) + lines;
  if (!view_line.empty()) out += kBr + font(esc(view_line), kGray, 10);
  if (!verdict.empty()) out += kBr + verdict;
  return out;
}

// The red note of a failed or erroneous run; empty for a pass.
std::string status_note(const Facts& f, bool list_all_failures) {
  std::string body;
  if (f.status == "fail") {
    body = font(bold("\u2717 the run fails its checks"), kRed, 11);
    for (const auto& c : f.failed_checks) body += kBr + font(esc("failed: " + c), kRed, 10);
    const auto& listed = list_all_failures ? f.all_failures : f.other_failures;
    const size_t marked = f.all_failures.size() - f.other_failures.size();  // attached to a node
    if (marked > 0) {
      body += kBr + font(esc(std::to_string(marked) + (marked == 1 ? " problem" : " problems") +
                             " marked in red on the diagram"), kRed, 9);
    }
    for (const auto& m : listed) {
      bool first = true;
      for (const auto& line : wrap(m, 56)) {
        body += kBr + font(esc((first ? "\u2022 " : "  ") + line), kRed, 9);
        first = false;
      }
    }
  } else if (f.status == "error") {
    body = font(bold("\u2717 error" + (f.error_kind.empty() ? "" : ": " + f.error_kind)), kRed, 11);
    for (const auto& line : wrap(f.error_message, 56)) body += kBr + font(esc(line), kRed, 10);
  }
  if (body.empty()) return "";
  return node_line("status", {{"label", html_value(body)},
                              {"shape", "note"},
                              {"style", "filled"},
                              {"color", kRed},
                              {"fillcolor", "#fff0f0"},
                              {"penwidth", "2"},
                              {"margin", "0.15,0.08"}},
                   "  ");
}

// Node roles and step kinds in two columns (one, under each other, for the rank view: it is
// wide enough), then a line on edges; invisible edges stack them.
std::string legend(bool with_op, bool one_column) {
  std::vector<std::pair<std::string, Attrs>> roles = {
      {"input", node_attrs(Role::Input, bold("input") + kBr + mono("[S(0)]", "#08306b", 9))},
      {"value", node_attrs(Role::Value, bold("value") + " " + font("global shape", kGray, 9) + kBr +
                                            mono("spec", "#08306b", 9))},
  };
  if (with_op) roles.push_back({"op", node_attrs(Role::Op, bold("op") + kBr + small("rule per axis"))});
  roles.push_back({"grad", node_attrs(Role::Grad, bold("gradient") + kBr + small("tracked placement"))});
  roles.push_back({"input grad", node_attrs(Role::InputGrad, bold("input gradient") + kBr +
                                                                 small("tracked vs cotangent"))});
  roles.push_back({"failing", node_attrs(Role::Value, font(bold("fails a check"), kRed), true)});
  std::vector<std::pair<std::string, Attrs>> steps;
  for (const auto& s : kCollectives) steps.push_back({s.name, step_attrs(s.name, font(bold(s.name), s.line))});
  steps.push_back({kLocalStep.name, step_attrs("", bold("local step") + kBr + small("no data moved"))});

  std::string body;
  std::string order;
  auto column = [&](const std::vector<std::pair<std::string, Attrs>>& nodes) {
    std::string chain;
    for (const auto& [name, attrs] : nodes) {
      Attrs a = attrs;
      a.emplace_back("fontsize", "9");
      body += node_line("legend:" + name, a);
      chain += (chain.empty() ? "    " : " -> ") + quote("legend:" + name);
    }
    order += chain + " [style=\"invis\"];\n";
    return "legend:" + nodes.back().first;
  };
  if (one_column) {
    roles.insert(roles.end(), steps.begin(), steps.end());
    steps.clear();
  }
  const std::string last_role = column(roles);
  const std::string last_step = steps.empty() ? last_role : column(steps);
  const std::string edges_html =
      font(esc("\u2500\u2500\u2192  forward"), "#525252", 9) + kBr +
      font(esc("- - \u2192  backward"), kBackwardEdge, 9) + kBr +
      font(esc("bold colored edge: a collective,"), kGray, 9) + kBr +
      font(esc("labelled with bytes moved per rank"), kGray, 9);
  body += node_line("legend:edges", {{"label", html_value(edges_html)}, {"shape", "plaintext"}});
  // Below the longer column, so that both start on the first row.
  order += "    " + quote(roles.size() >= steps.size() ? last_role : last_step) + " -> " + quote("legend:edges") +
           " [style=\"invis\"];\n";
  return cluster("legend",
                 {{"label", "legend"}, {"style", "rounded"}, {"color", "#bdbdbd"}, {"fontcolor", kGray},
                  {"fontsize", "11"}},
                 body + order);
}

// Above this many nodes, dot's network simplex that places nodes sideways stops after
// 0.1 x (its graph's nodes) iterations instead of running to the optimum: a 1000-op trace then lays
// out in about 1.5 s of CPU instead of 6 (bench/bench_render.cpp), with slightly less straight edges.
constexpr size_t kLargeDiagramNodes = 1000;

std::string graph_header(const std::string& title_html, size_t nodes) {
  Attrs large;
  if (nodes > kLargeDiagramNodes) large = {{"nslimit", "0.1"}};
  std::string out = "digraph trace {\n";
  out += "  graph" +
         attr_list({{"rankdir", "TB"},
                    {"label", html_value(title_html)},
                    {"labelloc", "t"},
                    {"fontname", kFont},
                    {"nodesep", "0.3"},
                    {"ranksep", "0.38"},
                    {"pad", "0.25"},
                    {"newrank", "true"},
                    {"bgcolor", "white"}}) +
         (large.empty() ? "" : attr_list(large).insert(0, ";\n  graph")) + ";\n";
  out += "  node" + attr_list({{"fontname", kFont}, {"fontsize", "10"}, {"margin", "0.1,0.04"}}) + ";\n";
  out += "  edge" + attr_list({{"fontname", kFont}, {"fontsize", "9"}, {"color", "#525252"},
                               {"arrowsize", "0.7"}}) + ";\n";
  return out;
}

// ---------------------------------------------------------------------------------------------
// The program as written, for a run that stopped before its first event
// ---------------------------------------------------------------------------------------------

std::string sketch(const Facts& f, std::string& edges) {
  // The op the error names: "y: ..." by its output, "add: ..." by its kind when only one op has it.
  const auto colon = f.error_message.find(": ");
  const std::string subject = colon == std::string::npos ? "" : f.error_message.substr(0, colon);
  int culprit = -1, same_kind = 0, kind_at = -1;
  for (size_t i = 0; i < f.program.size(); ++i) {
    const json& op = f.program[i];
    if (!op.is_object()) continue;
    if (op.value("out", json()) == subject && !subject.empty()) culprit = static_cast<int>(i);
    if (op.value("op", json()) == subject && !subject.empty()) {
      ++same_kind;
      kind_at = static_cast<int>(i);
    }
  }
  if (culprit < 0 && same_kind == 1) culprit = kind_at;

  std::string body;
  std::set<std::string> drawn;
  for (const auto& in : f.inputs) {
    if (!in.is_object() || !in.value("name", json()).is_string()) continue;
    const std::string name = in["name"].get<std::string>();
    bool ok = true;
    const auto shape = ints_of_json(in.value("shape", json()), &ok);
    std::string label = bold(name);
    if (ok) label += " " + font(esc(shape_str(shape)), kGray, 9);
    label += kBr + mono(spec_of_json(in.value("placements", json())));
    body += node_line(value_id(name), node_attrs(Role::Input, label));
    drawn.insert(name);
  }
  for (size_t i = 0; i < f.program.size(); ++i) {
    const json& op = f.program[i];
    if (!op.is_object()) continue;
    const std::string id = "p" + std::to_string(i);
    std::string label = bold(show(op.value("op", json("?"))));
    if (op.value("placements", json()).is_array()) label += kBr + mono("\u2192 " + spec_of_json(op["placements"]));
    const bool failing = static_cast<int>(i) == culprit;
    if (failing) label += error_lines({f.error_message}, 36);
    body += node_line(id, node_attrs(Role::Op, label, failing));
    if (op.value("args", json()).is_array()) {
      for (const auto& a : op["args"]) {
        const std::string arg = show(a);
        if (!drawn.count(arg)) {
          body += node_line(value_id(arg), node_attrs(Role::Ghost, esc(arg)));
          drawn.insert(arg);
        }
        edges += "  " + quote(value_id(arg)) + " -> " + quote(id) + ";\n";
      }
    }
    std::vector<std::string> outs;
    const json out = op.value("out", json());
    if (out.is_string()) outs.push_back(out.get<std::string>());
    if (out.is_array())
      for (const auto& o : out) outs.push_back(show(o));
    for (const auto& o : outs) {
      if (!drawn.count(o)) body += node_line(value_id(o), node_attrs(Role::Value, bold(o)));
      drawn.insert(o);
      edges += "  " + quote(id) + " -> " + quote(value_id(o)) + ";\n";
    }
  }
  return cluster("program",
                 {{"label", "program as written (the run stopped before its first event)"},
                  {"style", "rounded,dashed"},
                  {"color", "#969696"},
                  {"fontcolor", kGray}},
                 body);
}

// ---------------------------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------------------------

struct GvcDeleter {
  void operator()(GVC_t* gvc) const { gvFreeContext(gvc); }
};
struct GraphDeleter {
  void operator()(Agraph_t* graph) const { agclose(graph); }
};

std::string extension(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const auto dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  return path.substr(dot + 1);
}

}  // namespace

RenderView parse_render_view(const std::string& text) {
  if (text == "logical") return RenderView::Logical;
  if (text == "ranks") return RenderView::Ranks;
  throw std::invalid_argument("unknown view \"" + text + "\" (use logical or ranks)");
}

const char* render_view_name(RenderView view) { return view == RenderView::Ranks ? "ranks" : "logical"; }

std::string render_dot(const Trace& trace, RenderView view) {
  const Facts facts = facts_of(trace);
  std::string body, view_line, sketch_edges;
  const bool program_only = trace.events.empty() && !facts.program.empty();
  if (program_only) {
    body = sketch(facts, sketch_edges) + sketch_edges;
  } else if (view == RenderView::Ranks) {
    RankViewText ranks = rank_view(trace, facts);
    view_line = ranks.view_line;
    body = ranks.body;
  } else {
    body = logical_view(trace, facts);
  }
  size_t nodes = 0;
  for (auto at = body.find(" [label="); at != std::string::npos; at = body.find(" [label=", at + 1)) ++nodes;
  std::string out = graph_header(title(trace, facts, view_line), nodes);
  out += status_note(facts, view == RenderView::Ranks);
  out += body;
  out += legend(view == RenderView::Logical || program_only, view == RenderView::Ranks && !program_only);
  return out + "}\n";
}

std::string layout_dot(const std::string& dot, const std::string& format, const std::string& what) {
  std::unique_ptr<GVC_t, GvcDeleter> gvc(gvContext());
  std::unique_ptr<Agraph_t, GraphDeleter> graph(agmemread(dot.c_str()));
  if (!gvc || !graph) throw InputError(what, "", "graphviz could not read the diagram");
  if (gvLayout(gvc.get(), graph.get(), "dot") != 0) throw InputError(what, "", "graphviz layout failed");
  char* data = nullptr;
  unsigned int length = 0;
  const int rc = gvRenderData(gvc.get(), graph.get(), format.c_str(), &data, &length);
  std::string rendered = rc == 0 && data ? std::string(data, length) : std::string();
  gvFreeRenderData(data);
  gvFreeLayout(gvc.get(), graph.get());
  if (rendered.empty()) throw InputError(what, "", "graphviz could not render " + format);
  return rendered;
}

void render_to_file(const Trace& trace, const std::string& out_path, RenderView view) {
  const std::string format = extension(out_path);
  if (format != "dot" && format != "svg" && format != "png") {
    throw InputError(out_path, "", "unknown output format \"" + format + "\" (use .svg, .png or .dot)");
  }
  const std::string dot = render_dot(trace, view);
  const std::string bytes = format == "dot" ? dot : layout_dot(dot, format, out_path);
  write_file_atomically(out_path, bytes);
}

}  // namespace meshsim
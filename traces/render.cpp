#include "traces/render.h"

#include <graphviz/gvc.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/mesh.h"

namespace meshsim {

using nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------
// DOT text
// ---------------------------------------------------------------------------------------------

using Attrs = std::vector<std::pair<std::string, std::string>>;

// An attribute value that starts with this byte is an HTML-like label, written as <...>.
constexpr char kHtmlMark = '\x01';
std::string html_value(const std::string& body) { return std::string(1, kHtmlMark) + body; }

// A DOT string literal: quotes and backslashes escaped, newlines as DOT line breaks.
std::string quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string attr_value(const std::string& value) {
  if (!value.empty() && value[0] == kHtmlMark) return "<" + value.substr(1) + ">";
  return quote(value);
}

std::string attr_list(const Attrs& attrs) {
  std::string out;
  for (const auto& [key, value] : attrs) out += (out.empty() ? "" : ", ") + key + "=" + attr_value(value);
  return " [" + out + "]";
}

// Text inside an HTML-like label: markup characters escaped, newlines as line breaks.
std::string esc(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\n': out += "<BR/>"; break;
      default: out += c;
    }
  }
  return out;
}

constexpr const char* kFont = "Helvetica";
constexpr const char* kMono = "Courier";
constexpr const char* kGray = "#666666";
constexpr const char* kLightGray = "#8c8c8c";
constexpr const char* kRed = "#d7191c";
constexpr const char* kGreen = "#1a9641";
constexpr const char* kBackwardEdge = "#9e4a73";

// <FONT ...>html</FONT>; html is already escaped.
std::string font(const std::string& html, const std::string& color, int size = 0,
                 const std::string& face = "") {
  if (html.empty()) return "";  // graphviz refuses an empty <FONT></FONT>
  std::string open = "<FONT";
  if (!color.empty()) open += " COLOR=\"" + color + "\"";
  if (size > 0) open += " POINT-SIZE=\"" + std::to_string(size) + "\"";
  if (!face.empty()) open += " FACE=\"" + face + "\"";
  return open + ">" + html + "</FONT>";
}
std::string bold(const std::string& text) { return "<B>" + esc(text) + "</B>"; }
std::string mono(const std::string& text, const std::string& color = "#08306b", int size = 0) {
  return font(esc(text), color, size, kMono);
}
std::string small(const std::string& text, const std::string& color = kGray, int size = 8) {
  return font(esc(text), color, size);
}
constexpr const char* kBr = "<BR/>";

// Words joined into lines of at most `width` characters (a longer word gets its own line).
std::vector<std::string> wrap(const std::string& text, size_t width) {
  std::vector<std::string> lines;
  std::string line, word;
  auto flush_word = [&] {
    if (word.empty()) return;
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      lines.push_back(line);
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    word.clear();
  };
  for (char c : text) {
    if (c == ' ' || c == '\n') {
      flush_word();
      if (c == '\n' && !line.empty()) {
        lines.push_back(line);
        line.clear();
      }
    } else {
      word += c;
    }
  }
  flush_word();
  if (!line.empty()) lines.push_back(line);
  return lines;
}

// Red lines "✗ message", wrapped.
std::string error_lines(const std::vector<std::string>& messages, size_t width = 40) {
  std::string out;
  for (const auto& m : messages) {
    bool first = true;
    for (const auto& line : wrap(m, width)) {
      out += kBr + font(esc((first ? "\u2717 " : "   ") + line), kRed, 9);
      first = false;
    }
  }
  return out;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string out;
  for (int64_t d : shape) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return "[" + out + "]";
}

// "384 B", "1.5 KiB", "2 MiB"
std::string bytes_str(int64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = -1;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  std::string num = buf;
  if (num.size() > 2 && num.compare(num.size() - 2, 2, ".0") == 0) num.resize(num.size() - 2);
  return num + " " + units[u];
}

std::string arrows(std::string text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 2, "->") == 0) {
      out += "\u2192";
      ++i;
    } else {
      out += text[i];
    }
  }
  return out;
}

std::string show(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// ["S(0)", "R"] -> "[S(0), R]"; anything else -> "".
std::string spec_of_json(const json& placements) {
  if (!placements.is_array()) return "";
  std::string out;
  for (const auto& p : placements) out += (out.empty() ? "" : ", ") + show(p);
  return "[" + out + "]";
}

std::vector<int64_t> ints_of_json(const json& v, bool* ok) {
  std::vector<int64_t> out;
  *ok = v.is_array();
  if (!*ok) return out;
  for (const auto& d : v) {
    if (!d.is_number_integer()) {
      *ok = false;
      return {};
    }
    out.push_back(d.get<int64_t>());
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Styles: one row per collective kind, one per node role
// ---------------------------------------------------------------------------------------------

struct StepStyle {
  const char* name;
  const char* fill;
  const char* line;   // border, edge and byte-label color
};
constexpr StepStyle kCollectives[] = {
    {"all_gather", "#b8e3b0", "#1b7837"},
    {"reduce_scatter", "#fdd0a2", "#d94801"},
    {"all_reduce", "#d9c8ea", "#6a3d9a"},
    {"all_to_all", "#b3d7ee", "#1f68b4"},
};
constexpr StepStyle kLocalStep = {"local step", "#ececec", "#737373"};

// The outline of a step: all_gather widens downwards, reduce_scatter narrows, all_to_all leans.
Attrs step_shape(const std::string& name) {
  if (name == "all_gather") return {{"shape", "polygon"}, {"sides", "4"}, {"distortion", "-0.18"}};
  if (name == "reduce_scatter") return {{"shape", "polygon"}, {"sides", "4"}, {"distortion", "0.18"}};
  if (name == "all_to_all") return {{"shape", "polygon"}, {"sides", "4"}, {"skew", "0.25"}};
  if (name == "all_reduce") return {{"shape", "hexagon"}};
  return {{"shape", "box"}};
}

const StepStyle& step_style(const std::string& name) {
  for (const auto& row : kCollectives)
    if (name == row.name) return row;
  return kLocalStep;
}
bool is_collective_name(const std::string& name) { return &step_style(name) != &kLocalStep; }

enum class Role { Input, Value, Implicit, Op, Seed, Grad, InputGrad, Ghost };

Attrs role_style(Role role) {
  switch (role) {
    case Role::Input:
      return {{"shape", "box"}, {"style", "rounded,filled"}, {"fillcolor", "#cfe1f3"}, {"color", "#3b6a9a"}};
    case Role::Value:
      return {{"shape", "box"}, {"style", "rounded,filled"}, {"fillcolor", "#eef5fc"}, {"color", "#3b6a9a"}};
    case Role::Implicit:
      return {{"shape", "box"}, {"style", "rounded,dashed,filled"}, {"fillcolor", "#ffffff"}, {"color", "#3b6a9a"}};
    case Role::Op:
      return {{"shape", "ellipse"}, {"style", "filled"}, {"fillcolor", "#fff4c2"}, {"color", "#a67c00"}};
    case Role::Seed:
      return {{"shape", "box"}, {"style", "rounded,filled"}, {"fillcolor", "#f9cfbf"}, {"color", kBackwardEdge}};
    case Role::Grad:
      return {{"shape", "box"}, {"style", "rounded,filled"}, {"fillcolor", "#fbe6f0"}, {"color", kBackwardEdge}};
    case Role::InputGrad:
      return {{"shape", "box"}, {"style", "rounded,filled"}, {"fillcolor", "#f6cce0"}, {"color", kBackwardEdge},
              {"peripheries", "2"}};
    case Role::Ghost:
      return {{"shape", "box"}, {"style", "rounded,dashed"}, {"color", "#bdbdbd"}, {"fontcolor", kLightGray}};
  }
  return {};
}

const Attrs kFailing = {{"color", kRed}, {"penwidth", "3"}};

Attrs node_attrs(Role role, const std::string& html_label, bool failing = false, const Attrs& extra = {}) {
  Attrs attrs = {{"label", html_value(html_label)}};
  for (const auto& a : role_style(role)) {
    if (failing && a.first == "color") continue;
    attrs.push_back(a);
  }
  if (failing) attrs.insert(attrs.end(), kFailing.begin(), kFailing.end());
  attrs.insert(attrs.end(), extra.begin(), extra.end());
  return attrs;
}

Attrs step_attrs(const std::string& name, const std::string& html_label, const Attrs& extra = {}) {
  const StepStyle& s = step_style(name);
  Attrs attrs = {{"label", html_value(html_label)}};
  for (const auto& a : step_shape(name)) attrs.push_back(a);
  attrs.insert(attrs.end(), {{"style", "filled"},
                 {"fillcolor", s.fill},
                 {"color", s.line},
                 {"penwidth", is_collective_name(name) ? "1.5" : "1"},
                 {"margin", "0.12,0.04"}});
  attrs.insert(attrs.end(), extra.begin(), extra.end());
  return attrs;
}

// The style of an edge leaving a step: a collective's edge is bold, in its color.
Attrs step_out_edge(const Event& e, bool with_bytes) {
  if (!is_collective_name(e.name) || e.kind != "collective") return {};
  const StepStyle& s = step_style(e.name);
  Attrs attrs = {{"color", s.line}, {"penwidth", "2.2"}};
  if (with_bytes) {
    // An external label: a real edge label doubles dot's ranks, and the layout time with them.
    attrs.emplace_back("xlabel", " " + bytes_str(e.bytes) + "/rank ");
    attrs.emplace_back("fontcolor", s.line);
  }
  return attrs;
}

std::string node_line(const std::string& id, const Attrs& attrs, const std::string& indent = "    ") {
  return indent + quote(id) + attr_list(attrs) + ";\n";
}

std::string cluster(const std::string& name, const Attrs& attrs, const std::string& body,
                    const std::string& indent = "  ") {
  if (body.empty()) return "";
  std::string out = indent + "subgraph " + quote("cluster_" + name) + " {\n";
  for (const auto& [key, value] : attrs) out += indent + "  " + key + "=" + attr_value(value) + ";\n";
  return out + body + indent + "}\n";
}

// ---------------------------------------------------------------------------------------------
// What the diagram needs to know besides the events: mesh, shapes, gradients, verdicts
// ---------------------------------------------------------------------------------------------

// An LTensor's spec in a trace ("variant=[...] reduced=[...]"), not a DTensor placement list.
bool is_ltensor_spec(const std::string& spec) { return spec.compare(0, 8, "variant=") == 0; }

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
  json program = json::array();  // the scenario's program, for implicit operands and sketches
  json inputs = json::array();
};

Mesh mesh_of(const Trace& t, bool* from_scenario) {
  *from_scenario = false;
  const json mesh = t.scenario.is_object() ? t.scenario.value("mesh", json()) : json();
  if (mesh.is_object() && mesh.value("axes", json()).is_array()) {
    bool ok = true;
    std::vector<int64_t> shape = ints_of_json(mesh.value("shape", json()), &ok);
    std::vector<std::string> axes;
    for (const auto& a : mesh["axes"]) {
      if (!a.is_string()) ok = false;
      else axes.push_back(a.get<std::string>());
    }
    int64_t size = 1;
    for (int64_t d : shape) {
      if (d < 1 || d > (int64_t{1} << 24)) ok = false;
      else size *= d;
      if (size > (int64_t{1} << 24)) ok = false;
    }
    if (ok) {
      try {
        Mesh m(axes, shape);
        *from_scenario = true;
        return m;
      } catch (const std::invalid_argument&) {
      }
    }
  }
  size_t ranks = 1;
  for (const auto& e : t.events) ranks = std::max(ranks, e.local_shapes.size());
  return Mesh({"rank"}, {static_cast<int64_t>(ranks)});
}

// "rank 3 holds ..." -> 3, else -1.
int64_t rank_named(const std::string& message) {
  const std::string prefix = "rank ";
  if (message.compare(0, prefix.size(), prefix) != 0) return -1;
  size_t i = prefix.size();
  int64_t rank = 0;
  bool digits = false;
  while (i < message.size() && std::isdigit(static_cast<unsigned char>(message[i])) && rank < (1 << 30)) {
    rank = rank * 10 + (message[i++] - '0');
    digits = true;
  }
  return digits && message.compare(i, 6, " holds") == 0 ? rank : -1;
}

Facts facts_of(const Trace& t) {
  Facts f;
  f.mesh = mesh_of(t, &f.mesh_from_scenario);
  const json& sc = t.scenario;
  const json& r = t.result;
  if (sc.is_object() && sc.value("name", json()).is_string()) f.name = sc["name"].get<std::string>();
  else if (r.is_object() && r.value("name", json()).is_string()) f.name = r["name"].get<std::string>();
  if (sc.is_object() && sc.value("program", json()).is_array()) f.program = sc["program"];
  if (sc.is_object() && sc.value("inputs", json()).is_array()) f.inputs = sc["inputs"];

  // Global shapes: the result's values, else the scenario's (global) inputs.
  for (const auto& in : f.inputs) {
    if (!in.is_object() || !in.value("name", json()).is_string() || in.value("from_local", false) == true) continue;
    bool ok = true;
    auto shape = ints_of_json(in.value("shape", json()), &ok);
    if (ok) f.global_shape[in["name"].get<std::string>()] = shape;
  }
  if (!r.is_object()) return f;
  if (r.value("values", json()).is_object()) {
    for (const auto& [name, v] : r["values"].items()) {
      bool ok = v.is_object();
      auto shape = ok ? ints_of_json(v.value("shape", json()), &ok) : std::vector<int64_t>{};
      if (ok) f.global_shape[name] = shape;
    }
  }
  if (r.value("grads", json()).is_object()) {
    for (const auto& [name, g] : r["grads"].items()) {
      if (!g.is_object()) continue;
      f.grads[name] = {spec_of_json(g.value("placements", json())), spec_of_json(g.value("cotangent", json()))};
    }
  }
  f.status = show(r.value("status", json("")));
  if (r.value("checks", json()).is_object()) {
    for (const auto& [name, ok] : r["checks"].items())
      (ok == true ? f.passed_checks : ok.is_null() ? f.unchecked_checks : f.failed_checks).push_back(name);
  }
  const json error = r.value("error", json());
  if (error.is_object()) {
    f.error_kind = show(error.value("kind", json("")));
    f.error_message = show(error.value("message", json("")));
  } else if (!error.is_null()) {
    f.error_message = show(error);
  }

  // Which values and input gradients the events draw, to attach each failure to its node.
  std::set<std::string> values, input_grads;
  for (const auto& e : t.events) {
    if (e.phase == "forward" && (e.kind == "input" || e.kind == "op")) {
      values.insert(e.value);
      if (!is_ltensor_spec(e.out_spec)) f.dtensor_values.insert(e.value);
    }
    if (e.kind == "input_grad") input_grads.insert(e.value);
  }
  if (r.value("failures", json()).is_array()) {
    for (const auto& line_json : r["failures"]) {
      const std::string line = show(line_json);
      f.all_failures.push_back(line);
      const auto colon = line.find(": ");
      std::string subject = colon == std::string::npos ? "" : line.substr(0, colon);
      std::string message = colon == std::string::npos ? line : line.substr(colon + 2);
      // "untracked: total: ...": a category first, then the value.
      const auto inner = message.find(": ");
      if (!values.count(subject) && subject.compare(0, 5, "grad ") != 0 && inner != std::string::npos &&
          values.count(message.substr(0, inner))) {
        const std::string category = subject;
        subject = message.substr(0, inner);
        message = category + ": " + message.substr(inner + 2);
      }
      if (subject.compare(0, 5, "grad ") == 0 && input_grads.count(subject.substr(5))) {
        f.grad_errors[subject.substr(5)].push_back(message);
      } else if (input_grads.count(subject) && message.compare(0, 11, "gradient is") == 0) {
        f.grad_errors[subject].push_back(message);
      } else if (values.count(subject)) {
        f.value_errors[subject].push_back(message);
        const int64_t rank = rank_named(message);
        if (rank >= 0) f.rank_errors[subject][rank].push_back(message);
      } else {
        f.other_failures.push_back(line);
      }
    }
  }
  // A value whose variance tracking was lost (an unregistered communicating Function).
  if (r.value("values", json()).is_object()) {
    for (const auto& [name, v] : r["values"].items()) {
      if (v.is_object() && v.value("untracked", false) == true && values.count(name))
        f.value_errors[name].push_back("untracked: its variant and reduced sets are unknown");
    }
  }
  return f;
}

bool digits_only(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

// The names the runtime gives an op's operand, OUT.SUFFIX (user value names hold no '.'):
//   OUT.argK                 argument K of program op OUT, redistributed for it (sim/runtime.cpp)
//   OUT.inK                  argument K of local_map OUT, moved to its in_placements (sim/interpreter.cpp)
//   OUT.inK.AXIS             made varying over AXIS in the body (sim/local_map.cpp)
//   OUT.inK.invariant.AXIS   cast reduced -> invariant over AXIS in the body (sim/local_map.cpp)
struct ImplicitName {
  std::string of, operand, axis;
  bool redistributed = false;  // argK or inK
  bool invariant_cast = false;
};

std::optional<ImplicitName> parse_implicit(const std::string& name) {
  const auto dot = name.find('.');
  if (dot == std::string::npos || dot == 0) return std::nullopt;
  ImplicitName n;
  n.of = name.substr(0, dot);
  const std::string rest = name.substr(dot + 1);
  if (rest.compare(0, 3, "arg") == 0 && digits_only(rest.substr(3))) {
    n.operand = rest.substr(3);
    n.redistributed = true;
    return n;
  }
  if (rest.compare(0, 2, "in") != 0) return std::nullopt;
  const auto end = rest.find('.');
  n.operand = rest.substr(2, end == std::string::npos ? std::string::npos : end - 2);
  if (!digits_only(n.operand) || n.operand.size() > 6) return std::nullopt;
  if (end == std::string::npos) {
    n.redistributed = true;
    return n;
  }
  n.axis = rest.substr(end + 1);
  if (n.axis.compare(0, 10, "invariant.") == 0) {
    n.invariant_cast = true;
    n.axis = n.axis.substr(10);
  }
  if (n.axis.empty()) return std::nullopt;
  return n;
}

bool is_implicit(const std::string& name) { return parse_implicit(name).has_value(); }

// The operand a redistributed implicit value ("y.arg1", "y.in1") stands for: argument 1 of the
// program op producing y; "" for the others.
std::string implicit_source(const Facts& f, const std::string& name) {
  const auto n = parse_implicit(name);
  if (!n || !n->redistributed || n->operand.size() > 6) return "";
  const size_t k = std::stoul(n->operand);
  for (const auto& op : f.program) {
    if (!op.is_object() || op.value("out", json()) != n->of) continue;
    const json args = op.value("args", json());
    if (args.is_array() && k < args.size() && args[k].is_string()) return args[k].get<std::string>();
  }
  return "";
}

// "w as operand 1 of y", "operand 1 of y, over dp"
std::string implicit_text(const Facts& f, const std::string& name) {
  const auto n = parse_implicit(name);
  if (!n) return "";
  if (n->redistributed) {
    const std::string src = implicit_source(f, name);
    return (src.empty() ? "" : src + " as ") + "operand " + n->operand + " of " + n->of;
  }
  return "operand " + n->operand + " of " + n->of + (n->invariant_cast ? ", cast reduced -> invariant over " : ", over ") +
         n->axis;
}


// "mm: S(0), R -> S(0); mm: R, S(1) -> S(1)" -> one line per mesh axis, "dp: S(0), R → S(0)".
std::vector<std::string> rule_lines(const Event& e, const Mesh& mesh) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= e.note.size()) {
    const auto end = e.note.find("; ", start);
    parts.push_back(e.note.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 2;
  }
  std::vector<std::string> out;
  const bool per_axis = parts.size() == mesh.axes().size() && parts.size() > 1;
  for (size_t i = 0; i < parts.size(); ++i) {
    std::string p = parts[i];
    const std::string prefix = e.name + ": ";
    if (p.compare(0, prefix.size(), prefix) == 0) p = p.substr(prefix.size());
    if (p.empty()) continue;
    out.push_back((per_axis ? mesh.axes()[i] + ": " : "") + arrows(p));
  }
  return out;
}

// "grad hook: [P(sum)] -> cotangent of [R]" -> "grad hook";
// "backward of redistribute [S(0)] -> [Rd]" -> "backward of redistribute"
std::string note_tag(const std::string& note) {
  const auto cut = note.find_first_of(":[");
  std::string tag = cut == std::string::npos ? note : note.substr(0, cut);
  while (!tag.empty() && tag.back() == ' ') tag.pop_back();
  if (tag.size() > 40) tag = tag.substr(0, 37) + "...";
  return tag;
}

// "[S(0)] → [R]", or "[R]" when the step does not record its source.
std::string transition(const Event& e) {
  return e.in_specs.empty() ? e.out_spec : e.in_specs.front() + " \u2192 " + e.out_spec;
}

std::string step_label(const Event& e) {
  const StepStyle& s = step_style(e.name);
  std::string label = font(bold(e.name), is_collective_name(e.name) ? s.line : "#333333");
  if (!e.axis.empty()) label += " " + font(esc(e.axis), kGray);
  if (!e.out_spec.empty() || !e.in_specs.empty()) label += kBr + mono(transition(e), "#222222", 9);
  if (!e.note.empty() && e.phase == "backward") label += kBr + small(note_tag(e.note));
  return label;
}

// Local shapes as text: "[2, 16]" when every rank agrees, "[3, 4] / [2, 4]" otherwise.
std::string local_shapes_str(const Event& e) {
  std::vector<const std::vector<int64_t>*> distinct;
  for (const auto& s : e.local_shapes) {
    bool seen = false;
    for (const auto* d : distinct) seen = seen || *d == s;
    if (!seen) distinct.push_back(&s);
    if (distinct.size() > 3) break;
  }
  std::string out;
  for (size_t i = 0; i < distinct.size() && i < 3; ++i) out += (i ? " / " : "") + shape_str(*distinct[i]);
  if (distinct.size() > 3) out += " / ...";
  return out;
}

std::string event_id(const Event& e) { return "e" + std::to_string(e.seq); }
std::string value_id(const std::string& name) { return "v:" + name; }

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

// Two columns, node roles and step kinds, then a line on edges; invisible edges stack them.
std::string legend(bool with_op) {
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
  const std::string last_role = column(roles);
  const std::string last_step = column(steps);
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

// The redistribution steps waiting for the op that consumes `value`, removed from `pending`
// (both views draw a chain of steps where its consumer is drawn).
std::vector<const Event*> take_pending(std::map<std::string, std::vector<const Event*>>& pending,
                                       const std::string& value) {
  auto it = pending.find(value);
  if (it == pending.end()) return {};
  auto chain = std::move(it->second);
  pending.erase(it);
  return chain;
}

// ---------------------------------------------------------------------------------------------
// The logical view
// ---------------------------------------------------------------------------------------------

class Logical {
 public:
  Logical(const Trace& trace, const Facts& facts) : f_(facts) {
    for (const auto& e : trace.events) add(e);
    // Steps no op consumed, in event order.
    std::vector<const Event*> left;
    for (const auto& [value, chain] : pending_) left.insert(left.end(), chain.begin(), chain.end());
    std::sort(left.begin(), left.end(), [](const Event* a, const Event* b) { return a->seq < b->seq; });
    for (const Event* step : left) step_node(*step);
  }

  std::string body() const {
    std::string forward = forward_;
    for (size_t k = 0; k < bodies_.size(); ++k) {
      forward += cluster("local_map" + std::to_string(k),
                         {{"label", html_value(font(bold("local_map"), "#6a51a3", 11))},
                          {"labeljust", "l"},
                          {"tooltip", "a local_map body: its values are LTensors, with variant / reduced mesh axes"},
                          {"style", "rounded,dashed,filled"},
                          {"fillcolor", "#faf7fd"},
                          {"color", "#8c6bb1"}},
                         bodies_[k], "    ");
    }
    std::string out;
    out += cluster("forward",
                   {{"label", "forward"}, {"labeljust", "l"}, {"style", "rounded"}, {"color", "#a8a8a8"},
                    {"fontcolor", kGray}},
                   forward);
    out += cluster("backward",
                   {{"label", "backward"}, {"labeljust", "l"}, {"style", "rounded,dashed"}, {"color", "#a8a8a8"},
                    {"fontcolor", kGray}},
                   backward_);
    return out + edges_;
  }

 private:
  void add(const Event& e) {
    const bool forward = e.phase == "forward";
    if (e.kind == "collective" || e.kind == "local") return forward ? forward_step(e) : backward_step(e);
    if (forward) return e.kind == "input" ? void(value(e, Role::Input)) : op(e);
    if (e.kind == "seed") return seed(e);
    if (e.kind == "input_grad") return input_grad(e);
    grad(e);
  }

  // Forward nodes go to the local_map body being drawn, if any.
  std::string& forward_body() { return in_body_ ? bodies_.back() : forward_; }

  // ---- forward: values, ops, and the steps of each redistribution on the path from its operand

  // A forward step is drawn when an op consumes it, in the cluster of that op.
  void forward_step(const Event& e) {
    out_edge_[event_id(e)] = step_out_edge(e, true);
    pending_[e.value].push_back(&e);
  }
  void step_node(const Event& e, const std::string& as_op = "") {
    std::string label = step_label(e);
    if (!as_op.empty()) label += kBr + small("as " + as_op);
    node(forward_body(), event_id(e), step_attrs(e.name, label, tooltip(e)));
  }

  void op(const Event& e) {
    if (e.name == "enter_local_map" && !in_body_) {
      bodies_.emplace_back();
      in_body_ = true;
    }
    if (e.name == "leave_local_map") in_body_ = false;
    if (e.name == "redistribute") {
      const auto chain = take(e.value);
      const std::string src = value_ref(e.args.empty() ? "" : e.args.front());
      const std::string id = value(e, is_implicit(e.value) ? Role::Implicit : Role::Value);
      if (chain.empty()) {
        edge(src, id, {{"xlabel", " redistribute \n (no data moved) "}, {"fontcolor", kGray}});
      } else {
        draw_chain(src, chain, id);
      }
      return;
    }
    // Steps recorded under this op's own value (a collective inside a local_map body, or older
    // traces): they start from the operand whose spec is the chain's source spec.
    const auto own = take(e.value);
    const std::string via = own.empty() ? "" : chained_arg(e, *own.front());
    // An op that only wraps its collective ("all_gather_to_reduced" after an all_gather step) is
    // drawn as that step.
    if (!own.empty() && e.name.compare(0, own.back()->name.size(), own.back()->name) == 0 &&
        is_collective_name(own.back()->name)) {
      const std::string src = value_ref(via);
      std::vector<std::string> others;
      for (const auto& arg : e.args)
        if (arg != via) others.push_back(value_ref(arg));
      const std::string id = value(e, is_implicit(e.value) ? Role::Implicit : Role::Value);
      draw_chain(src, own, id, e.name == own.back()->name ? "" : e.name);
      for (const auto& other : others) edge(other, id);
      return;
    }
    // An op that is itself a collective (an LTensor collective in a local_map body).
    std::string label = bold(e.name);
    Attrs attrs;
    if (is_collective_name(e.name)) {
      const StepStyle& s = step_style(e.name);
      label = font(bold(e.name), s.line) + (e.axis.empty() ? "" : " " + font(esc(e.axis), kGray));
      for (const auto& line : rule_lines(e, f_.mesh)) label += kBr + small(line);
      attrs = step_attrs(e.name, label, tooltip(e));
      if (e.bytes > 0) out_edge_[event_id(e)] = step_out_edge(e, true);
    } else {
      for (const auto& line : rule_lines(e, f_.mesh)) label += kBr + small(line);
      attrs = node_attrs(Role::Op, label, false, tooltip(e));
    }
    node(forward_body(), event_id(e), attrs);

    for (const auto& arg : e.args) {
      if (!own.empty() && arg == via) {
        draw_chain(value_ref(arg), own, event_id(e));
        continue;
      }
      const auto chain = take(arg);
      if (!chain.empty()) {  // an implicit operand moved below autograd, inside the op
        std::string src = chain.front()->args.empty() ? implicit_source(f_, arg) : chain.front()->args.front();
        draw_chain(value_ref(src), chain, event_id(e));
        continue;
      }
      edge(value_ref(arg), event_id(e));
    }
    if (!own.empty() && via.empty()) draw_chain("", own, event_id(e));
    edge(event_id(e), value(e, is_implicit(e.value) ? Role::Implicit : Role::Value));
  }

  // Draws the value an event produces; returns its node id ("v:x", or "v:x@5" when the name was
  // drawn before, as a local_map's LTensor takes its argument's name).
  std::string value(const Event& e, Role role) {
    const bool ltensor = is_ltensor_spec(e.out_spec);
    std::string label = bold(e.value);
    auto it = f_.global_shape.find(e.value);
    if (it != f_.global_shape.end() && !ltensor) label += "  " + font(esc(shape_str(it->second)), kGray, 10);
    if (ltensor && !e.local_shapes.empty()) label += "  " + font(esc("local " + local_shapes_str(e)), kGray, 9);
    label += kBr + mono(e.out_spec);
    if (role == Role::Implicit) label += kBr + small(implicit_text(f_, e.value));
    if (!ltensor && !e.local_shapes.empty()) label += kBr + small("local " + local_shapes_str(e), kLightGray);
    auto errors = f_.value_errors.find(e.value);
    const bool failing = errors != f_.value_errors.end() && (!ltensor || !f_.dtensor_values.count(e.value));
    if (failing) label += error_lines(errors->second);
    const std::string id = current_.count(e.value) ? value_id(e.value) + "@" + std::to_string(e.seq) : value_id(e.value);
    node(forward_body(), id, node_attrs(role, label, failing));
    current_[e.value] = id;
    spec_of_[e.value] = e.out_spec;
    return id;
  }

  // The node of a forward value; a value the trace never produced gets a gray stand-in.
  std::string value_ref(const std::string& name) {
    if (name.empty()) return "";
    auto it = current_.find(name);
    if (it != current_.end()) return it->second;
    node(forward_, value_id(name), node_attrs(Role::Ghost, esc(name) + kBr + small("not in the trace", kLightGray)));
    return current_[name] = value_id(name);
  }

  std::vector<const Event*> take(const std::string& value) { return take_pending(pending_, value); }

  std::string chained_arg(const Event& op, const Event& first_step) const {
    for (const auto& arg : op.args) {
      auto it = spec_of_.find(arg);
      if (it != spec_of_.end() && !first_step.in_specs.empty() && it->second == first_step.in_specs[0]) return arg;
    }
    return op.args.empty() ? "" : op.args.front();
  }

  // Draws the steps of a chain and the edges from `from` through them to `to`.
  void draw_chain(const std::string& from, const std::vector<const Event*>& chain, const std::string& to,
                  const std::string& last_as_op = "") {
    std::string prev = from;
    for (const Event* step : chain) {
      step_node(*step, step == chain.back() ? last_as_op : "");
      if (!prev.empty()) edge(prev, event_id(*step));
      prev = event_id(*step);
    }
    if (!prev.empty()) edge(prev, to);
  }

  // ---- backward: every node that moves a value's gradient consumes the nodes holding it so far

  void seed(const Event& e) {
    std::string label = bold("grad " + e.value) + " " + small("seed" + (e.name.empty() ? "" : ": " + e.name)) + kBr +
                        mono(e.out_spec);
    if (!e.local_shapes.empty()) label += kBr + small("local " + local_shapes_str(e), kLightGray);
    node(backward_, event_id(e), node_attrs(Role::Seed, label));
    auto it = current_.find(e.value);
    if (it != current_.end()) edge(it->second, event_id(e), {{"style", "dotted"}, {"color", "#969696"}});
    grad_heads_[e.value] = {event_id(e)};
    seed_id_ = event_id(e);
  }

  void grad(const Event& e) {
    std::string label = bold("grad " + e.value) + " " + small("from " + e.name + " backward") + kBr + mono(e.out_spec);
    if (!e.local_shapes.empty()) label += kBr + small("local " + local_shapes_str(e), kLightGray);
    node(backward_, event_id(e), node_attrs(Role::Grad, label, false, tooltip(e)));
    if (!e.args.empty()) consume(e.args.front(), event_id(e));
    grad_heads_[e.value].push_back(event_id(e));
    remember(e, e.value);
  }

  // A step moves the gradient of args[0] (of its value when it has no args). It continues the
  // event just before it when that one produced the same gradient (a chain of steps, or a hook
  // after its contribution); otherwise it starts from the nodes holding its value's gradient.
  void backward_step(const Event& e) {
    const std::string id = event_id(e);
    node(backward_, id, step_attrs(e.name, step_label(e), tooltip(e)));
    out_edge_[id] = step_out_edge(e, true);
    const std::string grad_of = e.args.empty() ? e.value : e.args.front();
    if (!last_grad_id_.empty() && last_grad_of_ == grad_of && last_seq_ + 1 == e.seq) {
      backward_edge(last_grad_id_, id);
      auto& heads = grad_heads_[grad_of];
      heads.erase(std::remove(heads.begin(), heads.end(), last_grad_id_), heads.end());
    } else {
      consume(e.value, id);
      if (grad_of == e.value) grad_heads_[grad_of].clear();
    }
    grad_heads_[grad_of].push_back(id);
    remember(e, grad_of);
  }

  void remember(const Event& e, const std::string& grad_of) {
    last_grad_id_ = event_id(e);
    last_grad_of_ = grad_of;
    last_seq_ = e.seq;
  }

  void input_grad(const Event& e) {
    std::string tracked = e.out_spec, cot;
    auto g = f_.grads.find(e.value);
    if (g != f_.grads.end()) {
      if (!g->second.first.empty()) tracked = g->second.first;
      cot = g->second.second;
    }
    if (cot.empty() && e.note.compare(0, 10, "cotangent ") == 0) cot = e.note.substr(10);
    std::string label = bold("grad " + e.value) + kBr + small("tracked ", kGray, 9) + mono(tracked);
    const bool dual = cot.empty() || cot == tracked;
    if (!cot.empty()) {
      label += kBr + small("cotangent ", kGray, 9) + mono(cot, dual ? "#08306b" : kRed) + " " +
               font(dual ? "\u2713" : "\u2717", dual ? kGreen : kRed, 10);
    }
    if (!e.local_shapes.empty()) label += kBr + small("local " + local_shapes_str(e), kLightGray);
    auto errors = f_.grad_errors.find(e.value);
    const bool failing = errors != f_.grad_errors.end() || !dual;
    if (errors != f_.grad_errors.end()) label += error_lines(errors->second);
    node(backward_, event_id(e), node_attrs(Role::InputGrad, label, failing));
    consume(e.value, event_id(e));
  }

  // Edges from the nodes holding a gradient; a gradient no event produced (it flowed through a
  // local_map body, whose backward records only its collectives) comes from the seed, dotted.
  void consume(const std::string& value, const std::string& to) {
    const auto& heads = grad_heads_[value];
    for (const auto& from : heads) backward_edge(from, to);
    if (heads.empty() && !seed_id_.empty()) edge(seed_id_, to, {{"style", "dotted"}, {"color", kBackwardEdge}});
  }

  static Attrs tooltip(const Event& e) {
    if (e.note.empty()) return {};
    return {{"tooltip", e.note}};
  }

  void node(std::string& cluster_body, const std::string& id, const Attrs& attrs) {
    cluster_body += node_line(id, attrs, in_body_ && &cluster_body != &forward_ ? "      " : "    ");
  }
  void edge(const std::string& from, const std::string& to, const Attrs& extra = {}) {
    if (from.empty() || to.empty()) return;
    Attrs attrs;
    auto it = out_edge_.find(from);
    if (it != out_edge_.end()) attrs = it->second;
    // A collective's bytes label its first outgoing edge only.
    if (!attrs.empty() && !labelled_.insert(from).second)
      attrs.erase(std::remove_if(attrs.begin(), attrs.end(), [](const auto& a) { return a.first == "xlabel"; }),
                  attrs.end());
    attrs.insert(attrs.end(), extra.begin(), extra.end());
    edges_ += "  " + quote(from) + " -> " + quote(to) + (attrs.empty() ? "" : attr_list(attrs)) + ";\n";
  }
  void backward_edge(const std::string& from, const std::string& to) {
    auto it = out_edge_.find(from);
    if (it != out_edge_.end() && !it->second.empty()) return edge(from, to, {{"style", "dashed"}});
    edge(from, to, {{"style", "dashed"}, {"color", kBackwardEdge}});
  }

  const Facts& f_;
  std::string forward_, backward_, edges_;
  std::vector<std::string> bodies_;  // the nodes of each local_map body
  bool in_body_ = false;
  std::map<std::string, std::string> current_;  // value name -> its latest node
  std::map<std::string, Attrs> out_edge_;       // step node -> the style of its outgoing edges
  std::set<std::string> labelled_;              // step nodes whose bytes label an edge already
  std::map<std::string, std::vector<const Event*>> pending_;
  std::map<std::string, std::string> spec_of_;
  std::map<std::string, std::vector<std::string>> grad_heads_;
  std::string seed_id_, last_grad_id_, last_grad_of_;
  int64_t last_seq_ = -2;
};

// ---------------------------------------------------------------------------------------------
// The rank view
// ---------------------------------------------------------------------------------------------

// The ranks drawn: all of them up to kRankViewMaxRanks, else the first 4 coordinates of a 1-axis
// mesh or the first 2 coordinates of each of the first 4 axes (1 of any further axis).
std::vector<int64_t> shown_ranks(const Mesh& mesh) {
  std::vector<int64_t> out;
  if (mesh.size() <= kRankViewMaxRanks) {
    for (int64_t r = 0; r < mesh.size(); ++r) out.push_back(r);
    return out;
  }
  std::vector<int64_t> keep(mesh.ndim());
  for (int a = 0; a < mesh.ndim(); ++a)
    keep[a] = std::min<int64_t>(mesh.axis_size(a), mesh.ndim() == 1 ? 4 : (a < 4 ? 2 : 1));
  std::vector<int64_t> c(mesh.ndim(), 0);
  while (true) {
    out.push_back(mesh.rank_of(c));
    int a = mesh.ndim() - 1;
    while (a >= 0 && ++c[a] == keep[a]) c[a--] = 0;
    if (a < 0) break;
  }
  return out;
}

class RankView {
 public:
  RankView(const Trace& trace, const Facts& facts) : f_(facts), mesh_(facts.mesh), shown_(shown_ranks(facts.mesh)) {
    body_.resize(shown_.size());
    first_node_.resize(shown_.size());
    holder_.resize(shown_.size());
    heads_.resize(shown_.size());
    for (size_t s = 0; s < shown_.size(); ++s) coords_.push_back(mesh_.coords(shown_[s]));
    for (const auto& e : trace.events) add(e);
  }

  bool collapsed() const { return static_cast<int64_t>(shown_.size()) < mesh_.size(); }
  std::string view_line() const {
    if (!collapsed()) return "rank view: " + std::to_string(mesh_.size()) + (mesh_.size() == 1 ? " rank" : " ranks");
    return "rank view: " + std::to_string(shown_.size()) + " of " + std::to_string(mesh_.size()) +
           " ranks shown (meshes over " + std::to_string(kRankViewMaxRanks) + " ranks are collapsed)";
  }

  std::string body() const {
    std::vector<size_t> all(shown_.size());
    for (size_t s = 0; s < all.size(); ++s) all[s] = s;
    std::string out = clusters(0, all, "  ");
    if (collapsed()) {
      const int64_t more = mesh_.size() - static_cast<int64_t>(shown_.size());
      std::string label = bold("\u2026 and " + std::to_string(more) + " more ranks like these") + kBr +
                          small("mesh " + mesh_.str() + " (" + std::to_string(mesh_.size()) + " ranks)", kGray, 9) +
                          kBr + small("collectives list the shown members of each group", kGray, 9);
      out += node_line("more ranks", {{"label", html_value(label)},
                                      {"shape", "box"},
                                      {"style", "rounded,dashed"},
                                      {"color", "#969696"},
                                      {"margin", "0.2,0.1"}},
                       "  ");
    }
    return out + groups_ + order() + edges_;
  }

  // The ranks left to right in rank order. dot may swap sibling clusters freely (flat edges
  // between clusters do not bind it), so hidden points above the clusters fix it: one root with
  // ordering=out points at one point per rank, in rank order, and each of those at its rank's
  // first node; any other order of the clusters would cross these edges.
  std::string order() const {
    std::string out;
    int count = 0;
    for (size_t s = 0; s < shown_.size(); ++s) {
      if (first_node_[s].empty()) continue;
      const std::string id = quote("order:" + std::to_string(shown_[s]));
      out += "  " + id + " [shape=\"point\", style=\"invis\", width=\"0.05\", height=\"0.05\"];\n";
      out += "  \"order\" -> " + id + " [style=\"invis\"];\n";
      out += "  " + id + " -> " + quote(first_node_[s]) + " [style=\"invis\"];\n";
      ++count;
    }
    if (count < 2) return "";
    return "  \"order\" [shape=\"point\", style=\"invis\", width=\"0.05\", height=\"0.05\", ordering=\"out\"];\n" + out;
  }

 private:
  using Ids = std::vector<std::string>;

  void add(const Event& e) {
    const bool forward = e.phase == "forward";
    if (e.kind == "collective" || e.kind == "local") {
      if (forward) return void(pending_[e.value].push_back(&e));
      return backward_step(e);
    }
    if (forward) return e.kind == "input" ? input(e) : op(e);
    if (e.kind == "seed") return seed(e);
    if (e.kind == "input_grad") return input_grad(e);
    grad(e);
  }

  std::string rid(size_t s, const std::string& base) const { return "r" + std::to_string(shown_[s]) + ":" + base; }
  std::string local_shape(const Event& e, size_t s) const {
    const auto r = static_cast<size_t>(shown_[s]);
    return r < e.local_shapes.size() ? shape_str(e.local_shapes[r]) : "?";
  }

  // A per-rank node: "name [local shape]" over a small gray line.
  void rank_node(size_t s, const std::string& id, Role role, const std::string& name, const Event& e,
                 const std::string& detail, const std::vector<std::string>* errors = nullptr) {
    if (first_node_[s].empty()) first_node_[s] = id;
    // A failure names a DTensor: its LTensor namesake inside a local_map body is not marked.
    if (errors && is_ltensor_spec(e.out_spec) && f_.dtensor_values.count(name)) errors = nullptr;
    std::string label = bold(name) + " " + mono(local_shape(e, s), "#08306b", 9);
    if (!detail.empty()) label += kBr + small(detail);
    bool failing = false;
    if (errors) {
      failing = true;
      std::vector<std::string> mine;
      auto re = f_.rank_errors.find(name);
      if (re != f_.rank_errors.end()) {
        // Rank-specific failures mark only their rank, unless some failure is not rank-specific.
        size_t specific = 0;
        for (const auto& [rank, msgs] : re->second) specific += msgs.size();
        auto here = re->second.find(shown_[s]);
        if (here != re->second.end()) mine = here->second;
        failing = specific < errors->size() || here != re->second.end();
      }
      if (!mine.empty()) label += error_lines(mine, 30);
    }
    body_[s] += node_line(id, node_attrs(role, label, failing, {{"fontsize", "9"}}), "      ");
  }

  const std::vector<std::string>* errors_of(const std::map<std::string, std::vector<std::string>>& m,
                                            const std::string& name) const {
    auto it = m.find(name);
    return it == m.end() ? nullptr : &it->second;
  }

  std::string holder(size_t s, const std::string& name) {
    if (name.empty()) return "";
    auto it = holder_[s].find(name);
    if (it != holder_[s].end()) return it->second;
    const std::string id = rid(s, value_id(name));
    body_[s] += node_line(id, node_attrs(Role::Ghost, esc(name), false, {{"fontsize", "9"}}), "      ");
    holder_[s][name] = id;
    return id;
  }

  // "r0:v:x", or "r0:v:x@5" when the name was drawn before on that rank.
  std::string fresh_value_id(size_t s, const Event& e) const {
    return rid(s, value_id(e.value) + (holder_[s].count(e.value) ? "@" + std::to_string(e.seq) : ""));
  }

  void input(const Event& e) {
    for (size_t s = 0; s < shown_.size(); ++s) {
      const std::string id = fresh_value_id(s, e);
      rank_node(s, id, Role::Input, e.value, e, "input " + e.out_spec, errors_of(f_.value_errors, e.value));
      holder_[s][e.value] = id;
    }
  }

  std::vector<const Event*> take(const std::string& value) { return take_pending(pending_, value); }

  void op(const Event& e) {
    std::string args;
    for (const auto& a : e.args) args += (args.empty() ? "" : ", ") + a;
    const std::string detail = e.name + "(" + args + ") \u2192 " + e.out_spec;
    Ids targets;
    for (size_t s = 0; s < shown_.size(); ++s) targets.push_back(fresh_value_id(s, e));
    const auto own = take(e.value);
    std::vector<std::pair<std::vector<Ids>, Attrs>> incoming;  // per operand: sources per rank
    if (e.name == "redistribute") {
      incoming.push_back({chain(sources(e.args.empty() ? "" : e.args.front()), own, false), {}});
    } else {
      bool own_used = own.empty();
      for (const auto& arg : e.args) {
        auto moved = take(arg);
        if (!moved.empty()) {
          std::string src = moved.front()->args.empty() ? implicit_source(f_, arg) : moved.front()->args.front();
          incoming.push_back({chain(sources(src), moved, false), {}});
        } else if (!own_used) {
          incoming.push_back({chain(sources(arg), own, false), {}});
          own_used = true;
        } else {
          incoming.push_back({sources(arg), {}});
        }
      }
    }
    for (size_t s = 0; s < shown_.size(); ++s) {
      rank_node(s, targets[s], is_implicit(e.value) ? Role::Implicit : Role::Value, e.value, e, detail,
                errors_of(f_.value_errors, e.value));
      holder_[s][e.value] = targets[s];
      for (const auto& [srcs, attrs] : incoming)
        for (const auto& from : srcs[s]) edge(from, targets[s], false);
    }
  }

  std::vector<Ids> sources(const std::string& name) {
    std::vector<Ids> out(shown_.size());
    if (name.empty()) return out;
    for (size_t s = 0; s < shown_.size(); ++s) out[s] = {holder(s, name)};
    return out;
  }

  // Runs the steps of a chain from the per-rank sources; returns the per-rank nodes at its end.
  std::vector<Ids> chain(std::vector<Ids> cur, const std::vector<const Event*>& steps, bool backward) {
    for (const Event* step : steps) cur = run_step(*step, cur, backward);
    return cur;
  }

  // The shown ranks grouped as a collective over `axis` groups them (all together for an unknown axis).
  std::vector<std::vector<size_t>> groups(const std::string& axis) const {
    const int a = mesh_.axis_index(axis);
    std::vector<std::vector<size_t>> out;
    std::map<std::vector<int64_t>, size_t> index;
    for (size_t s = 0; s < shown_.size(); ++s) {
      std::vector<int64_t> key = coords_[s];
      if (a >= 0) key[a] = -1;
      else key.assign(1, 0);
      auto [it, fresh] = index.emplace(key, out.size());
      if (fresh) out.emplace_back();
      out[it->second].push_back(s);
    }
    return out;
  }

  std::vector<Ids> run_step(const Event& e, const std::vector<Ids>& cur, bool backward) {
    std::vector<Ids> next(shown_.size());
    if (e.kind != "collective") {
      for (size_t s = 0; s < shown_.size(); ++s) {
        const std::string id = rid(s, event_id(e));
        std::string label = bold(e.name) + " " + mono(local_shape(e, s), "#222222", 9);
        body_[s] += node_line(id, step_attrs(e.name, label, {{"fontsize", "8"}}), "      ");
        if (backward) consume(s, cur[s], id);
        else for (const auto& from : cur[s]) edge(from, id, backward);
        next[s] = {id};
      }
      return next;
    }
    const StepStyle& style = step_style(e.name);
    const int a = mesh_.axis_index(e.axis);
    const int64_t group_size = a >= 0 ? mesh_.axis_size(a) : mesh_.size();
    const auto all_groups = groups(e.axis);
    // The groups of one collective left to right by their first rank: a hidden point with
    // ordering=out points at them in that order.
    const std::string pin = quote(event_id(e) + ":order");
    if (all_groups.size() > 1)
      groups_ += "  " + pin + " [shape=\"point\", style=\"invis\", width=\"0.05\", height=\"0.05\", ordering=\"out\"];\n";
    for (const auto& members : all_groups) {
      const std::string id = event_id(e) + ":g" + std::to_string(shown_[members.front()]);
      std::string ranks;
      for (size_t s : members) ranks += (ranks.empty() ? "" : ", ") + std::to_string(shown_[s]);
      if (static_cast<int64_t>(members.size()) < group_size)
        ranks += " \u2026 (" + std::to_string(group_size) + " in the group)";
      std::string label = font(bold(e.name), style.line) + (e.axis.empty() ? "" : " " + font(esc(e.axis), kGray)) +
                          kBr + small("ranks " + ranks, "#333333", 8);
      if (!e.out_spec.empty() || !e.in_specs.empty()) label += kBr + mono(transition(e), "#222222", 8);
      if (e.bytes > 0) label += kBr + font(esc(bytes_str(e.bytes) + "/rank"), style.line, 9);
      if (backward && !e.note.empty()) label += kBr + small(note_tag(e.note));
      Attrs extra = {{"fontsize", "9"}};
      if (!e.note.empty()) extra.emplace_back("tooltip", e.note);
      groups_ += node_line(id, step_attrs(e.name, label, extra), "  ");
      if (all_groups.size() > 1) groups_ += "  " + pin + " -> " + quote(id) + " [style=\"invis\"];\n";
      group_style_[id] = {{"color", style.line}, {"penwidth", "1.6"}};
      for (size_t s : members) {
        if (backward) consume(s, cur[s], id);
        else for (const auto& from : cur[s]) edge(from, id, backward);
        next[s] = {id};
      }
    }
    return next;
  }

  void seed(const Event& e) {
    for (size_t s = 0; s < shown_.size(); ++s) {
      const std::string id = rid(s, event_id(e));
      rank_node(s, id, Role::Seed, "grad " + e.value, e, "seed " + e.out_spec);
      auto h = holder_[s].find(e.value);
      if (h != holder_[s].end()) add_edge(h->second, id, {{"style", "dotted"}, {"color", "#969696"}});
      heads_[s][e.value] = {id};
    }
    seed_seq_ = e.seq;
  }

  void grad(const Event& e) {
    for (size_t s = 0; s < shown_.size(); ++s) {
      const std::string id = rid(s, event_id(e));
      rank_node(s, id, Role::Grad, "grad " + e.value, e, "from " + e.name + " \u2192 " + e.out_spec);
      if (!e.args.empty()) consume(s, heads_[s][e.args.front()], id);
      heads_[s][e.value].push_back(id);
    }
    last_out_.assign(shown_.size(), {});
    for (size_t s = 0; s < shown_.size(); ++s) last_out_[s] = {rid(s, event_id(e))};
    last_grad_of_ = e.value;
    last_seq_ = e.seq;
  }

  void backward_step(const Event& e) {
    const std::string grad_of = e.args.empty() ? e.value : e.args.front();
    const bool chained = last_grad_of_ == grad_of && last_seq_ + 1 == e.seq && !last_out_.empty();
    std::vector<Ids> src(shown_.size());
    for (size_t s = 0; s < shown_.size(); ++s) src[s] = chained ? last_out_[s] : heads_[s][e.value];
    const std::vector<Ids> out = run_step(e, src, true);
    for (size_t s = 0; s < shown_.size(); ++s) {
      Ids& heads = heads_[s][grad_of];
      if (chained) {
        for (const auto& id : last_out_[s]) heads.erase(std::remove(heads.begin(), heads.end(), id), heads.end());
      } else if (grad_of == e.value) {
        heads.clear();
      }
      heads.insert(heads.end(), out[s].begin(), out[s].end());
    }
    last_out_ = out;
    last_grad_of_ = grad_of;
    last_seq_ = e.seq;
  }

  void input_grad(const Event& e) {
    std::string tracked = e.out_spec;
    auto g = f_.grads.find(e.value);
    if (g != f_.grads.end() && !g->second.first.empty()) tracked = g->second.first;
    for (size_t s = 0; s < shown_.size(); ++s) {
      const std::string id = rid(s, event_id(e));
      rank_node(s, id, Role::InputGrad, "grad " + e.value, e, "tracked " + tracked,
                errors_of(f_.grad_errors, e.value));
      consume(s, heads_[s][e.value], id);
    }
  }

  // Backward edges from the nodes holding a gradient on rank s; a gradient no event produced
  // (through a local_map body) comes from the seed, dotted.
  void consume(size_t s, const Ids& heads, const std::string& to) {
    for (const auto& from : heads) edge(from, to, true);
    if (heads.empty() && seed_seq_ >= 0)
      add_edge(rid(s, "e" + std::to_string(seed_seq_)), to, {{"style", "dotted"}, {"color", kBackwardEdge}});
  }

  void edge(const std::string& from, const std::string& to, bool backward) {
    Attrs attrs;
    auto it = group_style_.find(from);
    if (it == group_style_.end()) it = group_style_.find(to);
    if (it != group_style_.end()) attrs = it->second;
    if (backward) {
      attrs.emplace_back("style", "dashed");
      if (it == group_style_.end()) attrs.emplace_back("color", kBackwardEdge);
    }
    add_edge(from, to, attrs);
  }
  void add_edge(const std::string& from, const std::string& to, const Attrs& attrs) {
    if (from.empty() || to.empty() || !edge_seen_.insert({from, to}).second) return;
    edges_ += "  " + quote(from) + " -> " + quote(to) + (attrs.empty() ? "" : attr_list(attrs)) + ";\n";
  }

  // One cluster per coordinate of axis `level` holding those of the next axis; ranks innermost.
  std::string clusters(int level, const std::vector<size_t>& slots, const std::string& indent) const {
    static const char* kFills[] = {"#f4f6f8", "#e9edf1", "#f4f6f8", "#e9edf1"};
    std::string out;
    const std::string& axis = mesh_.axes()[level];
    if (level == mesh_.ndim() - 1) {
      for (size_t s : slots) {
        const std::string label = "rank " + std::to_string(shown_[s]) + "  \u00b7  " + axis + "=" +
                                  std::to_string(coords_[s][level]);
        out += cluster("rank" + std::to_string(shown_[s]),
                       {{"label", label}, {"style", "rounded,filled"}, {"fillcolor", "white"},
                        {"color", "#7f8c99"}, {"fontsize", "11"}},
                       body_[s].empty() ? "      \"" + rid(s, "empty") + "\" [style=\"invis\"];\n" : body_[s], indent);
      }
      return out;
    }
    std::vector<std::pair<int64_t, std::vector<size_t>>> by_coord;
    for (size_t s : slots) {
      if (by_coord.empty() || by_coord.back().first != coords_[s][level]) by_coord.push_back({coords_[s][level], {}});
      by_coord.back().second.push_back(s);
    }
    for (const auto& [c, sub] : by_coord) {
      std::string name = "axes";
      for (int a = 0; a <= level; ++a) name += ":" + mesh_.axes()[a] + "=" + std::to_string(coords_[sub.front()][a]);
      out += cluster(name,
                     {{"label", axis + " = " + std::to_string(c)}, {"style", "rounded,filled"},
                      {"fillcolor", kFills[level % 4]}, {"color", "#a9b4bf"}, {"fontsize", "12"}},
                     clusters(level + 1, sub, indent + "  "), indent);
    }
    return out;
  }

  const Facts& f_;
  const Mesh& mesh_;
  std::vector<int64_t> shown_;
  std::vector<std::vector<int64_t>> coords_;
  std::vector<std::string> body_;  // per shown rank: its nodes
  std::vector<std::string> first_node_;  // per shown rank: its first node, to order the ranks
  std::string groups_, edges_;
  std::set<std::pair<std::string, std::string>> edge_seen_;
  std::map<std::string, Attrs> group_style_;
  std::vector<std::map<std::string, std::string>> holder_;  // per shown rank: value -> node
  std::map<std::string, std::vector<const Event*>> pending_;
  std::vector<std::map<std::string, Ids>> heads_;           // per shown rank: gradient -> nodes
  std::vector<Ids> last_out_;
  std::string last_grad_of_;
  int64_t last_seq_ = -2;
  int64_t seed_seq_ = -1;
};

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
    RankView ranks(trace, facts);
    view_line = ranks.view_line();
    body = ranks.body();
  } else {
    body = Logical(trace, facts).body();
  }
  size_t nodes = 0;
  for (auto at = body.find(" [label="); at != std::string::npos; at = body.find(" [label=", at + 1)) ++nodes;
  std::string out = graph_header(title(trace, facts, view_line), nodes);
  out += status_note(facts, view == RenderView::Ranks);
  out += body;
  out += legend(view == RenderView::Logical || program_only);
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
  std::ofstream out(out_path, std::ios::binary);
  out << bytes;
  if (!out.flush()) throw InputError(out_path, "", "cannot write the file");
}

}  // namespace meshsim

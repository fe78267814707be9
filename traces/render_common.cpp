// DOT text, styles, and the facts a diagram needs besides the events (see render_common.h).
#include "traces/render_common.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <unordered_map>

namespace meshsim::render_detail {

// ---------------------------------------------------------------------------------------------
// DOT text
// ---------------------------------------------------------------------------------------------

namespace {
// An attribute value that starts with this byte is an HTML-like label, written as <...>.
constexpr char kHtmlMark = '\x01';
}  // namespace

std::string html_value(const std::string& html) { return std::string(1, kHtmlMark) + html; }

namespace {
// A control character (other than a newline) as visible text, \xNN: a NUL or an escape sequence in
// a user's string never reaches Graphviz or the picture as a control.
bool is_control(char c) { return (static_cast<unsigned char>(c) < 0x20 && c != '\n') || c == 0x7f; }
std::string visible(char c) {
  static const char* hex = "0123456789abcdef";
  const auto u = static_cast<unsigned char>(c);
  return std::string("x") + hex[u >> 4] + hex[u & 15];
}
}  // namespace

// A DOT string literal: quotes and backslashes escaped, newlines as DOT line breaks, other
// control characters as \xNN.
std::string quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (is_control(c)) {
      out += "\\\\" + visible(c);
      continue;
    }
    out += c;
  }
  return out + "\"";
}

namespace {
std::string attr_value(const std::string& value) {
  if (!value.empty() && value[0] == kHtmlMark) return "<" + value.substr(1) + ">";
  return quote(value);
}
}  // namespace

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
      default:
        if (is_control(c)) out += "\\" + visible(c);
        else out += c;
    }
  }
  return out;
}

std::string font(const std::string& html, const std::string& color, int size, const std::string& face) {
  if (html.empty()) return "";  // graphviz refuses an empty <FONT></FONT>
  std::string open = "<FONT";
  if (!color.empty()) open += " COLOR=\"" + color + "\"";
  if (size > 0) open += " POINT-SIZE=\"" + std::to_string(size) + "\"";
  if (!face.empty()) open += " FACE=\"" + face + "\"";
  return open + ">" + html + "</FONT>";
}
std::string bold(const std::string& text) { return "<B>" + esc(text) + "</B>"; }
std::string mono(const std::string& text, const std::string& color, int size) {
  return font(esc(text), color, size, kMono);
}
std::string small(const std::string& text, const std::string& color, int size) {
  return font(esc(text), color, size);
}

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
std::string error_lines(const std::vector<std::string>& messages, size_t width) {
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

namespace {
std::string arrows(const std::string& text) {
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
}  // namespace

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

namespace {

// The outline of a step: all_gather widens downwards, reduce_scatter narrows, all_to_all leans.
Attrs step_shape(const std::string& name) {
  if (name == "all_gather") return {{"shape", "polygon"}, {"sides", "4"}, {"distortion", "-0.18"}};
  if (name == "reduce_scatter") return {{"shape", "polygon"}, {"sides", "4"}, {"distortion", "0.18"}};
  if (name == "all_to_all") return {{"shape", "polygon"}, {"sides", "4"}, {"skew", "0.25"}};
  if (name == "all_reduce") return {{"shape", "hexagon"}};
  return {{"shape", "box"}};
}
}  // namespace

const StepStyle& step_style(const std::string& name) {
  for (const auto& row : kCollectives)
    if (name == row.name) return row;
  return kLocalStep;
}
bool is_collective_name(const std::string& name) { return &step_style(name) != &kLocalStep; }

namespace {
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
}  // namespace

Attrs node_attrs(Role role, const std::string& html_label, bool failing, const Attrs& extra) {
  Attrs attrs = {{"label", html_value(html_label)}};
  for (const auto& a : role_style(role)) {
    if (failing && a.first == "color") continue;
    attrs.push_back(a);
  }
  if (failing) attrs.insert(attrs.end(), kFailing.begin(), kFailing.end());
  attrs.insert(attrs.end(), extra.begin(), extra.end());
  return attrs;
}

Attrs step_attrs(const std::string& name, const std::string& html_label, const Attrs& extra) {
  const StepStyle& s = step_style(name);
  Attrs attrs = {{"label", html_value(html_label)}};
  for (const auto& a : step_shape(name)) attrs.push_back(a);
  // A style in `extra` (an implicit step's dashes) replaces the default one.
  const bool styled = std::any_of(extra.begin(), extra.end(), [](const auto& a) { return a.first == "style"; });
  if (!styled) attrs.emplace_back("style", "filled");
  attrs.insert(attrs.end(), {{"fillcolor", s.fill},
                 {"color", s.line},
                 {"penwidth", is_collective_name(name) ? "1.5" : "1"},
                 {"margin", "0.12,0.04"}});
  attrs.insert(attrs.end(), extra.begin(), extra.end());
  return attrs;
}

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

std::string node_line(const std::string& id, const Attrs& attrs, const std::string& indent) {
  return indent + quote(id) + attr_list(attrs) + ";\n";
}

std::string cluster(const std::string& name, const Attrs& attrs, const std::string& body,
                    const std::string& indent) {
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

namespace {
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
}  // namespace

namespace {

// Each value's `source` (inputs and ops, local_map bodies included): "file:line" to draw, and the
// module and code for the tooltip.
void collect_sources(const json& items, std::map<std::string, Facts::Source>& out) {
  for (const auto& item : items) {
    if (!item.is_object()) continue;
    if (item.contains("body")) collect_sources(item["body"], out);
    const json& src = item.value("source", json());
    if (!src.is_object()) continue;
    Facts::Source s;
    const std::string file = src.value("file", json()).is_string() ? src["file"].get<std::string>() : "";
    const std::string module = src.value("module", json()).is_string() ? src["module"].get<std::string>() : "";
    s.where = file.empty() ? module : std::filesystem::path(file).filename().string();
    if (!file.empty() && src.value("line", json()).is_number_integer())
      s.where += ":" + std::to_string(src["line"].get<int64_t>());
    s.detail = (file.empty() ? "" : file + (src.contains("line") ? ":" + src["line"].dump() : "")) +
               (module.empty() ? "" : (file.empty() ? "" : " ") + std::string("in ") + module);
    if (src.value("code", json()).is_string()) s.detail += ": " + src["code"].get<std::string>();
    std::vector<std::string> names;
    for (const char* key : {"name", "out"})
      if (item.value(key, json()).is_string()) names.push_back(item[key].get<std::string>());
    if (item.value("outs", json()).is_array())
      for (const auto& o : item["outs"])
        if (o.is_string()) names.push_back(o.get<std::string>());
    for (const auto& n : names) out.emplace(n, s);
  }
}

}  // namespace

Facts facts_of(const Trace& t) {
  Facts f;
  f.mesh = mesh_of(t, &f.mesh_from_scenario);
  const json& sc = t.scenario;
  const json& r = t.result;
  if (sc.is_object() && sc.value("name", json()).is_string()) f.name = sc["name"].get<std::string>();
  else if (r.is_object() && r.value("name", json()).is_string()) f.name = r["name"].get<std::string>();
  if (sc.is_object() && sc.value("program", json()).is_array()) f.program = sc["program"];
  if (sc.is_object() && sc.value("inputs", json()).is_array()) f.inputs = sc["inputs"];
  collect_sources(f.inputs, f.sources);
  collect_sources(f.program, f.sources);

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
  // The first divergence: marked on the node of the value its op makes (a body op's LTensor inside a
  // local_map), and said first in the note.
  const json d = r.value("first_divergence", json());
  if (d.is_object() && !d.contains("error")) {
    f.first_divergence = "first divergence (" + show(d.value("phase", json("?"))) + "): " + show(d.value("message", json("")));
    std::string node = show(d.value("out", json("")));
    if (d.value("body", json()).is_object()) node = show(d["body"].value("out", json("")));
    if (values.count(node)) {
      auto& errs = f.value_errors[node];
      errs.insert(errs.begin(), "\u25b6 first divergence (" + show(d.value("phase", json("?"))) + ")" +
                                    (d.value("phase", json("")) == "backward" ? ": this op's backward" : ": this value"));
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

std::string drawn_name(const Facts& f, const Event& e) {
  if (e.name != "enter_local_map" && e.name != "leave_local_map") return e.name;
  const char* want = e.name == "enter_local_map" ? "to_local" : "from_local";
  for (const auto& op : f.program)
    if (op.is_object() && op.value("op", json()) == want && op.value("out", json()) == e.value) return want;
  return e.name;
}

namespace {
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
}  // namespace

bool is_implicit(const std::string& name) { return parse_implicit(name).has_value(); }

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
  // The planner's own move, not the program's: said on the node (its reason is the tooltip).
  if (!e.implicit.empty()) label += kBr + font(bold("implicit"), kImplicitMark, 9);
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


std::vector<const Event*> take_pending(std::map<std::string, std::vector<const Event*>>& pending,
                                       const std::string& value) {
  auto it = pending.find(value);
  if (it == pending.end()) return {};
  auto chain = std::move(it->second);
  pending.erase(it);
  return chain;
}

// The red note lists this many failures at most.
constexpr size_t kMaxListedFailures = 40;

// The red note of a failed or erroneous run; empty for a pass.
std::string status_note(const Facts& f, bool list_all_failures) {
  std::string body;
  if (f.status == "fail") {
    body = font(bold("\u2717 the run fails its checks"), kRed, 11);
    if (!f.first_divergence.empty()) {
      bool first = true;
      for (const auto& line : wrap(f.first_divergence, 56)) {
        body += kBr + font(first ? bold(esc("\u25b6 " + line)) : esc("  " + line), kRed, 10);
        first = false;
      }
    }
    for (const auto& c : f.failed_checks) body += kBr + font(esc("failed: " + c), kRed, 10);
    const auto& listed = list_all_failures ? f.all_failures : f.other_failures;
    const size_t marked = f.all_failures.size() - f.other_failures.size();  // attached to a node
    if (marked > 0) {
      body += kBr + font(esc(std::to_string(marked) + (marked == 1 ? " problem" : " problems") +
                             " marked in red on the diagram"), kRed, 9);
    }
    size_t shown = 0;
    for (const auto& m : listed) {
      // A long program can fail on thousands of values: the first ones, then a count.
      if (listed.size() > kMaxListedFailures && shown++ == kMaxListedFailures - 1) {
        body += kBr + font(esc("\u2022 ... and " + count_str(static_cast<int64_t>(listed.size() - shown + 1)) +
                               " more (the result lists them all)"), kRed, 9);
        break;
      }
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

// ---- the size of a drawn body, for dot ----

namespace {

// The DOT string literal at text[at] (a quote), unescaped; `at` moves past it. False if none.
bool read_quoted(const std::string& text, size_t& at, std::string* out) {
  if (at >= text.size() || text[at] != '"') return false;
  out->clear();
  for (size_t i = at + 1; i < text.size() && text[i] != '\n'; ++i) {
    if (text[i] == '"') {
      at = i + 1;
      return true;
    }
    if (text[i] == '\\' && i + 1 < text.size()) ++i;
    *out += text[i];
  }
  return false;
}

}  // namespace

size_t count_nodes(const std::string& body) {
  size_t nodes = 0;
  for (auto at = body.find(" [label="); at != std::string::npos; at = body.find(" [label=", at + 1)) ++nodes;
  return nodes;
}

// dot's work on a body: its nodes, plus a virtual node on every rank a long edge crosses (dot
// routes and orders those like real nodes; a weight read by every layer, or a gradient summed
// from all of them, crosses hundreds of ranks per edge). Ranks as dot's network simplex tends to
// set them: a node one rank below its lowest predecessor, a source just above its highest
// successor.
size_t layout_size(const std::string& body, size_t nodes) {
  std::unordered_map<std::string, size_t> index;
  std::vector<std::pair<size_t, size_t>> edges;
  std::string from, to;
  for (size_t at = 0; at < body.size();) {
    size_t end = body.find('\n', at);
    if (end == std::string::npos) end = body.size();
    size_t p = body.find_first_not_of(' ', at);
    if (p < end && read_quoted(body, p, &from) && body.compare(p, 4, " -> ") == 0 && read_quoted(body, p += 4, &to)) {
      const size_t a = index.emplace(from, index.size()).first->second;
      const size_t b = index.emplace(to, index.size()).first->second;
      edges.emplace_back(a, b);
    }
    at = end + 1;
  }
  std::vector<std::vector<size_t>> succ(index.size());
  std::vector<size_t> indegree(index.size(), 0), rank(index.size(), 0), ready;
  for (const auto& [a, b] : edges) {
    succ[a].push_back(b);
    ++indegree[b];
  }
  std::vector<size_t> left = indegree;
  for (size_t v = 0; v < succ.size(); ++v)
    if (left[v] == 0) ready.push_back(v);
  while (!ready.empty()) {
    const size_t v = ready.back();
    ready.pop_back();
    for (size_t w : succ[v]) {
      rank[w] = std::max(rank[w], rank[v] + 1);
      if (--left[w] == 0) ready.push_back(w);
    }
  }
  for (size_t v = 0; v < succ.size(); ++v) {
    if (indegree[v] > 0 || succ[v].empty()) continue;
    size_t lowest = rank[succ[v].front()];
    for (size_t w : succ[v]) lowest = std::min(lowest, rank[w]);
    rank[v] = lowest > 0 ? lowest - 1 : 0;
  }
  size_t crossed = 0;
  for (const auto& [a, b] : edges)
    if (rank[b] > rank[a] + 1) crossed += rank[b] - rank[a] - 1;
  return nodes + crossed;
}

}  // namespace meshsim::render_detail

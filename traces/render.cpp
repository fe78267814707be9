#include "traces/render.h"

#include <algorithm>

#include <graphviz/gvc.h>

#include <fstream>
#include <map>
#include <memory>
#include <utility>

#include "core/error.h"

namespace meshsim {

using nlohmann::json;

namespace {

using Attrs = std::vector<std::pair<std::string, std::string>>;

// The color of each collective, in alphabetical order; every other step is a local step.
struct StepColor {
  const char* name;
  const char* fill;
};
constexpr StepColor kStepColors[] = {
    {"all_gather", "#a1d99b"},
    {"all_reduce", "#bcbddc"},
    {"all_to_all", "#9ecae1"},
    {"reduce_scatter", "#fdae6b"},
};
constexpr const char* kLocalStepFill = "#d9d9d9";

const char* step_fill(const std::string& name) {
  for (const auto& row : kStepColors) {
    if (name == row.name) return row.fill;
  }
  return kLocalStepFill;
}

// Node styles by role, one row each.
const std::map<std::string, Attrs> kStyles = {
    {"grad", {{"shape", "box"}, {"style", "rounded,filled"}, {"fillcolor", "#fde0ef"}}},
    {"input", {{"shape", "box"}, {"style", "rounded,filled"}, {"fillcolor", "#e5f5e0"}}},
    {"input_grad",
     {{"shape", "box"},
      {"style", "rounded,filled"},
      {"fillcolor", "#fee6ce"},
      {"peripheries", "2"}}},
    {"op", {{"shape", "ellipse"}, {"style", "filled"}, {"fillcolor", "#fff7bc"}}},
    {"seed", {{"shape", "box"}, {"style", "rounded,filled"}, {"fillcolor", "#fcbba1"}}},
    {"status",
     {{"shape", "note"},
      {"style", "filled"},
      {"color", "red"},
      {"fontcolor", "red"},
      {"fillcolor", "#fff0f0"}}},
    {"step", {{"shape", "box"}, {"style", "filled"}, {"fontsize", "9"}, {"height", "0.3"}}},
    {"value", {{"shape", "box"}, {"style", "rounded,filled"}, {"fillcolor", "#deebf7"}}},
};

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

std::string attr_list(const Attrs& attrs) {
  std::string out;
  for (const auto& [key, value] : attrs)
    out += (out.empty() ? "" : ", ") + key + "=" + quote(value);
  return " [" + out + "]";
}

Attrs styled(const std::string& role, const std::string& label, const Attrs& extra = {}) {
  Attrs attrs = {{"label", label}};
  const Attrs& style = kStyles.at(role);
  attrs.insert(attrs.end(), style.begin(), style.end());
  attrs.insert(attrs.end(), extra.begin(), extra.end());
  return attrs;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string out;
  for (int64_t d : shape) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return "[" + out + "]";
}

std::string show(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// "[S(0)] -> [R]", or "[R]" when the step does not record its source.
std::string transition(const Event& e) {
  return e.in_specs.empty() ? e.out_spec : e.in_specs.front() + " -> " + e.out_spec;
}

// "all_gather dp\n[S(0)] -> [R]\n384 B"
std::string step_label(const Event& e) {
  std::string label = e.name + (e.axis.empty() ? "" : " " + e.axis) + "\n" + transition(e);
  if (e.kind == "collective") label += "\n" + std::to_string(e.bytes) + " B";
  return label;
}

std::string event_id(const Event& e) { return "e" + std::to_string(e.seq); }
std::string value_id(const std::string& name) { return "v:" + name; }

// "fsdp_linear\nredistribute=above_autograd seed=0 ..." (empty options left out)
std::string title(const Trace& trace) {
  std::string name =
      trace.scenario.is_object() ? show(trace.scenario.value("name", json("trace"))) : "trace";
  std::string options = "meshsim " + trace.version;
  if (trace.options.is_object()) {
    for (const auto& item : trace.options.items()) {
      if (item.value() != "" && !item.value().is_null())
        options += " " + item.key() + "=" + show(item.value());
    }
  }
  return name + "\n" + options;
}

// The red note of a failed run: its failing checks, or its error; empty for a pass.
std::string status_note(const json& result) {
  if (!result.is_object()) return "";
  const std::string status = show(result.value("status", json("")));
  if (status == "fail") {
    std::string label = "status: fail";
    const json checks = result.value("checks", json::object());
    for (const auto& check : checks.items()) {
      if (check.value() == false) label += "\nfailed: " + check.key();
    }
    return label;
  }
  if (status == "error") {
    const json error = result.value("error", json::object());
    if (!error.is_object()) return "status: error\n" + show(error);
    return "status: error\n" + show(error.value("kind", json(""))) + ": " +
           show(error.value("message", json("")));
  }
  return "";
}

// Builds the diagram event by event: nodes per cluster, then all edges.
class Diagram {
 public:
  explicit Diagram(const Trace& trace) : trace_(trace) {
    for (const auto& e : trace.events) add(e);
  }
  std::string dot() const;

 private:
  void add(const Event& e) {
    const bool forward = e.phase == "forward";
    if (e.kind == "collective" || e.kind == "local")
      return forward ? forward_step(e) : backward_step(e);
    if (forward) return e.kind == "input" ? input(e) : op(e);
    if (e.kind == "seed") return seed(e);
    if (e.kind == "input_grad") return input_grad(e);
    grad(e);
  }

  // Forward: values, ops, and the steps of a redistribution on the path from its operand.
  void input(const Event& e) { value(e, "input"); }
  void forward_step(const Event& e) {
    node(forward_, event_id(e), styled("step", step_label(e), {{"fillcolor", step_fill(e.name)}}));
    auto& chain = pending_steps_[e.value];
    if (!chain.empty()) edge(event_id(*chain.back()), event_id(e));
    chain.push_back(&e);
  }
  void op(const Event& e) {
    node(forward_, event_id(e), styled("op", e.name));
    const auto chain = take_chain(e.value);
    const std::string via = chain.empty() ? "" : chained_arg(e, *chain.front());
    for (const auto& arg : e.args)
      edge(value_id(arg), arg == via ? event_id(*chain.front()) : event_id(e));
    if (!chain.empty()) edge(event_id(*chain.back()), event_id(e));
    value(e, "value");
    edge(event_id(e), value_id(e.value));
  }
  void value(const Event& e, const std::string& role) {
    std::string label = e.value + "\n" + e.out_spec;
    if (!e.local_shapes.empty()) label += "\nlocal " + shape_str(e.local_shapes.front());
    node(forward_, value_id(e.value), styled(role, label));
    spec_of_[e.value] = e.out_spec;
  }
  std::vector<const Event*> take_chain(const std::string& value) {
    auto it = pending_steps_.find(value);
    if (it == pending_steps_.end()) return {};
    auto chain = std::move(it->second);
    pending_steps_.erase(it);
    return chain;
  }
  // The operand a chain of steps starts from: the first whose spec is the chain's source spec.
  std::string chained_arg(const Event& op, const Event& first_step) const {
    for (const auto& arg : op.args) {
      auto it = spec_of_.find(arg);
      if (it != spec_of_.end() && !first_step.in_specs.empty() &&
          it->second == first_step.in_specs[0])
        return arg;
    }
    return op.args.empty() ? "" : op.args.front();
  }

  // Backward: every node that moves a value's gradient consumes the nodes holding it so far.
  void seed(const Event& e) {
    node(backward_, event_id(e), styled("seed", "seed grad " + e.value + "\n" + e.out_spec));
    if (spec_of_.count(e.value))
      edge(value_id(e.value), event_id(e), {{"style", "dotted"}, {"color", "#969696"}});
    grad_heads_[e.value] = {event_id(e)};
  }
  void grad(const Event& e) {
    const std::string label = e.name + " backward: grad " + e.value + "\n" + transition(e);
    node(backward_, event_id(e), styled("grad", label, with_note(e)));
    if (!e.args.empty()) consume(e.args.front(), event_id(e));
    grad_heads_[e.value].push_back(event_id(e));
    remember(e, e.value);
  }
  // A step moves the gradient of args[0] (of its value when it has no args). It continues the
  // event just before it when that one produced the same gradient (a chain of steps, or a hook
  // after its contribution); otherwise it starts from the nodes holding its value's gradient.
  void backward_step(const Event& e) {
    const std::string id = event_id(e);
    node(backward_, id, styled("step", step_label(e), with_note(e, {{"fillcolor", step_fill(e.name)}})));
    const std::string grad_of = e.args.empty() ? e.value : e.args.front();
    auto& heads = grad_heads_[grad_of];
    if (!last_grad_id_.empty() && last_grad_of_ == grad_of && last_seq_ + 1 == e.seq) {
      edge(last_grad_id_, id, {{"style", "dashed"}});
      heads.erase(std::remove(heads.begin(), heads.end(), last_grad_id_), heads.end());
    } else {
      consume(e.value, id);
      if (grad_of == e.value) heads.clear();
    }
    heads.push_back(id);
    remember(e, grad_of);
  }
  void remember(const Event& e, const std::string& grad_of) {
    last_grad_id_ = event_id(e);
    last_grad_of_ = grad_of;
    last_seq_ = e.seq;
  }
  void input_grad(const Event& e) {
    std::string label =
        "grad " + e.value + "\n" + e.out_spec + (e.note.empty() ? "" : " (" + e.note + ")");
    node(backward_, event_id(e), styled("input_grad", label));
    consume(e.value, event_id(e));
  }
  void consume(const std::string& value, const std::string& to) {
    for (const auto& from : grad_heads_[value]) edge(from, to, {{"style", "dashed"}});
  }
  // The event's note, if any, as the node's tooltip (shown on hover in SVG).
  static Attrs with_note(const Event& e, Attrs attrs = {}) {
    if (!e.note.empty()) attrs.emplace_back("tooltip", e.note);
    return attrs;
  }

  void node(std::string& cluster, const std::string& id, const Attrs& attrs) {
    cluster += "    " + quote(id) + attr_list(attrs) + ";\n";
  }
  void edge(const std::string& from, const std::string& to, const Attrs& attrs = {}) {
    edges_ +=
        "  " + quote(from) + " -> " + quote(to) + (attrs.empty() ? "" : attr_list(attrs)) + ";\n";
  }

  const Trace& trace_;
  std::string forward_, backward_, edges_;
  // Forward value -> its redistribution steps not yet attached to an op.
  std::map<std::string, std::vector<const Event*>> pending_steps_;
  // Forward value -> its spec.
  std::map<std::string, std::string> spec_of_;
  // Value -> the backward nodes holding its gradient (several while contributions accumulate).
  std::map<std::string, std::vector<std::string>> grad_heads_;
  // The last backward node that produced a gradient, for chains of steps.
  std::string last_grad_id_, last_grad_of_;
  int64_t last_seq_ = -2;
};

std::string cluster(const std::string& name, const Attrs& attrs, const std::string& body) {
  if (body.empty()) return "";
  std::string out = "  subgraph " + quote("cluster_" + name) + " {\n";
  for (const auto& [key, value] : attrs) out += "    " + key + "=" + quote(value) + ";\n";
  return out + body + "  }\n";
}

// One row of boxes, in the order of kStepColors then the local step (invisible edges keep it).
std::string legend() {
  std::vector<std::pair<std::string, const char*>> rows;
  for (const auto& row : kStepColors) rows.emplace_back(row.name, row.fill);
  rows.emplace_back("local step", kLocalStepFill);
  std::string nodes, order;
  for (const auto& [name, fill] : rows) {
    const std::string id = quote("legend:" + name);
    nodes += "      " + id + attr_list(styled("step", name, {{"fillcolor", fill}})) + ";\n";
    order += (order.empty() ? "" : " -> ") + id;
  }
  const std::string body =
      "    {\n      rank=\"same\";\n" + nodes + "      " + order + " [style=\"invis\"];\n    }\n";
  return cluster("legend", {{"label", "legend"}, {"style", "rounded"}, {"color", "#bdbdbd"}}, body);
}

std::string Diagram::dot() const {
  std::string out = "digraph trace {\n";
  out += "  graph" +
         attr_list({{"rankdir", "TB"},
                    {"label", title(trace_)},
                    {"labelloc", "t"},
                    {"fontname", "Helvetica"}}) +
         ";\n";
  out += "  node" + attr_list({{"fontname", "Helvetica"}, {"fontsize", "10"}}) + ";\n";
  out += "  edge" + attr_list({{"fontname", "Helvetica"}, {"fontsize", "9"}}) + ";\n";
  const std::string note = status_note(trace_.result);
  if (!note.empty()) out += "  " + quote("status") + attr_list(styled("status", note)) + ";\n";
  out += cluster("forward", {{"label", "forward"}, {"style", "rounded"}, {"color", "#969696"}},
                 forward_);
  out += cluster("backward",
                 {{"label", "backward"}, {"style", "rounded,dashed"}, {"color", "#969696"}},
                 backward_);
  out += legend();
  return out + edges_ + "}\n";
}

// libgvc objects, freed in reverse order of creation.
struct GvcDeleter {
  void operator()(GVC_t* gvc) const { gvFreeContext(gvc); }
};
struct GraphDeleter {
  void operator()(Agraph_t* graph) const { agclose(graph); }
};

std::string layout(const std::string& dot, const std::string& format, const std::string& out_path) {
  std::unique_ptr<GVC_t, GvcDeleter> gvc(gvContext());
  std::unique_ptr<Agraph_t, GraphDeleter> graph(agmemread(dot.c_str()));
  if (!gvc || !graph) throw InputError(out_path, "", "graphviz could not read the diagram");
  if (gvLayout(gvc.get(), graph.get(), "dot") != 0)
    throw InputError(out_path, "", "graphviz layout failed");
  char* data = nullptr;
  unsigned int length = 0;
  const int rc = gvRenderData(gvc.get(), graph.get(), format.c_str(), &data, &length);
  std::string rendered = rc == 0 && data ? std::string(data, length) : std::string();
  gvFreeRenderData(data);
  gvFreeLayout(gvc.get(), graph.get());
  if (rendered.empty()) throw InputError(out_path, "", "graphviz could not render " + format);
  return rendered;
}

std::string extension(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const auto dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  return path.substr(dot + 1);
}

}  // namespace

std::string render_dot(const Trace& trace) { return Diagram(trace).dot(); }

void render_to_file(const Trace& trace, const std::string& out_path) {
  const std::string format = extension(out_path);
  if (format != "dot" && format != "svg" && format != "png") {
    throw InputError(out_path, "",
                     "unknown output format \"" + format + "\" (use .svg, .png or .dot)");
  }
  const std::string dot = render_dot(trace);
  const std::string bytes = format == "dot" ? dot : layout(dot, format, out_path);
  std::ofstream out(out_path, std::ios::binary);
  out << bytes;
  if (!out.flush()) throw InputError(out_path, "", "cannot write the file");
}

}  // namespace meshsim

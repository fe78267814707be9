// The explorer's graphs (explore_graph.h): one node per forward op (its value, op, spec and the
// collectives that made its operands), one per input, edges along the values; folded, one node per
// layer with its ops counted and its collectives summed per kind and axis.
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "traces/explore.h"
#include "traces/explore_graph.h"
#include "traces/render.h"

namespace meshsim {

using nlohmann::json;
using namespace render_detail;

namespace {

struct Node {
  std::string id;     // "e17" (an op event), "v:x" (an input)
  std::string value;  // the value it makes
  std::string label;
  int layer = -1;
  bool failing = false;
  std::vector<const Event*> collectives;  // the steps that made it or its operands' redistributions
  std::vector<size_t> from;               // the nodes that made the values it reads, when it ran
};

struct Program {
  std::vector<Node> nodes;
  std::map<std::string, size_t> maker;  // value -> its node (the last that made it)
};

std::string collective_line(const Event& e) {
  return "⇄ " + e.name + " " + e.axis + " " + bytes_str(e.bytes) + (e.implicit.empty() ? "" : " (implicit)");
}

// The forward phase as nodes: ops and inputs; a collective or redistribution step belongs to the op
// that makes the same value next (the steps come before their op).
Program program_of(const Trace& t, const Facts& f, const std::vector<int>& layer_of) {
  Program p;
  std::map<std::string, std::vector<const Event*>> pending;
  for (size_t i = 0; i < t.events.size(); ++i) {
    const Event& e = t.events[i];
    if (e.phase != "forward") continue;
    if (e.kind == "collective") {
      pending[e.value].push_back(&e);
      continue;
    }
    if (e.kind != "op" && e.kind != "input") continue;
    Node n;
    n.id = e.kind == "input" ? value_id(e.value) : event_id(e);
    n.value = e.value;
    n.layer = layer_of[i];
    n.failing = f.value_errors.count(e.value) > 0;
    // Its operands' makers as they were when it ran: local_map's entry makes a value of the same
    // name as its operand ("h" from "h").
    for (const auto& arg : e.args) {
      auto made = p.maker.find(arg);
      if (made != p.maker.end()) n.from.push_back(made->second);
    }
    auto it = pending.find(e.value);
    if (it != pending.end()) {
      n.collectives = std::move(it->second);
      pending.erase(it);
    }
    n.label = e.kind == "input" ? e.value + "\n" + e.out_spec : e.value + "\n" + drawn_name(f, e) + "  " + e.out_spec;
    for (const Event* c : n.collectives) n.label += "\n" + collective_line(*c);
    p.maker[e.value] = p.nodes.size();
    p.nodes.push_back(std::move(n));
  }
  return p;
}

const char* kHead =
    "digraph explore {\n"
    "  graph [rankdir=TB, nodesep=0.25, ranksep=0.35, bgcolor=\"transparent\", fontname=\"Helvetica\"];\n"
    "  node [shape=box, style=\"rounded,filled\", fillcolor=\"#ffffff\", color=\"#8c8c8c\", fontname=\"Helvetica\", "
    "fontsize=10];\n"
    "  edge [color=\"#9a9a9a\", arrowsize=0.6];\n";

std::string node_text(const Node& n) {
  Attrs a = {{"label", n.label}};
  if (n.id.rfind("v:", 0) == 0) a.push_back({"fillcolor", "#e8f1fa"});
  if (!n.collectives.empty()) {
    a.push_back({"color", step_style(n.collectives.front()->name).line});
    a.push_back({"penwidth", "2"});
  }
  if (n.failing) {
    a.push_back({"color", kRed});
    a.push_back({"penwidth", "3"});
    a.push_back({"fillcolor", "#fde0e0"});
  }
  return "  " + quote(n.id) + attr_list(a) + ";\n";
}

// The ordered, distinct edges of a graph.
struct Edges {
  std::vector<std::pair<std::string, std::string>> list;
  std::set<std::pair<std::string, std::string>> seen;
  void add(const std::string& from, const std::string& to) {
    if (from != to && seen.insert({from, to}).second) list.push_back({from, to});
  }
  std::string text() const {
    std::string out;
    for (const auto& [a, b] : list) out += "  " + quote(a) + " -> " + quote(b) + ";\n";
    return out;
  }
};

std::string layer_id(int layer) { return "g" + std::to_string(layer); }

std::string layer_label(const Program& p, int layer, const std::string& name) {
  int64_t ops = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> sums;  // "all_gather dp" -> count, bytes
  for (const Node& n : p.nodes) {
    if (n.layer != layer) continue;
    if (n.id.rfind("e", 0) == 0) ++ops;
    for (const Event* c : n.collectives) {
      auto& s = sums[c->name + " " + c->axis];
      ++s.first;
      s.second += c->bytes;
    }
  }
  std::string label = "▸ " + name + "\n" + count_str(ops) + (ops == 1 ? " op" : " ops") + " (click to expand)";
  for (const auto& [k, s] : sums) label += "\n⇄ " + k + " ×" + count_str(s.first) + ", " + bytes_str(s.second);
  return label;
}

std::string overview_dot(const Program& p, const std::vector<std::string>& layers) {
  std::string body;
  std::set<int> drawn;
  auto id_of = [&](const Node& n) { return n.layer >= 0 ? layer_id(n.layer) : n.id; };
  for (const Node& n : p.nodes) {
    if (n.layer < 0) {
      body += node_text(n);
    } else if (drawn.insert(n.layer).second) {
      bool failing = false;
      for (const Node& m : p.nodes) failing = failing || (m.layer == n.layer && m.failing);
      Attrs a = {{"label", layer_label(p, n.layer, layers[static_cast<size_t>(n.layer)])},
                 {"fillcolor", "#f6f1e3"},
                 {"color", failing ? kRed : kFoldInk},
                 {"penwidth", failing ? "3" : "1.5"}};
      body += "  " + quote(layer_id(n.layer)) + attr_list(a) + ";\n";
    }
  }
  Edges edges;
  for (const Node& n : p.nodes)
    for (size_t k : n.from) edges.add(id_of(p.nodes[k]), id_of(n));
  return std::string(kHead) + body + edges.text() + "}\n";
}

// A layer's ops, with the values it reads from outside as gray nodes "x:VALUE".
std::string layer_dot(const Program& p, int layer) {
  std::string body;
  Edges edges;
  std::set<std::string> outside;
  for (const Node& n : p.nodes) {
    if (n.layer != layer) continue;
    body += node_text(n);
    for (size_t k : n.from) {
      const Node& from = p.nodes[k];
      const std::string& arg = from.value;
      if (from.layer == layer) {
        edges.add(from.id, n.id);
      } else {
        const std::string id = "x:" + arg;
        if (outside.insert(id).second)
          body += "  " + quote(id) +
                  attr_list({{"label", arg}, {"style", "rounded,dashed"}, {"color", kLightGray}, {"fontcolor", kGray}}) +
                  ";\n";
        edges.add(id, n.id);
      }
    }
  }
  return std::string(kHead) + body + edges.text() + "}\n";
}

}  // namespace

std::vector<std::string> explore_dots(const Trace& t, const Facts& f, const std::vector<int>& layer_of,
                                      const std::vector<std::string>& layers) {
  const Program p = program_of(t, f, layer_of);
  std::vector<std::string> out = {overview_dot(p, layers)};
  for (size_t k = 0; k < layers.size(); ++k) out.push_back(layer_dot(p, static_cast<int>(k)));
  return out;
}

json explore_graphs(const Trace& t, const Facts& f, const std::vector<int>& layer_of,
                    const std::vector<std::string>& layers) {
  const Program p = program_of(t, f, layer_of);
  json out = {{"nodes", p.nodes.size()}, {"layers", json::array()}};
  // The largest graph dot is given: the overview (a node per layer) or the largest layer.
  std::map<int, size_t> per_layer;
  size_t overview = layers.size();
  for (const Node& n : p.nodes) {
    if (n.layer < 0) ++overview;
    else ++per_layer[n.layer];
  }
  size_t largest = overview;
  for (const auto& [_, n] : per_layer) largest = std::max(largest, n);
  if (largest > kExploreMaxGraphNodes) {
    out["overview"] = nullptr;
    out["note"] = "the program has " + count_str(static_cast<int64_t>(largest)) +
                  " nodes in one graph, more than the " + count_str(static_cast<int64_t>(kExploreMaxGraphNodes)) +
                  " laid out: use search, the steps and the tables";
    return out;
  }
  out["overview"] = layout_dot(overview_dot(p, layers), "svg", "explore graph");
  for (size_t k = 0; k < layers.size(); ++k)
    out["layers"].push_back(layout_dot(layer_dot(p, static_cast<int>(k)), "svg", "explore graph of " + layers[k]));
  return out;
}

}  // namespace meshsim

// Diagrams that fit a screen (render.h, "Layers" and RenderOptions::ops): which layer each event
// belongs to, the folds of a diagram folded by layer and their boxes; the block each rank holds, as
// the rank view draws it; the range of a program that --ops draws.
#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/layout.h"
#include "traces/render.h"
#include "traces/render_common.h"

namespace meshsim::render_detail {

namespace {

// ---------------------------------------------------------------------------------------------
// Where each value comes from in the program
// ---------------------------------------------------------------------------------------------

std::vector<std::string> outs_of(const json& op) {
  std::vector<std::string> out;
  if (op.value("out", json()).is_string()) out.push_back(op["out"].get<std::string>());
  if (op.value("outs", json()).is_array())
    for (const auto& o : op["outs"])
      if (o.is_string()) out.push_back(o.get<std::string>());
  return out;
}

// Every value an op makes (a local_map body's values included) -> the index of its top-level op.
void index_values(const json& ops, size_t top, bool nested, std::map<std::string, size_t>& out) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const json& op = ops[i];
    if (!op.is_object()) continue;
    const size_t at = nested ? top : i;
    for (const auto& name : outs_of(op)) out.emplace(name, at);
    if (op.value("body", json()).is_array()) index_values(op["body"], at, true, out);
  }
}

// The top-level op that made a value: its own, or for a name the runtime made for an operand
// ("y.arg1", "y.in0.dp"), y's.
class ProgramIndex {
 public:
  explicit ProgramIndex(const json& program) {
    if (program.is_array()) index_values(program, 0, false, of_);
  }
  // -1 when no op made it (an input, or a name the program does not have).
  int64_t op_of(const std::string& value) const {
    auto it = of_.find(value);
    if (it != of_.end()) return static_cast<int64_t>(it->second);
    const auto dot = value.find('.');
    if (dot == std::string::npos || dot == 0) return -1;
    it = of_.find(value.substr(0, dot));
    return it == of_.end() ? -1 : static_cast<int64_t>(it->second);
  }

 private:
  std::map<std::string, size_t> of_;
};

// ---------------------------------------------------------------------------------------------
// Layers
// ---------------------------------------------------------------------------------------------

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

// "layers.0.attention.wq" -> "layers.0"; "tok_embeddings" -> itself; the root module is no layer.
std::string layer_of_module(const std::string& module) {
  if (module.empty() || module == "(root)") return "";
  size_t start = 0;
  while (start <= module.size()) {
    const auto dot = module.find('.', start);
    const std::string part = module.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (all_digits(part)) return module.substr(0, dot == std::string::npos ? module.size() : dot);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return module;
}

// The shortest prefix that ends in a number and is followed by '_' or '.' ("l0_wq" -> "l0",
// "blocks.3.attn" -> "blocks.3"), and its stem ("l", "blocks."); "" when none.
std::pair<std::string, std::string> name_prefix(const std::string& name) {
  for (size_t i = 1; i + 1 < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i - 1])) || (name[i] != '_' && name[i] != '.')) continue;
    size_t stem = i;
    while (stem > 0 && std::isdigit(static_cast<unsigned char>(name[stem - 1]))) --stem;
    if (stem == 0) continue;
    return {name.substr(0, i), name.substr(0, stem)};
  }
  return {"", ""};
}

// An op's or an input's `group` field (docs/scenario-format.md): its layer, named by the scenario.
std::string group_of(const json& item) {
  const json g = item.value("group", json());
  return g.is_string() ? g.get<std::string>() : "";
}

std::string module_of(const json& item) {
  const json src = item.value("source", json());
  return src.is_object() && src.value("module", json()).is_string() ? src["module"].get<std::string>() : "";
}

// Every op's layer, and every input's ("" for none).
struct Layers {
  std::vector<std::string> of_op;
  std::map<std::string, std::string> of_input;
  std::vector<std::string> names;  // in program order
};

Layers layers_of(const Facts& f) {
  Layers out;
  const json& program = f.program;
  out.of_op.assign(program.size(), "");
  // Names: a stem counts when two layers share it.
  std::map<std::string, std::set<std::string>> prefixes_of_stem;
  for (const auto& op : program) {
    if (!op.is_object()) continue;
    for (const auto& name : outs_of(op)) {
      const auto [prefix, stem] = name_prefix(name);
      if (!prefix.empty()) prefixes_of_stem[stem].insert(prefix);
    }
  }
  auto by_name = [&](const std::string& name) -> std::string {
    const auto [prefix, stem] = name_prefix(name);
    if (prefix.empty()) return "";
    auto it = prefixes_of_stem.find(stem);
    return it != prefixes_of_stem.end() && it->second.size() >= 2 ? prefix : "";
  };
  std::map<std::string, int64_t> ops_in;
  for (size_t i = 0; i < program.size(); ++i) {
    const json& op = program[i];
    if (!op.is_object()) continue;
    std::string layer = group_of(op);
    if (layer.empty()) layer = layer_of_module(module_of(op));
    if (layer.empty() && module_of(op).empty()) {
      const auto outs = outs_of(op);
      if (!outs.empty()) layer = by_name(outs.front());
    }
    out.of_op[i] = layer;
    if (!layer.empty()) ++ops_in[layer];
  }
  for (auto& layer : out.of_op) {
    if (layer.empty()) continue;
    if (ops_in[layer] < kMinLayerOps) layer.clear();
    else if (std::find(out.names.begin(), out.names.end(), layer) == out.names.end()) out.names.push_back(layer);
  }
  for (const auto& in : f.inputs) {
    if (!in.is_object() || !in.value("name", json()).is_string()) continue;
    const std::string name = in["name"].get<std::string>();
    std::string layer = group_of(in);
    if (layer.empty()) layer = layer_of_module(module_of(in));
    if (layer.empty()) layer = by_name(name);
    if (std::find(out.names.begin(), out.names.end(), layer) != out.names.end()) out.of_input[name] = layer;
  }
  return out;
}

bool fails(const Event& e, const Facts& f) {
  if (e.kind == "input_grad") return f.grad_errors.count(e.value) > 0;
  return e.phase == "forward" && (e.kind == "input" || e.kind == "op") && f.value_errors.count(e.value) > 0;
}

// ---------------------------------------------------------------------------------------------
// The block each rank holds (the rank view's pictures)
// ---------------------------------------------------------------------------------------------

// A picture's sides, in points: of two sharded dims the first runs down, the second (or the only
// one) across.
constexpr double kBlockDown = 20, kBlockAcross = 56;
// The height of a picture of one sharded dim (drawn across).
constexpr int64_t kBlockRow = 10;

// "[S(0), SS(0,2)]" -> its placements; nullopt when it is not a DTensor spec of the mesh's rank.
std::optional<Spec> spec_of_text(const std::string& text, int ndim) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return std::nullopt;
  Spec spec;
  int depth = 0;
  std::string part;
  try {
    for (size_t i = 1; i + 1 <= text.size() - 1; ++i) {
      const char c = text[i];
      if (c == '(') ++depth;
      if (c == ')') --depth;
      if (c == ',' && depth == 0) {
        spec.push_back(parse_placement(part));
        part.clear();
        continue;
      }
      if (!(c == ' ' && part.empty())) part += c;
    }
    if (!part.empty()) spec.push_back(parse_placement(part));
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  if (static_cast<int>(spec.size()) != ndim) return std::nullopt;
  return spec;
}

// "[0:4, :]": the block of one rank, a dim it holds whole as ':'.
std::string block_text(const LocalLayout& l, const Shape& global) {
  std::string out;
  for (size_t d = 0; d < global.size(); ++d) {
    out += d ? ", " : "";
    if (l.shape[d] == global[d]) out += ":";
    else out += std::to_string(l.offset[d]) + ":" + std::to_string(l.offset[d] + l.shape[d]);
  }
  return "[" + out + "]";
}

}  // namespace

// The picture of the global tensor's sharded dims (two at most) cut where the shown ranks' blocks
// start and end, the blocks of `ranks` filled and labelled with their rank where it fits, and
// under it the block of the first of them as slices ("[0:3, :] of [5, 8]"): an uneven shard shows
// as cells of unequal size. "" for a tensor no placement shards, a strided shard (not one box),
// or a spec, shape or local shape that does not agree.
std::string block_picture(const Mesh& mesh, const std::string& spec_text, const Shape& global,
                          const std::vector<int64_t>& ranks, const std::vector<int64_t>& shown,
                          const std::vector<int64_t>& rep_local) {
  const auto spec = spec_of_text(spec_text, mesh.ndim());
  if (!spec || ranks.empty()) return "";
  std::vector<int64_t> dims;
  for (const auto& p : *spec) {
    if (!p.is_shard()) continue;
    if (p.is_strided() || p.dim < 0 || p.dim >= static_cast<int64_t>(global.size())) return "";
    if (std::find(dims.begin(), dims.end(), p.dim) == dims.end()) dims.push_back(p.dim);
  }
  if (dims.empty() || !check_spec(mesh, *spec, static_cast<int64_t>(global.size())).empty()) return "";
  std::sort(dims.begin(), dims.end());
  if (dims.size() > 2) dims.resize(2);
  std::map<int64_t, LocalLayout> layout;
  for (const auto* list : {&ranks, &shown})
    for (int64_t r : *list)
      if (!layout.count(r)) layout[r] = local_layout(mesh, *spec, global, r);
  if (layout[ranks.front()].shape != rep_local) return "";
  // The dim pictured down (the first of two sharded dims; none when one is) and across, each cut
  // where a shown block starts or ends.
  const int64_t down = dims.size() > 1 ? dims[0] : -1, across = dims.back();
  auto cuts_of = [&](int64_t d) {
    if (d < 0) return std::vector<int64_t>{0, 1};
    std::set<int64_t> at = {0, global[d]};
    for (const auto& [r, l] : layout) {
      at.insert(l.offset[d]);
      at.insert(l.offset[d] + l.shape[d]);
    }
    return std::vector<int64_t>(at.begin(), at.end());
  };
  const std::vector<int64_t> rows_at = cuts_of(down), cols_at = cuts_of(across);
  auto holds = [&](int64_t r, int64_t d, int64_t at) {
    return d < 0 || (at >= layout[r].offset[d] && at < layout[r].offset[d] + layout[r].shape[d]);
  };
  auto side = [](int64_t len, int64_t extent, double budget) {
    return std::max<int64_t>(3, static_cast<int64_t>(budget * static_cast<double>(len) / static_cast<double>(extent) + 0.5));
  };
  std::string rows;
  int64_t width = 0, height = 0;  // the cells' sum
  for (size_t j = 0; j + 1 < cols_at.size(); ++j) width += side(cols_at[j + 1] - cols_at[j], global[across], kBlockAcross) + 2;
  for (size_t i = 0; i + 1 < rows_at.size(); ++i) {
    const int64_t h = down < 0 ? kBlockRow : side(rows_at[i + 1] - rows_at[i], global[down], kBlockDown);
    height += h + 2;
    std::string row;
    for (size_t j = 0; j + 1 < cols_at.size(); ++j) {
      const int64_t w = side(cols_at[j + 1] - cols_at[j], global[across], kBlockAcross);
      std::string holders;
      for (int64_t r : ranks)
        if (holds(r, down, rows_at[i]) && holds(r, across, cols_at[j]))
          holders += (holders.empty() ? "" : ",") + std::to_string(r);
      // 6-point digits need 10 points of height and 4 of width each.
      const bool fits = h >= 10 && static_cast<int64_t>(holders.size()) * 4 + 4 <= w;
      row += "<TD FIXEDSIZE=\"TRUE\" WIDTH=\"" + std::to_string(w) + "\" HEIGHT=\"" + std::to_string(h) +
             "\" BGCOLOR=\"" + (holders.empty() ? "#ffffff" : "#9ecae1") + "\">" +
             (fits && !holders.empty() ? font(esc(holders), "#08306b", 6) : "") + "</TD>";
    }
    rows += "<TR>" + row + "</TR>";
  }
  // Of fixed size: a table in a wider cell would spread its columns apart.
  const std::string grid = "<TABLE FIXEDSIZE=\"TRUE\" WIDTH=\"" + std::to_string(width + 2) + "\" HEIGHT=\"" +
                           std::to_string(height + 2) +
                           "\" BORDER=\"1\" CELLBORDER=\"1\" CELLSPACING=\"0\" CELLPADDING=\"0\" COLOR=\"#7f8c99\">" +
                           rows + "</TABLE>";
  // Which dim runs which way: the picture's tooltip.
  const std::string ways = (down < 0 ? "" : "down: dim " + std::to_string(down) + ", ") + "across: dim " +
                           std::to_string(across) + "; filled: the blocks of the ranks drawn here";
  const std::string caption = (ranks.size() == 1 ? "" : "rank " + std::to_string(ranks.front()) + ": ") +
                              block_text(layout[ranks.front()], global) + " of " + shape_str(global);
  return "<TR><TD TOOLTIP=\"" + esc(ways) + "\">" + grid + "</TD></TR><TR><TD>" + small(caption, "#333333", 7) +
         "</TD></TR>";
}

Collapse plan_layer_folds(const Trace& t, const Facts& f) {
  Collapse c;
  const Layers layers = layers_of(f);
  const ProgramIndex index(f.program);
  // An op outside every layer that the runtime decomposes into ops of its own ("loss.pick" of a
  // cross_entropy "loss") folds into one box too, when it makes at least kMinLayerOps of them.
  std::map<size_t, int64_t> parts;
  for (const auto& e : t.events) {
    if (e.phase != "forward" || e.kind != "op" || is_implicit(e.value)) continue;
    const int64_t op = index.op_of(e.value);
    if (op >= 0 && layers.of_op[static_cast<size_t>(op)].empty() && e.value.find('.') != std::string::npos)
      ++parts[static_cast<size_t>(op)];
  }
  std::vector<std::string> box_of_op(f.program.size());
  for (size_t i = 0; i < box_of_op.size(); ++i) {
    if (!layers.of_op[i].empty()) box_of_op[i] = "layer " + layers.of_op[i];
    auto it = parts.find(i);
    if (it != parts.end() && it->second >= kMinLayerOps) {
      const auto outs = outs_of(f.program[i]);
      box_of_op[i] = (outs.empty() ? "op " + std::to_string(i) : outs.front()) + " = " +
                     show(f.program[i].value("op", json("?"))) + ", decomposed";
    }
  }
  auto layer_of_value = [&](const std::string& value) -> std::string {
    const int64_t op = index.op_of(value);
    if (op >= 0) return box_of_op[static_cast<size_t>(op)];
    auto it = layers.of_input.find(value);
    return it == layers.of_input.end() ? "" : "layer " + it->second;
  };
  std::map<std::pair<std::string, bool>, int> fold_of_key;
  c.fold_of.assign(t.events.size(), -1);
  for (size_t i = 0; i < t.events.size(); ++i) {
    const Event& e = t.events[i];
    const bool backward = e.phase != "forward";
    const bool op = !backward && e.kind == "op";
    c.ops += op;
    c.backward_events += backward;
    // A backward step moves the gradient of its first argument.
    std::string layer = layer_of_value(e.value);
    if (layer.empty() && backward && !e.args.empty()) layer = layer_of_value(e.args.front());
    if (layer.empty() || e.kind == "seed") {
      ++c.drawn;
      continue;
    }
    auto [it, fresh] = fold_of_key.emplace(std::make_pair(layer, backward), static_cast<int>(c.folds.size()));
    if (fresh) {
      Fold fold;
      fold.layer = layer;
      fold.backward = backward;
      fold.first = i;
      c.folds.push_back(fold);
      ++c.drawn;
    }
    Fold& fold = c.folds[it->second];
    c.fold_of[i] = it->second;
    fold.end = i + 1;
    ++fold.events;
    fold.ops += op;
    fold.inputs += !backward && e.kind == "input";
    fold.failing += fails(e, f);
    if (is_collective_name(e.name) && (e.kind == "collective" || e.bytes > 0)) {
      auto& [count, bytes] = fold.collectives[e.name + (e.axis.empty() ? "" : " " + e.axis)];
      ++count;
      bytes += e.bytes;
    }
    c.ops_folded += op;
    c.backward_folded += backward;
  }
  if (c.folds.empty()) return Collapse{};
  for (const auto& fold : c.folds)
    if (!fold.backward && fold.layer.compare(0, 6, "layer ") != 0) ++c.decomposed;
  for (const auto& name : layers.names)
    if (fold_of_key.count({"layer " + name, false}) || fold_of_key.count({"layer " + name, true}))
      c.layers.push_back(name);
  return c;
}

// A layer's box: its name, what it holds, and its collectives summed per kind and axis, each in
// its kind's color.
Attrs layer_fold_attrs(const Fold& fold, const Attrs& extra) {
  std::string label = bold(fold.layer) + " " + small(fold.backward ? "backward" : "forward", kGray, 9);
  std::string held;
  if (fold.ops > 0) held = count_str(fold.ops) + (fold.ops == 1 ? " op" : " ops");
  if (fold.inputs > 0) held += (held.empty() ? "" : ", ") + count_str(fold.inputs) + (fold.inputs == 1 ? " input" : " inputs");
  held += (held.empty() ? "" : ", ") + count_str(fold.events) + (fold.events == 1 ? " event" : " events");
  label += kBr + small(held, "#333333", 9);
  if (fold.collectives.empty()) label += kBr + small("no collectives", kGray, 9);
  for (const auto& [what, sum] : fold.collectives) {
    const std::string kind = what.substr(0, what.find(' '));
    label += kBr + font(bold(what) + esc(" ×" + count_str(sum.first) + ": " + bytes_str(sum.second) + "/rank"),
                        step_style(kind).line, 9);
  }
  Attrs attrs = {{"label", html_value(label)}, {"shape", "tab"}, {"style", "filled"},
                 {"fillcolor", fold.backward ? "#f7eef3" : "#eef3f8"}, {"color", fold.backward ? kBackwardEdge : "#3b6a9a"},
                 {"penwidth", "1.4"}, {"margin", "0.15,0.06"}};
  if (fold.failing > 0) {
    attrs[0].second = html_value(label + kBr + font(bold("✗ " + count_str(fold.failing) + " failing " +
                                                          (fold.backward ? "gradients" : "values") + " inside"),
                                                     kRed, 10));
    for (auto& a : attrs) {
      if (a.first == "color") a.second = kRed;
      if (a.first == "penwidth") a.second = "3";
    }
  }
  attrs.insert(attrs.end(), extra.begin(), extra.end());
  return attrs;
}

// The title's lines on a diagram folded by layer.
std::string layer_fold_lines(const Collapse& c) {
  std::string names;
  for (size_t k = 0; k < c.layers.size() && k < 6; ++k) names += (k ? ", " : "") + c.layers[k];
  if (c.layers.size() > 6) names += ", …";
  std::string what = count_str(c.ops_folded) + " of " + count_str(c.ops) + " ops";
  if (c.backward_folded > 0)
    what += " and " + count_str(c.backward_folded) + " of " + count_str(c.backward_events) + " backward events";
  const auto layers = static_cast<int64_t>(c.layers.size());
  std::string folded = layers > 0 ? count_str(layers) + (layers == 1 ? " layer (" : " layers (") + names + ")" : "";
  if (c.decomposed > 0)
    folded += (folded.empty() ? "" : " and ") + count_str(c.decomposed) +
              (c.decomposed == 1 ? " decomposed op" : " decomposed ops");
  std::string out = kBr + font(bold("folded by layer: " + folded), kFoldInk, 11);
  out += kBr + font(esc(what + " in " + count_str(static_cast<int64_t>(c.folds.size())) +
                        " boxes, one per layer and phase, each with its collectives summed (render --no-fold draws every op)"),
                    kGray, 10);
  return out;
}

// ---------------------------------------------------------------------------------------------
// --ops FROM..TO
// ---------------------------------------------------------------------------------------------

Trace trace_in_range(const Trace& t, size_t first, size_t last) {
  const json program = t.scenario.is_object() ? t.scenario.value("program", json::array()) : json::array();
  const ProgramIndex index(program);
  auto in_range = [&](const std::string& value) {
    const int64_t op = index.op_of(value);
    return op >= static_cast<int64_t>(first) && op <= static_cast<int64_t>(last);
  };
  // The inputs the ops read, in their bodies too.
  std::set<std::string> inputs;
  std::vector<const json*> todo;
  for (size_t i = first; i <= last && i < program.size(); ++i) todo.push_back(&program[i]);
  while (!todo.empty()) {
    const json& op = *todo.back();
    todo.pop_back();
    if (!op.is_object()) continue;
    if (op.value("args", json()).is_array())
      for (const auto& a : op["args"])
        if (a.is_string() && index.op_of(a.get<std::string>()) < 0) inputs.insert(a.get<std::string>());
    if (op.value("body", json()).is_array())
      for (const auto& inner : op["body"]) todo.push_back(&inner);
  }
  Trace out;
  out.version = t.version;
  out.scenario = t.scenario;
  out.options = t.options;
  out.result = t.result;
  static_assert(sizeof(Trace) == sizeof(out.version) + 3 * sizeof(json) + sizeof(out.events),
                "a field of Trace that trace_in_range does not copy");
  for (const auto& e : t.events) {
    bool keep = false;
    if (e.phase == "forward") {
      keep = e.kind == "input" ? inputs.count(e.value) > 0 : in_range(e.value);
    } else if (e.kind == "input_grad") {
      keep = inputs.count(e.value) > 0;
    } else if (e.kind == "seed") {
      keep = in_range(e.value);
    } else {
      keep = in_range(e.value) || inputs.count(e.value) > 0 ||
             (!e.args.empty() && (in_range(e.args.front()) || inputs.count(e.args.front()) > 0));
    }
    if (keep) out.events.push_back(e);
  }
  return out;
}

}  // namespace meshsim::render_detail

namespace meshsim {

using nlohmann::json;

namespace {

// One end of a range: an index into the program or a value an op makes.
size_t range_end(const json& program, const std::string& range, const std::string& end, const char* which) {
  const std::string where = "--ops \"" + range + "\": ";
  if (std::all_of(end.begin(), end.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    if (end.size() > 9) throw std::invalid_argument(where + which + " " + end + " is past the program's last op");
    const auto at = static_cast<size_t>(std::stoul(end));
    if (at >= program.size())
      throw std::invalid_argument(where + which + " " + end + " is past the program's last op, " +
                                  std::to_string(program.size() - 1) + " (ops are numbered from 0)");
    return at;
  }
  for (size_t i = 0; i < program.size(); ++i) {
    if (!program[i].is_object()) continue;
    for (const auto& name : render_detail::outs_of(program[i]))
      if (name == end) return i;
  }
  throw std::invalid_argument(where + which + " \"" + end +
                              "\" is neither an op index nor a value an op of the program makes");
}

}  // namespace

std::pair<size_t, size_t> parse_op_range(const Trace& trace, const std::string& range) {
  const std::string where = "--ops \"" + range + "\": ";
  const json program = trace.scenario.is_object() ? trace.scenario.value("program", json()) : json();
  if (!program.is_array() || program.empty()) throw std::invalid_argument(where + "the file has no program to cut");
  const auto dots = range.find("..");
  if (dots == std::string::npos || range.find("..", dots + 2) != std::string::npos)
    throw std::invalid_argument(where + "expected FROM..TO (each end an op index or the name of a value an op makes; "
                                        "either end may be left out)");
  const std::string from = range.substr(0, dots), to = range.substr(dots + 2);
  const size_t first = from.empty() ? 0 : range_end(program, range, from, "FROM");
  const size_t last = to.empty() ? program.size() - 1 : range_end(program, range, to, "TO");
  if (first > last)
    throw std::invalid_argument(where + "FROM (op " + std::to_string(first) + ") comes after TO (op " +
                                std::to_string(last) + ")");
  return {first, last};
}

}  // namespace meshsim

// The frame of a diagram (title, status note, legend, the program as written), which events a
// diagram too large for dot's layout folds, layout with libgvc, and the public functions of
// render.h; the views live in render_logical.cpp and render_ranks.cpp.
#include "traces/render.h"

#include <graphviz/gvc.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cost_model.h"
#include "core/error.h"
#include "core/files.h"
#include "traces/render_common.h"

namespace meshsim {

// ---------------------------------------------------------------------------------------------
// Collapsing a diagram too large for dot's layout
// ---------------------------------------------------------------------------------------------

namespace render_detail {

namespace {

// A run folds when it repeats at least this often: its first and last repetitions stay drawn,
// so a fold holds two or more.
constexpr int64_t kMinRepetitions = 4;
// The longest pattern looked for, in items (an item is an event or a whole folded run): a
// transformer layer of a trace is about 30 events.
constexpr size_t kMaxPeriod = 32;
// Runs of runs of runs: a layer made of repeated blocks, repeated itself.
constexpr int kFoldPasses = 3;
// An elision keeps at least this many items of its phase, half before it and half after.
constexpr size_t kMinKeptPerPhase = 8;
// A fold's pattern is cut after this many bytes (ten lines): nested runs of long blocks spell out
// long patterns.
constexpr size_t kMaxPatternChars = 480;

// What a phase draws, in order: one event, or one whole folded run (its drawn first repetition,
// its fold node, its drawn last repetition).
struct Item {
  size_t first = 0, end = 0;  // its events
  int sig = 0;                // equal signatures draw alike
  int fold = -1;              // a whole run: its fold
  size_t drawn = 1;           // events and fold nodes it draws
};

// One repetition's word per event: "add", "all_gather dp", "grad mul".
std::string event_word(const Event& e) {
  if (e.kind == "collective") return e.name + (e.axis.empty() ? "" : " " + e.axis);
  if (e.kind == "op" && e.name == "redistribute") return "redistribute to " + e.out_spec;
  if (e.kind == "grad") return "grad " + e.name;
  if (e.kind == "input_grad") return "input grad";
  if (e.kind == "seed" || e.kind == "input" || e.name.empty()) return e.kind;
  return e.name;
}

// An elision's count per name: ops by name, steps by collective, backward events by kind.
std::string count_key(const Event& e) {
  if (e.kind == "grad") return "grad " + e.name;
  if (e.kind == "op" || e.kind == "collective" || e.kind == "local") return e.name.empty() ? e.kind : e.name;
  return e.kind;
}

bool event_fails(const Event& e, const Facts& f) {
  if (e.kind == "input_grad") return f.grad_errors.count(e.value) > 0;
  return e.phase == "forward" && (e.kind == "input" || e.kind == "op") && f.value_errors.count(e.value) > 0;
}

class Planner {
 public:
  Planner(const Trace& t, const Facts& f) : t_(t), f_(f) {}

  Collapse plan(size_t max_drawn) {
    c_.fold_of.assign(t_.events.size(), -1);
    std::vector<std::vector<Item>> phases;
    for (size_t i = 0; i < t_.events.size(); ++i) {
      if (i == 0 || t_.events[i].phase != t_.events[i - 1].phase) phases.emplace_back();
      phases.back().push_back(Item{i, i + 1, signature(i)});
    }
    for (auto& items : phases)
      for (int pass = 0; pass < kFoldPasses; ++pass) items = fold_runs(items);
    elide(phases, max_drawn);
    return finish();
  }

 private:
  // Events draw alike when their kind, name, specs, axis, bytes and rule are equal; a failing
  // value or gradient is like no other, so no run folds it.
  int signature(size_t i) {
    const Event& e = t_.events[i];
    // An input's name is its value's: inputs alike differ only by it.
    std::string key = e.phase + '\x1f' + e.kind + '\x1f' + (e.kind == "input" ? "" : e.name) + '\x1f' + e.out_spec +
                      '\x1f' + e.axis + '\x1f' + std::to_string(e.bytes) + '\x1f' + e.note + '\x1f' + e.implicit + '\x1f' +
                      std::to_string(e.args.size());
    for (const auto& s : e.in_specs) key += '\x1f' + s;
    if (event_fails(e, f_)) key += "\x1f!" + std::to_string(i);
    return intern(key);
  }
  int intern(const std::string& key) { return sigs_.emplace(key, static_cast<int>(sigs_.size())).first->second; }

  static bool same(const std::vector<Item>& items, size_t a, size_t b, size_t n) {
    for (size_t k = 0; k < n; ++k)
      if (items[a + k].sig != items[b + k].sig) return false;
    return true;
  }

  // One pass: every run of kMinRepetitions or more repetitions becomes one item; at each place,
  // the period covering the most items wins (the shorter on a tie).
  std::vector<Item> fold_runs(const std::vector<Item>& items) {
    std::vector<Item> out;
    size_t i = 0;
    while (i < items.size()) {
      size_t period = 0;
      int64_t reps = 0;
      for (size_t p = 1; p <= kMaxPeriod && i + p * kMinRepetitions <= items.size(); ++p) {
        int64_t k = 1;
        while (i + (k + 1) * p <= items.size() && same(items, i, i + k * p, p)) ++k;
        if (k >= kMinRepetitions && static_cast<size_t>(k) * p > static_cast<size_t>(reps) * period) {
          period = p;
          reps = k;
        }
      }
      if (period == 0) {
        out.push_back(items[i++]);
        continue;
      }
      out.push_back(fold_run(items, i, period, reps));
      i += period * reps;
    }
    return out;
  }

  Item fold_run(const std::vector<Item>& items, size_t at, size_t period, int64_t reps) {
    Fold fold;
    fold.backward = t_.events[items[at].first].phase != "forward";
    fold.first = items[at + period].first;
    fold.end = items[at + (reps - 1) * period - 1].end;
    fold.repetitions = reps;
    fold.folded_repetitions = reps - 2;
    std::string sig = "run\x1f" + std::to_string(reps);
    size_t drawn = 0;
    for (size_t k = at; k < at + period; ++k) {
      fold.pattern += (fold.pattern.empty() ? "" : " \u2192 ") + word(items[k]);
      sig += '\x1f' + std::to_string(items[k].sig);
      drawn += items[k].drawn;
    }
    c_.folds.push_back(fold);
    Item run;
    run.first = items[at].first;
    run.end = items[at + reps * period - 1].end;
    run.sig = intern(sig);
    run.fold = static_cast<int>(c_.folds.size()) - 1;
    run.drawn = 2 * drawn + 1;
    return run;
  }

  std::string word(const Item& item) const {
    if (item.fold < 0) return event_word(t_.events[item.first]);
    const Fold& inner = c_.folds[item.fold];
    return "(" + inner.pattern + ") \u00d7" + count_str(inner.repetitions);
  }

  // While more than max_drawn items are drawn, the middle of each phase over its share (by its
  // size) becomes one elision.
  void elide(std::vector<std::vector<Item>>& phases, size_t max_drawn) {
    size_t total = 0;
    for (const auto& items : phases)
      for (const auto& item : items) total += item.drawn;
    if (total <= max_drawn) return;
    for (auto& items : phases) {
      size_t drawn = 0;
      for (const auto& item : items) drawn += item.drawn;
      const size_t share = std::max(kMinKeptPerPhase, max_drawn * drawn / total);
      if (drawn <= share) continue;
      size_t head = 0, head_drawn = 0;
      while (head < items.size() && head_drawn + items[head].drawn <= share / 2) head_drawn += items[head++].drawn;
      size_t tail = items.size(), tail_drawn = 0;
      while (tail > head && tail_drawn + items[tail - 1].drawn <= share - share / 2 - 1)
        tail_drawn += items[--tail].drawn;
      if (tail - head < 2) continue;
      Fold fold;
      fold.elided = true;
      fold.backward = t_.events[items[head].first].phase != "forward";
      fold.first = items[head].first;
      fold.end = items[tail - 1].end;
      c_.folds.push_back(fold);
    }
  }

  // Each event's fold (a later fold, which holds an earlier one, wins), the folds that hold an
  // event renumbered in drawing order, and the counts.
  Collapse finish() {
    for (size_t k = 0; k < c_.folds.size(); ++k)
      for (size_t i = c_.folds[k].first; i < c_.folds[k].end; ++i) c_.fold_of[i] = static_cast<int>(k);
    std::vector<int> renumber(c_.folds.size(), -1);
    std::vector<Fold> kept;
    std::vector<std::map<std::string, int64_t>> names;
    for (size_t i = 0; i < t_.events.size(); ++i) {
      const Event& e = t_.events[i];
      const bool op = e.phase == "forward" && e.kind == "op";
      c_.ops += op;
      c_.backward_events += e.phase != "forward";
      int& k = c_.fold_of[i];
      if (k < 0) {
        ++c_.drawn;
        continue;
      }
      if (renumber[k] < 0) {
        renumber[k] = static_cast<int>(kept.size());
        kept.push_back(c_.folds[k]);
        kept.back().first = i;
        names.emplace_back();
        ++c_.drawn;
      }
      k = renumber[k];
      Fold& fold = kept[k];
      fold.end = i + 1;
      ++fold.events;
      fold.ops += op;
      fold.failing += event_fails(e, f_);
      ++names[k][count_key(e)];
      c_.ops_folded += op;
      c_.backward_folded += e.phase != "forward";
    }
    for (size_t k = 0; k < kept.size(); ++k) {
      kept[k].names.assign(names[k].begin(), names[k].end());
      std::stable_sort(kept[k].names.begin(), kept[k].names.end(),
                       [](const auto& a, const auto& b) { return a.second > b.second; });
    }
    c_.folds = std::move(kept);
    if (c_.folds.empty()) c_.fold_of.clear();
    return std::move(c_);
  }

  const Trace& t_;
  const Facts& f_;
  std::unordered_map<std::string, int> sigs_;
  Collapse c_;
};

}  // namespace

Collapse plan_collapse(const Trace& t, const Facts& f, size_t max_drawn) { return Planner(t, f).plan(max_drawn); }

std::string count_str(int64_t n) { return grouped_digits(n); }

Attrs fold_attrs(const Fold& fold, const Attrs& extra) {
  if (!fold.layer.empty()) return layer_fold_attrs(fold, extra);
  // "188 ops", "19,392 ops, 19,584 events" (with their steps), "288 backward events"
  std::string folded = fold.ops > 0 ? count_str(fold.ops) + (fold.ops == 1 ? " op" : " ops") : "";
  if (fold.events != fold.ops)
    folded += (folded.empty() ? "" : ", ") + count_str(fold.events) + (fold.backward ? " backward" : "") +
              (fold.events == 1 ? " event" : " events");
  std::string label;
  Attrs attrs;
  if (fold.elided) {
    label = bold("\u22ee " + folded + " not drawn") + kBr +
            small(std::string("the middle of the ") + (fold.backward ? "backward" : "forward") +
                  ", elided: the diagram is collapsed", kGray, 9);
    std::string counts;
    for (size_t k = 0; k < fold.names.size() && k < 8; ++k)
      counts += (k ? " \u00b7 " : "") + fold.names[k].first + " \u00d7" + count_str(fold.names[k].second);
    if (fold.names.size() > 8) counts += " \u00b7 \u2026";
    for (const auto& line : wrap(counts, 48)) label += kBr + small(line, "#333333", 9);
    attrs = {{"label", html_value(label)}, {"shape", "box"}, {"style", "rounded,dashed,filled"},
             {"fillcolor", "#fafafa"}, {"color", "#737373"}, {"margin", "0.2,0.08"}};
  } else {
    label = bold("\u00d7" + count_str(fold.folded_repetitions) + " repetitions folded");
    std::string pattern = "(" + fold.pattern + ") \u00d7" + count_str(fold.repetitions);
    if (pattern.size() > kMaxPatternChars) {
      size_t cut = kMaxPatternChars - 4;
      // Not inside a UTF-8 character.
      while (cut > 0 && (static_cast<unsigned char>(pattern[cut]) & 0xC0) == 0x80) --cut;
      pattern = pattern.substr(0, cut) + " ...";
    }
    for (const auto& line : wrap(pattern, 48))
      label += kBr + mono(line, "#333333", 9);
    label += kBr + small(folded + "; the run's first and last repetitions are drawn", kGray, 9);
    attrs = {{"label", html_value(label)}, {"shape", "box3d"}, {"style", "filled"},
             {"fillcolor", "#f4f1e4"}, {"color", kFoldInk}, {"margin", "0.15,0.06"}};
  }
  if (fold.failing > 0) {
    attrs[0].second = html_value(label + kBr + font(bold("\u2717 " + count_str(fold.failing) + " failing " +
                                                          (fold.backward ? "gradients" : "values") + " inside"),
                                                     kRed, 10));
    attrs.emplace_back("penwidth", "3");
    for (auto& a : attrs)
      if (a.first == "color") a.second = kRed;
  }
  attrs.insert(attrs.end(), extra.begin(), extra.end());
  return attrs;
}

}  // namespace render_detail

using namespace render_detail;

namespace {

// ---------------------------------------------------------------------------------------------
// Title, note, legend
// ---------------------------------------------------------------------------------------------

// The title's lines on a collapsed diagram: that it is, and what it folded.
std::string collapse_lines(const Collapse& c) {
  if (!c.layers.empty() || c.decomposed > 0) return layer_fold_lines(c);
  std::string what = count_str(c.ops_folded) + " of " + count_str(c.ops) + " ops";
  if (c.backward_folded > 0)
    what += " and " + count_str(c.backward_folded) + " of " + count_str(c.backward_events) + " backward events";
  const auto folds = static_cast<int64_t>(c.folds.size());
  std::string out = kBr + font(bold("collapsed: " + what + " folded into " + count_str(folds) +
                                    (folds == 1 ? " node" : " nodes")),
                               kFoldInk, 11);
  out += kBr + font(esc("a diagram too large for dot to lay out in seconds is collapsed:"), kGray, 10);
  if (std::any_of(c.folds.begin(), c.folds.end(), [](const Fold& k) { return !k.elided; }))
    out += kBr + font(esc("a run of a repeated pattern: its first repetition, one \u00d7N node, its last repetition"),
                      kGray, 10);
  if (std::any_of(c.folds.begin(), c.folds.end(), [](const Fold& k) { return k.elided; }))
    out += kBr + font(esc("still too long: the middle of a phase is one \u22ee node, with what it holds"), kGray, 10);
  return out;
}

std::string title(const Trace& t, const Facts& f, const std::string& view_line, const std::string& collapse_html) {
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
  out += collapse_html;
  if (!verdict.empty()) out += kBr + verdict;
  return out;
}

// Node roles and step kinds in two columns (one, under each other, for the rank view: it is
// wide enough), then a line on edges; invisible edges stack them.
std::string legend(bool with_op, bool one_column, const Collapse& collapse) {
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
  // A collapsed diagram's folds, after the roles: what a fold and an elision look like.
  for (const auto& fold : collapse.folds) {
    const std::string name = !fold.layer.empty() ? "layer" : fold.elided ? "elided" : "folded";
    if (std::any_of(roles.begin(), roles.end(), [&](const auto& r) { return r.first == name; })) continue;
    Attrs attrs = fold_attrs(fold);
    attrs[0].second = html_value(!fold.layer.empty() ? bold("layer") + kBr + small("collectives summed")
                                 : fold.elided ? bold("\u22ee events not drawn") + kBr + small("what they hold")
                                               : bold("\u00d7N repetitions folded") + kBr + small("(pattern) \u00d7total"));
    for (auto& a : attrs)
      if (a.first == "color" && fold.failing > 0)
        a.second = !fold.layer.empty() ? (fold.backward ? kBackwardEdge : "#3b6a9a") : fold.elided ? "#737373" : kFoldInk;
    attrs.erase(std::remove_if(attrs.begin(), attrs.end(), [](const auto& a) { return a.first == "penwidth"; }),
                attrs.end());
    roles.push_back({name, attrs});
  }
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

// A diagram folded by layer is laid out with ranks this far apart (inches; 0.38 otherwise): its
// boxes and the values between them stay readable, and a transformer step fits 3,000 px.
constexpr const char* kFoldedRankSep = "0.14";

std::string graph_header(const std::string& title_html, size_t nodes, bool folded_by_layer) {
  Attrs large;
  if (nodes > kLargeDiagramNodes) large = {{"nslimit", "0.1"}};
  std::string out = "digraph trace {\n";
  out += "  graph" +
         attr_list({{"rankdir", "TB"},
                    {"label", html_value(title_html)},
                    {"labelloc", "t"},
                    {"fontname", kFont},
                    {"nodesep", "0.3"},
                    {"ranksep", folded_by_layer ? kFoldedRankSep : "0.38"},
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

// A program drawn as written keeps this many of its ops, half from its start, half from its end.
constexpr size_t kSketchMaxOps = 300;

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
  // A long program draws its first and last ops and the op the error names; the others are one
  // node, and their outputs lead from it.
  const size_t ops = f.program.size();
  const bool cut = ops > kSketchMaxOps;
  const size_t head = kSketchMaxOps / 2, tail = ops - kSketchMaxOps / 2;
  const std::string elided_id = "program:elided";
  std::map<std::string, std::string> node_of;  // an elided op's output -> the elided node
  std::set<std::pair<std::string, std::string>> elided_edges;
  bool elided_drawn = false;
  for (size_t i = 0; i < f.program.size(); ++i) {
    const json& op = f.program[i];
    if (!op.is_object()) continue;
    if (cut && i >= head && i < tail && static_cast<int>(i) != culprit) {
      if (!elided_drawn) {
        const bool culprit_inside = culprit >= static_cast<int>(head) && culprit < static_cast<int>(tail);
        const auto hidden = static_cast<int64_t>(tail - head) - culprit_inside;
        const std::string where = "ops " + count_str(static_cast<int64_t>(head) + 1) + " to " +
                                  count_str(static_cast<int64_t>(tail)) + " of " +
                                  count_str(static_cast<int64_t>(ops)) + ": the diagram is collapsed";
        const std::string label = bold("\u22ee " + count_str(hidden) + " ops not drawn") + kBr + small(where, kGray, 9);
        body += node_line(elided_id, {{"label", html_value(label)},
                                      {"shape", "box"},
                                      {"style", "rounded,dashed"},
                                      {"color", "#737373"}});
      }
      elided_drawn = true;
      const json out = op.value("out", json());
      if (out.is_string()) node_of[out.get<std::string>()] = elided_id;
      if (out.is_array())
        for (const auto& o : out) node_of[show(o)] = elided_id;
      continue;
    }
    const std::string id = "p" + std::to_string(i);
    std::string label = bold(show(op.value("op", json("?"))));
    if (op.value("placements", json()).is_array()) label += kBr + mono("\u2192 " + spec_of_json(op["placements"]));
    const bool failing = static_cast<int>(i) == culprit;
    if (failing) label += error_lines({f.error_message}, 36);
    body += node_line(id, node_attrs(Role::Op, label, failing));
    if (op.value("args", json()).is_array()) {
      for (const auto& a : op["args"]) {
        const std::string arg = show(a);
        auto elided = node_of.find(arg);
        if (elided != node_of.end()) {
          if (elided_edges.insert({elided->second, id}).second)
            edges += "  " + quote(elided->second) + " -> " + quote(id) + ";\n";
          continue;
        }
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
// The body of a diagram, drawn in full or collapsed
// ---------------------------------------------------------------------------------------------

// A collapsed diagram aims at this layout size: under kRenderMaxLayoutSize, as the size per
// drawn event is a guess from the last drawing.
constexpr size_t kCollapsedSize = kRenderMaxLayoutSize * 3 / 4;
// A trace of more events is not drawn in full first (to measure it): it is collapsed at once.
constexpr size_t kDrawInFullUpToEvents = 4 * kRenderMaxLayoutSize;
// Rounds of collapsing (render_dot): folding, then elision to a shrinking budget.
constexpr int kCollapseRounds = 6;

struct Body {
  std::string text, view_line;
  size_t nodes = 0;
  size_t size = 0;  // layout_size
};

Body draw(const Trace& trace, const Facts& facts, RenderView view, const Collapse& collapse) {
  Body out;
  if (view == RenderView::Ranks) {
    RankViewText ranks = rank_view(trace, facts, collapse);
    out.text = std::move(ranks.body);
    out.view_line = std::move(ranks.view_line);
  } else {
    out.text = logical_view(trace, facts, collapse);
  }
  out.nodes = count_nodes(out.text);
  out.size = layout_size(out.text, out.nodes);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------------------------

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
  RenderOptions options;
  options.view = view;
  return render_dot(trace, options);
}

std::string render_dot(const Trace& full_trace, const RenderOptions& options) {
  const RenderView view = options.view;
  Trace cut;
  std::string range_line, range_numbers;
  if (!options.ops.empty()) {
    const auto [first, last] = parse_op_range(full_trace, options.ops);
    cut = trace_in_range(full_trace, first, last);
    const json& program = full_trace.scenario["program"];
    auto named = [&](size_t i) {
      const json out = program[i].is_object() ? program[i].value("out", json()) : json();
      return "program[" + std::to_string(i) + "]" + (out.is_string() ? " " + out.get<std::string>() : "");
    };
    range_numbers = std::to_string(first) + ".." + std::to_string(last);
    range_line = "ops " + range_numbers + " of " +
                 std::to_string(program.size()) + " drawn (" + named(first) + " to " + named(last) + ")";
  }
  const Trace& trace = options.ops.empty() ? full_trace : cut;
  Facts facts = facts_of(trace);
  if (!options.ops.empty()) facts.ghost_note = "made outside --ops " + range_numbers;
  const bool program_only = trace.events.empty() && !facts.program.empty() && options.ops.empty();
  Collapse collapse;
  Body body;
  if (program_only) {
    std::string sketch_edges;
    body.text = sketch(facts, sketch_edges) + sketch_edges;
    body.nodes = count_nodes(body.text);
  } else {
    // Drawn in full when it fits, folded by layer when asked or when it has more than
    // kFoldAboveNodes nodes. Else its repeated runs fold; if that is not enough, phases are
    // elided to a budget of drawn events, shrunk each round by the square root of the size still
    // too much: the size grows between linearly (a chain) and quadratically (a weight read by
    // every layer crosses the ranks of all of them) with the events drawn.
    const bool try_full = trace.events.size() <= kDrawInFullUpToEvents;
    bool drawn = false;
    if (try_full && options.fold != FoldMode::Always) {
      body = draw(trace, facts, view, collapse);
      drawn = true;
    }
    const bool by_layer = options.fold == FoldMode::Always ||
                          (options.fold == FoldMode::Auto && (!drawn || body.nodes > kFoldAboveNodes));
    if (by_layer) {
      Collapse layers = plan_layer_folds(trace, facts);
      if (layers.active()) {
        collapse = std::move(layers);
        body = draw(trace, facts, view, collapse);
        drawn = true;
      } else if (!drawn && try_full) {
        body = draw(trace, facts, view, collapse);
        drawn = true;
      }
    }
    for (int round = 0; round < kCollapseRounds && (!drawn || body.size > kRenderMaxLayoutSize); ++round) {
      size_t budget = kCollapsedSize / 4;  // a first guess for a trace too long to draw in full
      if (round == 0 && try_full) budget = trace.events.size();  // folds only
      if (round > 0) {
        const double shrink = std::sqrt(static_cast<double>(kCollapsedSize) / static_cast<double>(body.size));
        budget = std::max<size_t>(1, static_cast<size_t>(static_cast<double>(collapse.drawn) * shrink));
      }
      collapse = plan_collapse(trace, facts, budget);
      body = draw(trace, facts, view, collapse);
      drawn = true;
      if (body.size <= kRenderMaxLayoutSize) break;
    }
  }
  const std::string folded = collapse.active() ? collapse_lines(collapse) : "";
  std::string view_line = body.view_line;
  if (!range_line.empty()) view_line = range_line + (view_line.empty() ? "" : "\n" + view_line);
  std::string out = graph_header(title(trace, facts, view_line, folded), body.nodes,
                                 !collapse.layers.empty() || collapse.decomposed > 0);
  out += status_note(facts, view == RenderView::Ranks);
  out += body.text;
  out += legend(view == RenderView::Logical || program_only, view == RenderView::Ranks && !program_only, collapse);
  return out + "}\n";
}

std::string layout_dot(const std::string& dot, const std::string& format, const std::string& what) {
  // One Graphviz context for the process, never freed: freeing one and laying out with the next
  // reads freed memory in Graphviz's text-size cache (the pango plugin keeps a font name that
  // gvFreeContext released; AddressSanitizer found it on the second layout in one process).
  static GVC_t* const context = gvContext();
  std::unique_ptr<Agraph_t, GraphDeleter> graph(agmemread(dot.c_str()));
  if (!context || !graph) throw InputError(what, "", "graphviz could not read the diagram");
  if (gvLayout(context, graph.get(), "dot") != 0) throw InputError(what, "", "graphviz layout failed");
  char* data = nullptr;
  unsigned int length = 0;
  const int rc = gvRenderData(context, graph.get(), format.c_str(), &data, &length);
  std::string rendered = rc == 0 && data ? std::string(data, length) : std::string();
  gvFreeRenderData(data);
  gvFreeLayout(context, graph.get());
  if (rendered.empty()) throw InputError(what, "", "graphviz could not render " + format);
  return rendered;
}

void render_to_file(const Trace& trace, const std::string& out_path, RenderView view) {
  RenderOptions options;
  options.view = view;
  render_to_file(trace, out_path, options);
}

void render_to_file(const Trace& trace, const std::string& out_path, const RenderOptions& options) {
  const std::string format = extension(out_path);
  if (format != "dot" && format != "svg" && format != "png") {
    throw InputError(out_path, "", "unknown output format \"" + format + "\" (use .svg, .png or .dot)");
  }
  const std::string dot = render_dot(trace, options);
  const std::string bytes = format == "dot" ? dot : layout_dot(dot, format, out_path);
  write_file_atomically(out_path, bytes);
}

}  // namespace meshsim
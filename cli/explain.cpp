// meshsim explain: the scenario's forward runs once on the fake mesh with an observer on the
// runtime (every rule application, with its operands as given), then one op is explained from
// core/explain.h (the chooser propagate() runs) and the run's own events (the steps and bytes of
// each redistribution), or a value's placement is followed back to the inputs.
#include "cli/explain.h"

#include <algorithm>
#include <cctype>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/explain.h"
#include "core/reduced_policy.h"
#include "core/resources.h"
#include "core/scenario.h"
#include "sim/interpreter.h"

namespace meshsim::cli {

namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// The run

// The program op running, set by the interpreter's progress hook (called before each op).
int g_running_op = -1;
void note_running_op(size_t done, size_t total, const std::string&) {
  if (done < total) g_running_op = static_cast<int>(done);
}

struct Explained {
  Scenario sc;
  RunOptions options;
  SimRun run;                                      // the forward, up to the op that failed
  std::vector<std::vector<OpApplication>> apps;    // per program op, its rule applications
  std::optional<SemanticError> error;              // what stopped the run
  int failed_op = -1;                              // the program op it stopped at
};

// "/program/12/args/0" -> 12; -1 for a path outside the program.
int program_index(const std::string& path) {
  const std::string head = "/program/";
  if (path.rfind(head, 0) != 0) return -1;
  size_t end = head.size();
  while (end < path.size() && std::isdigit(static_cast<unsigned char>(path[end]))) ++end;
  return end == head.size() ? -1 : std::stoi(path.substr(head.size(), end - head.size()));
}

// The forward of `sc`, observed: every rule application, by the program op that made it.
SimRun observed_run(Scenario sc, const RunOptions& options, std::vector<std::vector<OpApplication>>& apps) {
  sc.backward.clear();  // the forward's placements are explained; the backward is `meshsim run`'s
  apps.assign(sc.program.size(), {});
  g_running_op = -1;
  set_progress_hook(note_running_op);
  struct Restore {
    ~Restore() {
      set_progress_hook(nullptr);
      install_progress_line();
    }
  } restore;
  return run_distributed(sc, options, [&apps](const OpApplication& app) {
    if (g_running_op >= 0 && static_cast<size_t>(g_running_op) < apps.size()) apps[g_running_op].push_back(app);
  });
}

// The run, and where it stopped. A run that stops at op N is run again up to N (without it) for
// the values before it; the applications of op N are those observed before it failed.
Explained explained_run(Scenario sc, const RunOptions& options) {
  Explained ex{std::move(sc), options, {}, {}, std::nullopt, -1};
  try {
    ex.run = observed_run(ex.sc, options, ex.apps);
    return ex;
  } catch (const SemanticError& e) {
    ex.error = e;
    ex.failed_op = program_index(e.path());
  }
  Scenario prefix = ex.sc;
  const size_t kept = ex.failed_op < 0 ? 0 : static_cast<size_t>(ex.failed_op);
  prefix.program.resize(std::min(kept, prefix.program.size()));
  std::vector<std::vector<OpApplication>> before;
  ex.run = observed_run(prefix, options, before);
  return ex;
}

// ---------------------------------------------------------------------------------------------
// Names

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The (up to) three names closest to `name`, closest first, ties in their given order.
std::vector<std::string> closest(const std::string& name, const std::vector<std::string>& names) {
  std::vector<std::pair<size_t, size_t>> d;
  for (size_t i = 0; i < names.size(); ++i) d.emplace_back(edit_distance(name, names[i]), i);
  std::stable_sort(d.begin(), d.end());
  std::vector<std::string> out;
  for (size_t k = 0; k < d.size() && k < 3; ++k) out.push_back(names[d[k].second]);
  return out;
}

std::string joined(const std::vector<std::string>& parts, const std::string& sep = ", ") {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// What a name refers to that is not an op or value of the program (a body value, an op's
// intermediate), as a hint; "" when nothing.
std::string hint_for(const Scenario& sc, const std::string& name) {
  for (const auto& op : sc.program) {
    for (const auto& b : op.body)
      if (b.out == name || std::find(b.outs.begin(), b.outs.end(), name) != b.outs.end())
        return "\"" + name + "\" is a value of the local_map body at " + b.path +
               " (an LTensor: it has variant and reduced axes, no placements): explain --op " + op.path;
    if (name.rfind(op.out + ".", 0) == 0 && !op.out.empty())
      return "\"" + name + "\" is an intermediate of " + op.path + " (" + op.op + "): explain --op " + op.path;
  }
  return "";
}

// The program op named by a JSON path ("/program/15") or by one of its outputs; -1 when none.
int find_op(const Scenario& sc, const std::string& name) {
  for (size_t i = 0; i < sc.program.size(); ++i) {
    const OpDecl& op = sc.program[i];
    if (op.path == name || op.out == name || std::find(op.outs.begin(), op.outs.end(), name) != op.outs.end())
      return static_cast<int>(i);
  }
  return -1;
}

std::vector<std::string> op_names(const Scenario& sc) {
  std::vector<std::string> out;
  for (const auto& op : sc.program)
    for (const auto& o : op.outs.empty() ? std::vector<std::string>{op.out} : op.outs) out.push_back(o);
  return out;
}

std::vector<std::string> value_names(const Scenario& sc) {
  std::vector<std::string> out;
  for (const auto& in : sc.inputs) out.push_back(in.name);
  for (const auto& n : op_names(sc)) out.push_back(n);
  return out;
}

// ---------------------------------------------------------------------------------------------
// What an op did

json spec_json(const Spec& s) {
  json out = json::array();
  for (const auto& p : s) out.push_back(p.str());
  return out;
}

std::string placements_str(const std::vector<Placement>& ps) {
  std::vector<std::string> parts;
  for (const auto& p : ps) parts.push_back(p.str());
  return joined(parts);
}

// The forward steps the run recorded for a value (a redistribution's output, an operand's
// ".argN"): collectives and local steps, in order.
std::vector<const Event*> steps_of(const SimRun& run, const std::string& value) {
  std::vector<const Event*> out;
  for (const auto& e : run.runtime->events())
    if (e.phase == "forward" && (e.kind == "collective" || e.kind == "local") && e.value == value) out.push_back(&e);
  return out;
}

std::string step_line(const Event& e) {
  std::string s = e.name + " over " + e.axis;
  if (!e.in_specs.empty() && !e.out_spec.empty()) s += ", " + e.in_specs[0] + " -> " + e.out_spec;  // not local code's
  if (e.kind == "collective") s += ", " + std::to_string(e.bytes) + " B";
  else s += ", no communication";
  return s;
}

json step_json(const Event& e) {
  return {{"step", e.name}, {"axis", e.axis}, {"from", e.in_specs.empty() ? "" : e.in_specs[0]}, {"to", e.out_spec},
          {"bytes", e.bytes}, {"communicates", e.kind == "collective"}};
}

// One rule application, explained: the operands as given, per axis every candidate, the result
// and the redistributions its rows needed (with the run's steps).
struct AppExplained {
  const OpApplication* app;
  PropagationExplanation ex;
  Spec out_spec;  // the result's, the Rd label restored by the run's policy
};

AppExplained explain_app(const Explained& x, const OpApplication& app) {
  AppExplained a{&app, explain_propagation(app.op, x.sc.mesh, app.given, app.shapes, app.attrs), {}};
  if (a.ex.error.empty())
    a.out_spec = restore_reduced(app.op, x.sc.mesh, app.given, a.ex.decision.out_spec, x.options.reduced_propagation);
  return a;
}

std::string operand_str(const std::string& name, const Spec& spec, const Shape& shape) {
  return name + " " + spec_str(spec) + " " + shape_str(shape);
}

void print_app(std::ostream& out, const Explained& x, const AppExplained& a) {
  const OpApplication& app = *a.app;
  std::vector<std::string> operands;
  for (size_t i = 0; i < app.args.size(); ++i) operands.push_back(operand_str(app.args[i], app.given[i], app.shapes[i]));
  out << "  " << app.op << ": " << app.out << " = " << app.op << "(" << joined(operands) << ")\n";
  for (const auto& ax : a.ex.axes) {
    out << "    mesh axis " << ax.axis_name << " (size " << ax.axis_size << "), given " << placements_str(ax.given)
        << ": " << ax.how << "\n";
    size_t width = 0;
    for (const auto& c : ax.candidates) width = std::max(width, c.row.size());
    for (const auto& c : ax.candidates) {
      const std::string cost = !c.legal ? "illegal" : std::to_string(c.bytes) + " B, " + std::to_string(c.changed) + " moved";
      out << "      " << (c.chosen ? "* " : "  ") << std::left << std::setw(static_cast<int>(width)) << c.row << "  "
          << std::setw(18) << cost << std::right << "  " << c.verdict << "\n";
    }
  }
  if (!a.ex.error.empty()) {
    out << "    no row: " << a.ex.error << "\n";
    return;
  }
  out << "    result " << app.out << " " << spec_str(a.out_spec) << " " << shape_str(a.ex.decision.out_shape);
  if (a.out_spec != a.ex.decision.out_spec)
    out << " (rows give " << spec_str(a.ex.decision.out_spec) << "; Rd restored by reduced_propagation "
        << reduced_propagation_name(x.options.reduced_propagation) << ")";
  out << "\n";
  bool any = false;
  for (size_t i = 0; i < app.args.size(); ++i) {
    if (a.ex.decision.in_specs[i] == app.given[i]) continue;
    any = true;
    out << "    redistribute operand " << i << " " << app.args[i] << ": " << spec_str(app.given[i]) << " -> "
        << spec_str(a.ex.decision.in_specs[i]) << " (the planner's, as " << app.out << ".arg" << i << ")\n";
    const auto steps = steps_of(x.run, app.out + ".arg" + std::to_string(i));
    for (const Event* e : steps) out << "      " << step_line(*e) << "\n";
    if (steps.empty()) out << "      (not run: the run stopped first)\n";
  }
  if (!any) out << "    no redistribution: every operand fits its row as it is\n";
}

json app_json(const Explained& x, const AppExplained& a) {
  const OpApplication& app = *a.app;
  json j = {{"op", app.op}, {"out", app.out}};
  j["operands"] = json::array();
  for (size_t i = 0; i < app.args.size(); ++i)
    j["operands"].push_back({{"name", app.args[i]}, {"placements", spec_json(app.given[i])}, {"shape", app.shapes[i]}});
  j["axes"] = json::array();
  for (const auto& ax : a.ex.axes) {
    json aj = {{"axis", ax.axis_name}, {"size", ax.axis_size}, {"given", spec_json(ax.given)}, {"how", ax.how}};
    aj["chosen"] = ax.chosen >= 0 ? json(ax.candidates[ax.chosen].row) : json(nullptr);
    aj["candidates"] = json::array();
    for (const auto& c : ax.candidates)
      aj["candidates"].push_back({{"row", c.row}, {"rule", c.rule}, {"ins", spec_json(c.ins)}, {"out", c.out.str()},
                                  {"bytes", c.bytes}, {"changed", c.changed}, {"legal", c.legal},
                                  {"chosen", c.chosen}, {"moves", c.moves}, {"verdict", c.verdict}});
    j["axes"].push_back(aj);
  }
  if (!a.ex.error.empty()) {
    j["error"] = a.ex.error;
    return j;
  }
  j["rows"] = a.ex.decision.rows;
  j["result"] = {{"placements", spec_json(a.out_spec)}, {"rows_give", spec_json(a.ex.decision.out_spec)},
                 {"shape", a.ex.decision.out_shape}};
  j["redistributions"] = json::array();
  for (size_t i = 0; i < app.args.size(); ++i) {
    if (a.ex.decision.in_specs[i] == app.given[i]) continue;
    json r = {{"operand", i}, {"name", app.args[i]}, {"value", app.out + ".arg" + std::to_string(i)},
              {"from", spec_json(app.given[i])}, {"to", spec_json(a.ex.decision.in_specs[i])}, {"steps", json::array()}};
    for (const Event* e : steps_of(x.run, app.out + ".arg" + std::to_string(i))) r["steps"].push_back(step_json(*e));
    j["redistributions"].push_back(r);
  }
  return j;
}

// The kind of a program op as explain treats it.
std::string op_kind(const Explained& x, size_t k) {
  const OpDecl& op = x.sc.program[k];
  if (op.op == "redistribute") return "redistribute";
  if (op.op == "local_map") return "local_map";
  if (is_creation_op(op.op)) return "creation";
  if (!x.apps[k].empty()) return "rules";
  return "local_code";
}

// A value's spec and shape after the run, when it is a DTensor of the run.
const DTensor* value_of(const Explained& x, const std::string& name) {
  auto it = x.run.values.find(name);
  return it == x.run.values.end() ? nullptr : &it->second;
}

std::string value_str(const Explained& x, const std::string& name) {
  const DTensor* v = value_of(x, name);
  return v ? operand_str(name, v->spec, v->shape) : name + " (local tensor)";
}

// Events of the forward that belong to a local_map op: its arguments' moves, its body's
// collectives and its results' moves.
std::vector<const Event*> local_map_steps(const Explained& x, const OpDecl& op) {
  std::set<std::string> names;
  for (const auto& b : op.body) {
    names.insert(b.out);
    names.insert(b.outs.begin(), b.outs.end());
  }
  std::vector<const Event*> out;
  for (const auto& e : x.run.runtime->events()) {
    if (e.phase != "forward" || (e.kind != "collective" && e.kind != "local")) continue;
    bool mine = names.count(e.value) > 0;
    for (const auto& o : op.outs.empty() ? std::vector<std::string>{op.out} : op.outs)
      mine |= e.value == o || e.value.rfind(o + ".", 0) == 0;
    if (mine) out.push_back(&e);
  }
  return out;
}

void explain_op_text(std::ostream& out, const Explained& x, size_t k) {
  const OpDecl& op = x.sc.program[k];
  std::vector<std::string> args;
  for (const auto& a : op.args) args.push_back(value_str(x, a));
  const std::vector<std::string> outs = op.outs.empty() ? std::vector<std::string>{op.out} : op.outs;
  out << op.path << ": " << joined(outs) << " = " << op.op << "(" << joined(args) << ")   (mesh " << x.sc.mesh.str()
      << ")\n";
  const std::string kind = op_kind(x, k);
  if (kind == "redistribute") {
    const DTensor* v = value_of(x, op.out);
    out << "  an explicit redistribution: the planner's steps (core/redistribute.h), no rule row\n";
    if (v) out << "  result " << operand_str(op.out, v->spec, v->shape) << "\n";
    int64_t total = 0;
    const auto steps = steps_of(x.run, op.out);
    for (const Event* e : steps) {
      out << "    " << step_line(*e) << "\n";
      total += e->kind == "collective" ? e->bytes : 0;
    }
    out << "  " << steps.size() << " step" << (steps.size() == 1 ? "" : "s") << ", " << total << " B per rank\n";
    return;
  }
  if (kind == "local_map") {
    out << "  a local_map: its body runs per rank on LTensors; placements are its in/out placements, no rule row\n";
    for (size_t i = 0; i < op.args.size(); ++i)
      out << "  in " << value_str(x, op.args[i]) << ": "
          << (op.in_placements.empty() ? std::string("as it is") : "in_placements " + spec_str(op.in_placements.at(i)))
          << "\n";
    for (size_t i = 0; i < op.out_placements.size() && i < outs.size(); ++i)
      out << "  out " << outs[i] << ": " << spec_str(op.out_placements[i]) << "\n";
    const auto& bodies = x.run.runtime->body_values();
    for (const auto& b : op.body) {
      out << "  body " << b.path << ": " << b.out << " = " << b.op << "(" << joined(b.args) << ")";
      if (auto it = bodies.find(b.out); it != bodies.end() && !it->second.unchecked)
        out << "  variant [" << joined(it->second.variant) << "] reduced [" << joined(it->second.reduced) << "]";
      out << "\n";
    }
    for (const Event* e : local_map_steps(x, op)) out << "    " << e->value << ": " << step_line(*e) << "\n";
    return;
  }
  if (kind == "creation") {
    out << "  a creation op: its value is laid out as its placements, no operand and no rule row\n";
    return;
  }
  if (kind == "local_code") {
    out << "  local code (to_local ... from_local): runs per rank as written, no rule row\n";
    return;
  }
  out << "  " << x.apps[k].size() << " rule application" << (x.apps[k].size() == 1 ? "" : "s")
      << "; per mesh axis every row of the op's table, the one chosen marked *, cost = bytes per rank "
         "(cost model, 8 B an element) and operands moved\n";
  for (const auto& app : x.apps[k]) print_app(out, x, explain_app(x, app));
}

json explain_op_json(const Explained& x, size_t k) {
  const OpDecl& op = x.sc.program[k];
  json j = {{"path", op.path}, {"op", op.op}, {"kind", op_kind(x, k)}};
  j["outs"] = op.outs.empty() ? std::vector<std::string>{op.out} : op.outs;
  j["args"] = json::array();
  for (const auto& a : op.args) {
    const DTensor* v = value_of(x, a);
    j["args"].push_back(v ? json{{"name", a}, {"placements", spec_json(v->spec)}, {"shape", v->shape}}
                          : json{{"name", a}, {"placements", nullptr}});
  }
  const std::string kind = j["kind"];
  if (kind == "redistribute") {
    j["steps"] = json::array();
    for (const Event* e : steps_of(x.run, op.out)) j["steps"].push_back(step_json(*e));
    if (const DTensor* v = value_of(x, op.out)) j["result"] = {{"placements", spec_json(v->spec)}, {"shape", v->shape}};
  } else if (kind == "local_map") {
    j["in_placements"] = json::array();
    for (const auto& s : op.in_placements) j["in_placements"].push_back(spec_json(s));
    j["out_placements"] = json::array();
    for (const auto& s : op.out_placements) j["out_placements"].push_back(spec_json(s));
    j["body"] = json::array();
    const auto& bodies = x.run.runtime->body_values();
    for (const auto& b : op.body) {
      json bj = {{"path", b.path}, {"op", b.op}, {"out", b.out}, {"args", b.args}};
      if (auto it = bodies.find(b.out); it != bodies.end() && !it->second.unchecked) {
        bj["variant"] = it->second.variant;
        bj["reduced"] = it->second.reduced;
      }
      j["body"].push_back(bj);
    }
    j["steps"] = json::array();
    for (const Event* e : local_map_steps(x, op)) {
      json s = step_json(*e);
      s["value"] = e->value;
      j["steps"].push_back(s);
    }
  } else if (kind == "rules") {
    j["applications"] = json::array();
    for (const auto& app : x.apps[k]) j["applications"].push_back(app_json(x, explain_app(x, app)));
  }
  return j;
}

// ---------------------------------------------------------------------------------------------
// A value's chain

struct ChainStep {
  std::string value;
  std::string path;  // "/inputs/0" or "/program/4"
  std::string op;    // "input" for an input
  std::string line;
  std::string follows;       // the operand followed back ("" at the start)
  std::string follows_why;
  std::vector<const Event*> steps;
};

// The communication of program op k: the steps recorded for its redistributions.
std::vector<const Event*> op_steps(const Explained& x, size_t k) {
  const OpDecl& op = x.sc.program[k];
  const std::string kind = op_kind(x, k);
  if (kind == "redistribute") return steps_of(x.run, op.out);
  if (kind == "local_map") return local_map_steps(x, op);
  std::vector<const Event*> out;
  for (const auto& app : x.apps[k])
    for (size_t i = 0; i < app.args.size(); ++i)
      for (const Event* e : steps_of(x.run, app.out + ".arg" + std::to_string(i))) out.push_back(e);
  return out;
}

std::string steps_summary(const std::vector<const Event*>& steps) {
  std::vector<std::string> parts;
  for (const Event* e : steps)
    parts.push_back(e->name + " over " + e->axis +
                    (e->kind == "collective" ? ", " + std::to_string(e->bytes) + " B" : std::string(" (local)")));
  return parts.empty() ? "no communication" : joined(parts, "; ");
}

// Among operands of the given specs, the one whose placement carried over to `result`: the most
// mesh axes on which it holds the result's shard or Partial, then the most axes alike; ties to
// the first. Returns its index (-1: none) and the axes it carried over on.
std::pair<int, std::vector<std::string>> carried(const Mesh& mesh, const std::vector<Spec>& ins, const Spec& result) {
  int best = -1, best_carried = -1, best_alike = -1;
  std::vector<std::string> best_axes;
  for (size_t i = 0; i < ins.size(); ++i) {
    int count = 0, alike = 0;
    std::vector<std::string> axes;
    if (ins[i].size() == result.size())
      for (size_t a = 0; a < result.size(); ++a) {
        const bool same = ins[i][a] == result[a] || (ins[i][a].is_replicate() && result[a].is_replicate());
        alike += same;
        if (same && !result[a].is_replicate()) {
          ++count;
          axes.push_back(mesh.axes()[a]);
        }
      }
    if (count > best_carried || (count == best_carried && alike > best_alike)) {
      best = static_cast<int>(i);
      best_carried = count;
      best_alike = alike;
      best_axes = axes;
    }
  }
  return {best, best_axes};
}

// The operand of program op k that value `v` is followed back to, and why. For an op of rules,
// the operands as its rows took them (after the planner's moves) are compared with the result,
// through the op's own intermediates (a linear's transposed weight) back to a program operand.
std::pair<std::string, std::string> followed_operand(const Explained& x, size_t k, const std::string& v,
                                                     const Spec& result) {
  const OpDecl& op = x.sc.program[k];
  if (op.args.empty()) return {"", ""};
  if (op.op == "redistribute") return {op.args[0], "the value redistributed"};
  const auto is_arg = [&](const std::string& n) { return std::find(op.args.begin(), op.args.end(), n) != op.args.end(); };
  const auto& apps = x.apps[k];
  std::string name = v;
  Spec spec = result;
  std::vector<std::string> axes;
  bool moved = false;
  for (int guard = 0; guard < 64 && !is_arg(name); ++guard) {
    auto it = std::find_if(apps.rbegin(), apps.rend(), [&](const OpApplication& a) { return a.out == name; });
    if (it == apps.rend()) break;
    const ShardingDecision d = propagate(it->op, x.sc.mesh, it->given, it->shapes, it->attrs);
    const auto [i, on] = carried(x.sc.mesh, d.in_specs, spec);
    if (i < 0) break;
    moved |= d.in_specs[i] != it->given[i];
    if (axes.empty()) axes = on;
    name = it->args[i];
    spec = it->given[i];
  }
  if (is_arg(name)) {
    const std::string moved_note = moved ? " (after the planner moved it)" : "";
    if (!axes.empty()) return {name, "its " + joined(axes) + " placement carried over" + moved_note};
    if (op.args.size() == 1) return {name, "its only operand"};
    return {name, "operand " + std::to_string(std::find(op.args.begin(), op.args.end(), name) - op.args.begin()) +
                      ": no shard or Partial carried over"};
  }
  // local_map and local code: the program operands as they are.
  std::vector<Spec> ins;
  for (const auto& a : op.args) {
    const DTensor* d = value_of(x, a);
    ins.push_back(d ? d->spec : Spec{});
  }
  const auto [i, on] = carried(x.sc.mesh, ins, result);
  const size_t at = i < 0 ? 0 : static_cast<size_t>(i);
  if (!on.empty()) return {op.args[at], "its " + joined(on) + " placement carried over"};
  return {op.args[at], op.args.size() == 1 ? "its only operand" : "operand " + std::to_string(at) + ": no shard or Partial carried over"};
}

std::vector<ChainStep> value_chain(const Explained& x, const std::string& value) {
  std::vector<ChainStep> chain;
  std::set<std::string> seen;
  for (std::string v = value; !v.empty() && seen.insert(v).second;) {
    ChainStep s;
    s.value = v;
    if (const InputDecl* in = x.sc.find_input(v)) {
      s.path = in->path;
      s.op = "input";
      s.line = value_str(x, v) + ": input " + in->path;
      chain.push_back(s);
      break;
    }
    const int k = find_op(x.sc, v);
    if (k < 0) break;
    const OpDecl& op = x.sc.program[k];
    s.path = op.path;
    s.op = op.op;
    const DTensor* out = value_of(x, v);
    std::vector<std::string> args;
    for (const auto& a : op.args) {
      const DTensor* av = value_of(x, a);
      args.push_back(av ? a + " " + spec_str(av->spec) : a);
    }
    s.steps = op_steps(x, k);
    s.line = v + " " + (out ? spec_str(out->spec) : std::string("(local tensor)")) + " = " + op.op + "(" +
             joined(args) + "): " + steps_summary(s.steps);
    if (out) std::tie(s.follows, s.follows_why) = followed_operand(x, k, v, out->spec);
    else if (!op.args.empty()) std::tie(s.follows, s.follows_why) = std::make_pair(op.args[0], std::string("operand 0"));
    if (!s.follows.empty()) s.line += "  [follows " + s.follows + ": " + s.follows_why + "]";
    else s.line += "  [" + op_kind(x, k) + ": no operand]";
    s.line += "  " + op.path;
    chain.push_back(s);
    v = s.follows;
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

// ---------------------------------------------------------------------------------------------
// The command

int refuse(std::ostream& out, const ExplainArgs& args, const std::string& message) {
  std::cerr << "meshsim: " << args.file << ": " << message << "\n";
  if (args.json)
    out << json{{"format", "meshsim.explain/1"}, {"status", "error"},
                {"error", {{"kind", "invalid_scenario"}, {"message", message}}}}
               .dump(2)
        << "\n";
  return 2;
}

std::string unknown(const Scenario& sc, const std::string& what, const std::string& name,
                    const std::vector<std::string>& names) {
  std::string msg = what + " \"" + name + "\": ";
  if (std::string hint = hint_for(sc, name); !hint.empty()) return msg + hint;
  msg += what == "--op" ? "no program op has that path or output" : "no input or program value has that name";
  if (names.empty()) return msg + " (the program is empty)";
  std::vector<std::string> near;
  for (const auto& n : closest(name, names)) {
    const int k = find_op(sc, n);
    near.push_back(k >= 0 && what == "--op" ? n + " (" + sc.program[k].path + ")" : n);
  }
  msg += "; closest: " + joined(near);
  if (what == "--op") msg += "; the program's ops are /program/0 to /program/" + std::to_string(sc.program.size() - 1);
  else msg += "; " + std::to_string(names.size()) + " values in all";
  return msg;
}

}  // namespace

int cmd_explain(const ExplainArgs& args, std::ostream& out) {
  if (args.op.empty() && args.value.empty()) throw UsageError("explain: give --op PATH|NAME, --value NAME, or both");
  Scenario sc = parse_scenario(read_json_file(args.file), args.file);
  const RunOptions options = options_with_overrides(sc, args.options);
  int k = -1;
  if (!args.op.empty() && (k = find_op(sc, args.op)) < 0) return refuse(out, args, unknown(sc, "--op", args.op, op_names(sc)));
  if (!args.value.empty()) {
    const auto names = value_names(sc);
    if (std::find(names.begin(), names.end(), args.value) == names.end())
      return refuse(out, args, unknown(sc, "--value", args.value, names));
  }
  check_resources(sc, options, resource_limits());
  const Explained x = explained_run(std::move(sc), options);
  // The op (or the value's op) at or after the one the run stopped at cannot be explained whole.
  int needed = k;
  if (!args.value.empty()) needed = std::max(needed, find_op(x.sc, args.value));
  const bool stopped_before = x.error && x.failed_op >= 0 && needed > x.failed_op;
  const bool stopped_at = x.error && (x.failed_op < 0 || needed == x.failed_op);

  json doc = {{"format", "meshsim.explain/1"}, {"file", args.file}, {"name", x.sc.name},
              {"mesh", {{"axes", x.sc.mesh.axes()}, {"shape", x.sc.mesh.shape()}}},
              {"options", x.options.to_json()}, {"status", "ok"}};
  if (k >= 0 && !stopped_before) {
    if (args.json) doc["op"] = explain_op_json(x, static_cast<size_t>(k));
    else explain_op_text(out, x, static_cast<size_t>(k));
  }
  if (!args.value.empty() && !stopped_before && !stopped_at) {
    const auto chain = value_chain(x, args.value);
    if (args.json) {
      json c = json::array();
      for (const auto& s : chain) {
        json sj = {{"value", s.value}, {"path", s.path}, {"op", s.op}, {"line", s.line}};
        if (const DTensor* v = value_of(x, s.value)) sj["placements"] = spec_json(v->spec);
        if (!s.follows.empty()) sj["follows"] = {{"name", s.follows}, {"why", s.follows_why}};
        sj["steps"] = json::array();
        for (const Event* e : s.steps) sj["steps"].push_back(step_json(*e));
        c.push_back(sj);
      }
      doc["value"] = {{"name", args.value}, {"chain", c}};
    } else {
      if (k >= 0) out << "\n";
      out << "how " << args.value << " came to be (from the inputs, each op following the operand whose "
          << "placement carried over):\n";
      for (const auto& s : chain) out << "  " << s.line << "\n";
    }
  }
  if (!x.error) {
    if (args.json) out << doc.dump(2) << "\n";
    return 0;
  }
  const SemanticError& e = *x.error;
  const bool matters = stopped_before || stopped_at;
  const std::string line = error_line(args.file, e.path(), error_kind_name(e.kind()), e.what());
  if (args.json) {
    doc["status"] = matters ? "error" : "ok";
    doc["run_error"] = {{"kind", error_kind_name(e.kind())}, {"message", e.what()}, {"path", e.path()}};
    out << doc.dump(2) << "\n";
  } else if (!matters) {
    out << "\n(the run stopped later, at " << e.path() << ": " << first_line(e.what()) << ")\n";
  }
  if (!matters) return 0;
  std::cerr << line << "\n";
  return exit_code_for(e.kind());
}

}  // namespace meshsim::cli

#include "cli/commands.h"

#include "core/cost_model.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include "cli/expect.h"
#include "api/trace_of.h"
#include "cli/values.h"
#include "core/cost_model.h"
#include "core/error.h"
#include "core/scenario_imported.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "oracles/localize.h"
#include "sim/interpreter.h"
#include "sim/local_map.h"
#include "traces/explore.h"
#include "traces/render.h"
#include "traces/trace.h"

namespace meshsim::cli {

namespace fs = std::filesystem;

RunOptions options_with_overrides(const Scenario& sc, const std::vector<std::string>& overrides) {
  return with_overrides(sc.options, overrides);
}

namespace {

// The progress line: drawn on stderr once a run has taken 2 s, redrawn at most 4 times a second,
// erased when the command ends; nothing when stderr is not a terminal.
struct ProgressLine {
  std::optional<std::chrono::steady_clock::time_point> start, drawn;
  bool shown = false;
} g_progress;

void draw_progress(size_t done, size_t total, const std::string& what) {
  const auto now = std::chrono::steady_clock::now();
  if (!g_progress.start) g_progress.start = now;
  const double elapsed = std::chrono::duration<double>(now - *g_progress.start).count();
  if (elapsed < 2 || (g_progress.drawn && now - *g_progress.drawn < std::chrono::milliseconds(250))) return;
  g_progress.drawn = now;
  g_progress.shown = true;
  char line[200];
  if (done < total)
    std::snprintf(line, sizeof line, "\r\033[Kmeshsim: op %zu of %zu (%s), %.0f s", done + 1, total, what.c_str(), elapsed);
  else
    std::snprintf(line, sizeof line, "\r\033[Kmeshsim: %s, %.0f s", what.c_str(), elapsed);
  std::cerr << line << std::flush;
}

}  // namespace

void install_progress_line() {
  if (::isatty(STDERR_FILENO)) set_progress_hook(draw_progress);
}

void erase_progress_line() {
  if (g_progress.shown) std::cerr << "\r\033[K" << std::flush;
  g_progress = {};
}

namespace {

std::string join_specs(const nlohmann::json& placements) {
  if (!placements.is_array()) return "none";
  std::string out = "[";
  for (size_t i = 0; i < placements.size(); ++i)
    out += (i ? ", " : "") + (placements[i].is_string() ? placements[i].get<std::string>() : placements[i].dump());
  return out + "]";
}

// A JSON string, or `fallback` when it is missing or not a string.
std::string text_of(const nlohmann::json& obj, const char* key, const std::string& fallback = "?") {
  if (!obj.is_object()) return fallback;
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// The members of an object or array (an empty object for anything else).
const nlohmann::json& members(const nlohmann::json& r, const char* key) {
  static const nlohmann::json none = nlohmann::json::object();
  auto it = r.find(key);
  return it != r.end() && (it->is_object() || it->is_array()) ? *it : none;
}

// The named values of a scenario in program order: the inputs, then each op's results (a
// local_map's body values before its results).
std::vector<std::string> program_order(const Scenario& sc) {
  std::vector<std::string> out;
  for (const auto& in : sc.inputs) out.push_back(in.name);
  for (const auto& op : sc.program) {
    for (const auto& b : op.body) {
      if (!b.outs.empty()) out.insert(out.end(), b.outs.begin(), b.outs.end());
      else out.push_back(b.out);
    }
    if (!op.outs.empty()) out.insert(out.end(), op.outs.begin(), op.outs.end());
    else out.push_back(op.out);
  }
  return out;
}

int64_t int_of(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

std::string grouped(int64_t n) { return grouped_digits(n); }




// A table line without trailing blanks.
std::string trimmed(std::string line) {
  const bool newline = !line.empty() && line.back() == '\n';
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line + (newline ? "\n" : "");
}

// The communication table (result "communication") and the implicit redistributions that cost
// communication, each with its reason.
void print_communication(const nlohmann::json& r) {
  const nlohmann::json& comm = members(r, "communication");
  if (comm.empty()) return;
  const nlohmann::json& axes = members(comm, "by_axis");
  if (axes.empty()) {
    std::cout << "  communication: none\n";
  } else {
    std::cout << "  communication per rank (cost model bytes):\n";
    char line[200];
    std::snprintf(line, sizeof line, "    %-8s %-9s %-15s %6s %10s  %s\n", "axis", "phase", "collective", "count", "bytes",
                  "implicit");
    std::cout << line;
    auto implicit_cell = [](const nlohmann::json& row) {
      const int64_t n = int_of(row, "implicit_count");
      return n ? std::to_string(n) + " (" + grouped(int_of(row, "implicit_bytes")) + " B)" : std::string();
    };
    for (const auto& row : axes) {
      std::snprintf(line, sizeof line, "    %-8s %-9s %-15s %6lld %10s  %s\n", text_of(row, "axis").c_str(),
                    text_of(row, "phase").c_str(), text_of(row, "collective").c_str(),
                    static_cast<long long>(int_of(row, "count")), grouped(int_of(row, "bytes")).c_str(),
                    implicit_cell(row).c_str());
      std::cout << trimmed(line);
    }
    std::snprintf(line, sizeof line, "    %-34s %6lld %10s  %s\n", "total", static_cast<long long>(int_of(comm, "count")),
                  grouped(int_of(comm, "bytes")).c_str(), implicit_cell(comm).c_str());
    std::cout << trimmed(line);
    // The ops that move the most, up to five.
    std::vector<const nlohmann::json*> ops;
    for (const auto& o : members(comm, "by_op")) ops.push_back(&o);
    std::stable_sort(ops.begin(), ops.end(),
                     [](const nlohmann::json* a, const nlohmann::json* b) { return int_of(*a, "bytes") > int_of(*b, "bytes"); });
    if (ops.size() > 1) {
      std::cout << "    most per op:";
      for (size_t i = 0; i < ops.size() && i < 5; ++i) {
        const nlohmann::json& o = *ops[i];
        std::cout << (i ? "," : "") << " " << (o["op"].is_string() ? text_of(o, "op") + " " + text_of(o, "out") : "outside the program's ops")
                  << " (" << text_of(o, "name") << ") " << grouped(int_of(o, "bytes")) << " B";
      }
      std::cout << "\n";
    }
  }
  size_t local_only = 0;
  std::vector<const nlohmann::json*> costly;
  for (const auto& m : members(r, "implicit")) {
    if (members(m, "collectives").empty()) ++local_only;
    else costly.push_back(&m);
  }
  if (costly.empty() && !local_only) return;
  std::cout << "  implicit redistributions (the planner's, not the program's): " << costly.size() << " communicating";
  if (local_only) std::cout << ", " << local_only << " local (no communication)";
  std::cout << "\n";
  for (const auto* m : costly) {
    std::string cost;
    for (const auto& c : members(*m, "collectives"))
      cost += (cost.empty() ? "" : ", ") + text_of(c, "phase") + " " + text_of(c, "op") + " over " + text_of(c, "axis") +
              " " + grouped(int_of(c, "bytes")) + " B";
    std::string reason = text_of(*m, "reason", "");
    if (reason.rfind("implicit: ", 0) == 0) reason = reason.substr(10);
    std::cout << "    " << reason << " (" << cost << ")\n";
  }
}

// Training steps (result "train"): one line per step, with each rank's total norm where it clips.
void print_train(const nlohmann::json& r) {
  const auto t = r.find("train");
  if (t == r.end() || !t->is_object()) return;
  std::cout << "  train: " << t->value("steps", 0) << " steps x " << t->value("microbatches", 0) << " microbatches, "
            << t->value("optimizer", std::string("?"));
  if (!t->value("ran", false)) {
    std::cout << ": not run (" << t->value("reason", std::string()) << ")\n";
    return;
  }
  std::cout << ", compared after every step within " << t->value("tolerance", 0.0) << "\n";
  for (const auto& s : t->value("per_step", nlohmann::json::array())) {
    std::cout << "    step " << s.value("step", 0) << ": " << s.value("status", std::string("?"));
    if (s.contains("grad_norm") && s["grad_norm"]["oracle"].is_number())
      std::cout << ", total norm " << s["grad_norm"]["oracle"].get<double>() << " (oracle)";
    const auto e = s.find("max_abs_error");
    if (e != s.end() && e->is_number()) std::cout << ", max_abs_error " << e->get<double>();
    std::cout << "\n";
  }
}

// What the system a program was imported from chose, against meshsim's choices (result "recorded").
void print_recorded(const nlohmann::json& r) {
  const nlohmann::json& rec = members(r, "recorded");
  if (rec.empty()) return;
  const std::string system = rec["system"].is_string() ? ImportedFrom::label_of(text_of(rec, "system")) : std::string("the recorded system");
  const nlohmann::json& n = members(rec, "compared");
  const nlohmann::json& diffs = members(rec, "differences");
  std::cout << "  " << system << (rec.contains("version") ? " " + text_of(rec, "version") : "") << " (recorded at import): "
            << int_of(n, "ops") << " ops, " << int_of(n, "placements") << " placements, " << int_of(n, "moves")
            << " redistributed operands, " << int_of(n, "backward_collectives") << " backward collective kinds compared; ";
  if (diffs.empty()) {
    std::cout << "meshsim chooses the same everywhere\n";
    return;
  }
  const nlohmann::json& bytes = members(rec, "bytes");
  std::cout << "meshsim chooses otherwise at " << diffs.size() << (diffs.size() == 1 ? " place" : " places")
            << " (forward moves: " << system << " " << grouped(int_of(bytes, "recorded")) << " B, meshsim "
            << grouped(int_of(bytes, "meshsim")) << " B)\n";
  for (const auto& d : diffs) std::cout << "    " << text_of(d, "message", "") << "\n";
}

// The human summary of a result; a result without values, collectives, grads or an error
// (a run that raised) prints what it has. Quiet: the verdict, the first divergence, the
// communication table, the checks and the failures.
void print_summary(const Scenario& sc, const RunOptions& options, const nlohmann::json& r, bool quiet = false) {
  std::cout << sc.name << ": " << text_of(r, "status") << "   (mesh " << sc.mesh.str() << ", seed " << options.seed
            << ")\n";
  if (text_of(r, "status") == "error") {
    const nlohmann::json& e = members(r, "error");
    std::cout << "  error " << text_of(e, "kind") << ": " << text_of(e, "message", "") << "\n";
    return;
  }
  // What a person needs first: where the run first goes wrong.
  const nlohmann::json& d = members(r, "first_divergence");
  if (!d.empty()) {
    if (d.contains("error")) std::cout << "  first divergence: not found: " << text_of(d, "error", "") << "\n";
    else std::cout << "  " << divergence_line(d) << "\n";
  }
  if (!quiet) {
    const nlohmann::json& values = members(r, "values");
    // Program order first, then the values meshsim made; each once (a set: a 100,000-op program
    // was quadratic here).
    std::vector<std::string> order;
    std::set<std::string> listed;
    for (const auto& n : program_order(sc))
      if (values.contains(n) && listed.insert(n).second) order.push_back(n);
    for (const auto& [name, v] : values.items())
      if (listed.insert(name).second) order.push_back(name);
    const SourceIndex sources = index_sources(sc);  // imported programs: where the user's code made each value
    for (const auto& name : order) {
      const nlohmann::json& v = values[name];
      if (!v.is_object()) continue;
      const auto src = sources.by_value.find(name);
      const std::string at = src == sources.by_value.end() ? "" : "   <- " + src->second->where();
      if (v.contains("placements"))
        std::cout << "  value " << name << " " << join_specs(v["placements"]) << " shape " << v.value("shape", nlohmann::json()).dump() << at << "\n";
      else if (v.value("variance", "") == "unchecked")  // plain local code: no sets kept
        std::cout << "  value " << name << " (local code, unchecked)" << at << "\n";
      else  // an LTensor of a local_map body
        std::cout << "  value " << name << " (local_map body) variant " << join_specs(v.value("variant", nlohmann::json()))
                  << " reduced " << join_specs(v.value("reduced", nlohmann::json()))
                  << (v.value("untracked", false) ? " UNTRACKED" : "") << at << "\n";
    }
    for (const auto& c : members(r, "collectives")) {
      if (!c.is_object()) continue;
      const auto bytes = c.find("bytes");
      std::cout << "  " << text_of(c, "phase") << " " << text_of(c, "op") << " over " << text_of(c, "axis") << ", "
                << (bytes != c.end() && bytes->is_number() ? bytes->dump() : "?") << " B per rank ("
                << text_of(c, "value") << ")" << (c.value("implicit", false) ? " implicit" : "") << "\n";
    }
    for (const auto& [name, g] : members(r, "grads").items()) {
      if (!g.is_object()) continue;
      std::cout << "  grad " << name << " " << join_specs(g.value("placements", nlohmann::json())) << " (cotangent "
                << join_specs(g.value("cotangent", nlohmann::json())) << ")\n";
    }
  }
  print_communication(r);
  print_recorded(r);
  print_train(r);
  std::cout << "  checks:";
  for (const auto& [name, ok] : members(r, "checks").items())  // null: the check did not (fully) run
    std::cout << " " << name << "=" << (ok == true ? "ok" : ok.is_null() ? "unchecked" : "FAIL");
  const auto err = r.find("max_abs_error");
  if (err != r.end() && err->is_number()) std::cout << "   max_abs_error " << err->get<double>();
  else if (err != r.end()) std::cout << "   max_abs_error not finite";  // null: NaN or infinity
  std::cout << "\n";
  if (r.contains("unchecked")) {
    std::cout << "  unchecked (no oracle value: a local_map without reference):";
    for (const auto& u : members(r, "unchecked")) std::cout << " " << (u.is_string() ? u.get<std::string>() : u.dump());
    std::cout << "\n";
  }
  for (const auto& f : members(r, "failures"))
    std::cout << "  failure: " << (f.is_string() ? f.get<std::string>() : f.dump()) << "\n";
}

Scenario scenario_from_trace(const Trace& t, const std::string& file, RunOptions& options) {
  Scenario sc = scenario_of_trace(t, file);
  options = sc.options;
  if (t.options.is_object())
    for (const auto& [key, value] : t.options.items()) {
      try {
        set_option(options, key, value);
      } catch (const std::invalid_argument& e) {
        throw InputError(file, "/options/" + key, e.what());
      }
    }
  return sc;
}

// A scenario, or a trace's scenario, ready to run: its options before any --option.
struct Runnable {
  Scenario sc;
  RunOptions options;
};

// The document is moved into the scenario (its `source`), not copied.
Runnable runnable_of(nlohmann::json doc, const std::string& file) {
  if (is_trace_document(doc)) {
    RunOptions options;
    Scenario sc = scenario_from_trace(trace_from_json(doc, file), file, options);
    return {std::move(sc), options};
  }
  Scenario sc = parse_scenario(std::move(doc), file);
  RunOptions options = sc.options;
  return {std::move(sc), options};
}

// One file run and judged: the checked run, its expect block's verdict and --strict's.
struct FileRun {
  Scenario sc;
  RunOptions options;
  CheckedRun run;
  std::optional<Expectation> expect;
  std::vector<std::string> unmet;  // the expectations not met
  std::string strict_problem;      // why --strict fails an unchecked run ("" when it does not)
  int exit_code = 0;

  // The result as printed: with the expect block's verdict when there is one.
  nlohmann::json result() const {
    nlohmann::json r = run.result;
    if (expect) r["expect"] = {{"met", unmet.empty()}, {"unmet", unmet}};
    return r;
  }
};

FileRun run_file(Runnable r, const RunArgs& args) {
  FileRun f{std::move(r.sc), {}, {}, std::nullopt, {}, "", 0};
  f.expect = parse_expectation(f.sc);  // before the run: a malformed block is unusable input
  f.options = with_overrides(r.options, args.options);
  if (args.no_implicit) f.options.implicit = ImplicitPolicy::Error;
  if (args.localize) f.options.localize = Localize::Always;
  check_resources(f.sc, f.options, resource_limits());
  f.run = check_scenario(f.sc, f.options, /*keep_values=*/!args.values_dir.empty());
  f.exit_code = f.run.exit_code;
  if (f.expect) {
    f.unmet = unmet_expectations(*f.expect, f.run.result, f.run.exit_code);
    // A met block makes a known failure or error a passing regression test.
    f.exit_code = f.unmet.empty() ? 0 : 1;
  }
  // A block that expects status unchecked has accepted it; one that is silent on it has not.
  const bool unchecked_expected = f.expect && f.expect->status == std::string("unchecked");
  if (args.strict && f.run.result.value("status", "") == "unchecked" && !unchecked_expected) {
    f.strict_problem = "strict: status unchecked is a failure; no oracle value for";
    for (const auto& u : members(f.run.result, "unchecked"))
      f.strict_problem += " " + (u.is_string() ? u.get<std::string>() : u.dump());
    f.exit_code = std::max(f.exit_code, 1);
  }
  return f;
}

// The expect block's and --strict's lines under the human summary.
void print_verdicts(const FileRun& f) {
  if (f.expect && f.unmet.empty())
    std::cout << "expect: met (status " << f.run.result.value("status", "") << " as expected)\n";
  for (const auto& u : f.unmet) std::cout << "expect: " << u << "\n";
  if (!f.strict_problem.empty()) std::cout << f.strict_problem << "\n";
}

// One file of several: its exit code, its verdict line and its result.
struct Report {
  std::string file;
  int exit_code = 0;
  std::string detail;
  nlohmann::json result;
};

Report report_of(const FileRun& f, const std::string& file) {
  Report rep{file, f.exit_code, "", f.result()};
  const std::string status = f.run.result.value("status", "");
  if (!f.unmet.empty()) {
    rep.detail = "expect " + f.unmet.front();
    if (f.unmet.size() > 1) rep.detail += " (and " + std::to_string(f.unmet.size() - 1) + " more)";
  } else if (!f.strict_problem.empty()) {
    rep.detail = f.strict_problem;
  } else if (f.expect) {
    rep.detail = status + ", as expected";
  } else if (status == "error") {
    const nlohmann::json& e = members(f.run.result, "error");
    rep.detail = "error " + text_of(e, "kind") + ": " + first_line(text_of(e, "message", ""));
  } else if (status == "fail" && !members(f.run.result, "failures").empty()) {
    const nlohmann::json& first = members(f.run.result, "failures").front();
    rep.detail = "fail: " + (first.is_string() ? first.get<std::string>() : first.dump());
  } else {
    rep.detail = status;
  }
  return rep;
}

// A file that could not be run (unreadable, malformed, a malformed expect block): exit 2 or 3.
Report report_of(const std::string& file, int exit_code, ErrorKind kind, const std::string& message) {
  nlohmann::json r = {{"format", "meshsim.result/1"},
                      {"status", "error"},
                      {"error", {{"kind", error_kind_name(kind)}, {"message", message}}}};
  return {file, exit_code, message, r};
}

Report report_of(const std::string& file, const InputError& e) {
  Report rep = report_of(file, 2, e.kind(), e.file() == file ? e.json_path() + ": " + e.detail() : e.what());
  if (e.file() == file && !e.json_path().empty()) rep.result["error"]["path"] = e.json_path();
  if (e.file() != file) rep.result["error"]["file"] = e.file();  // an option or another file named
  return rep;
}

Report report_of(const std::string& file, const SemanticError& e) {
  Report rep = report_of(file, exit_code_for(e.kind()), e.kind(), e.what());
  if (!e.path().empty()) rep.result["error"]["path"] = e.path();
  return rep;
}

}  // namespace

namespace {

void print_error_line(const std::string& file, const nlohmann::json& result) {
  const nlohmann::json& e = members(result, "error");
  std::cerr << error_line(file, text_of(e, "path", ""), text_of(e, "kind"), text_of(e, "message", "")) << "\n";
}

// One file, as `meshsim run FILE` has always run it (and the expect and --strict lines). A file
// that cannot run says why on stderr, and with --json prints its result with status error too.
int run_single(const RunArgs& args) {
  const std::string& file = args.files.front();
  if (!args.trace_out.empty()) refuse_output_over_input("--trace", args.trace_out, {file});
  if (!args.render_out.empty()) refuse_output_over_input("--render", args.render_out, {file, args.trace_out});
  if (!args.values_dir.empty()) refuse_directory_over_input("--values", args.values_dir, {file});
  if (!args.explore_out.empty()) {
    if (args.explore_out.size() < 5 || args.explore_out.compare(args.explore_out.size() - 5, 5, ".html") != 0)
      throw UsageError("run: --explore must name an .html file, got \"" + args.explore_out + "\"");
    refuse_output_over_input("--explore", args.explore_out, {file, args.trace_out, args.render_out});
  }
  std::optional<FileRun> run;
  std::optional<Report> refused;
  std::string said;  // unusable input: FILE: PATH: why, as main() says it
  // Without --trace or --render nothing reads the locals' hashes or the scenario's document: a long
  // program's run keeps neither.
  const bool traced = !args.trace_out.empty() || !args.render_out.empty() || !args.explore_out.empty();
  ScopedOverride<bool> hashes(local_hashes_enabled(), !args.trace_out.empty());
  try {
    Runnable r = runnable_of(read_json_file(file), file);  // the document is in r.sc now, not held twice
    if (!traced) r.sc.source = nullptr;
    run = run_file(std::move(r), args);
  } catch (const InputError& e) {
    refused = report_of(file, e);
    said = e.what();
  } catch (const SemanticError& e) {
    refused = report_of(file, e);
  }
  if (refused) {
    if (args.json) std::cout << refused->result.dump(2) << "\n";
    if (said.empty()) print_error_line(file, refused->result);
    else std::cerr << "meshsim: " << said << "\n";
    return refused->exit_code;
  }
  FileRun& f = *run;
  if (args.json) {
    std::cout << f.result().dump(2) << "\n";
    if (!f.strict_problem.empty()) std::cerr << f.strict_problem << "\n";
  } else {
    print_summary(f.sc, f.options, f.run.result, args.quiet);
    print_verdicts(f);
  }
  // An error that the expect block does not accept is said where errors are looked for.
  if (f.run.result.value("status", "") == "error" && f.exit_code != 0) print_error_line(file, f.run.result);
  if (!args.values_dir.empty()) write_values(f.run, args.values_dir, args.values_per_rank);
  if (traced) {
    Trace trace = trace_of(f.sc, f.options, std::move(f.run));  // the run's events, not a copy
    if (!args.trace_out.empty()) write_trace(trace, args.trace_out);
    if (!args.render_out.empty()) render_to_file(trace, args.render_out, parse_render_view(args.render_view));
    if (!args.explore_out.empty()) {
      ExploreRun page{file, std::move(trace), nullptr};
      write_file_atomically(args.explore_out, explore_html({page}));
    }
  }
  return f.exit_code;
}

bool is_scenario_document(const nlohmann::json& doc) {
  return doc.is_object() && doc.contains("format") && doc["format"] == "meshsim.scenario/1";
}

// Runs one file of several; what stops it is reported for that file, never for the others (as
// main() reports it for one file).
Report run_reported(nlohmann::json doc, const std::string& file, const RunArgs& args) {
  try {
    // A scenario that calls Functions of the user's own is skipped, and says so, where they are
    // not loaded (a suite run with the stock command; `--plugin` or a meshsim of one's own has them).
    Runnable r = runnable_of(std::move(doc), file);
    std::string missing;
    for (const auto& fn : r.sc.required_functions)
      if (!find_scenario_function(fn)) missing += (missing.empty() ? "" : ", ") + fn;
    if (!missing.empty())
      return {file, 0, "skipped: needs the Functions " + missing + " (load them with meshsim --plugin, docs/cpp-api.md)",
              {{"format", "meshsim.result/1"}, {"status", "skipped"}, {"missing_functions", missing}}};
    return report_of(run_file(std::move(r), args), file);
  } catch (const InputError& e) {
    return report_of(file, e);
  } catch (const SemanticError& e) {
    return report_of(file, e);
  } catch (const std::exception& e) {  // a bug of meshsim's own
    return report_of(file, 1, ErrorKind::InvalidScenario, std::string("internal error: ") + e.what());
  }
}

// The *.json files under a directory, sorted by path; InputError when it cannot be listed.
std::vector<std::string> json_files_under(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".json" && it->is_regular_file()) out.push_back(it->path().string());
  if (ec) throw InputError(dir, "", "cannot list the directory: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

// Every file of the arguments, run in turn: a verdict line each (or one JSON array), a summary,
// and the worst exit code.
int run_several(const RunArgs& args) {
  std::vector<Report> reports;
  auto reported = [&](Report rep) {
    if (!args.json)
      std::cout << (rep.result.value("status", "") == "skipped" ? "skip   "
                    : rep.exit_code == 0                     ? "ok     "
                    : rep.exit_code == 1                     ? "FAIL   "
                                                             : "ERROR  ")
                << rep.file << ": "
                << rep.detail << std::endl;  // flushed: a long suite shows its progress
    reports.push_back(std::move(rep));
  };
  for (const auto& arg : args.files) {
    std::error_code ec;
    if (!fs::is_directory(arg, ec)) {
      try {
        reported(run_reported(read_json_file(arg), arg, args));
      } catch (const InputError& e) {
        reported(report_of(arg, e));
      }
      continue;
    }
    size_t found = 0;
    try {
      for (const auto& file : json_files_under(arg)) {
        nlohmann::json doc;
        try {
          doc = read_json_file(file);
        } catch (const InputError& e) {  // unreadable or not JSON: it may be a broken scenario
          ++found;
          reported(report_of(file, e));
          continue;
        }
        if (!is_scenario_document(doc)) continue;  // goldens, traces, other JSON
        ++found;
        reported(run_reported(std::move(doc), file, args));
      }
      // An empty directory is more likely a wrong path than an empty suite.
      if (found == 0)
        reported(report_of(arg, 2, ErrorKind::InvalidScenario, "no scenario files (meshsim.scenario/1) in it"));
    } catch (const InputError& e) {
      reported(report_of(arg, e));
    }
  }
  int worst = 0, passed = 0, failed = 0, errors = 0, skipped = 0;
  nlohmann::json results = nlohmann::json::array();
  for (const auto& rep : reports) {
    worst = std::max(worst, rep.exit_code);
    if (rep.result.value("status", "") == "skipped") ++skipped;
    else (rep.exit_code == 0 ? passed : rep.exit_code == 1 ? failed : errors) += 1;
    nlohmann::json r = {{"file", rep.file}};
    r.update(rep.result);
    results.push_back(r);
  }
  std::ostringstream summary;
  summary << reports.size() << " scenarios: " << passed << " passed, " << failed << " failed, " << errors
          << " errors";
  if (skipped) summary << ", " << skipped << " skipped";
  summary << "\n";
  if (args.json) {
    std::cout << results.dump(2) << "\n";
    std::cerr << summary.str();  // stdout holds the JSON array alone
  } else {
    std::cout << summary.str();
  }
  return worst;
}

// replay --scenario OUT: the trace's scenario with the options it ran with, as a scenario file.
int write_trace_scenario(const Trace& t, const std::string& trace_file, const std::string& out) {
  refuse_output_over_input("--scenario", out, {trace_file});
  RunOptions options;
  scenario_from_trace(t, trace_file, options);  // a trace whose scenario does not parse writes nothing
  nlohmann::json doc = t.scenario;
  doc["options"] = options.to_json();
  write_file_atomically(out, doc.dump(2) + "\n");
  std::cout << "wrote " << out << " (the scenario of " << trace_file << " with its recorded options)\n";
  return 0;
}

}  // namespace

int cmd_run(const RunArgs& args) {
  std::error_code ec;
  const bool one_file = args.files.size() == 1 && !fs::is_directory(args.files.front(), ec);
  if (one_file) return run_single(args);
  if (!args.trace_out.empty() || !args.render_out.empty() || !args.values_dir.empty() || !args.explore_out.empty()) {
    std::cerr << "meshsim: run: --trace, --render, --explore and --values take exactly one scenario file, not "
              << (args.files.size() == 1 ? "a directory" : std::to_string(args.files.size()) + " files") << "\n";
    return 2;
  }
  ScopedOverride<bool> hashes(local_hashes_enabled(), false);  // no trace is written
  return run_several(args);
}

int cmd_replay(const ReplayArgs& args) {
  Trace recorded = read_trace(args.trace);
  if (!args.scenario_out.empty()) return write_trace_scenario(recorded, args.trace, args.scenario_out);
  RunOptions options;
  Scenario sc = scenario_from_trace(recorded, args.trace, options);
  check_resources(sc, options, resource_limits());
  CheckedRun run = check_scenario(sc, options);
  Divergence d = compare_events(recorded.events, run.events);
  if (!d.diverged && recorded.result.is_object() && recorded.result.value("status", "") != run.result.value("status", "")) {
    d.diverged = true;
    d.message = "status differs: recorded " + recorded.result.value("status", "") + ", replayed " +
                run.result.value("status", "");
  }
  if (d.diverged) {
    std::cout << "replay diverged: " << d.message << "\n";
    return 1;
  }
  std::cout << "replay reproduced " << run.events.size() << " events exactly (status "
            << run.result.value("status", "") << ")\n";
  if (run.result.contains("failures"))
    for (const auto& f : run.result["failures"]) std::cout << "  recorded failure: " << f.get<std::string>() << "\n";
  if (run.result.value("status", "") == "error")
    std::cout << "  recorded error: " << run.result["error"]["message"].get<std::string>() << "\n";
  return 0;
}

}  // namespace meshsim::cli

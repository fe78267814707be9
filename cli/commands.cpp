#include "cli/commands.h"

#include <iostream>

#include "cli/trace_of.h"
#include "core/error.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "traces/render.h"
#include "traces/trace.h"

namespace meshsim::cli {

RunOptions options_with_overrides(const Scenario& sc, const std::vector<std::string>& overrides) {
  RunOptions options = sc.options;
  for (const auto& kv : overrides) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InputError("--option", "", "expected key=value, got \"" + kv + "\"");
    try {
      set_option(options, kv.substr(0, eq), nlohmann::json(kv.substr(eq + 1)));
    } catch (const std::invalid_argument& e) {
      throw InputError("--option", "/" + kv.substr(0, eq), e.what());
    }
  }
  return options;
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

// The human summary of a result; a result without values, collectives, grads or an error
// (a run that raised) prints what it has.
void print_summary(const Scenario& sc, const RunOptions& options, const nlohmann::json& r) {
  std::cout << sc.name << ": " << text_of(r, "status") << "   (mesh " << sc.mesh.str() << ", seed " << options.seed
            << ")\n";
  if (text_of(r, "status") == "error") {
    const nlohmann::json& e = members(r, "error");
    std::cout << "  error " << text_of(e, "kind") << ": " << text_of(e, "message", "") << "\n";
    return;
  }
  for (const auto& [name, v] : members(r, "values").items()) {
    if (!v.is_object()) continue;
    if (v.contains("placements"))
      std::cout << "  value " << name << " " << join_specs(v["placements"]) << " shape " << v.value("shape", nlohmann::json()).dump() << "\n";
    else  // an LTensor of a local_map body
      std::cout << "  value " << name << " (local_map body) variant " << join_specs(v.value("variant", nlohmann::json()))
                << " reduced " << join_specs(v.value("reduced", nlohmann::json()))
                << (v.value("untracked", false) ? " UNTRACKED" : "") << "\n";
  }
  for (const auto& c : members(r, "collectives")) {
    if (!c.is_object()) continue;
    const auto bytes = c.find("bytes");
    std::cout << "  " << text_of(c, "phase") << " " << text_of(c, "op") << " over " << text_of(c, "axis") << ", "
              << (bytes != c.end() && bytes->is_number() ? bytes->dump() : "?") << " B per rank (" << text_of(c, "value")
              << ")\n";
  }
  for (const auto& [name, g] : members(r, "grads").items()) {
    if (!g.is_object()) continue;
    std::cout << "  grad " << name << " " << join_specs(g.value("placements", nlohmann::json())) << " (cotangent "
              << join_specs(g.value("cotangent", nlohmann::json())) << ")\n";
  }
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
  Scenario sc = parse_scenario(t.scenario, file);
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

}  // namespace

int cmd_run(const RunArgs& args) {
  Scenario sc = load_scenario(args.file);
  RunOptions options = options_with_overrides(sc, args.options);
  CheckedRun run = check_scenario(sc, options);
  if (args.json) std::cout << run.result.dump(2) << "\n";
  else print_summary(sc, options, run.result);
  Trace trace = trace_of(sc, options, run);
  if (!args.trace_out.empty()) write_trace(trace, args.trace_out);
  if (!args.render_out.empty()) render_to_file(trace, args.render_out, parse_render_view(args.render_view));
  return run.exit_code;
}

int cmd_replay(const ReplayArgs& args) {
  Trace recorded = read_trace(args.trace);
  RunOptions options;
  Scenario sc = scenario_from_trace(recorded, args.trace, options);
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

int cmd_render(const RenderArgs& args) {
  nlohmann::json doc = read_json_file(args.file);
  Trace trace;
  if (is_trace_document(doc)) {
    trace = trace_from_json(doc, args.file);
  } else {
    Scenario sc = parse_scenario(doc, args.file);
    trace = trace_of(sc, sc.options, check_scenario(sc, sc.options));
  }
  render_to_file(trace, args.out, parse_render_view(args.view));
  std::cout << "wrote " << args.out << "\n";
  return 0;
}

}  // namespace meshsim::cli

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
  for (size_t i = 0; i < placements.size(); ++i) out += (i ? ", " : "") + placements[i].get<std::string>();
  return out + "]";
}

// The human summary of a result.
void print_summary(const Scenario& sc, const RunOptions& options, const nlohmann::json& r) {
  std::cout << sc.name << ": " << r["status"].get<std::string>() << "   (mesh " << sc.mesh.str()
            << ", seed " << options.seed << ")\n";
  if (r["status"] == "error") {
    std::cout << "  error " << r["error"]["kind"].get<std::string>() << ": "
              << r["error"]["message"].get<std::string>() << "\n";
    return;
  }
  for (const auto& [name, v] : r["values"].items()) {
    if (v.contains("placements"))
      std::cout << "  value " << name << " " << join_specs(v["placements"]) << " shape " << v["shape"].dump() << "\n";
    else  // an LTensor of a local_map body
      std::cout << "  value " << name << " (local_map body) variant " << join_specs(v["variant"]) << " reduced "
                << join_specs(v["reduced"]) << (v.value("untracked", false) ? " UNTRACKED" : "") << "\n";
  }
  for (const auto& c : r["collectives"])
    std::cout << "  " << c["phase"].get<std::string>() << " " << c["op"].get<std::string>() << " over "
              << c["axis"].get<std::string>() << ", " << c["bytes"].get<int64_t>() << " B per rank ("
              << c["value"].get<std::string>() << ")\n";
  for (const auto& [name, g] : r["grads"].items())
    std::cout << "  grad " << name << " " << join_specs(g["placements"]) << " (cotangent "
              << join_specs(g["cotangent"]) << ")\n";
  std::cout << "  checks:";
  for (const auto& [name, ok] : r["checks"].items()) std::cout << " " << name << "=" << (ok.get<bool>() ? "ok" : "FAIL");
  std::cout << "   max_abs_error " << r["max_abs_error"].get<double>() << "\n";
  if (r.contains("failures"))
    for (const auto& f : r["failures"]) std::cout << "  failure: " << f.get<std::string>() << "\n";
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

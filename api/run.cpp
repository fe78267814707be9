// meshsim::run_scenario*: `meshsim run FILE` as a function that returns the result and never
// throws for bad input.
#include <sstream>

#include "api/trace_of.h"
#include "core/error.h"
#include "core/resources.h"
#include "core/scenario.h"
#include "meshsim/meshsim.h"
#include "oracles/check.h"
#include "traces/render.h"
#include "traces/trace.h"

namespace meshsim {

namespace {

RunResult error_result(int exit_code, const std::string& kind, const std::string& message) {
  RunResult r;
  r.exit_code = exit_code;
  r.status = "error";
  r.error_kind = kind;
  r.message = message;
  return r;
}

// What a person reads of a result: the error, or the failures with their numbers.
std::string message_of(const nlohmann::json& result) {
  std::ostringstream out;
  if (result.contains("error") && result["error"].is_object())
    out << result["error"].value("kind", "error") << ": " << result["error"].value("message", "");
  if (result.contains("failures") && result["failures"].is_array())
    for (const auto& f : result["failures"]) out << (out.tellp() > 0 ? "\n" : "") << (f.is_string() ? f.get<std::string>() : f.dump());
  return out.str();
}

RunResult run_parsed(const nlohmann::json& doc, const std::string& name, const RunSettings& settings) {
  Scenario sc = parse_scenario(doc, name);
  const RunOptions options = with_overrides(sc.options, settings.options);
  ResourceLimits limits;
  limits.max_bytes = settings.max_memory;
  limits.max_ranks = settings.max_ranks;
  check_resources(sc, options, limits);
  CheckedRun run = check_scenario(sc, options);
  RunResult r;
  r.exit_code = run.exit_code;
  r.result = run.result;
  r.status = run.result.value("status", "error");
  if (run.result.contains("error") && run.result["error"].is_object())
    r.error_kind = run.result["error"].value("kind", "");
  r.message = message_of(run.result);
  if (settings.strict && r.status == "unchecked") {
    r.exit_code = std::max(r.exit_code, 1);
    r.message = "strict: status unchecked is a failure (a value has no oracle value: " +
                run.result.value("unchecked", nlohmann::json::array()).dump() + ")";
  }
  if (!settings.trace_out.empty() || !settings.render_out.empty()) {
    const Trace t = trace_of(sc, options, run);
    if (!settings.trace_out.empty()) write_trace(t, settings.trace_out);
    if (!settings.render_out.empty()) render_to_file(t, settings.render_out);
  }
  return r;
}

// Runs `body`; whatever it throws becomes a result with an error.
template <class F>
RunResult guarded(const F& body) {
  try {
    return body();
  } catch (const InputError& e) {
    return error_result(2, error_kind_name(e.kind()), e.what());
  } catch (const SemanticError& e) {
    return error_result(exit_code_for(e.kind()), error_kind_name(e.kind()), e.what());
  } catch (const std::exception& e) {
    if (is_out_of_memory(e))
      return error_result(kExitResource, error_kind_name(ErrorKind::OutOfMemory), "out of memory: " + first_line(e.what()));
    return error_result(1, "internal", std::string("internal error: ") + first_line(e.what()));
  }
}

}  // namespace

RunResult run_scenario_file(const std::string& path, const RunSettings& settings) {
  return guarded([&] { return run_parsed(read_json_file(path), path, settings); });
}

RunResult run_scenario(const nlohmann::json& scenario, const std::string& name, const RunSettings& settings) {
  return guarded([&] { return run_parsed(scenario, name, settings); });
}

RunResult run_scenario_text(const std::string& text, const std::string& name, const RunSettings& settings) {
  return guarded([&] { return run_parsed(parse_json_text(text, name), name, settings); });
}

}  // namespace meshsim

// The commands' parts that compute nothing with tensors, so that `meshsim` (cli/front.cpp) runs
// them without libtorch: `render` (of a trace; a scenario is run by the tracer), the exit code of a
// drawn run, a trace's scenario, the error line and the resource limits.
#include <sys/stat.h>

#include <iostream>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/expect.h"
#include "core/error.h"
#include "core/files.h"
#include "core/resources.h"
#include "core/scenario.h"
#include "traces/render.h"
#include "traces/trace.h"

namespace meshsim::cli {

Scenario scenario_of_trace(const Trace& t, const std::string& file) {
  try {
    return parse_scenario(t.scenario, file);
  } catch (const InputError& e) {
    if (e.file() != file) throw;
    throw InputError(file, "/scenario" + (e.json_path() == "/" ? std::string() : e.json_path()), e.detail(), e.kind());
  }
}

namespace {
ResourceLimits g_limits;
ScenarioTracer g_tracer = nullptr;
void (*g_before_stream)() = nullptr;
}  // namespace

void set_resource_limits(const ResourceLimits& limits) { g_limits = limits; }
const ResourceLimits& resource_limits() { return g_limits; }

void set_scenario_tracer(ScenarioTracer tracer, void (*before_reading_stream)()) {
  g_tracer = tracer;
  g_before_stream = before_reading_stream;
}

nlohmann::json read_drawn_file(const std::string& file) {
  struct stat st {};
  if (g_before_stream && ::stat(file.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) g_before_stream();
  return read_json_file(file);
}

Trace trace_of_scenario(const Scenario& sc) {
  check_resources(sc, sc.options, g_limits);
  if (!g_tracer) throw std::logic_error("no scenario tracer set (cli::command_line sets it)");
  return g_tracer(sc);
}

std::string error_line(const std::string& file, const std::string& path, const std::string& kind, std::string message) {
  message = first_line(message);
  // Messages of the rules often lead with their JSON path already: said once, first.
  if (!path.empty() && message.rfind(path + ": ", 0) == 0) message = message.substr(path.size() + 2);
  return "meshsim: " + (file.empty() ? "" : file + ": ") + (path.empty() ? "" : path + ": ") + kind + ": " + message;
}

// The exit code of the run a diagram draws, as `meshsim run` would give it (contract 1): 0 for a
// run that passed (or met its expect block), 1 failed, 2 or 3 refused, 6 out of memory.
int exit_of_drawn(const nlohmann::json& result, const std::optional<Expectation>& expect) {
  if (!result.is_object()) return 0;  // a trace without its result: nothing to judge
  const std::string status = result.value("status", "");
  int code = status == "fail" ? 1 : 0;
  if (status == "error") {
    const std::string kind = result.contains("error") ? result["error"].value("kind", "") : "";
    code = 3;
    for (ErrorKind k : {ErrorKind::InvalidScenario, ErrorKind::ShapeMismatch, ErrorKind::UnsupportedOp,
                        ErrorKind::ResourceLimit, ErrorKind::OutOfMemory})
      if (kind == error_kind_name(k)) code = exit_code_for(k);
  }
  if (expect) return unmet_expectations(*expect, result, code).empty() ? 0 : 1;
  return code;
}

int cmd_render(const RenderArgs& args) {
  refuse_output_over_input("--out", args.out, {args.file});
  nlohmann::json doc = read_drawn_file(args.file);
  Trace trace;
  std::optional<Expectation> expect;
  if (is_trace_document(doc)) {
    trace = trace_from_json(doc, args.file);
    doc = nullptr;  // the trace holds what is drawn
    expect = parse_expectation(scenario_of_trace(trace, args.file));
  } else {
    Scenario sc = parse_scenario(std::move(doc), args.file);
    expect = parse_expectation(sc);
    trace = trace_of_scenario(sc);
  }
  RenderOptions options;
  options.view = parse_render_view(args.view);
  options.fold = args.fold ? FoldMode::Always : args.no_fold ? FoldMode::Never : FoldMode::Auto;
  options.ops = args.ops;
  if (!args.ops.empty()) {
    try {
      parse_op_range(trace, args.ops);  // a bad range is bad usage, said before anything is drawn
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("render: ") + e.what());
    }
  }
  render_to_file(trace, args.out, options);
  std::cout << "wrote " << args.out << "\n";
  // The diagram is written either way; the exit says whether the run it draws passed, so that CI
  // tells a failing program from its picture.
  const int code = exit_of_drawn(trace.result, expect);
  if (code != 0)
    std::cerr << "meshsim: render: the run it draws is not a pass: status " << trace.result.value("status", "?")
              << " (exit " << code << ")\n";
  return code;
}

}  // namespace meshsim::cli

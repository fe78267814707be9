// The subcommands of `meshsim` (DESIGN.md, contract 1). Each returns the process exit code.
#pragma once

#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/expect.h"
#include "core/resources.h"
#include "core/scenario.h"

namespace meshsim {
struct Trace;
}

namespace meshsim::cli {

// A command line that cannot run (exit 2, one plain line): a malformed --shard, -j 0, an unknown
// property, a plugin that cannot be loaded.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The scenario's options with `--option key=value` overrides applied (InputError when malformed).
RunOptions options_with_overrides(const Scenario& sc, const std::vector<std::string>& overrides);


// How render and explore run a scenario they are given instead of a trace: its checked run's trace
// (cli/app.h's TensorCommands::trace_scenario, which command_line sets).
using ScenarioTracer = Trace (*)(const Scenario& sc);
void set_scenario_tracer(ScenarioTracer tracer, void (*before_reading_stream)() = nullptr);
// Reads a scenario or a trace that render or explore was given; before a stream, the hook above.
nlohmann::json read_drawn_file(const std::string& file);
// The trace of the scenario's checked run, refused (check_resources) past the resource limits.
Trace trace_of_scenario(const Scenario& sc);

// A trace's scenario, parsed: its errors at the trace file's paths ("/scenario/program/0", not
// "/program/0"). For replay, run of a trace and explore.
Scenario scenario_of_trace(const Trace& t, const std::string& file);

// The limits every scenario run by the command line is held to (--max-memory, --max-ranks).
void set_resource_limits(const ResourceLimits& limits);
const ResourceLimits& resource_limits();

// The line on stderr for an error: "meshsim: FILE: PATH: kind: message" (file and path when
// known; a message that leads with the path says it once).
std::string error_line(const std::string& file, const std::string& path, const std::string& kind, std::string message);

// A progress line on stderr, when it is a terminal, for runs longer than 2 s; erased at the end.
void install_progress_line();
void erase_progress_line();

struct RunArgs {
  // Scenario files, trace files (run with their recorded options) and directories (searched for
  // scenario files). One file runs as it always has; several print a verdict each and a summary.
  std::vector<std::string> files;
  bool json = false;
  bool strict = false;  // status unchecked is a failure (exit 1)
  // Single file only:
  std::string trace_out;
  std::string render_out;
  std::string render_view = "logical";  // logical | ranks
  std::string explore_out;              // --explore PAGE.html: the explorer's page of this run
  std::string values_dir;               // --values DIR
  bool values_per_rank = false;         // --values-per-rank
  std::vector<std::string> options;  // key=value
  bool quiet = false;        // --quiet: the verdict, the first divergence, failures, the communication table
  bool no_implicit = false;  // --no-implicit: option implicit=error
  bool localize = false;     // --localize: option localize=always (the first divergence searched in the run itself)
};
int cmd_run(const RunArgs& args);

struct ReplayArgs {
  std::string trace;
  std::string scenario_out;  // --scenario OUT: write the trace's scenario there instead of replaying
};
int cmd_replay(const ReplayArgs& args);

struct RenderArgs {
  std::string file;
  std::string out;
  std::string view = "logical";  // logical | ranks
  bool fold = false;             // --fold: fold by layer whatever the size
  bool no_fold = false;          // --no-fold: never fold by layer
  std::string ops;               // --ops FROM..TO, "" for the whole program
};
int cmd_render(const RenderArgs& args);
// The exit code of the run a diagram or a page shows, as `meshsim run` would give it.
int exit_of_drawn(const nlohmann::json& result, const std::optional<Expectation>& expect);

// `meshsim explore FILE [B] -o PAGE.html [--values DIR]` (cli/explore.cpp, traces/explore.h).
struct ExploreArgs {
  std::vector<std::string> files;  // a scenario or a trace; or two traces, compared
  std::string out;
  std::string values;  // --values DIR of `meshsim run --values`
};
int cmd_explore(const ExploreArgs& args);

// `meshsim ops`: the op catalog (core/ops.h), one line per op; --json: meshsim.ops/1; --markdown:
// the table of the ops a scenario may use (docs/scenario-format.md's). Returns 0.
struct OpsArgs {
  bool json = false;
  bool markdown = false;
};
int cmd_ops(const OpsArgs& args, std::ostream& out);

}  // namespace meshsim::cli

#include "gpu_validate/validate.h"

namespace meshsim::cli {

int cmd_validate(const ValidateConfig& config);

}  // namespace meshsim::cli

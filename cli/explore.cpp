// meshsim explore (cli/commands.h): one self-contained HTML page of a run, or of two side by side.
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/expect.h"
#include "core/error.h"
#include "core/files.h"
#include "core/resources.h"
#include "core/scenario.h"
#include "traces/explore.h"
#include "traces/trace.h"

namespace meshsim::cli {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A scenario is run here; a trace (a run's, or a check counterexample) is shown as recorded.
std::pair<ExploreRun, int> load_run(const std::string& file) {
  ExploreRun run;
  run.file = file;
  nlohmann::json doc = read_drawn_file(file);
  std::optional<Expectation> expect;
  if (is_trace_document(doc)) {
    run.trace = trace_from_json(doc, file);
    expect = parse_expectation(scenario_of_trace(run.trace, file));
  } else {
    Scenario sc = parse_scenario(std::move(doc), file);
    expect = parse_expectation(sc);
    run.trace = trace_of_scenario(sc);
  }
  const int code = exit_of_drawn(run.trace.result, expect);
  return {std::move(run), code};
}

}  // namespace

int cmd_explore(const ExploreArgs& args) {
  if (args.files.empty() || args.files.size() > 2)
    throw UsageError("explore: give one scenario or trace, or two traces to compare, got " +
                     std::to_string(args.files.size()) + " files");
  if (!ends_with(args.out, ".html")) throw UsageError("explore: --out must name an .html file, got \"" + args.out + "\"");
  if (!args.values.empty() && args.files.size() != 1)
    throw UsageError("explore: --values goes with one run, not a comparison");
  refuse_output_over_input("--out", args.out, args.files);
  std::vector<ExploreRun> runs;
  int code = 0;
  for (const auto& file : args.files) {
    auto [run, run_code] = load_run(file);
    if (code == 0) code = run_code;
    runs.push_back(std::move(run));
  }
  if (!args.values.empty()) runs.front().recorded = read_recorded_values(args.values);
  const std::string page = explore_html(runs);
  write_file_atomically(args.out, page);
  std::cout << "wrote " << args.out << " (" << (page.size() + 1023) / 1024 << " KiB)\n";
  // As render: the page is written either way; the exit says whether the runs it shows passed.
  if (code != 0)
    std::cerr << "meshsim: explore: a run it shows is not a pass (exit " << code << ")\n";
  return code;
}

}  // namespace meshsim::cli

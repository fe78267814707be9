// meshsim: the command line (DESIGN.md, contract 1), defined once for `meshsim` (cli/front.cpp,
// without libtorch) and the full command (meshsim::main, cli/tensor_commands.cpp: meshsim-torch and
// a user's own binary with their Functions built in, include/meshsim/meshsim.h); each passes the
// commands that compute with tensors as it has them (cli/app.h).
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <random>

#include <CLI/CLI.hpp>

#include "cli/app.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/files.h"
#include "core/resources.h"
#include "cli/check.h"
#include "cli/emit.h"
#include "cli/explain.h"
#include "cli/import.h"
#include "core/error.h"

namespace meshsim::cli {

namespace {

// Numbers on the command line: parsed whole and bounded, with a plain message ("--ranks: expected
// a whole number from 1 to 1099511627776, got 0"); CLI11's own ranges print doubles of 309 digits.
CLI::Validator whole_number(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        const std::string expected =
            "expected a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got \"" + text + "\"";
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi) return expected;
        return "";
      },
      "INT " + std::to_string(lo) + ".." + std::to_string(hi));
}

CLI::Validator seed_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        std::strtoull(text.c_str(), &end, 10);
        if (text.empty() || text[0] == '-' || *end != '\0' || errno == ERANGE)
          return "expected a whole number from 0 to 18446744073709551615, got \"" + text + "\"";
        return "";
      },
      "UINT64");
}

CLI::Validator seconds(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !(v >= lo && v <= hi))
          return "expected seconds from " + CLI::detail::to_string(lo) + " to " + CLI::detail::to_string(hi) +
                 ", got \"" + text + "\"";
        return "";
      },
      "SECONDS");
}

CLI::Validator byte_size() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          parse_byte_size(text);
        } catch (const std::invalid_argument& e) {
          return e.what();
        }
        return "";
      },
      "SIZE");
}

// --max-memory and --max-ranks, for every subcommand that runs a scenario.
void add_limits(CLI::App* sub, ResourceLimits& limits, std::string& max_memory) {
  sub->add_option("--max-memory", max_memory,
                  "Refuse (exit 2, with the estimate) a scenario estimated to need more memory: 8G, 512M, bytes "
                  "(default: half this machine's memory)")
      ->check(byte_size());
  sub->add_option("--max-ranks", limits.max_ranks,
                  "Refuse (exit 2) a mesh of more ranks (default " + std::to_string(kDefaultMaxRanks) + ")")
      ->check(whole_number(1, int64_t{1} << 40));
}

// --max-input, for every subcommand that reads a scenario or a trace.
void add_input_limit(CLI::App* sub, std::string& max_input) {
  sub->add_option("--max-input", max_input,
                  "Refuse (exit 2, naming the limit) an input file larger than this, or a stream (a FIFO, "
                  "/dev/stdin, <(...)) that goes on longer: 64M, 2G, bytes (default 1G)")
      ->check(byte_size());
}

}  // namespace

int command_line(int argc, char** argv, const TensorCommands& tensors) {
  set_scenario_tracer(tensors.trace_scenario, tensors.before_reading_stream);
  CLI::App app{"meshsim: a deterministic simulator and testing harness for distributed tensor semantics"};
  app.set_version_flag("--version", std::string(MESHSIM_VERSION));
  app.require_subcommand(1);
  std::vector<std::string> plugins;
  app.add_option("--plugin", plugins,
                 "Load a plugin (a shared library defining MESHSIM_PLUGIN) whose Functions scenarios can call "
                 "(repeatable; before the subcommand; MESHSIM_PLUGINS, colon-separated, names more)");

  ResourceLimits limits;
  std::string max_memory, max_input;
  RunArgs run;
  auto* run_cmd =
      app.add_subcommand("run", "Run scenarios on the fake mesh and check them against the single-device oracle");
  run_cmd->add_option("files", run.files,
                      "Scenario files (meshsim.scenario/1), traces (run with their recorded options) and "
                      "directories (searched for scenario files); several print a verdict each and a summary")
      ->required();
  run_cmd->add_flag("--json", run.json, "Print the result as JSON (meshsim.result/1); several: one JSON array");
  run_cmd->add_flag("--strict", run.strict, "Status unchecked (values without an oracle value) is a failure");
  run_cmd->add_option("--trace", run.trace_out, "Write the trace (meshsim.trace/1) to this file");
  auto* run_render = run_cmd->add_option("--render", run.render_out, "Write the dataflow diagram (.svg, .png or .dot)");
  run_cmd->add_option("--explore", run.explore_out,
                      "Write the explorer's page of the run (.html; as `meshsim explore FILE -o PAGE.html`)");
  run_cmd->add_option("--view", run.render_view, "Diagram view for --render: logical (default) or ranks")
      ->check(CLI::IsMember({"logical", "ranks"}))
      ->needs(run_render);
  auto* run_values = run_cmd->add_option("--values", run.values_dir,
                                         "Write the run's values and gradients, the mesh's and the oracle's, as .npy "
                                         "files in this directory");
  run_cmd->add_flag("--values-per-rank", run.values_per_rank, "With --values, each rank's local tensors too")
      ->needs(run_values);
  // One value per --option, so that scenario files may follow it.
  run_cmd->add_option("--option", run.options, "Override a scenario option, key=value (repeatable)")
      ->allow_extra_args(false);
  run_cmd->add_flag("--quiet", run.quiet,
                    "Print the verdict, the first divergence, the failures and the communication table only");
  run_cmd->add_flag("--no-implicit", run.no_implicit,
                    "Fail a run whose planner inserts communication the program did not ask for (option "
                    "implicit=error), listing every implicit redistribution with its reason");
  run_cmd->add_flag("--localize", run.localize,
                    "Keep every intermediate gradient in the run (option localize=always); by default a failing run "
                    "is run a second time to find its first divergence");
  add_limits(run_cmd, limits, max_memory);
  add_input_limit(run_cmd, max_input);

  CheckArgs check;
  auto* check_cmd = app.add_subcommand("check", "Run the property suite");
  check_cmd->add_option("--cases", check.cases, "Cases per property")->check(whole_number(1, 100000000));
  check_cmd->add_option("--seed", check.seed, "Seed (printed before the run starts)")->check(seed_number());
  check_cmd->add_option("--property", check.properties, "Run only this property (repeatable)");
  check_cmd->add_option("--mutant", check.mutant, "Switch on a planted bug; the run must then fail");
  check_cmd->add_option("--out", check.out_dir, "Where counterexample traces are written");
  check_cmd->add_flag("--list", check.list, "Print the property and mutant names");
  check_cmd->add_option("--scenario", check.scenarios,
                        "Check these scenario files as properties: each runs over random mesh sizes, shapes, input "
                        "placements and options against the oracle (repeatable)");
  check_cmd->add_flag("--json", check.json, "Print the run as JSON (meshsim.check/1) instead of the report");
  add_input_limit(check_cmd, max_input);
  add_limits(check_cmd, limits, max_memory);
  check_cmd->add_option("--junit", check.junit, "Write the run as JUnit XML to this file");
  check_cmd->add_option("--shard", check.shard,
                        "Run shard I of N (1 <= I <= N): every N-th unit of 25 cases; the N shards together are the "
                        "whole run");
  check_cmd->add_option("-j,--jobs", check.jobs, "Worker processes (the same results as -j 1)")
      ->check(whole_number(1, 1024));
  check_cmd->add_option("--worker-units", check.worker_units, "Internal: the units a -j worker runs")->group("");
  check_cmd->add_flag("--coverage", check.coverage,
                      "Report how many cases exercised each rule row, backward rule and redistribution "
                      "transition; fail when a reachable one was never exercised");
  EmitArgs emit;
  check_cmd
      ->add_option("--emit", emit.dir,
                   "Write --cases generated programs (the property generators' in turn) as scenario files into "
                   "this directory instead of running properties")
      ->excludes(check_cmd->get_option("--property"))
      ->excludes(check_cmd->get_option("--scenario"))
      ->excludes(check_cmd->get_option("--mutant"))
      ->excludes(check_cmd->get_option("--json"))
      ->excludes(check_cmd->get_option("--junit"))
      ->excludes(check_cmd->get_option("--shard"))
      ->excludes(check_cmd->get_option("--jobs"))
      ->excludes(check_cmd->get_option("--coverage"))
      ->excludes(check_cmd->get_option("--list"));
  check_cmd
      ->add_option("--generators", emit.generators,
                   "With --emit: only these generators, in turn (dtensor, dtensor_even, single_op, local_map, "
                   "local_code, and local_map_even, whose inputs shard evenly, and train, training steps; "
                   "comma-separated)")
      ->delimiter(',')
      ->needs(check_cmd->get_option("--emit"));

  ReplayArgs replay;
  auto* replay_cmd = app.add_subcommand("replay", "Re-run a trace and compare it event by event");
  replay_cmd->add_option("trace", replay.trace, "Trace file (meshsim.trace/1)")->required();
  replay_cmd->add_option("--scenario", replay.scenario_out,
                         "Write the trace's scenario, with its recorded options, to this scenario file instead "
                         "of replaying");
  add_limits(replay_cmd, limits, max_memory);
  add_input_limit(replay_cmd, max_input);

  RenderArgs render;
  auto* render_cmd = app.add_subcommand("render", "Draw a scenario or a trace as a dataflow diagram");
  render_cmd->add_option("file", render.file, "Scenario or trace file")->required();
  render_cmd->add_option("-o,--out", render.out, "Output file: .svg, .png or .dot")->required();
  render_cmd->add_option("--view", render.view,
                         "logical (default): values, ops, redistributions, gradients; ranks: one cluster "
                         "per rank with local shapes and the block of each sharded tensor it holds, "
                         "collectives joining each group (meshes over 16 ranks collapsed)")
      ->check(CLI::IsMember({"logical", "ranks"}));
  auto* render_fold = render_cmd->add_flag(
      "--fold", render.fold,
      "Fold each layer (an imported module's numbered part, layers.0; or a name prefix shared by "
      "numbered layers, l0_ and l1_) into one box per phase with its collectives summed. Default: "
      "folded when the diagram in full has more than 250 nodes");
  render_cmd->add_flag("--no-fold", render.no_fold, "Draw every op, never folded by layer")->excludes(render_fold);
  render_cmd->add_option("--ops", render.ops,
                         "Draw only the ops FROM..TO of the program (both included; each end an op index "
                         "from 0 or the name of a value an op makes; an end left out is the first or last "
                         "op), with the inputs they read and their backward; a bad range exits 2")
      ->type_name("FROM..TO");
  add_limits(render_cmd, limits, max_memory);
  add_input_limit(render_cmd, max_input);

  ExploreArgs explore;
  auto* explore_cmd = app.add_subcommand(
      "explore", "Write one self-contained HTML page to explore a run: the program folded by layer, values and "
                 "their blocks per rank, the run step by step, its collectives; two traces side by side");
  explore_cmd->add_option("files", explore.files,
                          "A scenario (run first), a trace or a check counterexample; or two traces to compare")
      ->required();
  explore_cmd->add_option("-o,--out", explore.out, "Output page (.html)")->required();
  explore_cmd->add_option("--values", explore.values,
                          "The directory `meshsim run --values DIR` wrote: the page shows the values recorded");
  add_limits(explore_cmd, limits, max_memory);
  add_input_limit(explore_cmd, max_input);

  OpsArgs ops;
  auto* ops_cmd = app.add_subcommand(
      "ops", "Print the op catalog: every op with its operands, attributes, rule family and what it computes");
  auto* ops_json = ops_cmd->add_flag("--json", ops.json, "Print the catalog as JSON (meshsim.ops/1)");
  ops_cmd
      ->add_flag("--markdown", ops.markdown,
                 "Print the Markdown table of the ops a scenario may use (docs/scenario-format.md's; "
                 "scripts/gen_op_table.sh writes it there)")
      ->excludes(ops_json);

  ExplainArgs explain;
  auto* explain_cmd = app.add_subcommand(
      "explain",
      "Explain an op's placements (per mesh axis: the rule row chosen, every candidate with its cost and why it "
      "lost, the redistributions it needed) or how a value's placement came to be, op by op");
  explain_cmd->add_option("file", explain.file, "Scenario file (meshsim.scenario/1)")->required();
  explain_cmd->add_option(
      "--op", explain.op, "The op: its JSON path (/program/15) or its output's name (l0_q)");
  explain_cmd->add_option(
      "--value", explain.value, "A value: the chain of ops, from the inputs, that gave it its placements");
  explain_cmd->add_flag("--json", explain.json, "Print the explanation as JSON (meshsim.explain/1)");
  explain_cmd->add_option("--option", explain.options, "Override a scenario option, key=value (repeatable)")
      ->allow_extra_args(false);
  add_limits(explain_cmd, limits, max_memory);
  add_input_limit(explain_cmd, max_input);

  auto* import_cmd = app.add_subcommand(
      "import",
      "Read the program you run into a scenario: `import pytorch FILE.py[:FUNC] --mesh dp=2,tp=2 -o OUT.json` (a "
      "parallelized nn.Module, one training step under LocalTensorMode), `import jax FILE.py:FUNC --mesh ...` (a "
      "shard_map function's jaxpr); `import regenerate` re-imports the bundled models; `import table --markdown` "
      "prints the aten table (docs/import.md; `meshsim import pytorch --help` for the rest)");
  import_cmd->prefix_command();  // everything after `import` is tools/import/meshsim-import's
  import_cmd->set_help_flag();   // and so is --help

  ValidateConfig validate;
  auto* validate_cmd = app.add_subcommand(
      "validate", "Run a scenario on a real engine (one process per rank) and compare every rank with the simulation");
  validate_cmd->add_option("file", validate.file, "Scenario file (meshsim.scenario/1)")->required();
  validate_cmd->add_option("--backend", validate.backend, "gloo (CPU processes) or nccl (one GPU per rank)")
      ->check(CLI::IsMember({"gloo", "nccl"}));
  validate_cmd->add_option("--ranks", validate.ranks, "World size; must equal the mesh's (default: the mesh's)")
      ->check(whole_number(1, int64_t{1} << 40));
  validate_cmd->add_option("--option", validate.options, "Override a scenario option, key=value (repeatable)");
  validate_cmd->add_option("--timeout", validate.timeout_s, "Seconds any collective or rendezvous may take (default 30)")
      ->check(seconds(0.001, 86400));
  validate_cmd->add_flag("--json", validate.json, "Print the report as JSON (meshsim.validate/1)");
  add_input_limit(validate_cmd, max_input);
  validate_cmd->add_flag("--keep", validate.keep, "Keep the workers' directory (logs, progress, verdicts)");
  validate_cmd->add_option("--fault", validate.fault, "Testing: kill:RANK:AT, hang:RANK:AT, stop:RANK:AT (SIGSTOP) or corrupt:RANK:AT, at that rank's AT-th collective");
  auto* worker = validate_cmd->add_option_group("worker", "Run one rank (workers started by hand, or by the coordinator)");
  worker->add_option("--rank", validate.rank, "This worker's rank")->check(whole_number(0, int64_t{1} << 40));
  worker->add_option("--master-addr", validate.master_addr, "TCP store host (rank 0 serves it)");
  worker->add_option("--master-port", validate.master_port, "TCP store port (default 29500)")
      ->check(whole_number(1, 65535));
  worker->add_option("--hostname", validate.hostname, "The address this worker listens on (default: this host's name)");
  worker->add_option("--store", validate.store, "File store path (a shared file system)");
  worker->add_option("--result", validate.result_file, "Write this rank's verdict (JSON) here");
  worker->add_option("--progress", validate.progress_file, "Append a line per collective here");
  worker->add_option("--scenario-copy", validate.scenario_copy,
                     "Run the scenario document read from here (the coordinator's copy); FILE only names it");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (!max_memory.empty()) limits.max_bytes = parse_byte_size(max_memory);
  if (!max_input.empty()) {
    const double bytes = parse_byte_size(max_input);  // "1e30" is as good as no limit
    set_max_input_bytes(bytes >= 0x1p62 ? uint64_t{1} << 62 : std::max<uint64_t>(1, static_cast<uint64_t>(bytes)));
  }
  set_resource_limits(limits);
  if (!(*validate_cmd && validate.rank >= 0)) tensors.install_progress_line();  // a worker has no terminal of its own
  struct Erase {
    const TensorCommands& t;
    ~Erase() { t.erase_progress_line(); }
  } erase{tensors};
  // With --json, an error that stops the command is a document on stdout too (status "error"), in
  // the command's own format, besides its line on stderr.
  auto json_error = [&](ErrorKind kind, const std::string& message, const std::string& file, const std::string& path) {
    const char* format = *validate_cmd && validate.json ? "meshsim.validate/1"
                         : *check_cmd && check.json     ? "meshsim.check/1"
                         : *explain_cmd && explain.json ? "meshsim.explain/1"
                                                        : nullptr;
    if (!format) return;
    nlohmann::json doc = {{"format", format}, {"status", "error"},
                          {"error", {{"kind", error_kind_name(kind)}, {"message", message}}}};
    if (!file.empty()) doc["error"]["file"] = file;
    if (!path.empty()) doc["error"]["path"] = path;
    std::cout << doc.dump(2) << "\n";
  };
  try {
    tensors.load_plugins(plugins);
    if (*run_cmd) return tensors.run(run);
    if (*check_cmd) {
      check.seed_given = check_cmd->count("--seed") > 0;
      if (check_cmd->count("--emit")) {
        emit.cases = check.cases;
        emit.seed = check.seed_given ? check.seed : std::random_device{}() * 4294967296ULL + std::random_device{}();
        return tensors.emit(emit, std::cout);
      }
      return tensors.check(check, std::cout);
    }
    if (*replay_cmd) return tensors.replay(replay);
    if (*ops_cmd) return cmd_ops(ops, std::cout);
    if (*render_cmd) return cmd_render(render);
    if (*explore_cmd) return cmd_explore(explore);
    if (*explain_cmd) return tensors.explain(explain, std::cout);
    if (*validate_cmd) return tensors.validate(validate);
    if (*import_cmd) return cmd_import(import_cmd->remaining());
  } catch (const InputError& e) {
    std::cerr << "meshsim: " << e.what() << "\n";
    json_error(ErrorKind::InvalidScenario, e.detail(), e.file(), e.json_path());
    return 2;
  } catch (const UsageError& e) {  // plugins that cannot be loaded included
    std::cerr << "meshsim: " << e.what() << "\n";
    json_error(ErrorKind::InvalidScenario, e.what(), "", "");
    return 2;
  } catch (const WorkerError& e) {
    std::cerr << "meshsim: " << e.what();
    return 1;
  } catch (const SemanticError& e) {
    // FILE: PATH: kind: message, as `meshsim run` says it, where the file is known.
    const std::string file = *validate_cmd ? validate.file : *render_cmd ? render.file
                             : *explore_cmd && explore.files.size() == 1 ? explore.files.front()
                             : *replay_cmd ? replay.trace
                             : *explain_cmd ? explain.file
                             : *check_cmd && check.scenarios.size() == 1 ? check.scenarios.front() : "";
    std::cerr << error_line(file, e.path(), error_kind_name(e.kind()), e.what()) << "\n";
    json_error(e.kind(), e.what(), file, e.path());
    return exit_code_for(e.kind());
  } catch (const std::exception& e) {
    if (is_out_of_memory(e)) {  // the machine's limit: its own exit code, never "a check failed"
      std::cerr << "meshsim: out of memory: " << first_line(e.what()) << "\n";
      return kExitResource;
    }
    std::cerr << "meshsim: internal error: " << first_line(e.what()) << "\n";  // a bug of meshsim's own
    return 1;
  }
  return 2;
}

}  // namespace meshsim::cli

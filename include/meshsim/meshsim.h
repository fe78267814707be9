// meshsim's public C++ API: run scenarios from your own program, register your own autograd
// Functions (with their variance strategy, their reference on global tensors and the collective
// they perform), build a `meshsim` of your own, or load Functions into the stock command as a
// plugin. docs/cpp-api.md shows each use with code the tests compile and run.
//
// This one header is the API: it needs libtorch's ATen, nlohmann::json and the standard library,
// nothing of meshsim's internals. Nothing here throws for bad input: a scenario that cannot be read
// or run is a RunResult with an error; a malformed FunctionDef is refused by register_function with
// std::invalid_argument (a programming error of the caller, reported when it is registered).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

// The version of this header's ABI that plugins are built against (meshsim_plugin_init checks it).
#define MESHSIM_API_VERSION 2

namespace meshsim {

// ---------------------------------------------------------------------------------------------
// Running scenarios (DESIGN.md contracts 1-3: exit codes, scenario files, result JSON)

struct RunSettings {
  std::vector<std::string> options;  // "key=value" overrides, as `meshsim run --option`
  std::string trace_out;             // write the trace (meshsim.trace/1) here; "" none
  std::string render_out;            // write the diagram here (.svg, .png or .dot); "" none
  bool strict = false;               // status "unchecked" is a failure, as `--strict`
  // As --max-memory and --max-ranks: a scenario estimated to need more (bytes; 0: half this
  // machine's memory) or a mesh of more ranks is refused, error kind "resource_limit", exit 2.
  double max_memory = 0;
  int64_t max_ranks = 16384;
};

struct RunResult {
  // As `meshsim run` exits: 0 passed, 1 a check failed, 2 bad input, 3 refused by the semantics,
  // 6 out of memory (error kind "out_of_memory").
  int exit_code = 2;
  // The result's status: "pass" | "fail" | "unchecked" | "error"; "error" too when the input could
  // not be read (then `result` is null).
  std::string status = "error";
  // The error's kind ("input" for a file or JSON that cannot be read, else the result's
  // error.kind); "" when the run had no error.
  std::string error_kind;
  // What a person reads: the error, naming the file and the JSON path, or the failed checks with
  // their numbers; "" when the run passed.
  std::string message;
  // The result document (meshsim.result/1); null when the input could not be read.
  nlohmann::json result;

  bool passed() const { return exit_code == 0; }
};

// Runs a scenario file (meshsim.scenario/1) on the simulated mesh and checks it against the
// single-device oracle.
RunResult run_scenario_file(const std::string& path, const RunSettings& settings = {});
// The same for a scenario held in memory; `name` stands for the file in messages.
RunResult run_scenario(const nlohmann::json& scenario, const std::string& name = "<memory>",
                       const RunSettings& settings = {});
// The same for a scenario's JSON text (a parse error is a RunResult naming `name`, line and column).
RunResult run_scenario_text(const std::string& text, const std::string& name = "<memory>",
                            const RunSettings& settings = {});

// ---------------------------------------------------------------------------------------------
// Functions that scenarios `call` (in a local_map body, and in a local_map's `reference`)

using AxisNames = std::set<std::string>;  // mesh axis names

// What a variance strategy sees: per input, the mesh axes it varies over and those it is reduced
// over (SEMANTICS.md sections 5 and 6), the mesh's axis names and the call's attributes.
struct VarianceInput {
  std::vector<AxisNames> variant;
  std::vector<AxisNames> reduced;
  std::vector<std::string> mesh_axes;
  const nlohmann::json& attrs;
};
struct VarianceOutput {
  AxisNames variant;
  std::optional<AxisNames> reduced;  // absent: the default, the intersection of the inputs'
  // A Function with several outputs: one entry per output, each its own sets (`variant` and
  // `reduced` above are then unused); empty: every output gets the sets above.
  std::vector<VarianceOutput> outputs = {};
};
using VarianceStrategy = std::function<VarianceOutput(const VarianceInput&)>;

// The collective a communicating Function performs, so that it is counted in the result's
// `collectives` (with its bytes) and drawn in diagrams like meshsim's own.
struct CollectiveDecl {
  std::string op;           // all_reduce | all_gather | reduce_scatter | all_to_all
  std::string backward_op;  // the backward's collective; "" when the backward communicates nothing
  // Bytes each rank sends, from the group's inputs; unset: meshsim's cost model for `op` on them.
  std::function<int64_t(const std::vector<at::Tensor>& group_inputs)> bytes;
};

struct FunctionDef {
  std::string name;  // as scenarios `call` it; registering a name again replaces the Function

  // Exactly one of the bodies.
  // Rank-local: runs once per rank on that rank's locals of the call's args (an autograd
  // Function's apply, or any differentiable libtorch code).
  std::function<at::Tensor(const std::vector<at::Tensor>& locals, const nlohmann::json& attrs)> rank_local;
  // Communicating: runs once per group of the mesh axis named by the call's "axis" attribute, on
  // every member's local of its one argument, and returns one output per member, in rank order.
  std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& group, const nlohmann::json& attrs)> group;
  // The same two for a Function with several outputs (seed 001's tuple result): rank-local, one
  // tensor per output; communicating, per output one tensor per member in rank order.
  std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& locals, const nlohmann::json& attrs)>
      rank_local_outputs;
  std::function<std::vector<std::vector<at::Tensor>>(const std::vector<at::Tensor>& group, const nlohmann::json& attrs)>
      group_outputs;

  // How many args a call passes (checked, with the JSON path, before the body runs); -1: any.
  int arity = 1;
  // How many tensors a call returns: a call of a Function with several names them in "out", a
  // list (checked, with the JSON path). More than 1 needs one of the *_outputs bodies.
  int outputs = 1;

  // The outputs' variance. Unset: a rank-local Function gets the default (variant by union,
  // reduced by intersection); a communicating one's output is flagged untracked.
  std::optional<VarianceStrategy> variance;

  // The same computation on global tensors: what the oracle runs where the program calls the
  // Function, and what a local_map's `reference` may `call`. Unset: the oracle has no value there
  // and the run is "unchecked".
  std::function<at::Tensor(const std::vector<at::Tensor>& globals, const nlohmann::json& attrs)> reference;
  // The reference of a Function with several outputs: one global tensor per output (at most one
  // of the two references).
  std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& globals, const nlohmann::json& attrs)>
      reference_outputs;

  // Communicating Functions: the collective they perform (unset: none is counted).
  std::optional<CollectiveDecl> collective;
};

// Registers (or replaces) a Function for every later run in this process. Throws
// std::invalid_argument for a malformed definition (no name, no body or two, a collective on a
// rank-local Function, an unknown collective op, several outputs without an *_outputs body).
void register_function(FunctionDef def);
// The names scenarios can `call`, built-ins included, sorted.
std::vector<std::string> function_names();

// ---------------------------------------------------------------------------------------------
// One registry for ops and Functions (seed 001's register_variance_tracking_strategy): a variance
// strategy for a local_map body's ops (by op name: "mul", "exp", ...) or for Functions (by the
// name scenarios `call`), one target or a list, as the seed's decorator takes one or a list.
//
// The lookup, first found wins: for a call, (1) this registry's entry for the Function's name,
// (2) the Function's own strategy (FunctionDef::variance, or a C++ Function class's static
// variance_strategy), (3) the default (variant by union, reduced by intersection). For an op,
// (1) this registry, (2) the default. The registry comes first so that a strategy can be corrected
// from outside a Function one cannot edit (docs/cpp-api.md, "Which strategy wins").
struct StrategyTarget {
  enum class Kind { Op, Function };
  Kind kind = Kind::Op;
  std::string name;
};
inline StrategyTarget op_target(std::string name) { return {StrategyTarget::Kind::Op, std::move(name)}; }
inline StrategyTarget function_target(std::string name) { return {StrategyTarget::Kind::Function, std::move(name)}; }

// Registers (or replaces) the strategy of each target for every later run in this process. Throws
// std::invalid_argument for an op that a body does not run through variance tracking (an unknown
// op, a collective, `call`: their rules are meshsim's own) or a Function target with no name.
void register_variance_tracking_strategy(const std::vector<StrategyTarget>& targets, VarianceStrategy strategy);
inline void register_variance_tracking_strategy(const StrategyTarget& target, VarianceStrategy strategy) {
  register_variance_tracking_strategy(std::vector<StrategyTarget>{target}, std::move(strategy));
}
void unregister_variance_tracking_strategy(const StrategyTarget& target);

// ---------------------------------------------------------------------------------------------
// The command line in a binary of your own: register your Functions, then
//   int main(int argc, char** argv) { register_mine(); return meshsim::main(argc, argv); }
// Every subcommand, option and exit code is the stock command's.
int main(int argc, char** argv);

// ---------------------------------------------------------------------------------------------
// Plugins: `meshsim --plugin libmine.so run ...` loads the library and calls its entry point,
//   MESHSIM_PLUGIN(host) { host.register_function({...}); return 0; }
// A plugin is built against this header and libtorch only (CMake: meshsim::plugin); it reaches
// meshsim through the host, never by linking meshsim's libraries.
class PluginHost {
 public:
  virtual ~PluginHost() = default;
  virtual int api_version() const = 0;  // MESHSIM_API_VERSION of the loading meshsim
  virtual void register_function(FunctionDef def) = 0;
  // meshsim::register_variance_tracking_strategy, for a plugin (API version 2).
  virtual void register_variance_tracking_strategy(const std::vector<StrategyTarget>& targets,
                                                   VarianceStrategy strategy) = 0;
};

}  // namespace meshsim

// The entry point a plugin defines: returns 0 on success, anything else refuses the load (the
// command then exits 2 naming the plugin). `meshsim_plugin_api_version` lets meshsim refuse a
// plugin built against another version of this header before calling into it.
#define MESHSIM_PLUGIN(host)                                                   \
  extern "C" int meshsim_plugin_api_version() { return MESHSIM_API_VERSION; }  \
  extern "C" int meshsim_plugin_init(meshsim::PluginHost& host)

// The scenario interpreter: runs a scenario on the fake mesh and keeps every value, the inputs'
// global data (for the oracle) and the inputs' gradients.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/scenario.h"
#include "sim/ltensor.h"
#include "sim/runtime.h"

namespace meshsim {

struct SimRun {
  std::unique_ptr<Runtime> runtime;
  std::vector<std::string> named;           // inputs then program values, in scenario order
  std::map<std::string, DTensor> values;    // the named DTensor values
  std::map<std::string, at::Tensor> input_globals;
  std::vector<std::string> grad_inputs;     // inputs that require grad, in scenario order
  std::map<std::string, Locals> grads;
  std::map<std::string, GradSpec> grad_specs;  // but inputs with no cotangent no gradient reached
  // options.localize always: the total gradient of every named program value that requires grad
  // (undefined locals where none flowed), laid out as runtime->grad_spec() names; the backward's
  // graph is kept for Runtime::contribution().
  std::map<std::string, Locals> value_grads;
  // options.localize always: every local_map body's values (its args and its ops' results, with
  // their graphs), by the local_map's JSON path, for the localization of a wrong gradient inside it.
  std::map<std::string, std::map<std::string, LTensor>> bodies;
  // options.localize always: each program op's operands as that op received them (an identity node
  // of its own per use: its gradient is that op's contribution alone), by (op index, operand).
  std::map<std::pair<int, int>, DTensor> operand_uses;
  bool ran_backward = false;
  bool has_local_map = false;  // a tracked one (exclusivity and variance tracking were checked)
};

// Runs one local_map op: its args enter as LTensors (after redistribution to in_placements), the
// body runs, the returns leave as DTensors with out_placements.
// With `body`, the body's values are kept there.
std::vector<DTensor> run_local_map(Runtime& rt, const OpDecl& op, const std::vector<DTensor>& args,
                                   std::map<std::string, LTensor>* body = nullptr);
// One DTensor op of the program (not local_map or redistribute): a binary op's scalar `value`
// becomes a replicated 0-d operand, and linear runs as transpose, matmul and add.
DTensor apply_program_op(Runtime& rt, const OpDecl& op, const std::vector<DTensor>& args);

// Makes the inputs of a scenario: global data from the seed (one stream per input), then the
// locals; a from_local input gives every rank the same local data. An input named in `given`
// (training steps' parameters) takes those locals, laid out by its placements, and its global is
// their assembly (the first holder of a replicated axis wins where replicas disagree).
std::vector<DTensor> make_inputs(const Scenario& sc, const RunOptions& options,
                                 std::map<std::string, at::Tensor>& globals,
                                 const std::map<std::string, Locals>* given = nullptr);

// One op of a program's local code (to_local, from_local, or any op on to_local's results, body
// collectives included): runs it in `ctx` (unchecked) and returns true; false for a DTensor op.
class BodyContext;
struct LTensor;
bool run_local_code(BodyContext& ctx, const OpDecl& op, SimRun& run, std::map<std::string, LTensor>& locals);

// Throws SemanticError when the scenario is illegal under the semantics.
// Progress of a run, for a person watching: called before each program op (done = its index,
// total = the program's length, what = the op), before the backward pass (what = "backward") and
// by check_scenario before the oracle and the comparison. The command line draws a line on a
// terminal from it; set once, at start-up (nullptr: none).
using ProgressHook = void (*)(size_t done, size_t total, const std::string& what);
void set_progress_hook(ProgressHook hook);
void report_progress(size_t done, size_t total, const std::string& what);

// `observer`, when given, sees every rule application of the forward (Runtime::set_op_observer).
// `given`: inputs whose locals are given (make_inputs).
SimRun run_distributed(const Scenario& sc, const RunOptions& options,
                       std::function<void(const OpApplication&)> observer = {},
                       const std::map<std::string, Locals>* given = nullptr);

}  // namespace meshsim

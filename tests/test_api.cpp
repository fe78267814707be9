// The public C++ API (include/meshsim/meshsim.h): running scenarios without exceptions, Functions
// registered with their references and collectives, plugins in the stock command, a meshsim of
// one's own; and docs/cpp-api.md quoting the examples it shows.
#include <fstream>

#include <gtest/gtest.h>

#include "examples/api/my_functions.h"
#include "meshsim/meshsim.h"
#include "tests/process_support.h"

namespace {

using namespace meshsim::testing;

const std::string kSource = MESHSIM_SOURCE_DIR;
const std::string kPluginScenario = kSource + "/examples/api/plugin_functions.json";
const std::string kScatterScenario = kSource + "/examples/api/scatter_rows.json";
const std::string kMultiScenario = kSource + "/examples/api/multi_output_functions.json";

void register_mine() {
  meshsim::register_function(mine::scale_by());
  meshsim::register_function(mine::fused_all_reduce());
  meshsim::register_function(mine::scatter_rows());
  meshsim::register_function(mine::fused_reduce_keep());
  meshsim::register_function(mine::sum_and_difference());
}

// A Function of one output that doubles its input, with a strategy of its own that says its output
// is invariant everywhere: a lie for a sharded input, which leaving the local_map as S(0) refuses.
meshsim::FunctionDef lying_double() {
  meshsim::FunctionDef f;
  f.name = "lying_double";
  f.rank_local = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) { return xs[0] * 2; };
  f.reference = f.rank_local;
  f.variance = [](const meshsim::VarianceInput&) { return meshsim::VarianceOutput{}; };
  return f;
}

// x [4, 3] S(0) over tp=2 through one body op (a call of `fn`, or the op `op`), left as S(0).
nlohmann::json one_body_op(const std::string& op, const std::string& fn) {
  nlohmann::json body = {{"out", "y"}, {"op", op}, {"args", {"x"}}};
  if (!fn.empty()) body["function"] = fn;
  if (op == "mul") body["args"] = {"x", "x"};
  return {{"format", "meshsim.scenario/1"},
          {"name", "one_body_op"},
          {"mesh", {{"axes", {"tp"}}, {"shape", {2}}}},
          {"inputs", {{{"name", "x"}, {"shape", {4, 3}}, {"placements", {"S(0)"}}, {"requires_grad", true}}}},
          {"program",
           {{{"out", "z"}, {"op", "local_map"}, {"args", {"x"}}, {"out_placements", {{"S(0)"}}}, {"body", {body}},
             {"returns", {"y"}}, {"reference", {body}}},
            {{"out", "loss"}, {"op", "sum"}, {"args", {"z"}}}}},
          {"backward", "loss"}};
}

TEST(Api, RunsAScenarioFileAndReturnsItsResult) {
  meshsim::RunResult r = meshsim::run_scenario_file(kSource + "/examples/fsdp_reduced.json");
  EXPECT_EQ(r.exit_code, 0) << r.message;
  EXPECT_TRUE(r.passed());
  EXPECT_EQ(r.status, "pass");
  EXPECT_EQ(r.result.value("format", ""), "meshsim.result/1");
  EXPECT_EQ(r.error_kind, "");
}

TEST(Api, BadInputIsAResultNamingTheFileAndPath) {
  meshsim::RunResult text = meshsim::run_scenario_text("{\"format\": ", "mine.json");
  EXPECT_EQ(text.exit_code, 2);
  EXPECT_EQ(text.status, "error");
  EXPECT_TRUE(contains(text.message, "mine.json")) << text.message;
  EXPECT_TRUE(text.result.is_null());

  meshsim::RunResult missing = meshsim::run_scenario_file("/nonexistent/s.json");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_TRUE(contains(missing.message, "/nonexistent/s.json")) << missing.message;

  nlohmann::json doc = nlohmann::json::parse(read_text(kSource + "/examples/fsdp_reduced.json"));
  doc["inputs"][0]["shape"] = "eight";
  meshsim::RunResult shape = meshsim::run_scenario(doc, "edited.json");
  EXPECT_EQ(shape.exit_code, 2);
  EXPECT_TRUE(contains(shape.message, "edited.json: /inputs/0/shape")) << shape.message;

  meshsim::RunResult option = meshsim::run_scenario(doc, "edited.json", {{"reduced_policy"}, "", "", false});
  EXPECT_EQ(option.exit_code, 2);
}

TEST(Api, RefusedAndFailingRunsKeepTheirExitCodesAndNumbers) {
  // Refused by the semantics (the scenario's expect block is the command line's, not the API's).
  meshsim::RunResult refused = meshsim::run_scenario_file(kSource + "/examples/reduced_policy_strict.json");
  EXPECT_EQ(refused.exit_code, 3) << refused.message;
  EXPECT_EQ(refused.status, "error");
  EXPECT_FALSE(refused.error_kind.empty());

  meshsim::RunResult failing = meshsim::run_scenario_file(kSource + "/examples/bugs/missing_pvary_dp_weight.json");
  EXPECT_EQ(failing.exit_code, 1);
  EXPECT_EQ(failing.status, "fail");
  EXPECT_TRUE(contains(failing.message, "expected")) << failing.message;
}

TEST(Api, MalformedFunctionsAreRefusedWhenRegistered) {
  meshsim::FunctionDef none;
  EXPECT_THROW(meshsim::register_function(none), std::invalid_argument);
  meshsim::FunctionDef both = mine::scale_by();
  both.group = mine::fused_all_reduce().group;
  EXPECT_THROW(meshsim::register_function(both), std::invalid_argument);
  meshsim::FunctionDef local_collective = mine::scale_by();
  local_collective.collective = meshsim::CollectiveDecl{"all_reduce", "", nullptr};
  EXPECT_THROW(meshsim::register_function(local_collective), std::invalid_argument);
  meshsim::FunctionDef unknown_op = mine::fused_all_reduce();
  unknown_op.collective->op = "broadcast";
  EXPECT_THROW(meshsim::register_function(unknown_op), std::invalid_argument);
}

TEST(Api, AReferenceThatCallsAFunctionIsCheckedByTheOracle) {
  register_mine();
  meshsim::RunResult r = meshsim::run_scenario_file(kPluginScenario);
  ASSERT_EQ(r.exit_code, 0) << r.message;
  EXPECT_EQ(r.status, "pass");  // not "unchecked": the oracle ran the Functions' references
  EXPECT_EQ(r.result["checks"].value("forward_equivalence", false), true);
  EXPECT_EQ(r.result["checks"].value("gradient_equivalence", false), true);

  // A reference that disagrees with the Function: the oracle finds it, with numbers.
  meshsim::FunctionDef wrong = mine::scale_by();
  wrong.reference = [](const std::vector<at::Tensor>& xs, const nlohmann::json& attrs) {
    return xs[0] * (attrs.value("factor", 1.0) + 1);
  };
  meshsim::register_function(wrong);
  meshsim::RunResult bad = meshsim::run_scenario_file(kPluginScenario);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.status, "fail");
  EXPECT_TRUE(contains(bad.message, "expected")) << bad.message;

  // A Function without a reference cannot be called in one: invalid input naming the path.
  meshsim::FunctionDef no_reference = mine::scale_by();
  no_reference.reference = nullptr;
  meshsim::register_function(no_reference);
  meshsim::RunResult unusable = meshsim::run_scenario_file(kPluginScenario);
  EXPECT_EQ(unusable.exit_code, 2);
  EXPECT_TRUE(contains(unusable.message, "/program/0/reference/0")) << unusable.message;
  register_mine();
}

// Seed 001's tuple result: a call names one value per output; each output has its own sets (the
// sum invariant over tp, the kept local varying) and the oracle checks every output and gradient.
TEST(Api, FunctionsWithSeveralOutputsAreCheckedOutputByOutput) {
  register_mine();
  meshsim::RunResult r = meshsim::run_scenario_file(kMultiScenario);
  ASSERT_EQ(r.exit_code, 0) << r.message;
  EXPECT_EQ(r.status, "pass");
  EXPECT_EQ(r.result["checks"].value("gradient_equivalence", false), true);
  EXPECT_EQ(r.result["values"]["red"]["placements"], nlohmann::json({"S(0)", "R"})) << r.result["values"].dump();

  // One output given the other's sets (the kept local labelled invariant over tp): meeting the
  // varying q, it is marked varying, whose backward all_reduces its gradient, so p's gradient is
  // wrong, and the oracle says by how much.
  meshsim::FunctionDef shared = mine::fused_reduce_keep();
  shared.variance = [](const meshsim::VarianceInput& in) {
    meshsim::VarianceOutput sum;
    sum.variant = in.variant[0];
    sum.variant.erase("tp");
    return sum;  // one result: every output gets it
  };
  meshsim::register_function(shared);
  meshsim::RunResult wrong = meshsim::run_scenario_file(kMultiScenario);
  EXPECT_EQ(wrong.exit_code, 1) << wrong.message;
  EXPECT_TRUE(contains(wrong.message, "grad p: ")) << wrong.message;

  // A reference that swaps the two outputs: the oracle finds the values, with numbers.
  meshsim::FunctionDef swapped = mine::sum_and_difference();
  swapped.reference_outputs = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) {
    return std::vector<at::Tensor>{xs[0] - xs[1], xs[0] + xs[1]};
  };
  register_mine();
  meshsim::register_function(swapped);
  meshsim::RunResult bad = meshsim::run_scenario_file(kMultiScenario);
  EXPECT_EQ(bad.exit_code, 1) << bad.message;
  EXPECT_TRUE(contains(bad.message, "expected")) << bad.message;

  // A call naming one value for a Function of two: invalid input at the call's out.
  register_mine();
  nlohmann::json doc = nlohmann::json::parse(read_text(kMultiScenario));
  for (const char* part : {"body", "reference"}) doc["program"][0][part][1]["out"] = "plus";
  doc["program"][0]["returns"] = {"sum", "plus", "plus"};
  meshsim::RunResult one = meshsim::run_scenario(doc, "one_out.json");
  EXPECT_EQ(one.exit_code, 2) << one.message;
  EXPECT_TRUE(contains(one.message, "/program/0/body/1/out: Function \"sum_and_difference\" returns 2 tensors"))
      << one.message;
}

TEST(Api, SeveralOutputsNeedTheirBodiesAndReferences) {
  meshsim::FunctionDef two = mine::sum_and_difference();
  two.rank_local_outputs = nullptr;
  two.rank_local = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) { return xs[0]; };
  EXPECT_THROW(meshsim::register_function(two), std::invalid_argument);
  meshsim::FunctionDef both = mine::sum_and_difference();
  both.reference = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) { return xs[0]; };
  EXPECT_THROW(meshsim::register_function(both), std::invalid_argument);
  meshsim::FunctionDef none = mine::sum_and_difference();
  none.outputs = 0;
  EXPECT_THROW(meshsim::register_function(none), std::invalid_argument);
}

// The lookup order (docs/cpp-api.md, "Which strategy wins"): the registry's entry for a Function's
// name beats the Function's own strategy, so a wrong strategy can be corrected from outside.
TEST(Api, TheRegistryWinsOverAFunctionsOwnStrategy) {
  meshsim::register_function(lying_double());
  const nlohmann::json doc = one_body_op("call", "lying_double");
  meshsim::RunResult own = meshsim::run_scenario(doc, "lying.json");
  EXPECT_EQ(own.exit_code, 3) << own.message;  // its own strategy: invariant, but left as S(0)
  EXPECT_TRUE(contains(own.message, "variant")) << own.message;

  meshsim::register_variance_tracking_strategy(meshsim::function_target("lying_double"), [](const meshsim::VarianceInput& in) {
    return meshsim::VarianceOutput{in.variant.at(0), std::nullopt};
  });
  meshsim::RunResult corrected = meshsim::run_scenario(doc, "lying.json");
  EXPECT_EQ(corrected.exit_code, 0) << corrected.message;

  meshsim::unregister_variance_tracking_strategy(meshsim::function_target("lying_double"));
  EXPECT_EQ(meshsim::run_scenario(doc, "lying.json").exit_code, 3);
}

// Ops in the same registry, one or a list, as the seed's decorator takes them; only ops a body runs
// through variance tracking (collectives and casts keep meshsim's own rules).
TEST(Api, OpStrategiesAreRegisteredForOneOpOrAList) {
  const nlohmann::json doc = one_body_op("mul", "");
  ASSERT_EQ(meshsim::run_scenario(doc, "mul.json").exit_code, 0);
  const auto invariant = [](const meshsim::VarianceInput&) { return meshsim::VarianceOutput{}; };
  meshsim::register_variance_tracking_strategy({meshsim::op_target("mul"), meshsim::op_target("add")}, invariant);
  meshsim::RunResult lied = meshsim::run_scenario(doc, "mul.json");
  meshsim::unregister_variance_tracking_strategy(meshsim::op_target("mul"));
  meshsim::unregister_variance_tracking_strategy(meshsim::op_target("add"));
  EXPECT_EQ(lied.exit_code, 3) << lied.message;
  EXPECT_EQ(meshsim::run_scenario(doc, "mul.json").exit_code, 0);

  EXPECT_THROW(meshsim::register_variance_tracking_strategy(meshsim::op_target("all_reduce"), invariant),
               std::invalid_argument);
  EXPECT_THROW(meshsim::register_variance_tracking_strategy(meshsim::op_target("no_such_op"), invariant),
               std::invalid_argument);
  // A list with one bad target registers none of them.
  EXPECT_THROW(meshsim::register_variance_tracking_strategy({meshsim::op_target("mul"), meshsim::op_target("call")},
                                                            invariant),
               std::invalid_argument);
  EXPECT_EQ(meshsim::run_scenario(doc, "mul.json").exit_code, 0);
}

TEST(Api, DeclaredCollectivesAreCountedWithTheirBytes) {
  register_mine();
  meshsim::RunResult r = meshsim::run_scenario_file(kScatterScenario);
  ASSERT_EQ(r.exit_code, 0) << r.message;
  // [8, 3] float64 over tp=4: reduce_scatter moves 3/4 of 192 B forward; the backward's all_gather
  // of [2, 3] blocks gathers the same 192 B. The forward one belongs to the local_map at
  // /program/0; the Function's own backward runs outside meshsim's nodes (program_op unknown).
  const nlohmann::json expected = nlohmann::json::parse(R"([
    {"phase": "forward", "op": "reduce_scatter", "axis": "tp", "bytes": 144, "value": "rs", "program_op": "/program/0"},
    {"phase": "backward", "op": "all_gather", "axis": "tp", "bytes": 144, "value": "rs", "program_op": null}])");
  EXPECT_EQ(r.result["collectives"], expected) << r.result["collectives"].dump();
}

TEST(Api, TheStockCommandRunsAPluginsFunctions) {
  const auto dir = fresh_dir("meshsim_test_api", "plugin");
  Outcome with = run_process(dir, MESHSIM_BIN, "--plugin " + q(MINE_PLUGIN) + " run " + q(kPluginScenario), 120);
  EXPECT_EQ(with.code, 0) << with;
  EXPECT_TRUE(contains(with.out, "forward all_reduce over tp, 180 B per rank")) << with;

  // Without it: the error says how to provide the Function.
  Outcome without = run_process(dir, MESHSIM_BIN, "run " + q(kPluginScenario), 120, "2");
  EXPECT_EQ(without.code, 2) << without;
  EXPECT_TRUE(contains(without.out + without.err, "--plugin")) << without;

  // A suite skips what needs Functions it has not loaded, and says so.
  Outcome suite = run_process(dir, MESHSIM_BIN, "run " + q(kSource + "/examples/api"), 120, "3");
  EXPECT_EQ(suite.code, 0) << suite;
  EXPECT_TRUE(contains(suite.out, "skip   ")) << suite;
  EXPECT_TRUE(contains(suite.out, "3 skipped")) << suite;

  // Functions of several outputs from a plugin, and a strategy it registers for a Function it did
  // not write: the untracked opaque kernel is tracked with it.
  Outcome multi = run_process(dir, MESHSIM_BIN, "--plugin " + q(MINE_PLUGIN) + " run " + q(kMultiScenario), 120, "5");
  EXPECT_EQ(multi.code, 0) << multi;
  nlohmann::json opaque = nlohmann::json::parse(read_text(kSource + "/examples/failing/lm_call_opaque_unregistered.json"));
  opaque.erase("expect");
  const std::string opaque_file = (dir / "opaque.json").string();
  { std::ofstream(opaque_file) << opaque.dump(); }
  Outcome untracked = run_process(dir, MESHSIM_BIN, "run " + q(opaque_file), 120, "6");
  EXPECT_EQ(untracked.code, 1) << untracked;
  Outcome tracked = run_process(dir, MESHSIM_BIN, "--plugin " + q(MINE_PLUGIN) + " run " + q(opaque_file), 120, "7");
  EXPECT_EQ(tracked.code, 0) << tracked;

  // Passed on to the processes meshsim starts (MESHSIM_PLUGINS).
  Outcome env = run_process(dir, "/usr/bin/env", "MESHSIM_PLUGINS=" + q(MINE_PLUGIN) + " " + q(MESHSIM_BIN) + " run " +
                                                     q(kScatterScenario), 120, "4");
  EXPECT_EQ(env.code, 0) << env;
  std::filesystem::remove_all(dir.parent_path());
}

TEST(Api, PluginsThatCannotBeLoadedAreNamed) {
  const auto dir = fresh_dir("meshsim_test_api", "bad_plugin");
  Outcome missing = run_process(dir, MESHSIM_BIN, "--plugin nowhere.so run " + q(kPluginScenario), 60);
  EXPECT_EQ(missing.code, 2) << missing;
  EXPECT_TRUE(contains(missing.err, "plugin nowhere.so: no such file")) << missing;
  // A shared library that is not a plugin (no entry point).
  Outcome not_plugin = run_process(dir, MESHSIM_BIN, "--plugin /lib/x86_64-linux-gnu/libm.so.6 run " + q(kPluginScenario),
                                   60, "2");
  EXPECT_EQ(not_plugin.code, 2) << not_plugin;
  EXPECT_TRUE(contains(not_plugin.err, "no meshsim entry point")) << not_plugin;
  // Not a shared library at all.
  Outcome not_elf = run_process(dir, MESHSIM_BIN, "--plugin " + q(kPluginScenario) + " run " + q(kPluginScenario), 60, "3");
  EXPECT_EQ(not_elf.code, 2) << not_elf;
  EXPECT_TRUE(contains(not_elf.err, "cannot load it")) << not_elf;
  std::filesystem::remove_all(dir.parent_path());
}

TEST(Api, AMeshsimOfOnesOwnAndAProgramThatRunsAScenario) {
  const auto dir = fresh_dir("meshsim_test_api", "own");
  Outcome own = run_process(dir, MY_MESHSIM_BIN, "run " + q(kScatterScenario), 120);
  EXPECT_EQ(own.code, 0) << own;
  EXPECT_TRUE(contains(own.out, "backward all_gather over tp, 144 B per rank")) << own;
  Outcome program = run_process(dir, RUN_FROM_CPP_BIN, q(kPluginScenario), 120, "2");
  EXPECT_EQ(program.code, 0) << program;
  EXPECT_TRUE(contains(program.out, "plugin_functions.json: pass (exit 0)")) << program;
  std::filesystem::remove_all(dir.parent_path());
}

TEST(Api, TheDocsQuoteTheCodeTheTestsBuild) {
  const std::string doc = read_text(kSource + "/docs/cpp-api.md");
  for (const char* file : {"my_functions.h", "plugin.cpp", "my_meshsim.cpp", "run_from_cpp.cpp"}) {
    const std::string code = read_text(kSource + "/examples/api/" + file);
    ASSERT_FALSE(code.empty()) << file;
    EXPECT_TRUE(contains(doc, code)) << "docs/cpp-api.md must quote examples/api/" << file << " verbatim";
  }
}

}  // namespace

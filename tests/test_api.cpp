// The public C++ API (include/meshsim/meshsim.h): running scenarios without exceptions, Functions
// registered with their references and collectives, plugins in the stock command, a meshsim of
// one's own; and docs/cpp-api.md quoting the examples it shows.
#include <gtest/gtest.h>

#include "examples/api/my_functions.h"
#include "meshsim/meshsim.h"
#include "tests/process_support.h"

namespace {

using namespace meshsim::testing;

const std::string kSource = MESHSIM_SOURCE_DIR;
const std::string kPluginScenario = kSource + "/examples/api/plugin_functions.json";
const std::string kScatterScenario = kSource + "/examples/api/scatter_rows.json";

void register_mine() {
  meshsim::register_function(mine::scale_by());
  meshsim::register_function(mine::fused_all_reduce());
  meshsim::register_function(mine::scatter_rows());
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
  EXPECT_TRUE(contains(suite.out, "2 skipped")) << suite;

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

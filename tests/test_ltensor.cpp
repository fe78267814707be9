// LTensor variance tracking inside local_map: propagation, collectives, exclusivity, meshes, and
// custom Functions in both registration styles (the code of docs/cpp-api.md).
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <sstream>

#include <gtest/gtest.h>

#include "core/error.h"
#include "examples/cpp/user_functions.h"
#include "oracles/check.h"
#include "sim/interpreter.h"
#include "sim/local_map.h"

using namespace meshsim;
namespace fs = std::filesystem;

namespace {

nlohmann::json scenario(const std::vector<std::string>& axes, const std::vector<int64_t>& shape,
                        nlohmann::json inputs, nlohmann::json program, const std::string& backward = "loss") {
  nlohmann::json d = {{"format", "meshsim.scenario/1"}, {"name", "t"}, {"mesh", {{"axes", axes}, {"shape", shape}}},
                      {"inputs", inputs}, {"program", program}};
  if (!backward.empty()) d["backward"] = backward;
  return d;
}

nlohmann::json op(const std::string& out, const std::string& o, std::vector<std::string> args,
                  nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json d = {{"out", out}, {"op", o}, {"args", args}};
  d.update(extra);
  return d;
}

CheckedRun run(const nlohmann::json& doc) {
  Scenario sc = parse_scenario(doc, "<test>");
  return check_scenario(sc, sc.options);
}

// One local_map over `p: P(sum)` on tp=4 that calls `function` and returns it as R.
nlohmann::json all_reduce_call(const std::string& function) {
  return scenario({"tp"}, {4}, {{{"name", "p"}, {"shape", {3, 2}}, {"placements", {"P(sum)"}}, {"requires_grad", true}}},
                  {op("total", "local_map", {"p"},
                      {{"out_placements", {{"R"}}},
                       {"body", {op("red", "call", {"p"}, {{"function", function}, {"axis", "tp"}})}},
                       {"returns", {"red"}},
                       {"reference", {op("red", "redistribute", {"p"}, {{"placements", {"R"}}})}}}),
                   op("loss", "sum", {"total"})});
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(LTensor, BodyValuesCarryVariantAndReducedSets) {
  auto r = run(scenario({"dp"}, {4},
                        {{{"name", "x"}, {"shape", {8, 6}}, {"placements", {"S(0)"}}},
                         {{"name", "w"}, {"shape", {6, 3}}, {"placements", {"S(0)"}}, {"requires_grad", true}}},
                        {op("loss", "local_map", {"x", "w"},
                            {{"out_placements", {{"P(sum)"}}},
                             {"body", {op("wf", "all_gather", {"w"}, {{"axis", "dp"}, {"dim", 0}, {"to", "reduced"}}),
                                       op("y", "mm", {"x", "wf"}), op("s", "sum", {"y"})}},
                             {"returns", {"s"}},
                             {"reference", {op("y", "mm", {"x", "w"}), op("s", "sum", {"y"})}}})}));
  ASSERT_EQ(r.result["status"], "pass") << r.result.dump(2);
  EXPECT_EQ(r.result["values"]["wf"]["variant"], nlohmann::json::array());
  EXPECT_EQ(r.result["values"]["wf"]["reduced"], nlohmann::json({"dp"}));
  EXPECT_EQ(r.result["values"]["y"]["variant"], nlohmann::json({"dp"}));
  EXPECT_EQ(r.result["values"]["y"]["reduced"], nlohmann::json::array());
  EXPECT_TRUE(r.result["checks"]["exclusivity"]);
  // The reduced weight is cast to varying for free: its backward is the all_gather's
  // reduce_scatter, and no all_reduce runs.
  int reduce_scatters = 0, all_reduces = 0;
  for (const auto& e : r.events) {
    if (e.phase != "backward") continue;
    reduce_scatters += e.note == "backward of all_gather";
    all_reduces += e.note == "backward of mark_varying";
  }
  EXPECT_EQ(reduce_scatters, 1);
  EXPECT_EQ(all_reduces, 0);
}

TEST(LTensor, InvariantInputGetsMarkVaryingWithBackwardAllReduce) {
  auto r = run(scenario({"dp"}, {4},
                        {{{"name", "x"}, {"shape", {8, 6}}, {"placements", {"S(0)"}}},
                         {{"name", "w"}, {"shape", {6, 3}}, {"placements", {"R"}}, {"requires_grad", true}}},
                        {op("loss", "local_map", {"x", "w"},
                            {{"out_placements", {{"P(sum)"}}},
                             {"body", {op("y", "mm", {"x", "w"}), op("s", "sum", {"y"})}},
                             {"returns", {"s"}},
                             {"reference", {op("y", "mm", {"x", "w"}), op("s", "sum", {"y"})}}})}));
  ASSERT_EQ(r.result["status"], "pass") << r.result.dump(2);
  bool marked = false;
  for (const auto& e : r.events) marked |= e.phase == "backward" && e.note == "backward of mark_varying";
  EXPECT_TRUE(marked);
}

TEST(LTensor, VaryingReturnedAsReplicateIsAnOutSpecError) {
  auto r = run(scenario({"dp"}, {2}, {{{"name", "x"}, {"shape", {4}}, {"placements", {"S(0)"}}}},
                        {op("y", "local_map", {"x"},
                            {{"out_placements", {{"R"}}}, {"body", {op("z", "mul", {"x", "x"})}}, {"returns", {"z"}}})},
                        ""));
  EXPECT_EQ(r.result["status"], "error");
  EXPECT_EQ(r.result["error"]["kind"], "out_spec_mismatch");
  EXPECT_EQ(r.exit_code, 3);
}

TEST(LTensor, PlantedOverlappingStrategyIsAnExclusivityViolation) {
  register_variance_tracking_strategy("mul", [](const StrategyInput& in) {
    return StrategyResult{{0}, AxisSet{0}};  // variant and reduced on the same axis
  });
  auto r = run(scenario({"dp"}, {2}, {{{"name", "x"}, {"shape", {4}}, {"placements", {"S(0)"}}}},
                        {op("y", "local_map", {"x"},
                            {{"out_placements", {{"S(0)"}}}, {"body", {op("z", "mul", {"x", "x"})}}, {"returns", {"z"}}})},
                        ""));
  unregister_variance_tracking_strategy("mul");
  EXPECT_EQ(r.result["error"]["kind"], "exclusivity_violation");
  EXPECT_EQ(r.exit_code, 3);
}

TEST(LTensor, MixedMeshesAreAMeshMismatch) {
  Scenario sc = parse_scenario(scenario({"dp"}, {2}, {{{"name", "x"}, {"shape", {4}}, {"placements", {"S(0)"}}}},
                                        nlohmann::json::array(), ""),
                               "<test>");
  Runtime rt(sc.mesh, sc.options);
  BodyContext ctx(rt);
  std::map<std::string, at::Tensor> globals;
  LTensor x = ctx.enter(make_inputs(sc, sc.options, globals).at(0));
  Mesh other({"tp"}, {2});
  LTensor y = x;
  y.mesh = &other;
  try {
    ctx.op("add", nlohmann::json::object(), {x, y}, "z");
    FAIL() << "no error";
  } catch (const SemanticError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::MeshMismatch);
  }
}

TEST(LTensor, CollectiveMetadataRules) {
  Scenario sc = parse_scenario(scenario({"a"}, {4}, {{{"name", "x"}, {"shape", {8, 4}}, {"placements", {"S(0)"}}}},
                                        nlohmann::json::array(), ""),
                               "<test>");
  Runtime rt(sc.mesh, sc.options);
  BodyContext ctx(rt);
  std::map<std::string, at::Tensor> globals;
  LTensor x = ctx.enter(make_inputs(sc, sc.options, globals).at(0));
  EXPECT_EQ(x.variant, AxisSet{0});
  EXPECT_EQ(ctx.all_reduce(x, 0, ReduceOp::Sum, "ar").variant, AxisSet{});
  EXPECT_EQ(ctx.all_gather(x, 0, 0, false, "agv").variant, AxisSet{0});
  LTensor agr = ctx.all_gather(x, 0, 0, true, "agr");
  EXPECT_EQ(agr.variant, AxisSet{});
  EXPECT_EQ(agr.reduced, AxisSet{0});
  LTensor rs = ctx.reduce_scatter(agr, 0, 0, "rs");  // reduced -> varying cast first
  EXPECT_EQ(rs.variant, AxisSet{0});
  EXPECT_EQ(rs.reduced, AxisSet{});
  EXPECT_EQ(ctx.all_to_all(x, 0, 1, 0, "a2a").variant, AxisSet{0});
  LTensor inv = ctx.all_reduce(x, 0, ReduceOp::Sum, "inv");
  EXPECT_EQ(ctx.mark_varying(inv, 0, "mv").variant, AxisSet{0});
  // all_reduce of an invariant value over n ranks is n times it (it is made varying first).
  LTensor twice = ctx.all_reduce(inv, 0, ReduceOp::Sum, "n_times");
  EXPECT_TRUE(at::equal(twice.locals[0], inv.locals[0] * 4));
}

// A collective's backward runs after its BodyContext is gone (the context lives on the stack of
// run_local_map; the graph outlives it). The backward must reach the Runtime without the context:
// here the context's memory is overwritten before the backward, which records the all_gather's
// reduce_scatter and returns the right gradient.
TEST(LTensor, CollectiveBackwardOutlivesItsBodyContext) {
  Scenario sc = parse_scenario(
      scenario({"a"}, {2}, {{{"name", "x"}, {"shape", {4, 3}}, {"placements", {"S(0)"}}, {"requires_grad", true}}},
               nlohmann::json::array(), ""),
      "<test>");
  Runtime rt(sc.mesh, sc.options);
  std::map<std::string, at::Tensor> globals;
  DTensor x = make_inputs(sc, sc.options, globals).at(0);
  DTensor gathered;
  {
    alignas(BodyContext) unsigned char storage[sizeof(BodyContext)];
    auto* ctx = new (storage) BodyContext(rt);
    LTensor g = ctx->all_gather(ctx->enter(x), 0, 0, /*to_reduced=*/false, "g");
    gathered = ctx->leave(g, {Placement::partial(ReduceOp::Sum)}, "gathered");
    ctx->~BodyContext();
    std::memset(storage, 0xA5, sizeof storage);  // what a later stack frame would leave there
  }
  DTensor loss = rt.apply_op("sum", OpAttrs{}, {gathered}, "loss");
  std::vector<Locals> grads = rt.backward(loss, {x});
  int scatters = 0;
  for (const auto& e : rt.events()) scatters += e.phase == "backward" && e.name == "reduce_scatter";
  EXPECT_EQ(scatters, 1);
  // d/dx sum(P(sum) of both ranks' gathered x) = 2 on every element (each rank's copy counts).
  ASSERT_EQ(grads.size(), 1u);
  for (const auto& g : grads[0]) EXPECT_TRUE(at::equal(g, at::full({2, 3}, 2.0, g.options()))) << g;
}

TEST(CustomFunctions, BuiltInsPassAndTheUnregisteredKernelIsReported) {
  EXPECT_EQ(run(all_reduce_call("opaque_all_reduce")).result["status"], "pass");
  auto bad = run(all_reduce_call("opaque_all_reduce_unregistered"));
  EXPECT_EQ(bad.result["status"], "fail") << bad.result.dump(2);
  EXPECT_FALSE(bad.result["checks"]["variance_tracking"]);
  EXPECT_EQ(bad.exit_code, 1);
}

// An opaque all_reduce kernel over an axis on which its input is invariant (R over tp) sees n
// equal locals and returns n times x, as all_reduce does; its input is made varying first
// (mark_varying), whose backward all_reduces the gradient: the gradient of x is n (the oracle's),
// not the 1 of the kernel's identity backward alone.
TEST(CustomFunctions, OpaqueAllReduceOfAnInvariantInputMakesItVaryingFirst) {
  for (const char* fn : {"opaque_all_reduce", "opaque_all_reduce_unregistered"}) {
    SCOPED_TRACE(fn);
    auto r = run(scenario({"tp"}, {4}, {{{"name", "x"}, {"shape", {3, 2}}, {"placements", {"R"}}, {"requires_grad", true}}},
                          {op("total", "local_map", {"x"},
                              {{"out_placements", {{"R"}}},
                               {"body", {op("red", "call", {"x"}, {{"function", fn}, {"axis", "tp"}})}},
                               {"returns", {"red"}},
                               {"reference", {op("red", "scale", {"x"}, {{"value", 4}})}}}),
                           op("loss", "sum", {"total"})}));
    EXPECT_EQ(r.result["values"]["red.varying.tp"]["variant"], nlohmann::json({"tp"})) << r.result.dump(2);
    bool marked = false, reduced_back = false;
    for (const auto& e : r.events) {
      marked |= e.phase == "forward" && e.name == "mark_varying";
      reduced_back |= e.phase == "backward" && e.kind == "collective" && e.name == "all_reduce";
    }
    EXPECT_TRUE(marked);
    EXPECT_TRUE(reduced_back);
    if (std::string(fn) == "opaque_all_reduce") {
      EXPECT_EQ(r.result["status"], "pass") << r.result.dump(2);
      EXPECT_EQ(r.result["values"]["red"]["variant"], nlohmann::json::array());
    } else {  // untracked (no strategy), but the values and the gradient are right
      EXPECT_EQ(r.result["checks"]["variance_tracking"], false) << r.result.dump(2);
      EXPECT_EQ(r.result["checks"]["forward_equivalence"], true) << r.result.dump(2);
      EXPECT_EQ(r.result["checks"]["gradient_equivalence"], true) << r.result.dump(2);
    }
  }
}

// The opaque kernels take exactly one argument: none, or two, is invalid input (exit 2) naming the
// call's args, not a crash or a run that "raised".
TEST(CustomFunctions, OpaqueAllReduceWithoutItsOneArgumentIsInvalidScenario) {
  for (const char* fn : {"opaque_all_reduce", "opaque_all_reduce_unregistered", "local_square"})
    for (const std::vector<std::string>& args : {std::vector<std::string>{}, std::vector<std::string>{"p", "p"}}) {
      SCOPED_TRACE(std::string(fn) + " with " + std::to_string(args.size()) + " args");
      auto doc = all_reduce_call(fn);
      doc["program"][0]["body"][0]["args"] = args;
      auto r = run(doc);
      EXPECT_EQ(r.result["status"], "error") << r.result.dump(2);
      EXPECT_EQ(r.result["error"]["kind"], "invalid_scenario");
      EXPECT_EQ(r.result["error"]["message"],
                "/program/0/body/0/args: " + std::string(fn) + " takes 1 argument, got " + std::to_string(args.size()));
      EXPECT_EQ(r.exit_code, 2);
    }
}

TEST(CustomFunctions, BothRegistrationStylesOfTheDocs) {
  user::register_user_functions();
  for (const char* fn : {"fused_all_reduce", "fused_all_reduce_mixin"}) {
    auto r = run(all_reduce_call(fn));
    EXPECT_EQ(r.result["status"], "pass") << fn << "\n" << r.result.dump(2);
    EXPECT_EQ(r.result["values"]["red"]["variant"], nlohmann::json::array()) << fn;
  }
  // Without its registry entry, the decorator-style Function is untracked; the mixin is not.
  unregister_variance_tracking_strategy(function_key<user::FusedAllReduce>());
  EXPECT_EQ(run(all_reduce_call("fused_all_reduce")).result["status"], "fail");
  EXPECT_EQ(run(all_reduce_call("fused_all_reduce_mixin")).result["status"], "pass");
  user::register_fused_all_reduce();
}

// The lookup order for a C++ Function type (docs/cpp-api.md, "Which strategy wins"): the registry's
// entry for the name a scenario calls, then the type's entry, then the class's own static strategy.
TEST(CustomFunctions, TheRegistryWinsOverTheClassesOwnStrategy) {
  user::register_user_functions();
  const Strategy keeps_axis = [](const StrategyInput& in) { return StrategyResult{in.variant.at(0), std::nullopt, {}}; };
  ASSERT_EQ(run(all_reduce_call("fused_all_reduce_mixin")).result["status"], "pass");
  register_variance_tracking_strategy<user::FusedAllReduceMixin>(keeps_axis);  // the type's entry
  auto by_type = run(all_reduce_call("fused_all_reduce_mixin"));
  EXPECT_EQ(by_type.result["error"]["kind"], "out_spec_mismatch") << by_type.result.dump(2);
  EXPECT_NE(by_type.result["error"]["message"].get<std::string>().find("variant=[tp]"), std::string::npos);
  // The entry for the called name beats the type's.
  register_variance_tracking_strategy(function_name_key("fused_all_reduce_mixin"), &user::FusedAllReduceMixin::variance_strategy);
  EXPECT_EQ(run(all_reduce_call("fused_all_reduce_mixin")).result["status"], "pass");
  unregister_variance_tracking_strategy(function_name_key("fused_all_reduce_mixin"));
  unregister_variance_tracking_strategy(function_key<user::FusedAllReduceMixin>());
  EXPECT_EQ(run(all_reduce_call("fused_all_reduce_mixin")).result["status"], "pass");
}

TEST(CustomFunctions, TheDocsQuoteTheExampleUnchanged) {
  const fs::path root(MESHSIM_SOURCE_DIR);
  const std::string code = read(root / "examples" / "cpp" / "user_functions.h");
  EXPECT_NE(read(root / "docs" / "cpp-api.md").find(code), std::string::npos)
      << "docs/cpp-api.md must quote examples/cpp/user_functions.h verbatim";
}

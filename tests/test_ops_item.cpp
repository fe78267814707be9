// detach, item, and the creation ops in local code: every placement of meshes [3], [4] and [2, 2]
// against the oracle on uneven shapes; detach cuts the gradient; item reads a DTensor whole (a
// Partial reduced first) and, in local code, each rank's own part (the user's bug, caught with its
// numbers); the planted bug item_of_partial_unreduced; zeros, ones, full and arange in a local_map
// body, invariant over every axis.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/scenario.h"
#include "oracles/check.h"

namespace meshsim {
namespace {

using json = nlohmann::json;

json doc_of(const json& mesh, const json& inputs, const json& program, const std::string& backward = "") {
  const json axes = mesh.size() == 1 ? json::array({"a"}) : json::array({"a", "b"});
  json doc = {{"format", "meshsim.scenario/1"}, {"name", "item"}, {"mesh", {{"axes", axes}, {"shape", mesh}}},
              {"inputs", inputs}, {"program", program}};
  if (!backward.empty()) doc["backward"] = backward;
  return doc;
}

json run(const json& doc) {
  const Scenario sc = parse_scenario(doc, "test.json");
  return check_scenario(sc, sc.options).result;
}

// Every spec of a mesh of `ndim` axes from the per-axis placements `one`.
std::vector<json> specs(const std::vector<std::string>& one, size_t ndim) {
  std::vector<json> out;
  for (const auto& p : one) {
    if (ndim == 1) {
      out.push_back({p});
      continue;
    }
    for (const auto& q : one) out.push_back({p, q});
  }
  return out;
}

bool differentiable(const json& spec) {
  for (const auto& p : spec)
    if (p == "P(max)" || p == "P(min)") return false;
  return true;
}

const std::vector<std::string> kEvery = {"S(0)", "S(1)", "R", "Rd", "P(sum)", "P(avg)", "P(max)", "P(min)"};
const std::vector<std::string> kTwoAxes = {"S(0)", "S(1)", "R", "Rd", "P(sum)", "P(max)"};

TEST(Detach, EveryPlacementKeepsItsLayoutAndMatchesTheOracle) {
  // d = detach(x) of x [5, 3] (uneven on 2, 3 and 4 ranks), then y = x * d summed: d keeps x's
  // placements, a Partial of every kind included; values and gradients against the oracle.
  size_t cases = 0;
  for (const json& mesh : {json{3}, json{4}, json{2, 2}})
    for (const json& spec : specs(mesh.size() == 1 ? kEvery : kTwoAxes, mesh.size())) {
      const bool grad = differentiable(spec);
      const json inputs = {{{"name", "x"}, {"shape", {5, 3}}, {"placements", spec}, {"requires_grad", grad}}};
      const json program = {{{"out", "d"}, {"op", "detach"}, {"args", {"x"}}},
                            {{"out", "y"}, {"op", "mul"}, {"args", {"x", "d"}}},
                            {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}};
      const json r = run(doc_of(mesh, inputs, program, grad ? "loss" : ""));
      ASSERT_EQ(r["status"], "pass") << mesh << " " << spec << r.dump(1);
      EXPECT_EQ(r["values"]["d"]["placements"], spec) << mesh << " " << spec << r.dump(1);
      ++cases;
    }
  EXPECT_EQ(cases, 8u + 8u + 36u);
}

TEST(Detach, CutsTheGradient) {
  // loss = sum(x * detach(x)) of x = arange [4, 3] S(0) on 3 ranks: dloss/dx = x (the detached
  // factor is a constant), not 2x.
  const json inputs = {{{"name", "x"}, {"shape", {4, 3}}, {"placements", {"S(0)"}}, {"init", "arange"}, {"requires_grad", true}}};
  const json program = {{{"out", "d"}, {"op", "detach"}, {"args", {"x"}}},
                        {{"out", "y"}, {"op", "mul"}, {"args", {"x", "d"}}},
                        {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}};
  const Scenario sc = parse_scenario(doc_of({3}, inputs, program, "loss"), "test.json");
  const CheckedRun checked = check_scenario(sc, sc.options, /*keep_values=*/true);
  ASSERT_EQ(checked.result["status"], "pass") << checked.result.dump(1);
  ASSERT_TRUE(checked.tensors);
  ASSERT_EQ(checked.tensors->grads.size(), 1u);
  const at::Tensor g = checked.tensors->grads[0].global;
  ASSERT_TRUE(g.defined());
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(g.reshape({-1})[i].item<double>(), static_cast<double>(i)) << i;
}

TEST(Item, EveryPlacementReadsTheWholeValue) {
  // i = item(x) of x [], [1] or [1, 1] (a shard of its one element: rank 0 holds it), scaling
  // w [5, 3] S(0): i is replicated (a Partial reduced first, a shard gathered), 0-d, no gradient.
  size_t cases = 0;
  for (const json& mesh : {json{3}, json{4}, json{2, 2}})
    for (const json& shape : {json::array(), json{1}, json{1, 1}})
      for (const json& spec : specs(mesh.size() == 1 ? kEvery : kTwoAxes, mesh.size())) {
        bool fits = true;  // a shard of a dim the shape has
        for (const auto& p : spec) fits &= !(p == "S(0)" && shape.empty()) && !(p == "S(1)" && shape.size() < 2);
        if (!fits) continue;
        const json axes_w = mesh.size() == 1 ? json{"S(0)"} : json{"S(0)", "R"};
        const json inputs = {{{"name", "x"}, {"shape", shape}, {"placements", spec}, {"requires_grad", differentiable(spec)}},
                             {{"name", "w"}, {"shape", {5, 3}}, {"placements", axes_w}, {"requires_grad", true}}};
        const json program = {{{"out", "i"}, {"op", "item"}, {"args", {"x"}}},
                              {{"out", "y"}, {"op", "mul"}, {"args", {"w", "i"}}},
                              {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}};
        const json r = run(doc_of(mesh, inputs, program, "loss"));
        ASSERT_EQ(r["status"], "pass") << mesh << " " << shape << " " << spec << r.dump(1);
        EXPECT_EQ(r["values"]["i"]["shape"], json::array()) << r.dump(1);
        for (const auto& p : r["values"]["i"]["placements"]) EXPECT_TRUE(p == "R" || p == "Rd") << spec << r.dump(1);
        EXPECT_FALSE(r["grads"].contains("i")) << r.dump(1);
        ++cases;
      }
  EXPECT_GT(cases, 100u);
}

TEST(Item, ThePlantedBugReadsEachRanksOwnPart) {
  // x: 1 on each of 4 ranks as P(sum) (4 in all); i = item(x) scales w = ones [5, 3] S(0). The
  // planner all_reduces x first (i = 4); under item_of_partial_unreduced each rank reads its own 1.
  json doc = doc_of({4},
                    {{{"name", "x"}, {"shape", json::array()}, {"placements", {"P(sum)"}}, {"init", "ones"}, {"from_local", true}},
                     {{"name", "w"}, {"shape", {5, 3}}, {"placements", {"S(0)"}}, {"init", "ones"}, {"requires_grad", true}}},
                    {{{"out", "i"}, {"op", "item"}, {"args", {"x"}}},
                     {{"out", "y"}, {"op", "mul"}, {"args", {"w", "i"}}},
                     {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}},
                    "loss");
  const json right = run(doc);
  ASSERT_EQ(right["status"], "pass") << right.dump(1);
  bool reduced = false;
  for (const auto& c : right["collectives"]) reduced |= c["op"] == "all_reduce" && c["phase"] == "forward";
  EXPECT_TRUE(reduced) << right.dump(1);
  doc["options"] = {{"mutant", "item_of_partial_unreduced"}};
  const json r = run(doc);
  ASSERT_EQ(r["status"], "fail") << r.dump(1);
  const std::string f = r["failures"][0];
  EXPECT_EQ(f.rfind("i: ", 0), 0u) << f;
  EXPECT_NE(f.find("expected 4, actual 1"), std::string::npos) << f;
}

TEST(Item, InLocalCodeReadsEachRanksOwnPart) {
  // to_local of a P(sum) x [] (1 on each of 4 ranks), item, from_local as R: each rank holds its
  // own 1 where the value is 4 (the user's bug: a loss logged from a partial sum); with the
  // all_reduce first, 4 on every rank.
  auto doc = [](bool reduce) {
    json program = {{{"out", "xl"}, {"op", "to_local"}, {"args", {"x"}}}};
    std::string read = "xl";
    if (reduce) {
      program.push_back({{"out", "xr"}, {"op", "all_reduce"}, {"args", {"xl"}}, {"axis", "a"}});
      read = "xr";
    }
    program.push_back({{"out", "il"}, {"op", "item"}, {"args", {read}}});
    program.push_back({{"out", "i"}, {"op", "from_local"}, {"args", {"il"}}, {"placements", {"R"}}});
    return doc_of({4}, {{{"name", "x"}, {"shape", json::array()}, {"placements", {"P(sum)"}}, {"init", "ones"}, {"from_local", true}}},
                  program);
  };
  const json wrong = run(doc(false));
  ASSERT_EQ(wrong["status"], "fail") << wrong.dump(1);
  const std::string f = wrong["failures"][0];
  EXPECT_EQ(f.rfind("i: ", 0), 0u) << f;
  EXPECT_NE(f.find("expected 4, actual 1"), std::string::npos) << f;
  const json right = run(doc(true));
  EXPECT_EQ(right["status"], "pass") << right.dump(1);
}

TEST(Item, InALocalMapBodyIsVaryingWhereItsOperandIs) {
  // A body's item of a P(sum) arg is each rank's part: varying, so it leaves as P(sum) (passes)
  // and not as R (refused: it needs neither variant nor reduced).
  auto doc = [](const char* out) {
    const json lm = {{"out", "i"}, {"op", "local_map"}, {"args", {"x"}}, {"out_placements", {{out}}},
                     {"body", {{{"out", "il"}, {"op", "item"}, {"args", {"x"}}}}},
                     {"returns", {"il"}},
                     {"reference", {{{"out", "il"}, {"op", "item"}, {"args", {"x"}}}}}};
    return doc_of({4}, {{{"name", "x"}, {"shape", json::array()}, {"placements", {"P(sum)"}}}}, json::array({lm}));
  };
  const json partial = run(doc("P(sum)"));
  ASSERT_EQ(partial["status"], "pass") << partial.dump(1);
  EXPECT_EQ(partial["values"]["il"]["variant"], json::array({"a"})) << partial.dump(1);
  const json replicated = run(doc("R"));
  ASSERT_EQ(replicated["status"], "error") << replicated.dump(1);
  EXPECT_NE(replicated["error"]["message"].get<std::string>().find("needs it neither variant nor reduced"), std::string::npos)
      << replicated.dump(1);
}

TEST(Item, RefusesAValueOfManyElements) {
  const json r = run(doc_of({2}, {{{"name", "x"}, {"shape", {2, 3}}, {"placements", {"S(0)"}}}},
                            {{{"out", "i"}, {"op", "item"}, {"args", {"x"}}}}));
  ASSERT_EQ(r["status"], "error") << r.dump(1);
  EXPECT_EQ(r["error"]["kind"], "shape_mismatch") << r.dump(1);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("item: a value of one element has a number, got [2, 3] (6 elements)"),
            std::string::npos)
      << r.dump(1);
}

// y = x * c of x [5, 3] laid out by `spec`, c made in a local_map body: `op` of local shape [3]
// (every rank the same, invariant), the reference making it of the same (global) shape. y leaves
// as x's spec, but R for Rd: x, reduced there, meets the invariant c (cast reduced -> invariant).
json created_in_body(const json& mesh, const json& spec, const std::string& op) {
  json c = {{"out", "c"}, {"op", op}, {"shape", {3}}};
  if (op == "full") c["value"] = 2.5;
  json out = spec;
  for (auto& p : out)
    if (p == "Rd") p = "R";
  const json lm = {{"out", "y"}, {"op", "local_map"}, {"args", {"x"}}, {"out_placements", json::array({out})},
                   {"body", {c, {{"out", "yl"}, {"op", "mul"}, {"args", {"x", "c"}}}}},
                   {"returns", {"yl"}},
                   {"reference", {c, {{"out", "yl"}, {"op", "mul"}, {"args", {"x", "c"}}}}}};
  return doc_of(mesh, {{{"name", "x"}, {"shape", {5, 3}}, {"placements", spec}, {"requires_grad", true}}},
                {lm, {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}}, "loss");
}

TEST(Creation, InALocalMapBodyIsInvariantOverEveryAxis) {
  // zeros, ones, full and arange of [3] in a body, times x sharded on its rows, replicated,
  // reduced or Partial (uneven [5, 3] on 3, 4 and 2 x 2 ranks): values and gradients against the
  // oracle; the created value varies over no axis and is reduced over none.
  size_t cases = 0;
  for (const std::string op : {"zeros", "ones", "full", "arange"})
    for (const json& mesh : {json{3}, json{4}, json{2, 2}})
      for (const json& spec : specs({"S(0)", "R", "Rd", "P(sum)"}, mesh.size())) {
        const json r = run(created_in_body(mesh, spec, op));
        ASSERT_EQ(r["status"], "pass") << op << " " << mesh << " " << spec << r.dump(1);
        EXPECT_EQ(r["values"]["c"]["variant"], json::array()) << r.dump(1);
        EXPECT_EQ(r["values"]["c"]["reduced"], json::array()) << r.dump(1);
        EXPECT_EQ(r["values"]["c"]["local_shapes"][0], json({3})) << r.dump(1);
        ++cases;
      }
  EXPECT_EQ(cases, 4u * (4u + 4u + 16u));
}

TEST(Creation, AReturnedConstantIsReplicatedNotSharded) {
  // A created value leaves a body as R (invariant: passes) and not as S(0) (it needs variant).
  auto doc = [](const char* out) {
    const json c = {{"out", "c"}, {"op", "arange"}, {"shape", {4, 2}}};
    const json lm = {{"out", "y"}, {"op", "local_map"}, {"args", {"x"}}, {"out_placements", {{out}}},
                     {"body", {c}}, {"returns", {"c"}}, {"reference", {c}}};
    return doc_of({4}, {{{"name", "x"}, {"shape", {4, 2}}, {"placements", {"S(0)"}}}}, json::array({lm}));
  };
  const json r = run(doc("R"));
  ASSERT_EQ(r["status"], "pass") << r.dump(1);
  const json s = run(doc("S(0)"));
  ASSERT_EQ(s["status"], "error") << s.dump(1);
  EXPECT_NE(s["error"]["message"].get<std::string>().find("which needs it variant"), std::string::npos) << s.dump(1);
}

TEST(Creation, ABodysCreationOpTakesNoPlacements) {
  json doc = created_in_body({4}, {"S(0)"}, "ones");
  doc["program"][0]["body"][0]["placements"] = {"R"};
  try {
    parse_scenario(doc, "test.json");
    FAIL() << "placements in a body accepted";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/program/0/body/0/placements"), std::string::npos) << what;
    EXPECT_NE(what.find("ones in a local_map body makes a local tensor of its shape"), std::string::npos) << what;
  }
}

TEST(Creation, InLocalCodeIsEachRanksSameTensor) {
  // Between to_local and from_local: arange [3] (no placements) scales each rank's rows of x
  // [5, 3] S(0) on 4 ranks; the oracle reads the same arange in the global program. Before any
  // to_local a creation op without placements is refused, named.
  json program = {{{"out", "xl"}, {"op", "to_local"}, {"args", {"x"}}},
                  {{"out", "b"}, {"op", "arange"}, {"shape", {3}}},
                  {{"out", "yl"}, {"op", "mul"}, {"args", {"xl", "b"}}},
                  {{"out", "y"}, {"op", "from_local"}, {"args", {"yl"}}, {"placements", {"S(0)"}}},
                  {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}};
  const json inputs = {{{"name", "x"}, {"shape", {5, 3}}, {"placements", {"S(0)"}}, {"requires_grad", true}}};
  const json r = run(doc_of({4}, inputs, program, "loss"));
  ASSERT_EQ(r["status"], "pass") << r.dump(1);
  EXPECT_EQ(r["values"]["b"]["variance"], "unchecked") << r.dump(1);
  program.insert(program.begin(), json{{"out", "z"}, {"op", "zeros"}, {"shape", {3}}});
  const json early = run(doc_of({4}, inputs, program, "loss"));
  ASSERT_EQ(early["status"], "error") << early.dump(1);
  EXPECT_NE(early["error"]["message"].get<std::string>().find("/program/0/placements: zeros without placements makes a "
                                                              "local tensor of local code (after to_local)"),
            std::string::npos)
      << early.dump(1);
}

}  // namespace
}  // namespace meshsim

// Integer arithmetic (issue #31): add, sub and mul of int64 data, floor_divide and remainder, on
// every placement of meshes [3], [4] and [2, 2] against the oracle, uneven and broadcast; their
// refusals (a zero divisor, a fractional value against int64 data, a bool operand) name the op,
// the operand and the numbers.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/scenario.h"
#include "oracles/check.h"

namespace meshsim {
namespace {

using json = nlohmann::json;

// y = op(x, d) of int64 data (x in [-4, 4]; d in [1, 3], or its negative), on a mesh of `shape`
// with the placements given; or y = op(x) {value} where `value` is set.
json scenario(const std::string& op, const json& mesh, const json& x_spec, const json& d_spec, const json& x_shape,
              const json& d_shape, const json& value = nullptr, bool negative = false) {
  const json axes = mesh.size() == 1 ? json::array({"a"}) : json::array({"a", "b"});
  json inputs = json::array({{{"name", "x"}, {"shape", x_shape}, {"placements", x_spec}, {"dtype", "int64"}}});
  json program = json::array();
  json y = {{"out", "y"}, {"op", op}, {"args", {"x"}}};
  if (value.is_null()) {
    inputs.push_back({{"name", "d0"}, {"shape", d_shape}, {"placements", d_spec}, {"dtype", "int64"}, {"init", {{"ids", 3}}}});
    program.push_back({{"out", "d"}, {"op", "add"}, {"args", {"d0"}}, {"value", 1}});  // [1, 3]
    if (negative) program.push_back({{"out", "dn"}, {"op", "mul"}, {"args", {"d"}}, {"value", -1}});
    y["args"].push_back(negative ? "dn" : "d");
  } else {
    y["value"] = value;
  }
  program.push_back(y);
  return {{"format", "meshsim.scenario/1"}, {"name", op}, {"mesh", {{"axes", axes}, {"shape", mesh}}},
          {"inputs", inputs}, {"program", program}};
}

json run(const json& doc) {
  const Scenario sc = parse_scenario(doc, "test.json");
  return check_scenario(sc, sc.options).result;
}

const std::vector<std::string> kOps = {"add", "sub", "mul", "floor_divide", "remainder"};

TEST(IntegerArithmetic, EveryPlacementMatchesTheOracleOnUnevenMeshes) {
  // x [5, 3] (uneven on 2, 3 and 4 ranks) against d of its shape or broadcast ([3], [5, 1]); int64
  // data is never Partial: S(0), S(1), R and Rd on each axis.
  const std::vector<std::string> one = {"S(0)", "S(1)", "R", "Rd"};
  size_t cases = 0;
  for (const auto& op : kOps)
    for (const json& d_shape : {json{5, 3}, json{3}, json{5, 1}}) {
      for (const json& mesh : {json{3}, json{4}})
        for (const auto& p : one)
          for (const auto& q : one) {
            if (d_shape.size() == 1 && q == "S(1)") continue;  // a 1-D d has no dim 1
            const json r = run(scenario(op, mesh, {p}, {q}, {5, 3}, d_shape, nullptr, cases % 2 == 1));
            ASSERT_EQ(r["status"], "pass") << op << " " << mesh << " " << p << " " << q << " " << d_shape << r.dump(1);
            ++cases;
          }
      for (const auto& p : one)
        for (const auto& q : one) {
          const json d_spec = d_shape.size() == 1 ? json{"R", q == "S(1)" ? "S(0)" : q} : json{q, p};
          const json r = run(scenario(op, {2, 2}, {p, q}, d_spec, {5, 3}, d_shape, nullptr, cases % 2 == 1));
          ASSERT_EQ(r["status"], "pass") << op << " [2, 2] " << p << q << " " << d_shape << r.dump(1);
          ++cases;
        }
    }
  for (const auto& op : kOps)
    for (double value : {-3.0, 2.0})
      for (const auto& p : one) {
        const json r = run(scenario(op, {4}, {p}, nullptr, {5, 3}, nullptr, value));
        ASSERT_EQ(r["status"], "pass") << op << " value " << value << " " << p << r.dump(1);
        ++cases;
      }
  EXPECT_GT(cases, 400u);
}

TEST(IntegerArithmetic, CumsumOfInt64DataMatchesTheOracleOnEveryPlacement) {
  // cumsum of int64 x [5, 3] along each dim: the dim gathered where sharded, the other kept.
  const std::vector<std::string> one = {"S(0)", "S(1)", "R", "Rd"};
  for (int64_t dim : {0, 1, -1})
    for (const json& mesh : {json{3}, json{4}, json{2, 2}})
      for (const auto& p : one)
        for (const auto& q : one) {
          const json spec = mesh.size() == 1 ? json{p} : json{p, q};
          if (mesh.size() == 1 && q != "R") continue;
          const json axes = mesh.size() == 1 ? json::array({"a"}) : json::array({"a", "b"});
          const json doc = {
              {"format", "meshsim.scenario/1"}, {"name", "cumsum"}, {"mesh", {{"axes", axes}, {"shape", mesh}}},
              {"inputs", {{{"name", "x"}, {"shape", {5, 3}}, {"placements", spec}, {"dtype", "int64"}}}},
              {"program", {{{"out", "y"}, {"op", "cumsum"}, {"args", {"x"}}, {"dim", dim}}}}};
          const json r = run(doc);
          ASSERT_EQ(r["status"], "pass") << dim << " " << mesh << " " << spec << r.dump(1);
          // A shard of the dim is gathered first; a shard of the other dim is kept.
          const std::string sharded_dim = dim == 0 ? "S(0)" : "S(1)";
          if (mesh.size() == 1 && (p == "S(0)" || p == "S(1)")) {
            EXPECT_EQ(r["values"]["y"]["placements"][0] == p, p != sharded_dim) << dim << " " << p << r.dump(1);
          }
        }
}

TEST(IntegerArithmetic, FloorDivideRoundsDownAndRemainderTakesTheDivisorsSign) {
  // -7 // 2 = -4 and -7 % 2 = 1; 7 // -2 = -4 and 7 % -2 = -1 (PyTorch's, Python's): on the mesh,
  // S(0) over 3 ranks, against the oracle and the values themselves.
  json doc = {{"format", "meshsim.scenario/1"}, {"name", "signs"}, {"mesh", {{"axes", {"a"}}, {"shape", {3}}}},
              {"inputs", json::array()}, {"program", json::array()}};
  doc["program"] = {{{"out", "x"}, {"op", "arange"}, {"shape", {4}}, {"placements", {"S(0)"}}, {"dtype", "int64"}},
                    {{"out", "x7"}, {"op", "mul"}, {"args", {"x"}}, {"value", 7}},
                    {{"out", "x9"}, {"op", "sub"}, {"args", {"x7"}}, {"value", 7}},  // -7, 0, 7, 14
                    {{"out", "q"}, {"op", "floor_divide"}, {"args", {"x9"}}, {"value", -2}},
                    {{"out", "r"}, {"op", "remainder"}, {"args", {"x9"}}, {"value", -2}}};
  const Scenario sc = parse_scenario(doc, "test.json");
  const CheckedRun run = check_scenario(sc, sc.options, /*keep_values=*/true);
  ASSERT_EQ(run.result["status"], "pass") << run.result.dump(1);
  ASSERT_TRUE(run.tensors);
  for (const auto& v : run.tensors->values) {
    if (v.name != "q" && v.name != "r") continue;
    const std::vector<int64_t> want = v.name == "q" ? std::vector<int64_t>{3, 0, -4, -7} : std::vector<int64_t>{-1, 0, -1, 0};
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(v.global[static_cast<int64_t>(i)].item<int64_t>(), want[i]) << v.name << i;
    EXPECT_TRUE(v.global.equal(v.oracle)) << v.name;
  }
}

TEST(Cumsum, ThePlantedBugKeepsEachRanksOwnRunningSums) {
  // x [6, 2] arange S(0) on 3 ranks (2 rows each), cumsum along dim 0: the dim is gathered first;
  // under cumsum_sharded_dim_local rank 1's rows start again from its own rows 2-3 (4, 5; then 10,
  // 12), where the global running sums are 6, 9 and 12, 16; rank 2's (8, 9; 18, 20) miss 12 and 16.
  json doc = {{"format", "meshsim.scenario/1"}, {"name", "cumsum"}, {"mesh", {{"axes", {"a"}}, {"shape", {3}}}},
              {"inputs", {{{"name", "x"}, {"shape", {6, 2}}, {"placements", {"S(0)"}}, {"init", "arange"}, {"requires_grad", true}}}},
              {"program", {{{"out", "y"}, {"op", "cumsum"}, {"args", {"x"}}, {"dim", 0}},
                           {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}}},
              {"backward", "loss"}};
  const json right = run(doc);
  ASSERT_EQ(right["status"], "pass") << right.dump(1);
  EXPECT_EQ(right["values"]["y"]["placements"], json::array({"R"})) << right.dump(1);
  doc["options"] = {{"mutant", "cumsum_sharded_dim_local"}};
  const json r = run(doc);
  ASSERT_EQ(r["status"], "fail") << r.dump(1);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"S(0)"})) << r.dump(1);
  const std::string f = r["failures"][0];
  EXPECT_EQ(f.rfind("y: 8 of 12 elements differ", 0), 0u) << f;
  EXPECT_NE(f.find("greatest difference 16 at [4, 1]: expected 25, actual 9 (ranks 1, 2)"), std::string::npos) << f;
}

TEST(IntegerArithmetic, RefusalsNameTheOpTheOperandAndTheNumbers) {
  auto message = [](const json& doc) {
    const json r = run(doc);
    EXPECT_EQ(r["status"], "error") << r.dump(1);
    return r["error"]["message"].get<std::string>();
  };
  // A divisor holding 0 (ids in [0, 3), not shifted): its place and rank.
  json zero = scenario("floor_divide", {2}, {"S(0)"}, {"S(0)"}, {6, 3}, {6, 3});
  zero["program"][1]["args"] = {"x", "d0"};
  const std::string z = message(zero);
  EXPECT_NE(z.find("/program/1/args/1: floor_divide: \"d0\" holds 0 at local ["), std::string::npos) << z;
  EXPECT_NE(z.find("integer division by zero"), std::string::npos) << z;
  EXPECT_NE(message(scenario("remainder", {2}, {"R"}, nullptr, {4}, nullptr, 0.0)).find("/program/0/value: remainder: divides by zero"),
            std::string::npos);
  const std::string half = message(scenario("add", {2}, {"R"}, nullptr, {4}, nullptr, 0.5));
  EXPECT_NE(half.find("/program/0/value: add: 0.5 against the int64 \"x\": integer arithmetic takes a whole value"),
            std::string::npos)
      << half;
  json boolean = scenario("add", {2}, {"R"}, {"R"}, {4}, {4});
  boolean["inputs"][0]["dtype"] = "bool";
  const std::string b = message(boolean);
  EXPECT_NE(b.find("add: \"x\" is bool, expected float or int64"), std::string::npos) << b;
  json mixed = scenario("mul", {2}, {"R"}, {"R"}, {4}, {4});
  mixed["inputs"][0].erase("dtype");
  const std::string m = message(mixed);
  EXPECT_NE(m.find("mul: \"d\" is int64, the other data operands are float"), std::string::npos) << m;
}

}  // namespace
}  // namespace meshsim

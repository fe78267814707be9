// gather and index_select (issue #31): their refusals (an index out of range, shapes that do not
// fit) name the op, the operand and the numbers; the rows PyTorch lacks are right on uneven
// shards; the planted bug gather_shard_extents_unchecked gives wrong values the oracle names.
// Every placement against the oracle is in test_ops (OpEquivalence/gather, /index_select).
#include <gtest/gtest.h>

#include <string>

#include "core/scenario.h"
#include "oracles/check.h"

namespace meshsim {
namespace {

using json = nlohmann::json;

// x [rows, 4] (arange: every row differs) on a mesh [n], `op` of x along `dim` by an int64 index
// laid out as given, then sum(y * c).
json scenario(const std::string& op, int64_t dim, const json& index_shape, const json& index_init,
              const json& x_spec, const json& index_spec, int64_t n = 2, int64_t rows = 5) {
  json program = json::array({{{"out", "y"}, {"op", op}, {"args", {"x", "i"}}, {"dim", dim}}});
  json inputs = json::array({{{"name", "x"}, {"shape", {rows, 4}}, {"placements", x_spec}, {"init", "arange"}},
                             {{"name", "i"}, {"shape", index_shape}, {"placements", index_spec}, {"dtype", "int64"},
                              {"init", index_init}}});
  return {{"format", "meshsim.scenario/1"}, {"name", op}, {"mesh", {{"axes", {"a"}}, {"shape", {n}}}},
          {"inputs", inputs}, {"program", program}};
}

json run(const json& doc) {
  const Scenario sc = parse_scenario(doc, "test.json");
  return check_scenario(sc, sc.options).result;
}

TEST(Indexing, AnIndexOutOfRangeIsRefusedWithItsValueRankAndRange) {
  // Positions along dim 1 of x [5, 4] must lie in [0, 4): ids drawn in [0, 6) reach past it.
  const json r = run(scenario("gather", 1, {5, 3}, {{"ids", 6}}, {"R"}, {"S(0)"}));
  ASSERT_EQ(r["status"], "error") << r.dump(1);
  const std::string msg = r["error"]["message"];
  EXPECT_NE(msg.find("/program/0/args/1: gather: \"i\" holds"), std::string::npos) << msg;
  EXPECT_NE(msg.find("outside [0, 4)"), std::string::npos) << msg;
}

TEST(Indexing, ShapesThatDoNotFitNameTheOpAndTheShapes) {
  const json rank = run(scenario("gather", 0, {5}, {{"ids", 5}}, {"R"}, {"R"}));
  ASSERT_EQ(rank["status"], "error");
  EXPECT_NE(rank["error"]["message"].get<std::string>().find("gather: the index [5] must have as many dims as x [5, 4]"),
            std::string::npos)
      << rank.dump(1);
  const json larger = run(scenario("gather", 0, {2, 6}, {{"ids", 5}}, {"R"}, {"R"}));
  ASSERT_EQ(larger["status"], "error");
  EXPECT_NE(larger["error"]["message"].get<std::string>().find("is larger than x [5, 4] on dim 1"), std::string::npos)
      << larger.dump(1);
  const json two_d = run(scenario("index_select", 0, {2, 2}, {{"ids", 5}}, {"R"}, {"R"}));
  ASSERT_EQ(two_d["status"], "error");
  EXPECT_NE(two_d["error"]["message"].get<std::string>().find("index_select: the index must be 1-D, got [2, 2]"),
            std::string::npos)
      << two_d.dump(1);
}

TEST(Indexing, GatherOfXAndIndexShardedAlikeOnAnotherDimKeepsTheShard) {
  // x [5, 4] and the index [5, 3] S(0) on 3 ranks (2, 2, 1 rows): meshsim's row, no communication.
  const json r = run(scenario("gather", 1, {5, 3}, {{"ids", 4}}, {"S(0)"}, {"S(0)"}, 3));
  ASSERT_EQ(r["status"], "pass") << r.dump(1);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"S(0)"})) << r.dump(1);
}

TEST(Indexing, IndexSelectOfAShardedIndexShardsTheResultAtDim) {
  const json r = run(scenario("index_select", 1, {7}, {{"ids", 4}}, {"R"}, {"S(0)"}, 4));
  ASSERT_EQ(r["status"], "pass") << r.dump(1);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"S(1)"})) << r.dump(1);
}

TEST(Indexing, ThePlantedBugGathersFromOtherRowsOfX) {
  // x [5, 4] and the index [3, 3] S(0) on 2 ranks: no row keeps both sharded (the index is
  // shorter); under the bug rank 1 gathers the index's row 2 from x's row 3 (its first row).
  json doc = scenario("gather", 1, {3, 3}, {{"ids", 4}}, {"S(0)"}, {"S(0)"});
  EXPECT_EQ(run(doc)["status"], "pass");
  doc["options"] = {{"mutant", "gather_shard_extents_unchecked"}};
  const json r = run(doc);
  ASSERT_EQ(r["status"], "fail") << r.dump(1);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"S(0)"})) << r.dump(1);
  // Row 2 of the result read x's row 3 (arange: 12..15), where the oracle read row 2 (8..11): 4 more.
  ASSERT_EQ(r["failures"].size(), 1u) << r["failures"].dump(1);
  const std::string f = r["failures"][0];
  EXPECT_EQ(f.rfind("y: 3 of 9 elements differ; greatest difference 4 at [2, ", 0), 0u) << f;
  EXPECT_NE(f.find("(rank 1)"), std::string::npos) << f;
}

// A comparison of int64 data with a fractional value promotes, as PyTorch's does: eq(ids, 0.5) is
// all false and lt(ids, 0.5) is ids == 0, on the mesh and in the oracle (the value was truncated
// to 0 before: eq(ids, 0.5) was ids == 0).
TEST(Comparisons, AFractionalValueAgainstInt64DataIsNotTruncated) {
  for (const char* op : {"eq", "lt"}) {
    const json doc = {
        {"format", "meshsim.scenario/1"}, {"name", op}, {"mesh", {{"axes", {"a"}}, {"shape", {2}}}},
        {"inputs", {{{"name", "i"}, {"shape", {6}}, {"placements", {"S(0)"}}, {"dtype", "int64"}, {"init", "arange"}}}},
        {"program", {{{"out", "m"}, {"op", op}, {"args", {"i"}}, {"value", 0.5}}}}};
    const Scenario sc = parse_scenario(doc, "test.json");
    const CheckedRun run = check_scenario(sc, sc.options, /*keep_values=*/true);
    ASSERT_EQ(run.result["status"], "pass") << run.result.dump(1);
    ASSERT_TRUE(run.tensors);
    for (const auto& v : run.tensors->values)
      if (v.name == "m") {  // ids 0..5: none equals 0.5, only 0 is below it
        EXPECT_EQ(v.oracle.sum().item<int64_t>(), std::string(op) == "eq" ? 0 : 1) << op;
        EXPECT_TRUE(v.global.equal(v.oracle)) << op;  // the mesh's, assembled
      }
  }
}

}  // namespace
}  // namespace meshsim

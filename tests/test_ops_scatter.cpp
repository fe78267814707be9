// scatter, scatter_add and index_add (issue #31): their refusals (an index out of range, shapes
// that do not fit) name the op, the operand and the numbers; the rows PyTorch lacks (a sharded
// index adding into a Partial x, index_add's rows) are right on uneven shards; the planted bug
// scatter_add_sharded_index_replicated gives wrong values the oracle names. Every placement
// against the oracle is in test_ops (OpEquivalence/scatter, /scatter_add, /index_add).
#include <gtest/gtest.h>

#include <string>

#include "core/scenario.h"
#include "oracles/check.h"

namespace meshsim {
namespace {

using json = nlohmann::json;

// x [rows, 4] (arange) on a mesh [n]; y = op(x, dim, i, s) with the int64 index i and src s
// laid out as given; then sum(y * c).
json scenario(const std::string& op, int64_t dim, const json& index_shape, const json& src_shape, const json& ids,
              const json& x_spec, const json& index_spec, const json& src_spec, int64_t n = 3, int64_t rows = 5) {
  json program = json::array({{{"out", "y"}, {"op", op}, {"args", {"x", "i", "s"}}, {"dim", dim}},
                              {{"out", "m"}, {"op", "mul"}, {"args", {"y", "c"}}},
                              {{"out", "loss"}, {"op", "sum"}, {"args", {"m"}}}});
  json inputs = json::array(
      {{{"name", "x"}, {"shape", {rows, 4}}, {"placements", x_spec}, {"init", "arange"}, {"requires_grad", true}},
       {{"name", "i"}, {"shape", index_shape}, {"placements", index_spec}, {"dtype", "int64"}, {"init", ids}},
       {{"name", "s"}, {"shape", src_shape}, {"placements", src_spec}, {"requires_grad", true}},
       {{"name", "c"}, {"shape", {rows, 4}}, {"placements", {"R"}}}});
  return {{"format", "meshsim.scenario/1"}, {"name", op}, {"mesh", {{"axes", {"a"}}, {"shape", {n}}}},
          {"inputs", inputs}, {"program", program}, {"backward", "loss"}};
}

json run(const json& doc) {
  const Scenario sc = parse_scenario(doc, "test.json");
  return check_scenario(sc, sc.options).result;
}

TEST(Scatter, AnIndexOutOfRangeIsRefusedWithItsValueRankAndRange) {
  // Positions along dim 0 of x [5, 4] must lie in [0, 5): ids drawn in [0, 9) reach past it.
  const json r = run(scenario("scatter_add", 0, {7, 4}, {7, 4}, {{"ids", 9}}, {"R"}, {"S(0)"}, {"S(0)"}));
  ASSERT_EQ(r["status"], "error") << r.dump(1);
  const std::string msg = r["error"]["message"];
  EXPECT_NE(msg.find("/program/0/args/1: scatter_add: \"i\" holds"), std::string::npos) << msg;
  EXPECT_NE(msg.find("outside [0, 5)"), std::string::npos) << msg;
}

TEST(Scatter, ShapesThatDoNotFitNameTheOpAndTheShapes) {
  auto message = [](const json& doc) {
    const json r = run(doc);
    EXPECT_EQ(r["status"], "error") << r.dump(1);
    return r["error"]["message"].get<std::string>();
  };
  EXPECT_NE(message(scenario("scatter", 0, {3, 4}, {3, 2}, {{"ids", 5}}, {"R"}, {"R"}, {"R"}))
                .find("scatter: src [3, 2] must have the index's shape [3, 4]"),
            std::string::npos);
  EXPECT_NE(message(scenario("scatter_add", 0, {2, 6}, {2, 6}, {{"ids", 5}}, {"R"}, {"R"}, {"R"}))
                .find("is larger than x [5, 4] on dim 1"),
            std::string::npos);
  EXPECT_NE(message(scenario("index_add", 1, {3}, {5, 2}, {{"ids", 4}}, {"R"}, {"R"}, {"R"}))
                .find("index_add: the source [5, 2] must be x [5, 4] with the index's length 3 on dim 1: [5, 3]"),
            std::string::npos);
}

TEST(Scatter, ASharedIndexAddsEachRanksPartIntoAPartialX) {
  // scatter_add of x [5, 4] R with the index and src [7, 4] S(0) on 3 ranks (3, 2, 2 rows): x is
  // made P(sum) (divided), each rank adds its rows of src, the result is P(sum); index_add of
  // source [7, 4] S(0) by a 1-D index S(0) alike.
  const json r = run(scenario("scatter_add", 0, {7, 4}, {7, 4}, {{"ids", 5}}, {"R"}, {"S(0)"}, {"S(0)"}));
  ASSERT_EQ(r["status"], "pass") << r.dump(1);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"P(sum)"})) << r.dump(1);
  EXPECT_EQ(r["grads"]["s"]["placements"], json::array({"S(0)"})) << r.dump(1);
  const json a = run(scenario("index_add", 0, {7}, {7, 4}, {{"ids", 5}}, {"R"}, {"S(0)"}, {"S(0)"}));
  ASSERT_EQ(a["status"], "pass") << a.dump(1);
  EXPECT_EQ(a["values"]["y"]["placements"], json::array({"P(sum)"})) << a.dump(1);
}

TEST(Scatter, XIndexAndSrcShardedAlikeOnAnotherDimKeepTheShard) {
  // Along dim 0, all three S(1) on 3 ranks (2, 1, 1 columns): no communication, the shard kept.
  const json r = run(scenario("scatter", 0, {3, 4}, {3, 4}, {{"ids", 5}}, {"S(1)"}, {"S(1)"}, {"S(1)"}));
  ASSERT_EQ(r["status"], "pass") << r.dump(1);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"S(1)"})) << r.dump(1);
  EXPECT_TRUE(r["collectives"].empty() || r["collectives"][0]["phase"] != "forward") << r.dump(1);
}

TEST(Scatter, ThePlantedBugKeepsEachRanksOwnSum) {
  // x [5, 4] R, the index and src [6, 4] S(0) on 2 ranks: the correct row makes x P(sum); under the
  // bug each rank's x plus its own 3 rows of src is labelled R, so rank 0's result stands for all.
  json doc = scenario("scatter_add", 0, {6, 4}, {6, 4}, {{"ids", 5}}, {"R"}, {"S(0)"}, {"S(0)"}, 2);
  EXPECT_EQ(run(doc)["status"], "pass");
  doc["options"] = {{"mutant", "scatter_add_sharded_index_replicated"}};
  const json r = run(doc);
  ASSERT_EQ(r["status"], "fail") << r.dump(1);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"R"})) << r.dump(1);
  ASSERT_FALSE(r["failures"].empty()) << r.dump(1);
  const std::string f = r["failures"][0];
  EXPECT_EQ(f.rfind("y: ", 0), 0u) << f;
  EXPECT_NE(f.find("greatest difference"), std::string::npos) << f;
}

}  // namespace
}  // namespace meshsim

// all_to_all with split sizes (issue #31): all_to_all_single's uneven rows of dim 0 in a local_map
// body, the sizes computed from the data and exchanged by an equal all_to_all of counts, as
// expert-parallel code does. Each row goes to a destination rank drawn per row; the receiver scales
// what it gets by its own row of a sharded weight, and a second all_to_all with the transposed
// sizes brings the rows home. Checked against the oracle (x * ws[dest]) with gradients on meshes
// [3], [4] and [2, 2] (over either axis) with uneven row counts and zero-size splits; the refusals name the op, the
// ranks and the numbers; the planted bug all_to_all_split_backward_untransposed is caught.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/scenario.h"
#include "oracles/check.h"
#include "sim/collectives.h"

namespace meshsim {
namespace {

using json = nlohmann::json;

json op(const std::string& out, const std::string& name, const std::vector<std::string>& args, json attrs = json::object()) {
  json o = {{"out", out}, {"op", name}, {"args", args}};
  for (auto& [k, v] : attrs.items()) o[k] = v;
  return o;
}

// Rows of x [rows, 3] (placements `x_spec`, dim 0 sharded on the all_to_all's axis, "a" or `axis`) go to the
// ranks `dest` names (ids in [0, n), laid out as x's rows); ws [n, 3] is S(0) on that axis. `how` changes
// the body for the refusals: "" as written, "same" passes the input sizes as the output sizes,
// "negative" and "plus_one" change the input sizes, "float" passes float sizes, "two_args" drops one.
json scenario(const json& mesh, const json& x_spec, const json& ws_spec, int64_t rows, const std::string& how = "",
              const std::string& axis = "a") {
  const bool two_d = mesh.size() == 2;
  const int64_t n = mesh[axis == "a" ? 0 : 1].get<int64_t>();
  const json axes = two_d ? json{"a", "b"} : json{"a"};
  const json r_spec = two_d ? json{"R", "R"} : json{"R"};
  json inputs = json::array({
      {{"name", "x"}, {"shape", {rows, 3}}, {"placements", x_spec}, {"requires_grad", true}},
      {{"name", "dest"}, {"shape", {rows}}, {"placements", x_spec}, {"dtype", "int64"}, {"init", {{"ids", n}}}},
      {{"name", "ws"}, {"shape", {n, 3}}, {"placements", ws_spec}, {"requires_grad", true}},
      {{"name", "ranks"}, {"shape", {n}}, {"placements", r_spec}, {"dtype", "int64"}, {"init", "arange"}},
      {{"name", "ranks_f"}, {"shape", {n}}, {"placements", r_spec}, {"init", "arange"}},
      {{"name", "one_f"}, {"shape", {1}}, {"placements", r_spec}, {"init", "ones"}},
  });
  std::string in_sizes = "counts", out_sizes = "recv";
  json body = json::array({
      op("dcol", "unsqueeze", {"dest"}, {{"dim", 1}}),
      op("hot", "eq", {"dcol", "ranks"}),
      op("zero_f", "scale", {"one_f"}, {{"value", 0}}),
      op("hot_f", "where", {"hot", "one_f", "zero_f"}),
      op("keyed", "mul", {"hot_f", "ranks_f"}),
      op("key", "sum", {"keyed"}, {{"dim", 1}}),
      op("perm", "argsort", {"key"}, {{"dim", 0}}),  // stable: rows keep their order per destination
      op("x_sorted", "index_select", {"x", "perm"}, {{"dim", 0}}),
      op("zero_n", "mul", {"ranks"}, {{"value", 0}}),
      op("zero_rows", "mul", {"dest"}, {{"value", 0}}),
      op("one_per_row", "add", {"zero_rows"}, {{"value", 1}}),
      // Rows per destination (bincount), exchanged by an equal all_to_all of the counts.
      op("counts", "scatter_add", {"zero_n", "dest", "one_per_row"}, {{"dim", 0}}),
  });
  body.push_back(op("recv", "all_to_all", {"counts"}, {{"axis", axis}}));
  if (how == "same") out_sizes = "counts";
  if (how == "negative") {
    body.push_back(op("bad", "mul", {"counts"}, {{"value", -1}}));
    in_sizes = "bad";
  }
  if (how == "plus_one") {
    body.push_back(op("bad", "add", {"counts"}, {{"value", 1}}));
    in_sizes = "bad";
  }
  if (how == "float") in_sizes = "key";
  std::vector<std::string> args = {"x_sorted", in_sizes, out_sizes};
  if (how == "two_args") args.pop_back();
  body.push_back(op("routed", "all_to_all", args, {{"axis", axis}}));
  body.push_back(op("scaled", "mul", {"routed", "ws"}));
  body.push_back(op("back", "all_to_all", {"scaled", "recv", "counts"}, {{"axis", axis}}));
  body.push_back(op("zero_y", "scale", {"x"}, {{"value", 0}}));
  body.push_back(op("y_local", "index_add", {"zero_y", "perm", "back"}, {{"dim", 0}}));
  const json reference = json::array({
      op("w_rows", "index_select", {"ws", "dest"}, {{"dim", 0}}),
      op("y_local", "mul", {"x", "w_rows"}),
  });
  json lm = {{"out", "y"},
             {"op", "local_map"},
             {"args", {"x", "dest", "ws", "ranks", "ranks_f", "one_f"}},
             {"out_placements", json::array({x_spec})},
             {"body", body},
             {"returns", {"y_local"}},
             {"reference", reference}};
  json program = json::array({lm, op("s", "sum", {"y"})});
  return {{"format", "meshsim.scenario/1"}, {"name", "all_to_all_split"}, {"mesh", {{"axes", axes}, {"shape", mesh}}},
          {"inputs", inputs}, {"program", program}, {"backward", "s"}};
}

json run(const json& doc) {
  const Scenario sc = parse_scenario(doc, "test.json");
  return check_scenario(sc, sc.options).result;
}

// The split sizes a run used, from the routed value's local shapes: whether some rank received
// nothing from some sender is not visible there, so the tests count empty receivers instead.
int64_t empty_receivers(const json& r) {
  int64_t n = 0;
  for (const auto& s : r["values"]["routed"]["local_shapes"]) n += s[0].get<int64_t>() == 0;
  return n;
}

TEST(AllToAllSplit, UnevenSplitsMatchTheOracleOnMeshes3And4And2x2) {
  size_t cases = 0;
  bool uneven = false;
  for (const json& mesh : {json{3}, json{4}})
    for (int64_t rows : {7, 12, 2})
      for (int seed : {0, 1}) {
        json doc = scenario(mesh, {"S(0)"}, {"S(0)"}, rows);
        doc["options"] = {{"seed", seed}};
        const json r = run(doc);
        ASSERT_EQ(r["status"], "pass") << mesh << " rows " << rows << " seed " << seed << r.dump(1);
        const auto& shapes = r["values"]["routed"]["local_shapes"];
        for (const auto& s : shapes) uneven |= s != shapes[0];
        ++cases;
      }
  // [2, 2]: the all_to_all over "a"; x's rows sharded on "b" too, or replicated there.
  for (const json& x_spec : {json{"S(0)", "R"}, json{"S(0)", "S(0)"}})
    for (int64_t rows : {7, 8, 5}) {
      const json r = run(scenario({2, 2}, x_spec, {"S(0)", "R"}, rows));
      ASSERT_EQ(r["status"], "pass") << x_spec << " rows " << rows << r.dump(1);
      ++cases;
    }
  // Over the inner axis "b" of [2, 2]: groups of ranks {0, 1} and {2, 3}, x's rows sharded on "a" too.
  for (const json& x_spec : {json{"R", "S(0)"}, json{"S(0)", "S(0)"}})
    for (int64_t rows : {7, 8, 5}) {
      const json r = run(scenario({2, 2}, x_spec, {"R", "S(0)"}, rows, "", "b"));
      ASSERT_EQ(r["status"], "pass") << "axis b " << x_spec << " rows " << rows << r.dump(1);
      ++cases;
    }
  EXPECT_TRUE(uneven);
  EXPECT_EQ(cases, 24u);
}

TEST(AllToAllSplit, ZeroSizeSplitsAndEmptyLocalsMove) {
  // 2 rows over 4 ranks: two ranks hold no rows (their sizes all 0) and at least two receive none.
  const json r = run(scenario({4}, {"S(0)"}, {"S(0)"}, 2));
  ASSERT_EQ(r["status"], "pass") << r.dump(1);
  EXPECT_GE(empty_receivers(r), 2) << r.dump(1);
  // The forward moves of the split all_to_all and their backward, each over "a".
  int forward = 0, backward = 0;
  for (const auto& c : r["collectives"])
    if (c["op"] == "all_to_all") (c["phase"] == "forward" ? forward : backward) += 1;
  EXPECT_EQ(forward, 3) << r.dump(1);  // counts, routed, back
  EXPECT_EQ(backward, 2) << r.dump(1);
}

TEST(AllToAllSplit, TheSimulationsMoveIsTheTableAndItsTransposeUndoesIt) {
  // Member k's rows to member s, in order: 3 members with a zero row and a zero column.
  const SplitTable sends = {{1, 0, 2}, {0, 0, 0}, {2, 1, 0}};
  Locals group = {at::arange(3, at::kDouble), at::zeros({0}, at::kDouble), at::arange(10, 13, at::kDouble)};
  const Locals out = all_to_all_split(group, sends);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(at::equal(out[0], at::tensor({0.0, 10.0, 11.0}, at::kDouble)));
  EXPECT_EQ(out[1].size(0), 1);
  EXPECT_TRUE(at::equal(out[1], at::tensor({12.0}, at::kDouble)));
  EXPECT_TRUE(at::equal(out[2], at::tensor({1.0, 2.0}, at::kDouble)));
  const Locals back = all_to_all_split(out, transposed(sends));
  for (size_t k = 0; k < group.size(); ++k) EXPECT_TRUE(at::equal(back[k], group[k])) << k;
}

TEST(AllToAllSplit, PlainLocalCodeBetweenToLocalAndFromLocalMovesAndComesBack) {
  // DTensor mode's local code: the rows per destination counted, exchanged, moved there and back;
  // the oracle reads local code's collectives as the identity, which the round trip is.
  json doc = scenario({4}, {"S(0)"}, {"S(0)"}, 10);
  json program = json::array({op("xl", "to_local", {"x"}), op("dl", "to_local", {"dest"}), op("rl", "to_local", {"ranks"}),
                              op("zn", "mul", {"rl"}, {{"value", 0}}), op("zr", "mul", {"dl"}, {{"value", 0}}),
                              op("one", "add", {"zr"}, {{"value", 1}}),
                              op("counts", "scatter_add", {"zn", "dl", "one"}, {{"dim", 0}}),
                              op("recv", "all_to_all", {"counts"}, {{"axis", "a"}}),
                              op("there", "all_to_all", {"xl", "counts", "recv"}, {{"axis", "a"}}),
                              op("back", "all_to_all", {"there", "recv", "counts"}, {{"axis", "a"}}),
                              op("y", "from_local", {"back"}, {{"placements", {"S(0)"}}}), op("s", "sum", {"y"})});
  doc["program"] = program;
  const json r = run(doc);
  ASSERT_EQ(r["status"], "pass") << r.dump(1);
  EXPECT_NE(r["values"]["there"]["local_shapes"], r["values"]["xl"]["local_shapes"]) << r.dump(1);
  // One way only: from_local asserts S(0) of rows that moved, and the oracle's identity says so.
  doc["program"][10]["args"] = {"there"};
  EXPECT_EQ(run(doc)["status"], "fail");
}

std::string refusal(const json& doc, const std::string& kind) {
  const json r = run(doc);
  EXPECT_EQ(r["status"], "error") << r.dump(1);
  EXPECT_EQ(r["error"]["kind"], kind) << r.dump(1);
  return r["error"].value("message", "");
}

TEST(AllToAllSplit, SizesThatDoNotFitAreRefusedNamingTheRanksAndTheNumbers) {
  // The output sizes not exchanged: each rank takes its input sizes for its output sizes.
  const std::string same = refusal(scenario({3}, {"S(0)"}, {"S(0)"}, 12, "same"), "shape_mismatch");
  EXPECT_NE(same.find("/program/0/body/"), std::string::npos) << same;
  EXPECT_NE(same.find("all_to_all over \"a\": rank "), std::string::npos) << same;
  EXPECT_NE(same.find("rows to rank "), std::string::npos) << same;
  EXPECT_NE(same.find("expects "), std::string::npos) << same;
  EXPECT_NE(same.find("(output_split_sizes \"counts\" ["), std::string::npos) << same;
  const std::string neg = refusal(scenario({3}, {"S(0)"}, {"S(0)"}, 12, "negative"), "shape_mismatch");
  EXPECT_NE(neg.find("input_split_sizes \"bad\" holds -"), std::string::npos) << neg;
  EXPECT_NE(neg.find("a split size is never negative"), std::string::npos) << neg;
  const std::string sum = refusal(scenario({3}, {"S(0)"}, {"S(0)"}, 12, "plus_one"), "shape_mismatch");
  EXPECT_NE(sum.find("input_split_sizes \"bad\" on rank 0 are ["), std::string::npos) << sum;
  EXPECT_NE(sum.find("summing to 7, but \"x_sorted\" has 4 rows there (dim 0)"), std::string::npos) << sum;
  const std::string f = refusal(scenario({3}, {"S(0)"}, {"S(0)"}, 12, "float"), "invalid_scenario");
  EXPECT_NE(f.find("input_split_sizes \"key\" is Double on rank 0, split sizes are int64"), std::string::npos) << f;
  const std::string two = refusal(scenario({3}, {"S(0)"}, {"S(0)"}, 12, "two_args"), "invalid_scenario");
  EXPECT_NE(two.find("all_to_all takes x alone (equal splits) or x, input_split_sizes and output_split_sizes"),
            std::string::npos)
      << two;
  json dims = scenario({3}, {"S(0)"}, {"S(0)"}, 12);
  for (auto& o : dims["program"][0]["body"])
    if (o["out"] == "routed") o["split_dim"] = 1;
  EXPECT_NE(refusal(dims, "invalid_scenario").find("/split_dim: all_to_all with split sizes moves rows of dim 0"),
            std::string::npos);
}

TEST(AllToAllSplit, ThePlantedBugMovesTheGradientByTheForwardsSizes) {
  json doc = scenario({3}, {"S(0)"}, {"S(0)"}, 12);
  doc["options"] = {{"mutant", "all_to_all_split_backward_untransposed"}};
  const json r = run(doc);
  // The gradient of "back" arrives with the rows it sent and is split by the sizes it received:
  // the ranks' counts differ, so the move runs past a local (as PyTorch's all_to_all_single
  // refuses sizes that do not sum to the extent), localized at that op's backward.
  ASSERT_EQ(r["status"], "fail") << r.dump(1);
  EXPECT_EQ(r["first_divergence"]["phase"], "backward") << r.dump(1);
  EXPECT_EQ(r["first_divergence"]["body"]["name"], "all_to_all") << r.dump(1);
  EXPECT_EQ(r["first_divergence"]["body"]["out"], "back") << r.dump(1);
}

}  // namespace
}  // namespace meshsim

// Imported programs (docs/import.md): the scenario's `source`, `recorded` and `imported` fields
// read and checked at their JSON paths; `meshsim run`'s comparison of PyTorch's recorded choices
// with its own (result "recorded"), which must name each place they differ with bytes and stay
// silent where they agree; the user's source on a failing run's first divergence and mismatches.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "core/scenario.h"
#include "oracles/check.h"

namespace meshsim {
namespace {

using json = nlohmann::json;

// A two-layer TP MLP as PyTorch runs it: colwise w1 (h is S(1)), rowwise w2 (y is P(sum) until
// the explicit redistribute to R). Its recorded choices are PyTorch's; x needs no gradient, so the
// backward communicates nothing (R -> P(sum) is local).
json mlp() {
  return json::parse(R"js({
    "format": "meshsim.scenario/1", "name": "imported_mlp", "mesh": {"axes": ["tp"], "shape": [2]},
    "imported": {"system": "pytorch", "version": "2.15.0", "file": "m.py", "function": "build", "mesh": "tp=2",
                 "backward_collectives": []},
    "inputs": [
      {"name": "x", "shape": [4, 8], "placements": ["R"], "source": {"file": "m.py", "line": 3}},
      {"name": "w1", "shape": [8, 8], "placements": ["S(1)"], "requires_grad": true, "source": {"module": "fc1"}},
      {"name": "w2", "shape": [8, 8], "placements": ["S(0)"], "requires_grad": true, "source": {"module": "fc2"}}],
    "program": [
      {"out": "h", "op": "mm", "args": ["x", "w1"], "recorded": {"placements": ["S(1)"]},
       "source": {"module": "fc1", "file": "m.py", "line": 10, "code": "h = x @ self.w1"}},
      {"out": "y", "op": "mm", "args": ["h", "w2"], "recorded": {"placements": ["P(sum)"]},
       "source": {"module": "fc2", "file": "m.py", "line": 11}},
      {"out": "yr", "op": "redistribute", "args": ["y"], "placements": ["R"], "recorded": {"placements": ["R"]}},
      {"out": "loss", "op": "sum", "args": ["yr"]}],
    "backward": "loss"})js");
}

json run_doc(const json& doc) {
  const Scenario sc = parse_scenario(doc, "imported.json");
  return check_scenario(sc, sc.options).result;
}

std::string parse_error(const json& doc) {
  try {
    parse_scenario(doc, "imported.json");
  } catch (const InputError& e) {
    return e.json_path() + ": " + e.detail();
  }
  return "";
}

TEST(Imported, FieldsAreRead) {
  const Scenario sc = parse_scenario(mlp(), "imported.json");
  EXPECT_TRUE(sc.imported.present);
  EXPECT_EQ(sc.imported.label(), "PyTorch");
  EXPECT_TRUE(sc.imported.backward_recorded);
  EXPECT_TRUE(sc.imported.backward_collectives.empty());
  EXPECT_EQ(sc.inputs[0].source.where(), "m.py:3");
  EXPECT_EQ(sc.inputs[1].source.where(), "fc1");
  EXPECT_EQ(sc.program[0].source.where(), "m.py:10 (fc1)");
  EXPECT_EQ(sc.program[0].source.code, "h = x @ self.w1");
  ASSERT_TRUE(sc.program[1].recorded.present);
  EXPECT_EQ(sc.program[1].recorded.placements.at(0).at(0)->str(), "P(sum)");
  EXPECT_FALSE(sc.program[3].recorded.present);
}

TEST(Imported, MalformedFieldsNameTheirPath) {
  json d = mlp();
  d["program"][0]["recorded"]["placements"] = json::array({"S(1)", "R"});
  EXPECT_NE(parse_error(d).find("/program/0/recorded/placements: expected 1 placements"), std::string::npos) << parse_error(d);
  d = mlp();
  d["program"][1]["recorded"]["collectives"] = json::parse(R"js([{"arg": 2, "from": ["S(1)"], "to": ["R"]}])js");
  EXPECT_NE(parse_error(d).find("/program/1/recorded/collectives/0/arg: the op has 2 operands"), std::string::npos)
      << parse_error(d);
  d = mlp();
  d["program"][0]["source"] = json::parse(R"js({"line": 3})js");
  EXPECT_NE(parse_error(d).find("/program/0/source/line: a line needs the file"), std::string::npos) << parse_error(d);
  d = mlp();
  d["inputs"][0]["source"]["column"] = 4;
  EXPECT_NE(parse_error(d).find("/inputs/0/source/column: unknown field"), std::string::npos) << parse_error(d);
  d = mlp();
  d["imported"].erase("system");
  EXPECT_NE(parse_error(d).find("/imported/system: missing required field"), std::string::npos) << parse_error(d);
  d = mlp();
  d["program"][0]["recorded"]["placements"] = json::array({"Q(1)"});
  EXPECT_NE(parse_error(d).find("/program/0/recorded/placements/0"), std::string::npos) << parse_error(d);
}

TEST(Imported, AgreeingChoicesAreSilent) {
  const json r = run_doc(mlp());
  ASSERT_EQ(r["status"], "pass") << r.dump(1);
  const json& rec = r["recorded"];
  EXPECT_EQ(rec["system"], "pytorch");
  EXPECT_EQ(rec["compared"]["ops"], 3);
  EXPECT_EQ(rec["compared"]["placements"], 3);
  EXPECT_EQ(rec["compared"]["backward_collectives"], 0);
  EXPECT_TRUE(rec["differences"].empty()) << rec.dump(1);
}

TEST(Imported, EveryDifferenceIsNamedWithBytes) {
  json d = mlp();
  // PyTorch "chose" R for y and gathered w2 first: a planted difference of each kind.
  d["program"][1]["recorded"] = json::parse(R"js({"placements": ["R"], "collectives": [{"arg": 1, "from": ["S(0)"], "to": ["R"]}]})js");
  d["imported"]["backward_collectives"] = json::parse(R"js([{"op": "reduce_scatter", "axis": "tp", "count": 2}])js");
  const json r = run_doc(d);
  const json& diffs = r["recorded"]["differences"];
  ASSERT_EQ(diffs.size(), 3u) << diffs.dump(1);
  EXPECT_EQ(diffs[0]["kind"], "placement");
  EXPECT_EQ(diffs[0]["value"], "y");
  EXPECT_EQ(diffs[0]["meshsim"], json::array({"P(sum)"}));
  EXPECT_EQ(diffs[0]["source"]["line"], 11);
  EXPECT_EQ(diffs[0]["message"], "value \"y\" of mm \"y\" at /program/1, m.py:11 (fc2): PyTorch chose [R], meshsim [P(sum)]");
  EXPECT_EQ(diffs[1]["kind"], "move");
  EXPECT_EQ(diffs[1]["operand"], "w2");
  // w2 is [8, 8] float64 over 2 ranks: an all_gather moves half of 512 B.
  EXPECT_EQ(diffs[1]["recorded"]["bytes"], 256);
  EXPECT_TRUE(diffs[1]["meshsim"].is_null());
  EXPECT_EQ(r["recorded"]["bytes"]["recorded"], 256);
  // meshsim's backward communicates nothing; PyTorch's (planted) reduce_scatters twice.
  EXPECT_EQ(diffs[2]["kind"], "backward_collectives");
  EXPECT_EQ(diffs[2]["collective"], "reduce_scatter");
  EXPECT_EQ(diffs[2]["recorded"], 2);
  EXPECT_EQ(diffs[2]["meshsim"], 0);
}

TEST(Imported, MeshsimsOwnMoveIsComparedToTheRecordedOne) {
  json d = mlp();
  // h arrives S(1); an add with a replicated bias needs no move, but with x's S(0) copy the planner
  // must move one operand. PyTorch recorded none: a difference with meshsim's bytes.
  d["inputs"].push_back(json::parse(R"js({"name": "z", "shape": [4, 8], "placements": ["S(0)"]})js"));
  d["program"].insert(d["program"].begin() + 1,
                      json::parse(R"js({"out": "hz", "op": "add", "args": ["h", "z"], "recorded": {"placements": ["S(1)"]}})js"));
  d["program"][2]["args"][0] = "hz";
  const json r = run_doc(d);
  ASSERT_EQ(r["status"], "pass") << r.dump(1);
  bool found = false;
  for (const auto& diff : r["recorded"]["differences"])
    if (diff["kind"] == "move" && diff["program_op"] == "/program/1") {
      found = true;
      EXPECT_TRUE(diff["recorded"].is_null());
      EXPECT_GT(diff["meshsim"]["bytes"].get<int64_t>(), 0) << diff.dump(1);
    }
  EXPECT_TRUE(found) << r["recorded"].dump(1);
}

TEST(Imported, AFailureNamesTheUsersSource) {
  json d = mlp();
  d["options"] = {{"mutant", "mm_s1_s0_labelled_r"}};
  const json r = run_doc(d);
  ASSERT_EQ(r["status"], "fail") << r.dump(1);
  ASSERT_TRUE(r.contains("first_divergence")) << r.dump(1);
  const json& fd = r["first_divergence"];
  ASSERT_TRUE(fd.contains("source")) << fd.dump(1);
  EXPECT_NE(fd["message"].get<std::string>().find("[m.py:"), std::string::npos) << fd.dump(1);
  ASSERT_TRUE(r.contains("mismatches"));
  EXPECT_TRUE(r["mismatches"][0].contains("source")) << r["mismatches"].dump(1);
}

// A linear runs as a transpose, a matmul and an add: its moves are compared by operand value, so
// the add's move of the matmul's own result is not taken for a move of x.
TEST(Imported, MovesAreComparedByOperandNotByThePartsIndex) {
  json d = json::parse(R"js({
    "format": "meshsim.scenario/1", "name": "lin", "mesh": {"axes": ["tp"], "shape": [2]},
    "imported": {"system": "pytorch"},
    "inputs": [{"name": "x", "shape": [4, 8], "placements": ["S(0)"]},
               {"name": "w", "shape": [6, 8], "placements": ["S(1)"], "requires_grad": true},
               {"name": "b", "shape": [6], "placements": ["S(0)"], "requires_grad": true}],
    "program": [{"out": "y", "op": "linear", "args": ["x", "w", "b"],
                 "recorded": {"collectives": [{"arg": 0, "from": ["S(0)"], "to": ["S(1)"]}]}},
                {"out": "loss", "op": "sum", "args": ["y"]}],
    "backward": "loss"})js");
  const json r = run_doc(d);
  ASSERT_EQ(r["status"], "pass") << r.dump(1);
  for (const auto& diff : r["recorded"]["differences"]) EXPECT_NE(diff["kind"], "move") << diff.dump(1);
  // The same move costs the same on both sides: the recorded one by the run's own byte count.
  EXPECT_EQ(r["recorded"]["bytes"]["recorded"], r["recorded"]["bytes"]["meshsim"]);
  EXPECT_EQ(r["recorded"]["compared"]["moves"], 1);
}

// The recorded move's bytes are what meshsim's collectives move for it (padded uneven pieces).
TEST(Imported, RecordedBytesAreTheRunsOwnCount) {
  json d = json::parse(R"js({
    "format": "meshsim.scenario/1", "name": "unev", "mesh": {"axes": ["tp"], "shape": [4]},
    "inputs": [{"name": "x", "shape": [5, 3], "placements": ["S(0)"]}],
    "program": [{"out": "g", "op": "redistribute", "args": ["x"], "placements": ["R"]},
                {"out": "y", "op": "relu", "args": ["x"],
                 "recorded": {"collectives": [{"arg": 0, "from": ["S(0)"], "to": ["R"]}]}}]})js");
  const json r = run_doc(d);
  int64_t gathered = 0;
  for (const auto& c : r["collectives"])
    if (c["value"] == "g") gathered += c["bytes"].get<int64_t>();
  ASSERT_GT(gathered, 0) << r.dump(1);
  EXPECT_EQ(r["recorded"]["differences"][0]["recorded"]["bytes"], gathered) << r["recorded"].dump(1);
}

TEST(Imported, MovesOfTheProgramsOwnAreNotRecorded) {
  json d = mlp();
  d["program"][2]["recorded"]["collectives"] = json::parse(R"js([{"arg": 0, "from": ["P(sum)"], "to": ["R"]}])js");
  EXPECT_NE(parse_error(d).find("/program/2/recorded/collectives: redistribute moves its operands"), std::string::npos)
      << parse_error(d);
  d = mlp();
  d["program"][1]["recorded"]["collectives"] =
      json::parse(R"js([{"arg": 1, "from": ["S(0)"], "to": ["R"]}, {"arg": 1, "from": ["S(0)"], "to": ["R"]}])js");
  EXPECT_NE(parse_error(d).find("/program/1/recorded/collectives/1/arg: operand 1 is moved once per op"),
            std::string::npos)
      << parse_error(d);
}

TEST(Imported, ScenariosWithoutTheFieldsAreUnchanged) {
  json d = mlp();
  d.erase("imported");
  for (auto& in : d["inputs"]) in.erase("source");
  for (auto& op : d["program"]) {
    op.erase("source");
    op.erase("recorded");
  }
  const json r = run_doc(d);
  EXPECT_FALSE(r.contains("recorded"));
}

}  // namespace
}  // namespace meshsim

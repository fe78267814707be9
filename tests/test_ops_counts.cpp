// clamp (float with its gradient, and int64), one_hot, bincount and arange's start, end and step,
// on every placement of meshes [3], [4] and [2, 2] against the oracle, on uneven shapes; their
// placements by the rules (clamp's pointwise rows, one_hot's kept shards and whole new dim,
// bincount's S(0) -> P(sum)); their refusals name the op, the field and the numbers.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/scenario.h"
#include "oracles/check.h"

namespace meshsim {
namespace {

using json = nlohmann::json;

json doc_on(const json& mesh, const json& inputs, const json& program, bool backward = false) {
  const json axes = mesh.size() == 1 ? json::array({"a"}) : json::array({"a", "b"});
  json doc = {{"format", "meshsim.scenario/1"}, {"name", "counts"}, {"mesh", {{"axes", axes}, {"shape", mesh}}},
              {"inputs", inputs}, {"program", program}};
  if (backward) doc["backward"] = "loss";
  return doc;
}

json run(const json& doc) {
  const Scenario sc = parse_scenario(doc, "test.json");
  return check_scenario(sc, sc.options).result;
}

// Every spec of `one` per axis: [3] and [4] one axis, [2, 2] two.
std::vector<std::pair<json, json>> meshes_and_specs(const std::vector<std::string>& one) {
  std::vector<std::pair<json, json>> out;
  for (const json& mesh : {json{3}, json{4}})
    for (const auto& p : one) out.push_back({mesh, json{p}});
  for (const auto& p : one)
    for (const auto& q : one) out.push_back({json{2, 2}, json{p, q}});
  return out;
}

const std::vector<json> kBounds = {{{"min", -1}}, {{"max", 1}}, {{"min", -1}, {"max", 2}}, {{"min", 1}, {"max", -1}}};

TEST(Clamp, FloatValuesAndGradientsMatchTheOracleOnEveryPlacement) {
  // x [5, 3] of small integers (on the bounds often: the gradient passes there, as torch's
  // clamp_backward), uneven on 2, 3 and 4 ranks, in every placement a float takes; the loss
  // weighs y by c so that the gradient is not uniform. A Partial operand is reduced first (clamp
  // is not linear): the result is never Partial.
  const std::vector<std::string> one = {"S(0)", "S(1)", "R", "Rd", "P(sum)", "P(avg)"};
  size_t cases = 0;
  for (const auto& bounds : kBounds)
    for (const auto& [mesh, spec] : meshes_and_specs(one)) {
      json y = {{"out", "y"}, {"op", "clamp"}, {"args", {"x"}}};
      y.update(bounds);
      const json doc = doc_on(mesh,
                              {{{"name", "x"}, {"shape", {5, 3}}, {"placements", spec}, {"requires_grad", true}},
                               {{"name", "c"}, {"shape", {5, 3}}, {"placements", spec.size() == 1 ? json{"R"} : json{"R", "R"}}}},
                              {y,
                               {{"out", "w"}, {"op", "mul"}, {"args", {"y", "c"}}},
                               {{"out", "loss"}, {"op", "sum"}, {"args", {"w"}}}},
                              true);
      const json r = run(doc);
      ASSERT_EQ(r["status"], "pass") << bounds << " " << mesh << " " << spec << r.dump(1);
      for (size_t a = 0; a < spec.size(); ++a) {
        const std::string got = r["values"]["y"]["placements"][a];
        const std::string given = spec[a];
        if (given[0] == 'S') {
          EXPECT_EQ(got, given) << bounds << spec;
        }
        EXPECT_NE(got[0], 'P') << bounds << spec;
      }
      ++cases;
    }
  EXPECT_EQ(cases, 4u * (2 * 6 + 36));
}

TEST(Clamp, Int64ValuesMatchTheOracleAndStayInt64) {
  const std::vector<std::string> one = {"S(0)", "S(1)", "R", "Rd"};
  for (const auto& bounds : kBounds)
    for (const auto& [mesh, spec] : meshes_and_specs(one)) {
      json y = {{"out", "y"}, {"op", "clamp"}, {"args", {"x"}}};
      y.update(bounds);
      const json r = run(doc_on(mesh, {{{"name", "x"}, {"shape", {5, 3}}, {"placements", spec}, {"dtype", "int64"}}},
                                {y, {{"out", "z"}, {"op", "add"}, {"args", {"y", "x"}}}}));
      ASSERT_EQ(r["status"], "pass") << bounds << " " << mesh << " " << spec << r.dump(1);
    }
}

TEST(Clamp, TheGradientPassesOnTheBoundsAndStopsOutside) {
  // x = arange(5) - 2 = [-2, -1, 0, 1, 2] clamped to [-1, 1]: y = [-1, -1, 0, 1, 1], the
  // gradient of sum(y) [0, 1, 1, 1, 0] (on the bounds included), S(0) on 3 ranks.
  const json doc = doc_on({3}, {{{"name", "x0"}, {"shape", {5}}, {"placements", {"S(0)"}}, {"init", "arange"}, {"requires_grad", true}}},
                          {{{"out", "x"}, {"op", "sub"}, {"args", {"x0"}}, {"value", 2}},
                           {{"out", "y"}, {"op", "clamp"}, {"args", {"x"}}, {"min", -1}, {"max", 1}},
                           {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}},
                          true);
  const Scenario sc = parse_scenario(doc, "test.json");
  const CheckedRun r = check_scenario(sc, sc.options, /*keep_values=*/true);
  ASSERT_EQ(r.result["status"], "pass") << r.result.dump(1);
  ASSERT_TRUE(r.tensors);
  bool value = false, grad = false;
  for (const auto& v : r.tensors->values)
    if (v.name == "y") {
      value = true;
      const std::vector<double> want = {-1, -1, 0, 1, 1};
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(v.global[static_cast<int64_t>(i)].item<double>(), want[i]) << i;
    }
  for (const auto& g : r.tensors->grads)
    if (g.name == "x0") {
      grad = true;
      const std::vector<double> want = {0, 1, 1, 1, 0};
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(g.global[static_cast<int64_t>(i)].item<double>(), want[i]) << i;
    }
  EXPECT_TRUE(value && grad);
}

TEST(OneHot, EveryPlacementKeepsItsShardsAndTheNewDimWhole) {
  // x [5, 3] of ids in [0, 4), num_classes 4 and 6: y [5, 3, C]; a shard of dim 0 or 1 stays, the
  // new dim 2 is never sharded; then y summed over dim 0 (int64 sums) to read it back.
  const std::vector<std::string> one = {"S(0)", "S(1)", "R", "Rd"};
  size_t cases = 0;
  for (int64_t classes : {4, 6})
    for (const auto& [mesh, spec] : meshes_and_specs(one)) {
      const json r = run(doc_on(
          mesh, {{{"name", "x"}, {"shape", {5, 3}}, {"placements", spec}, {"dtype", "int64"}, {"init", {{"ids", 4}}}}},
          {{{"out", "y"}, {"op", "one_hot"}, {"args", {"x"}}, {"num_classes", classes}},
           {{"out", "z"}, {"op", "add"}, {"args", {"y", "y"}}}}));
      ASSERT_EQ(r["status"], "pass") << classes << " " << mesh << " " << spec << r.dump(1);
      EXPECT_EQ(r["values"]["y"]["shape"], json({5, 3, classes}));
      for (size_t a = 0; a < spec.size(); ++a) {
        const std::string got = r["values"]["y"]["placements"][a];
        const std::string given = spec[a];
        EXPECT_EQ(got, given[0] == 'S' ? given : got) << spec;
        EXPECT_NE(got, "S(2)") << spec;
      }
      ++cases;
    }
  EXPECT_EQ(cases, 2u * (2 * 4 + 16));
}

TEST(Bincount, AShardCountsItsOwnValuesAsAPartialSum) {
  // x [7] of ids in [0, 5) (uneven on 2, 3 and 4 ranks: [2, 2, 2, 1] on 4), minlength 5 and 8:
  // S(0) gives P(sum) of each rank's counts, R gives R; then y reduced to R (an all_reduce of
  // int64 counts) and added to itself.
  const std::vector<std::string> one = {"S(0)", "R", "Rd"};
  size_t cases = 0;
  for (int64_t bins : {5, 8})
    for (const auto& [mesh, spec] : meshes_and_specs(one)) {
      const json replicated = spec.size() == 1 ? json{"R"} : json{"R", "R"};
      const json r = run(doc_on(
          mesh, {{{"name", "x"}, {"shape", {7}}, {"placements", spec}, {"dtype", "int64"}, {"init", {{"ids", 5}}}}},
          {{{"out", "y"}, {"op", "bincount"}, {"args", {"x"}}, {"minlength", bins}},
           {{"out", "yr"}, {"op", "redistribute"}, {"args", {"y"}}, {"placements", replicated}},
           {{"out", "z"}, {"op", "add"}, {"args", {"yr", "yr"}}}}));
      ASSERT_EQ(r["status"], "pass") << bins << " " << mesh << " " << spec << r.dump(1);
      EXPECT_EQ(r["values"]["y"]["shape"], json({bins}));
      for (size_t a = 0; a < spec.size(); ++a) {
        const std::string got = r["values"]["y"]["placements"][a];
        const std::string given = spec[a];
        EXPECT_EQ(got, given == "S(0)" ? "P(sum)" : given) << spec << r.dump(1);
      }
      ++cases;
    }
  EXPECT_EQ(cases, 2u * (2 * 3 + 9));
}

TEST(Arange, StartEndAndStepMatchTorchArange) {
  // The 1-D form (its shape left off), and the shape form with start and step, each S(0) over 3
  // ranks, against the values torch.arange gives.
  struct Case {
    json op;
    std::vector<double> want;
  };
  const std::vector<Case> cases = {
      {{{"start", 2}, {"end", 11}, {"step", 3}, {"dtype", "int64"}}, {2, 5, 8}},
      {{{"start", 5}, {"end", -2}, {"step", -2}, {"dtype", "int64"}}, {5, 3, 1, -1}},
      {{{"end", 4}}, {0, 1, 2, 3}},
      {{{"start", 0.5}, {"end", 2}, {"step", 0.25}}, {0.5, 0.75, 1, 1.25, 1.5, 1.75}},
      {{{"shape", {2, 3}}, {"start", 1}, {"step", 2}}, {1, 3, 5, 7, 9, 11}},
      {{{"shape", {2, 2}}}, {0, 1, 2, 3}},
      {{{"start", 1}, {"end", 4}, {"shape", {3}}}, {1, 2, 3}},
  };
  for (const auto& c : cases)
    for (const json& mesh : {json{3}, json{4}, json{2, 2}}) {
      json a = {{"out", "a"}, {"op", "arange"}, {"placements", mesh.size() == 1 ? json{"S(0)"} : json{"S(0)", "R"}}};
      a.update(c.op);
      const json doc = doc_on(mesh, json::array(), {a, {{"out", "b"}, {"op", "add"}, {"args", {"a", "a"}}}});
      const Scenario sc = parse_scenario(doc, "test.json");
      const CheckedRun r = check_scenario(sc, sc.options, /*keep_values=*/true);
      ASSERT_EQ(r.result["status"], "pass") << c.op << r.result.dump(1);
      ASSERT_TRUE(r.tensors);
      bool seen = false;
      for (const auto& v : r.tensors->values)
        if (v.name == "a") {
          seen = true;
          const at::Tensor flat = v.global.flatten().to(at::kDouble);
          ASSERT_EQ(flat.numel(), static_cast<int64_t>(c.want.size())) << c.op;
          for (size_t i = 0; i < c.want.size(); ++i) EXPECT_EQ(flat[static_cast<int64_t>(i)].item<double>(), c.want[i]) << c.op << i;
          EXPECT_EQ(v.global.scalar_type() == at::kLong, c.op.value("dtype", "") == "int64") << c.op;
        }
      EXPECT_TRUE(seen);
    }
}

// The message of a scenario refused when read (exit 2), or of a run that stops with an error.
std::string refused(const json& doc) {
  try {
    parse_scenario(doc, "test.json");
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "read without a refusal: " << doc.dump();
  return "";
}

std::string run_error(const json& doc) {
  const json r = run(doc);
  EXPECT_EQ(r["status"], "error") << r.dump(1);
  return r["error"].is_object() ? r["error"]["message"].get<std::string>() : "";
}

TEST(Counts, RefusalsNameTheOpTheFieldAndTheNumbers) {
  const json ids = {{{"name", "x"}, {"shape", {6}}, {"placements", {"S(0)"}}, {"dtype", "int64"}, {"init", {{"ids", 5}}}}};
  auto has = [](const std::string& text, const std::string& part) {
    EXPECT_NE(text.find(part), std::string::npos) << text;
  };
  has(refused(doc_on({2}, ids, {{{"out", "y"}, {"op", "clamp"}, {"args", {"x"}}}})),
      "/program/0/min: clamp takes min, max or both");
  has(refused(doc_on({2}, ids, {{{"out", "y"}, {"op", "one_hot"}, {"args", {"x"}}, {"num_classes", -1}}})),
      "/program/0/num_classes: one_hot: num_classes -1 (torch: the data's max + 1) is refused: on a shard");
  has(refused(doc_on({2}, ids, {{{"out", "y"}, {"op", "bincount"}, {"args", {"x"}}}})),
      "/program/0/minlength: bincount: minlength 0 leaves the result's length to the data");
  has(refused(doc_on({2}, json::array(), {{{"out", "a"}, {"op", "arange"}, {"end", 3}, {"step", 0}, {"placements", {"R"}}}})),
      "/program/0/step: arange: step must not be 0");
  has(refused(doc_on({2}, json::array(), {{{"out", "a"}, {"op", "arange"}, {"start", 3}, {"end", 0}, {"placements", {"R"}}}})),
      "/program/0/step: arange: from start 3.0 to end 0.0 a step of the other sign is needed, got 1.0");
  has(refused(doc_on({2}, json::array(),
                     {{{"out", "a"}, {"op", "arange"}, {"end", 3}, {"shape", {4}}, {"placements", {"R"}}}})),
      "/program/0/shape: arange: shape [4] disagrees with start, end and step, which give [3]");
  has(refused(doc_on({2}, json::array(),
                     {{{"out", "a"}, {"op", "arange"}, {"end", 2.5}, {"dtype", "int64"}, {"placements", {"R"}}}})),
      "/program/0/end: arange of int64 takes a whole end, got 2.5");
  has(refused(doc_on({2}, json::array(), {{{"out", "a"}, {"op", "arange"}, {"placements", {"R"}}}})),
      "/program/0/shape: arange takes a shape, or end");
  has(refused(doc_on({2}, json::array(), {{{"out", "a"}, {"op", "arange"}, {"end", 1e19}, {"placements", {"R"}}}})),
      "/program/0/end: arange: from start 0.0 to end 1e+19 by step 1.0 is more than 2^40 elements");
  // Values out of range, with the rank that holds them.
  has(run_error(doc_on({2}, ids, {{{"out", "y"}, {"op", "bincount"}, {"args", {"x"}}, {"minlength", 3}}})),
      "bincount: \"x\" holds ");
  has(run_error(doc_on({2}, ids, {{{"out", "y"}, {"op", "bincount"}, {"args", {"x"}}, {"minlength", 3}}})),
      ", outside [0, 3) (minlength): the counts' length would follow the data");
  has(run_error(doc_on({2}, ids, {{{"out", "y"}, {"op", "one_hot"}, {"args", {"x"}}, {"num_classes", 2}}})),
      ", outside [0, 2) (num_classes)");
  has(run_error(doc_on({2}, ids, {{{"out", "y"}, {"op", "clamp"}, {"args", {"x"}}, {"min", 0.5}}})),
      "/program/0/min: clamp: 0.5 against the int64 \"x\": an integer clamp takes whole bounds");
  // An int64 P(sum) meeting a replicated int64 operand: R -> P(sum) would divide an integer.
  json counts = doc_on({2}, ids,
                       {{{"out", "y"}, {"op", "bincount"}, {"args", {"x"}}, {"minlength", 5}},
                        {{"out", "one"}, {"op", "full"}, {"shape", {5}}, {"value", 1}, {"dtype", "int64"}, {"placements", {"R"}}},
                        {{"out", "z"}, {"op", "add"}, {"args", {"y", "one"}}}});
  has(run_error(counts), "R -> P(sum) of the int64 \"z.arg1\" over \"a\" under partial_from_replicate divide");
  counts["options"] = {{"partial_from_replicate", "rank0"}};
  EXPECT_EQ(run(counts)["status"], "pass") << run(counts).dump(1);
}

}  // namespace
}  // namespace meshsim

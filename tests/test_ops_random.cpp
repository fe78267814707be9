// Randomness (issue #32 item 3): dropout, rand and randn on a DTensor give the values one device
// draws for the global tensor, whatever the layout (every replica the same, each shard its global
// elements), reproducible from the run's seed; dropout's backward is its factor times the incoming
// gradient; local code's dropout draws from each rank's own generator, as the scenario seeds it,
// and the two bug classes of such code (the same seed on every sequence shard, different seeds on
// tensor-parallel replicas) fail with the element named; the planted bugs of meshsim's own random
// op are found.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/layout.h"
#include "core/random.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "sim/data.h"
#include "sim/interpreter.h"
#include "sim/local_ops.h"
#include "tests/spec_sets.h"

namespace meshsim {
namespace {

using json = nlohmann::json;

json mesh_of(const std::vector<int64_t>& shape) {
  json axes = json::array();
  for (size_t a = 0; a < shape.size(); ++a) axes.push_back(std::string(1, static_cast<char>('a' + a)));
  return {{"axes", axes}, {"shape", shape}};
}

// Every spec of S(d) (d < rank), R and Rd per axis, as JSON.
std::vector<json> every_spec(size_t axes, int64_t rank) {
  std::vector<Placement> one = {Placement::replicate(), Placement::reduced()};
  for (int64_t d = 0; d < rank; ++d) one.push_back(Placement::shard(d));
  std::vector<json> out;
  for (const Spec& spec : testing_util::specs_over(one, static_cast<int>(axes))) {
    json t = json::array();
    for (const auto& p : spec) t.push_back(p.str());
    out.push_back(t);
  }
  return out;
}

json doc(const json& mesh, const json& inputs, const json& program, uint64_t seed, const std::string& backward = "") {
  json d = {{"format", "meshsim.scenario/1"}, {"name", "random"}, {"mesh", mesh},
            {"options", {{"seed", seed}}}, {"inputs", inputs}, {"program", program}};
  if (!backward.empty()) d["backward"] = backward;
  return d;
}

json check(const json& d) {
  const Scenario sc = parse_scenario(d, "test.json");
  return check_scenario(sc, sc.options).result;
}

const std::vector<std::vector<int64_t>> kMeshes = {{3}, {4}, {2, 2}};
const std::vector<std::vector<int64_t>> kShapes = {{5, 7}, {7, 3, 2}};

// rand and randn: each rank's local is the global draw at the indices it holds, bit for bit, on
// every layout of uneven shapes.
TEST(Random, CreationIsTheGlobalDrawOnEveryLayout) {
  for (const auto& m : kMeshes)
    for (const auto& shape : kShapes)
      for (const char* op : {"rand", "randn"})
        for (const auto& spec : every_spec(m.size(), static_cast<int64_t>(shape.size()))) {
          const json program = json::array({{{"out", "y"}, {"op", op}, {"shape", shape}, {"placements", spec}}});
          const Scenario sc = parse_scenario(doc(mesh_of(m), json::array(), program, 7), "test.json");
          const SimRun run = run_distributed(sc, sc.options);
          const at::Tensor global = drawn_value(sc.program[0], 7, DType::Float64);
          const DTensor& y = run.values.at("y");
          for (int64_t r = 0; r < sc.mesh.size(); ++r) {
            at::Tensor want = global;
            const auto idx = local_indices(sc.mesh, y.spec, shape, r);
            for (size_t d = 0; d < idx.size(); ++d) want = want.index_select(static_cast<int64_t>(d), at::tensor(idx[d], at::kLong));
            ASSERT_TRUE(at::equal(y.locals[static_cast<size_t>(r)], want))
                << op << " on " << json(m) << " " << spec << " rank " << r;
          }
          EXPECT_EQ(check(doc(mesh_of(m), json::array(), program, 7))["status"], "pass") << op << " " << spec;
        }
}

// dropout of x on every layout (a Partial x reduced first) against the oracle, bit for bit, with
// its gradient.
TEST(Random, DropoutMatchesTheOracleOnEveryLayout) {
  for (const auto& m : kMeshes)
    for (const auto& shape : kShapes) {
      std::vector<json> specs = every_spec(m.size(), static_cast<int64_t>(shape.size()));
      json partial = json::array();
      for (size_t a = 0; a < m.size(); ++a) partial.push_back(a == 0 ? "P(sum)" : "R");
      specs.push_back(partial);
      for (const auto& spec : specs) {
        const json inputs = json::array({{{"name", "x"}, {"shape", shape}, {"placements", spec}, {"requires_grad", true}},
                                         {{"name", "c"}, {"shape", shape}, {"placements", spec}}});
        const json program = json::array({{{"out", "y"}, {"op", "dropout"}, {"args", {"x"}}, {"p", 0.5}},
                                          {{"out", "w"}, {"op", "mul"}, {"args", {"y", "c"}}},
                                          {{"out", "loss"}, {"op", "sum"}, {"args", {"w"}}}});
        const json r = check(doc(mesh_of(m), inputs, program, 3, "loss"));
        ASSERT_EQ(r["status"], "pass") << json(m) << " " << spec << "\n" << r.dump(1);
        EXPECT_EQ(r["max_abs_error"], 0.0) << json(m) << " " << spec;
      }
    }
}

// A [2, 2] mesh (dp x tp), x S(0) over dp and R over tp: the two tp replicas of each dp shard hold
// the same mask, the two dp shards different ones.
TEST(Random, ReplicasShareTheMaskAndShardsDiffer) {
  const json inputs = json::array({{{"name", "x"}, {"shape", {8, 16}}, {"placements", {"S(0)", "R"}}, {"init", "ones"}}});
  const json program = json::array({{{"out", "y"}, {"op", "dropout"}, {"args", {"x"}}, {"p", 0.5}}});
  const Scenario sc = parse_scenario(doc(mesh_of({2, 2}), inputs, program, 1), "test.json");
  const SimRun run = run_distributed(sc, sc.options);
  const Locals& y = run.values.at("y").locals;
  EXPECT_TRUE(at::equal(y[0], y[1]));  // ranks 0 and 1: dp 0, tp 0 and 1
  EXPECT_TRUE(at::equal(y[2], y[3]));
  EXPECT_FALSE(at::equal(y[0], y[2]));  // dp 0 and dp 1: rows 0-3 and 4-7 of the global mask
  // Every element is 0 or 1 / (1 - p) = 2, some of each.
  const at::Tensor all = at::cat({y[0], y[2]});
  EXPECT_TRUE(at::logical_or(all.eq(0), all.eq(2)).all().item<bool>());
  EXPECT_GT(all.eq(0).sum().item<int64_t>(), 0);
  EXPECT_GT(all.eq(2).sum().item<int64_t>(), 0);
}

// The seed reproduces the draw; another seed or another stream draws other values.
TEST(Random, TheSeedAndTheStreamDecideTheDraw) {
  const uint64_t k = random_stream_key(1, "y");
  EXPECT_EQ(uniform_at(k, 5), uniform_at(random_stream_key(1, "y"), 5));
  EXPECT_NE(uniform_at(k, 5), uniform_at(random_stream_key(2, "y"), 5));
  EXPECT_NE(uniform_at(k, 5), uniform_at(random_stream_key(1, "z"), 5));
  EXPECT_NE(uniform_at(k, 5), uniform_at(random_stream_key(1, "y", 0), 5));
  EXPECT_NE(uniform_at(random_stream_key(1, "y", 0, 0), 5), uniform_at(random_stream_key(1, "y", 0, 1), 5));
  // Uniform in [0, 1) with about 1 - p kept.
  int kept = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    const double u = uniform_at(k, i);
    ASSERT_TRUE(u >= 0.0 && u < 1.0);
    kept += dropout_keeps(k, i, 0.3);
  }
  EXPECT_NEAR(kept / 10000.0, 0.7, 0.02);
  double sum = 0, squares = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    const double z = normal_at(k, i);
    sum += z;
    squares += z * z;
  }
  EXPECT_NEAR(sum / 10000.0, 0.0, 0.05);
  EXPECT_NEAR(squares / 10000.0, 1.0, 0.05);
  // Two dropouts of one program draw different masks (their streams are their result names); a
  // dropout's `stream` names its stream instead.
  const json inputs = json::array({{{"name", "x"}, {"shape", {4, 8}}, {"placements", {"S(1)"}}, {"init", "ones"}}});
  const json program = json::array({{{"out", "y1"}, {"op", "dropout"}, {"args", {"x"}}},
                                    {{"out", "y2"}, {"op", "dropout"}, {"args", {"x"}}},
                                    {{"out", "y3"}, {"op", "dropout"}, {"args", {"x"}}, {"stream", "y1"}}});
  const Scenario sc = parse_scenario(doc(mesh_of({2}), inputs, program, 1), "test.json");
  const SimRun a = run_distributed(sc, sc.options), b = run_distributed(sc, sc.options);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_TRUE(at::equal(a.values.at("y1").locals[r], b.values.at("y1").locals[r]));
    EXPECT_FALSE(at::equal(a.values.at("y1").locals[r], a.values.at("y2").locals[r]));
    EXPECT_TRUE(at::equal(a.values.at("y1").locals[r], a.values.at("y3").locals[r]));
  }
}

// dropout's backward: the incoming gradient times the mask over (1 - p), in x's layout.
TEST(Random, DropoutBackwardIsTheMaskTimesTheGradientOverOneMinusP) {
  for (const auto& m : kMeshes) {
    const json inputs = json::array({{{"name", "x"}, {"shape", {7, 5}}, {"placements", json::array()},
                                      {"init", "ones"}, {"requires_grad", true}}});
    json d = doc(mesh_of(m), inputs, json::array({{{"out", "y"}, {"op", "dropout"}, {"args", {"x"}}, {"p", 0.25}},
                                                   {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}}),
                 4, "loss");
    for (size_t a = 0; a < m.size(); ++a) d["inputs"][0]["placements"].push_back(a == 0 ? "S(0)" : "S(1)");
    const Scenario sc = parse_scenario(d, "test.json");
    SimRun run = run_distributed(sc, sc.options);
    const DTensor& y = run.values.at("y");
    const at::Tensor mask = assemble(sc.mesh, y.spec, y.locals);  // x of ones: y is the factor itself
    const at::Tensor grad = assemble(sc.mesh, run.values.at("x").spec, run.grads.at("x"));
    EXPECT_TRUE(at::equal(grad, mask)) << json(m);
    EXPECT_TRUE(at::logical_or(mask.eq(0), mask.eq(1 / 0.75)).all().item<bool>());
  }
}

// Local code's dropout of a sequence shard with the same seed on every rank: each shard draws the
// same mask, and the global mask repeats; the forward check names the first element that differs.
TEST(Random, LocalDropoutWithTheSameSeedOnEverySequenceShardFails) {
  const json inputs = json::array({{{"name", "x"}, {"shape", {8, 4}}, {"placements", {"S(0)"}}, {"init", "ones"}}});
  auto program = [](const std::string& generator, const json& spec) {
    return json::array({{{"out", "xl"}, {"op", "to_local"}, {"args", {"x"}}},
                        {{"out", "dl"}, {"op", "dropout"}, {"args", {"xl"}}, {"stream", "d"}, {"generator", generator}},
                        {{"out", "d"}, {"op", "from_local"}, {"args", {"dl"}}, {"placements", spec}}});
  };
  const json same = check(doc(mesh_of({2}), inputs, program("same_seed", {"S(0)"}), 1));
  ASSERT_EQ(same["status"], "fail") << same.dump(1);
  const std::string f = same["failures"][0];
  EXPECT_EQ(f.rfind("d: ", 0), 0u) << f;
  EXPECT_NE(f.find("differ"), std::string::npos) << f;
  EXPECT_NE(f.find("(rank 1)"), std::string::npos) << f;
  // Rank 1's mask is rank 0's.
  const Scenario sc = parse_scenario(doc(mesh_of({2}), inputs, program("same_seed", {"S(0)"}), 1), "test.json");
  const SimRun run = run_distributed(sc, sc.options);
  EXPECT_TRUE(at::equal(run.values.at("d").locals[0], run.values.at("d").locals[1]));
}

// Local code's dropout of a tensor-parallel replica seeded by rank: the replicas diverge, and the
// run names them; seeded alike, the replicas agree with the oracle.
TEST(Random, LocalDropoutSeededByRankOnReplicasFailsAndTheSameSeedPasses) {
  const json inputs = json::array({{{"name", "x"}, {"shape", {6, 4}}, {"placements", {"R"}}, {"init", "ones"}}});
  auto program = [](const std::string& generator) {
    return json::array({{{"out", "xl"}, {"op", "to_local"}, {"args", {"x"}}},
                        {{"out", "dl"}, {"op", "dropout"}, {"args", {"xl"}}, {"stream", "d"}, {"generator", generator}},
                        {{"out", "d"}, {"op", "from_local"}, {"args", {"dl"}}, {"placements", {"R"}}}});
  };
  const json rank = check(doc(mesh_of({2}), inputs, program("rank_seed"), 1));
  ASSERT_EQ(rank["status"], "fail") << rank.dump(1);
  const std::string f = rank["failures"][0];
  EXPECT_NE(f.find("ranks 0 and 1 hold different locals across mesh axis \"a\" where R says they are equal (first at local ["),
            std::string::npos)
      << f;
  const json same = check(doc(mesh_of({2}), inputs, program("same_seed"), 1));
  EXPECT_EQ(same["status"], "pass") << same.dump(1);
}

// The planted bugs of meshsim's own random op: shards that ignore their offsets, replicas seeded by
// rank; each fails where the right op passes.
TEST(Random, ThePlantedBugsFail) {
  const json inputs = json::array({{{"name", "x"}, {"shape", {6, 5}}, {"placements", {"S(0)", "R"}}, {"init", "ones"}}});
  const json program = json::array({{{"out", "y"}, {"op", "dropout"}, {"args", {"x"}}}});
  json d = doc(mesh_of({2, 2}), inputs, program, 1);
  ASSERT_EQ(check(d)["status"], "pass");
  for (const char* m : {"dropout_shard_offset_ignored", "dropout_replicas_rank_seeded"}) {
    d["options"]["mutant"] = m;
    const json r = check(d);
    EXPECT_EQ(r["status"], "fail") << m << "\n" << r.dump(1);
  }
}

TEST(Random, BadInputIsRefusedWithItsPath) {
  const json inputs = json::array({{{"name", "x"}, {"shape", {4}}, {"placements", {"S(0)"}}}});
  try {
    parse_scenario(doc(mesh_of({2}), inputs, json::array({{{"out", "y"}, {"op", "dropout"}, {"args", {"x"}}, {"p", 1.5}}}), 1),
                   "test.json");
    FAIL() << "p 1.5 parsed";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/program/0/p"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[0, 1]"), std::string::npos) << e.what();
  }
  const json r = check(doc(mesh_of({2}), inputs,
                           json::array({{{"out", "y"}, {"op", "dropout"}, {"args", {"x"}}, {"generator", "rank_seed"}}}), 1));
  ASSERT_EQ(r["status"], "error") << r.dump(1);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("/program/0/generator"), std::string::npos) << r.dump(1);
}

// Training steps: each microbatch draws its random values from its own seed (as its data), and the
// oracle draws the same ones, step by step; the planted bug shows in the steps. With fixed data every
// step would draw the same mask: a random op there is refused, with its path.
TEST(Random, DropoutInTrainingStepsDrawsEachMicrobatchsOwnMask) {
  const json inputs = json::array({{{"name", "x"}, {"shape", {6, 4}}, {"placements", {"S(0)"}}},
                                   {{"name", "w"}, {"shape", {4, 4}}, {"placements", {"R"}}, {"requires_grad", true}}});
  const json program = json::array({{{"out", "h"}, {"op", "mm"}, {"args", {"x", "w"}}},
                                    {{"out", "d"}, {"op", "dropout"}, {"args", {"h"}}},
                                    {{"out", "loss"}, {"op", "sum"}, {"args", {"d"}}}});
  json d = doc(mesh_of({2}), inputs, program, 1, "loss");
  d["train"] = {{"steps", 3}, {"microbatches", 2}, {"lr", 0.01}, {"optimizer", {{"kind", "sgd"}}}};
  const json r = check(d);
  ASSERT_EQ(r["status"], "pass") << r.dump(1);
  d["options"]["mutant"] = "dropout_shard_offset_ignored";
  EXPECT_EQ(check(d)["status"], "fail");
  d["options"].erase("mutant");
  d["train"]["data"] = "fixed";
  try {
    parse_scenario(d, "test.json");
    FAIL() << "dropout in training steps with fixed data parsed";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/program/1: dropout in training steps with fixed data"), std::string::npos)
        << e.what();
  }
}

// A half-precision run draws in its dtype (the float64 draw rounded), and passes against the
// oracle's float64 reference within the dtype's tolerance.
TEST(Random, AHalfPrecisionRunDrawsInItsDtype) {
  const json inputs = json::array({{{"name", "x"}, {"shape", {7, 4}}, {"placements", {"S(0)"}}, {"requires_grad", true}}});
  const json program = json::array({{{"out", "r"}, {"op", "randn"}, {"shape", {7, 4}}, {"placements", {"S(0)"}}},
                                    {{"out", "y"}, {"op", "mul"}, {"args", {"x", "r"}}},
                                    {{"out", "d"}, {"op", "dropout"}, {"args", {"y"}}, {"p", 0.25}},
                                    {{"out", "loss"}, {"op", "sum"}, {"args", {"d"}}}});
  for (const char* dtype : {"bfloat16", "float16"}) {
    json d = doc(mesh_of({3}), inputs, program, 2, "loss");
    d["options"]["dtype"] = dtype;
    const Scenario sc = parse_scenario(d, "test.json");
    const SimRun run = run_distributed(sc, sc.options);
    EXPECT_EQ(run.values.at("r").locals[0].scalar_type(), std::string(dtype) == "bfloat16" ? at::kBFloat16 : at::kHalf);
    const json r = check(d);
    EXPECT_EQ(r["status"], "pass") << dtype << "\n" << r.dump(1);
  }
}

}  // namespace
}  // namespace meshsim

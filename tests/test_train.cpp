// Training steps (core/train.h, sim/train.h, oracles/train.h): the optimizers' arithmetic against
// numbers worked by hand, the steps of sharded parameters and states against the oracle after
// every step, the user's reduction of clip_grad_norm's total norm (right, over too many axes, over
// too few), the planted bugs of gradient accumulation, and the messages of a malformed "train".
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "sim/interpreter.h"
#include "sim/train.h"

namespace meshsim {
namespace {

using json = nlohmann::json;

// HSDP on replicate x shard (2 x 2): a two-layer MLP, parameters [R, S(0)], the batch sharded on both.
json hsdp(const json& train) {
  json doc = json::parse(R"J({
    "format": "meshsim.scenario/1", "name": "hsdp",
    "mesh": {"axes": ["replicate", "shard"], "shape": [2, 2]},
    "inputs": [
      {"name": "x", "shape": [8, 6], "placements": ["S(0)", "S(0)"]},
      {"name": "w1", "shape": [6, 5], "placements": ["R", "S(0)"], "requires_grad": true, "init": "randn"},
      {"name": "w2", "shape": [5, 3], "placements": ["R", "S(0)"], "requires_grad": true, "init": "randn"}
    ],
    "program": [
      {"out": "w1_full", "op": "redistribute", "args": ["w1"], "placements": ["R", "Rd"]},
      {"out": "h", "op": "mm", "args": ["x", "w1_full"]},
      {"out": "a", "op": "tanh", "args": ["h"]},
      {"out": "w2_full", "op": "redistribute", "args": ["w2"], "placements": ["R", "Rd"]},
      {"out": "y", "op": "mm", "args": ["a", "w2_full"]},
      {"out": "y2", "op": "mul", "args": ["y", "y"]},
      {"out": "loss", "op": "sum", "args": ["y2"]}
    ],
    "backward": "loss"})J");
  doc["train"] = train;
  return doc;
}

// Data parallel on [n]: parameters replicated (w [5, 3], b [3]), the batch sharded.
json dp(const json& train, int64_t n = 3) {
  json doc = json::parse(R"J({
    "format": "meshsim.scenario/1", "name": "dp",
    "mesh": {"axes": ["dp"], "shape": [3]},
    "inputs": [
      {"name": "x", "shape": [7, 5], "placements": ["S(0)"]},
      {"name": "w", "shape": [5, 3], "placements": ["R"], "requires_grad": true, "init": "randn"},
      {"name": "b", "shape": [3], "placements": ["R"], "requires_grad": true, "init": "randn"}
    ],
    "program": [
      {"out": "xw", "op": "mm", "args": ["x", "w"]},
      {"out": "h", "op": "add", "args": ["xw", "b"]},
      {"out": "a", "op": "tanh", "args": ["h"]},
      {"out": "loss", "op": "sum", "args": ["a"]}
    ],
    "backward": "loss"})J");
  doc["mesh"]["shape"] = {n};
  doc["train"] = train;
  return doc;
}

json run(const json& doc, const std::string& mutant = "") {
  const Scenario sc = parse_scenario(doc, "train.json");
  RunOptions options = sc.options;
  options.mutant = mutant;
  return check_scenario(sc, options).result;
}

std::string failures(const json& r) { return r.value("failures", json::array()).dump(); }

const json kAdamClip = {{"steps", 3},
                        {"microbatches", 2},
                        {"lr", 0.01},
                        {"optimizer", {{"kind", "adamw"}}},
                        {"clip_grad_norm", {{"max_norm", 1.0}, {"reduce", {{"all_reduce", {"shard"}}}}}}};

TEST(TrainMath, SgdWithMomentumFollowsTorchsFormula) {
  OptimizerSpec opt;
  opt.momentum = 0.5;
  opt.dampening = 0.25;
  opt.weight_decay = 0.1;
  at::Tensor p = at::full({2}, 1.0, at::kDouble);
  const at::Tensor g = at::full({2}, 2.0, at::kDouble);
  std::map<std::string, at::Tensor> st;
  optimizer_update(opt, 0.1, 1, p, g, st);
  // d = g + 0.1 p = 2.1; buf = d (first step); p = 1 - 0.1 * 2.1 = 0.79
  EXPECT_NEAR(p[0].item<double>(), 0.79, 1e-15);
  EXPECT_NEAR(st.at("momentum_buffer")[0].item<double>(), 2.1, 1e-15);
  optimizer_update(opt, 0.1, 2, p, g, st);
  // d = 2 + 0.079 = 2.079; buf = 0.5 * 2.1 + 0.75 * 2.079 = 2.60925; p = 0.79 - 0.260925
  EXPECT_NEAR(st.at("momentum_buffer")[0].item<double>(), 2.60925, 1e-14);
  EXPECT_NEAR(p[0].item<double>(), 0.529075, 1e-14);
}

TEST(TrainMath, AdamWFirstStepMovesBySignTimesLr) {
  OptimizerSpec opt;
  opt.kind = OptimizerKind::AdamW;
  opt.weight_decay = 0.5;
  opt.eps = 0.0;
  at::Tensor p = at::tensor({1.0, -2.0}, at::kDouble);
  const at::Tensor g = at::tensor({3.0, -0.25}, at::kDouble);
  std::map<std::string, at::Tensor> st;
  optimizer_update(opt, 0.1, 1, p, g, st);
  // p (1 - 0.05), then - 0.1 * m_hat / sqrt(v_hat) = - 0.1 * sign(g)
  EXPECT_NEAR(p[0].item<double>(), 0.95 - 0.1, 1e-15);
  EXPECT_NEAR(p[1].item<double>(), -1.9 + 0.1, 1e-15);
  EXPECT_NEAR(st.at("exp_avg")[0].item<double>(), 0.3, 1e-15);
  EXPECT_NEAR(st.at("exp_avg_sq")[0].item<double>(), 0.009, 1e-15);
}

TEST(TrainMath, NormPowersAndRoots) {
  const at::Tensor g = at::tensor({3.0, -4.0}, at::kDouble);
  EXPECT_EQ(norm_root(norm_power(g, 2).item<double>(), 2), 5.0);
  EXPECT_EQ(norm_root(norm_power(g, 1).item<double>(), 1), 7.0);
  EXPECT_EQ(norm_root(norm_power(g, INFINITY).item<double>(), INFINITY), 4.0);
  EXPECT_NEAR(norm_root(norm_power(g, 3).item<double>(), 3), std::cbrt(91.0), 1e-14);
}

TEST(Train, HsdpAdamWWithTheNormReducedOverTheShardAxisMatchesEveryStep) {
  const json r = run(hsdp(kAdamClip));
  ASSERT_EQ(r["status"], "pass") << failures(r);
  EXPECT_EQ(r["checks"]["train_equivalence"], true);
  ASSERT_EQ(r["train"]["per_step"].size(), 3u);
  for (const auto& s : r["train"]["per_step"]) {
    // clipping is active: the norm is larger than max_norm, and every rank has the oracle's
    EXPECT_GT(s["grad_norm"]["oracle"].get<double>(), 1.0);
    for (const auto& n : s["grad_norm"]["ranks"]) EXPECT_NEAR(n.get<double>(), s["grad_norm"]["oracle"].get<double>(), 1e-9);
  }
}

TEST(Train, TheDtensorNormMatchesWithoutTheUsersReduction) {
  json t = kAdamClip;
  t["clip_grad_norm"].erase("reduce");
  t["clip_grad_norm"]["norm_type"] = 3;
  const json r = run(hsdp(t));
  EXPECT_EQ(r["status"], "pass") << failures(r);
}

TEST(Train, TheNormReducedOverBothAxesIsOffBySqrtOfTheReplicateSize) {
  json t = kAdamClip;
  t["clip_grad_norm"]["reduce"]["all_reduce"] = {"replicate", "shard"};
  const json r = run(hsdp(t));
  ASSERT_EQ(r["status"], "fail");
  EXPECT_EQ(r["train"]["first_failing_step"], 1);
  const std::string f = r["failures"][0];
  EXPECT_NE(f.find("step 1, clip_grad_norm's total norm"), std::string::npos) << f;
  EXPECT_NE(f.find("= sqrt(2), the size of mesh axis replicate"), std::string::npos) << f;
  // the L1 norm is off by the size itself
  t["clip_grad_norm"]["norm_type"] = 1;
  const std::string f1 = run(hsdp(t))["failures"][0];
  EXPECT_NE(f1.find("actual = 2 x expected = 2, the size of mesh axis replicate"), std::string::npos) << f1;
}

TEST(Train, TheNormNotReducedOverTheShardAxisDiffersBetweenRanks) {
  json t = kAdamClip;
  t["clip_grad_norm"]["reduce"]["all_reduce"] = json::array();
  const json r = run(hsdp(t));
  ASSERT_EQ(r["status"], "fail");
  const json& m = r["mismatches"][0];
  EXPECT_EQ(m["kind"], "grad_norm");
  EXPECT_EQ(m["step"], 1);
  EXPECT_EQ(m["replicas_disagree"], true) << m.dump();
}

// A parameter Rd has a P(sum) gradient: the DTensor norm all_reduces it first (the norm is not
// linear), and its states default to R; code that takes the norm of each rank's unreduced part gets
// a different total on every rank.
TEST(Train, APartialGradientIsReducedBeforeItsNorm) {
  json doc = dp({{"steps", 2}, {"microbatches", 2}, {"lr", 0.01}, {"optimizer", {{"kind", "adamw"}}},
                 {"clip_grad_norm", {{"max_norm", 0.5}, {"norm_type", "inf"}}}});
  doc["inputs"][1]["placements"] = {"Rd"};
  const json r = run(doc);
  ASSERT_EQ(r["status"], "pass") << failures(r);
  EXPECT_EQ(r["grads"]["w"]["placements"], json({"P(sum)"}));
  EXPECT_EQ(r["train"]["parameters"]["w"]["states"]["exp_avg"], json({"R"}));
  doc["train"]["clip_grad_norm"]["reduce"] = {{"all_reduce", json::array()}};
  const json bad = run(doc);
  ASSERT_EQ(bad["status"], "fail");
  EXPECT_EQ(bad["mismatches"][0]["kind"], "grad_norm");
  EXPECT_EQ(bad["mismatches"][0]["replicas_disagree"], true);
}

TEST(Train, ZeroStatesShardedWhereParametersAreReplicatedMatch) {
  json t = {{"steps", 2}, {"microbatches", 3}, {"lr", {0.02, 0.01}},
            {"optimizer", {{"kind", "adamw"}, {"states", {{"w", {"S(0)"}}, {"b", {"S(0)"}}}}}}};
  const json r = run(dp(t));
  ASSERT_EQ(r["status"], "pass") << failures(r);
  EXPECT_EQ(r["train"]["parameters"]["b"]["states"]["exp_avg"], json({"S(0)"}));
  // the updated shards are gathered back to the replicated parameters
  ASSERT_EQ(r["train"]["communication"].size(), 1u);
  EXPECT_EQ(r["train"]["communication"][0]["op"], "all_gather");
  EXPECT_EQ(r["train"]["communication"][0]["count"], 4);  // 2 parameters x 2 steps
}

TEST(Train, SgdNesterovWithStatesReplicatedWhereParametersAreSharded) {
  json doc = hsdp({{"steps", 3}, {"lr", 0.05},
                   {"optimizer", {{"kind", "sgd"}, {"momentum", 0.9}, {"nesterov", true}, {"weight_decay", 0.01},
                                  {"states", {{"w1", {"R", "R"}}}}}}});
  const json r = run(doc);
  ASSERT_EQ(r["status"], "pass") << failures(r);
  EXPECT_EQ(r["train"]["parameters"]["w1"]["states"]["momentum_buffer"], json({"R", "R"}));
  EXPECT_EQ(r["train"]["parameters"]["w2"]["states"]["momentum_buffer"], json({"R", "S(0)"}));
}

TEST(Train, ALostMicrobatchGradientIsFoundAtTheFirstStep) {
  json t = {{"steps", 2}, {"microbatches", 2}, {"lr", 0.1}, {"optimizer", {{"kind", "sgd"}}}};
  EXPECT_EQ(run(dp(t))["status"], "pass");
  const json r = run(dp(t), "accumulation_lost_gradient");
  ASSERT_EQ(r["status"], "fail");
  EXPECT_NE(failures(r).find("step 1, parameter w"), std::string::npos) << failures(r);
  // one microbatch: nothing to lose
  t["microbatches"] = 1;
  EXPECT_EQ(run(dp(t), "accumulation_lost_gradient")["status"], "pass");
}

TEST(Train, AGradientReducedAgainAfterAccumulationIsOffByTheGroupSize) {
  json t = {{"steps", 1}, {"microbatches", 2}, {"lr", 0.1}, {"optimizer", {{"kind", "sgd"}, {"momentum", 0.9}}}};
  const json r = run(dp(t), "accumulation_double_reduce");
  ASSERT_EQ(r["status"], "fail");
  EXPECT_NE(failures(r).find("optimizer state w.momentum_buffer"), std::string::npos) << failures(r);
  EXPECT_NE(failures(r).find("actual = 3 x expected"), std::string::npos) << failures(r);
}

TEST(Train, FixedDataRepeatsTheFirstMicrobatch) {
  json t = {{"steps", 2}, {"microbatches", 2}, {"data", "fixed"}, {"lr", 0.1}, {"optimizer", {{"kind", "sgd"}}}};
  // with the same data every microbatch, dropping all but the last halves the gradient: still found
  EXPECT_EQ(run(dp(t))["status"], "pass");
  EXPECT_EQ(run(dp(t), "accumulation_lost_gradient")["status"], "fail");
}

// Malformed "train": the file and the JSON path named.
void expect_refused(const json& doc, const std::string& path, const std::string& words) {
  try {
    parse_scenario(doc, "t.json");
    ADD_FAILURE() << "accepted: " << doc["train"].dump();
  } catch (const InputError& e) {
    EXPECT_EQ(e.json_path(), path) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(Train, ABatchIsCutIntoMicrobatchSlicesWhoseFirstIsTheCheckedRunsDraw) {
  json t = {{"steps", 2}, {"microbatches", 3}, {"batch", {"x"}}, {"lr", 0.1},
            {"optimizer", {{"kind", "sgd"}, {"momentum", 0.5}}}};
  EXPECT_EQ(run(dp(t))["status"], "pass");
  EXPECT_EQ(run(dp(t), "accumulation_lost_gradient")["status"], "fail");
  for (const char* data : {"per_microbatch", "fixed"}) {
    SCOPED_TRACE(data);
    t["data"] = data;
    const Scenario sc = parse_scenario(dp(t), "train.json");
    const SimRun first = run_distributed(sc, sc.options);
    std::map<std::pair<int64_t, int64_t>, at::Tensor> xs;
    auto x = [&](int64_t step, int64_t mb) { return xs[std::make_pair(step, mb)]; };
    run_train_steps(sc, sc.options, first,
                    [&](int64_t step, int64_t mb, const SimRun& r) { xs[std::make_pair(step, mb)] = r.input_globals.at("x"); },
                    nullptr);
    ASSERT_EQ(xs.size(), 6u);
    // The step's batch [21, 5] drawn as x's stream: its first 7 rows are the checked run's x, and
    // each microbatch has rows of its own.
    EXPECT_TRUE(x(1, 0).equal(first.input_globals.at("x")));
    EXPECT_FALSE(x(1, 1).equal(x(1, 0)));
    EXPECT_FALSE(x(1, 2).equal(x(1, 1)));
    // A new batch every step, or the same one with fixed data.
    EXPECT_EQ(x(2, 1).equal(x(1, 1)), std::string(data) == "fixed");
  }
  json bad = dp(t);
  bad["train"]["batch"] = {"w"};
  expect_refused(bad, "/train/batch/0", "is a parameter");
}

TEST(TrainInput, MalformedTrainIsRefusedAtItsPath) {
  const json sgd = {{"kind", "sgd"}};
  expect_refused(dp({{"lr", 0.1}, {"optimizer", sgd}}), "/train/steps", "missing required field");
  expect_refused(dp({{"steps", 2}, {"lr", {0.1}}, {"optimizer", sgd}}), "/train/lr", "one learning rate per step (2)");
  expect_refused(dp({{"steps", 1}, {"lr", 0.1}, {"optimizer", {{"kind", "adam"}}}}), "/train/optimizer/kind",
                 "unknown optimizer");
  expect_refused(dp({{"steps", 1}, {"lr", 0.1}, {"optimizer", {{"kind", "adamw"}, {"momentum", 0.9}}}}),
                 "/train/optimizer/momentum", "unknown field");
  expect_refused(dp({{"steps", 1}, {"lr", 0.1}, {"optimizer", {{"kind", "adamw"}, {"states", {{"x", {"R"}}}}}}}),
                 "/train/optimizer/states/x", "not a parameter");
  expect_refused(dp({{"steps", 1}, {"lr", 0.1}, {"optimizer", {{"kind", "adamw"}, {"states", {{"w", {"P(sum)"}}}}}}}),
                 "/train/optimizer/states/w/0", "Shard or Replicate");
  expect_refused(dp({{"steps", 1}, {"lr", 0.1}, {"optimizer", sgd},
                     {"clip_grad_norm", {{"max_norm", 1}, {"reduce", {{"all_reduce", {"tp"}}}}}}}),
                 "/train/clip_grad_norm/reduce/all_reduce/0", "unknown mesh axis");
  expect_refused(dp({{"steps", 1}, {"lr", 0.1}, {"optimizer", sgd}, {"clip_grad_norm", {{"max_norm", 0}}}}),
                 "/train/clip_grad_norm/max_norm", "(0, inf)");
  json no_backward = dp({{"steps", 1}, {"lr", 0.1}, {"optimizer", sgd}});
  no_backward.erase("backward");
  expect_refused(no_backward, "/train", "need a \"backward\"");
}

}  // namespace
}  // namespace meshsim

// Reproducing the user's bug: semantics profiles (meshsim's rules or PyTorch DTensor's as released),
// plain local code (a local_map with check_variance false, DTensor mode's to_local / from_local),
// each checked by its meaning against the single-device oracle: the user's bug fails, the same
// program under meshsim's rules (or written right) passes.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "core/scenario.h"
#include "core/semantics.h"
#include "oracles/check.h"

namespace meshsim {
namespace {

using json = nlohmann::json;

std::string bug_file(const std::string& name) { return std::string(MESHSIM_SOURCE_DIR) + "/examples/bugs/" + name + ".json"; }

json run_file(const std::string& name, const std::map<std::string, json>& overrides = {}) {
  Scenario sc = load_scenario(bug_file(name));
  RunOptions options = sc.options;
  for (const auto& [k, v] : overrides) set_option(options, k, v);
  return check_scenario(sc, options).result;
}

json run_doc(const json& d, const std::map<std::string, json>& overrides = {}) {
  Scenario sc = parse_scenario(d, "semantics.json");
  RunOptions options = sc.options;
  for (const auto& [k, v] : overrides) set_option(options, k, v);
  return check_scenario(sc, options).result;
}

// The bytes of the collectives of one phase and op.
int64_t bytes_of(const json& r, const std::string& phase, const std::string& op) {
  int64_t total = 0;
  for (const auto& c : r["collectives"])
    if (c["phase"] == phase && c["op"] == op) total += c["bytes"].get<int64_t>();
  return total;
}

TEST(Semantics, EveryDifferenceNamesItsSource) {
  EXPECT_TRUE(differences(Semantics::Meshsim).empty());
  const auto& rows = differences(Semantics::Pytorch);
  EXPECT_GE(rows.size(), 6u);
  for (const auto& row : rows) {
    SCOPED_TRACE(row.name);
    EXPECT_TRUE(follows(Semantics::Pytorch, row.id));
    EXPECT_FALSE(follows(Semantics::Meshsim, row.id));
    EXPECT_GT(std::string(row.source).size(), 10u);
    EXPECT_GT(std::string(row.meshsim).size(), 10u);
    EXPECT_GT(std::string(row.other).size(), 10u);
  }
}

TEST(Semantics, OptionParsesAndIsRecorded) {
  RunOptions o;
  set_option(o, "semantics", "pytorch");
  EXPECT_EQ(o.semantics, Semantics::Pytorch);
  EXPECT_EQ(o.to_json()["semantics"], "pytorch");
  EXPECT_THROW(set_option(o, "semantics", "jax2"), std::invalid_argument);
}

// pytorch/pytorch#162692: the mean over an unevenly sharded dim, P(avg) of local means.
TEST(Semantics, PytorchMeanOverUnevenShardsFailsAndPassesOnEvenOnes) {
  const json bad = run_file("pytorch_162692_uneven_mean");
  EXPECT_EQ(bad["status"], "fail");
  EXPECT_EQ(bad["values"]["m"]["placements"], json::array({"P(avg)"}));
  EXPECT_EQ(bad["checks"]["forward_equivalence"], false);
  EXPECT_EQ(bad["checks"]["gradient_equivalence"], true) << "the backward divides by the global count";

  const json ours = run_file("pytorch_162692_uneven_mean", {{"semantics", "meshsim"}});
  EXPECT_EQ(ours["status"], "pass");
  EXPECT_EQ(ours["values"]["m"]["placements"], json::array({"P(sum)"}));

  json even = read_json_file(bug_file("pytorch_162692_uneven_mean"));
  even["inputs"][0]["shape"] = {8, 4};
  even.erase("expect");
  const json r = run_doc(even);
  EXPECT_EQ(r["values"]["m"]["placements"], json::array({"P(avg)"}));
  EXPECT_EQ(r["checks"]["forward_equivalence"], true) << r.dump(2);
  EXPECT_EQ(r["checks"]["gradient_equivalence"], true);
}

// An empty shard (6 rows over 4 ranks: 2, 2, 2, 0): PyTorch's local mean there is 0/0, and the
// P(avg) of the four is NaN; meshsim's P(sum) gives rank 3 a 0 and the mean is right.
TEST(Semantics, PytorchMeanOverAnEmptyShardIsNaN) {
  json d = read_json_file(bug_file("pytorch_162692_uneven_mean"));
  d["inputs"][0]["shape"] = {6, 4};
  d.erase("expect");
  const json theirs = run_doc(d);
  EXPECT_EQ(theirs["values"]["m"]["local_shapes"][3], json::array({4}));
  EXPECT_EQ(theirs["checks"]["forward_equivalence"], false);
  EXPECT_TRUE(theirs["max_abs_error"].is_null()) << "NaN against a number";
  EXPECT_EQ(run_doc(d, {{"semantics", "meshsim"}})["status"], "pass");
}

// Redistribute.backward: meshsim's hook all_reduces the P(sum) gradient of the R output and
// chunks it; PyTorch's backward reduce_scatters it straight to S(0). Both are right.
TEST(Semantics, RedistributeBackwardBytesUnderBothSemantics) {
  const json ours = run_file("redistribute_backward_meshsim");
  const json theirs = run_file("redistribute_backward_pytorch");
  EXPECT_EQ(ours["checks"]["gradient_equivalence"], true);
  EXPECT_EQ(theirs["checks"]["gradient_equivalence"], true);
  EXPECT_GT(bytes_of(ours, "backward", "all_reduce"), 0);
  EXPECT_EQ(bytes_of(ours, "backward", "reduce_scatter"), 0);
  EXPECT_EQ(bytes_of(theirs, "backward", "all_reduce"), 0);
  EXPECT_GT(bytes_of(theirs, "backward", "reduce_scatter"), 0);
  EXPECT_EQ(bytes_of(ours, "backward", "all_reduce"), 2 * bytes_of(theirs, "backward", "reduce_scatter"));
}

// Without the hook an input's gradient may be Partial, as PyTorch's .grad is; the oracle still
// judges its value.
TEST(Semantics, PytorchLeavesPartialGradients) {
  json d = {{"format", "meshsim.scenario/1"},
            {"mesh", {{"axes", {"dp"}}, {"shape", {4}}}},
            {"inputs", {{{"name", "x"}, {"shape", {8, 6}}, {"placements", {"S(0)"}}},
                        {{"name", "w"}, {"shape", {6, 3}}, {"placements", {"R"}}, {"requires_grad", true}}}},
            {"program", {{{"out", "y"}, {"op", "mm"}, {"args", {"x", "w"}}}, {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}}},
            {"backward", "loss"}};
  const json theirs = run_doc(d, {{"semantics", "pytorch"}});
  EXPECT_EQ(theirs["grads"]["w"]["placements"], json::array({"P(sum)"}));
  EXPECT_EQ(theirs["checks"]["gradient_equivalence"], true);
  EXPECT_EQ(bytes_of(theirs, "backward", "all_reduce"), 0);
  const json ours = run_doc(d);
  EXPECT_EQ(ours["grads"]["w"]["placements"], json::array({"R"}));
  EXPECT_GT(bytes_of(ours, "backward", "all_reduce"), 0);
}

TEST(Semantics, PytorchRefusesRank0Convention) {
  json d = read_json_file(bug_file("redistribute_backward_meshsim"));
  d.erase("expect");
  const json r = run_doc(d, {{"semantics", "pytorch"}, {"partial_from_replicate", "rank0"}});
  EXPECT_EQ(r["status"], "error");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("partial_from_replicate"), std::string::npos);
}

// The missing pvary: a data-parallel body whose replicated weight is never made varying; its
// gradient is each rank's own part, labelled R. meshsim's tracking inserts the mark_varying.
TEST(Semantics, MissingPvaryFailsUncheckedAndPassesTracked) {
  const json bad = run_file("missing_pvary_dp_weight");
  EXPECT_EQ(bad["status"], "fail");
  EXPECT_EQ(bad["checks"]["forward_equivalence"], true);
  EXPECT_EQ(bad["checks"]["gradient_equivalence"], false);
  EXPECT_EQ(bytes_of(bad, "backward", "all_reduce"), 0);
  json d = read_json_file(bug_file("missing_pvary_dp_weight"));
  d["program"][0]["check_variance"] = true;
  d.erase("expect");
  const json tracked = run_doc(d);
  EXPECT_EQ(tracked["status"], "pass");
  EXPECT_GT(bytes_of(tracked, "backward", "all_reduce"), 0);
  // PyTorch's local_map tracks nothing: under semantics pytorch the body is unchecked by default.
  d["program"][0].erase("check_variance");
  EXPECT_EQ(run_doc(d, {{"semantics", "pytorch"}})["checks"]["gradient_equivalence"], false);
  EXPECT_EQ(run_doc(d)["status"], "pass");
}

// The bias added before the all_reduce as 1/tp of itself: the forward is right, the gradient is
// 1/tp of the truth unchecked; tracked, the mark_varying's all_reduce makes it whole.
TEST(Semantics, BiasGradientOffByTpOnlyUnchecked) {
  const json bad = run_file("bias_grad_off_by_tp");
  EXPECT_EQ(bad["checks"]["forward_equivalence"], true);
  EXPECT_EQ(bad["checks"]["gradient_equivalence"], false);
  json d = read_json_file(bug_file("bias_grad_off_by_tp"));
  d["program"][0]["check_variance"] = true;
  d.erase("expect");
  EXPECT_EQ(run_doc(d)["status"], "pass");
}

json local_code_doc(bool all_reduce, bool run_check) {
  json program = json::array();
  program.push_back({{"out", "xl"}, {"op", "to_local"}, {"args", {"x"}}});
  program.push_back({{"out", "s"}, {"op", "sum"}, {"args", {"xl"}}, {"dim", 0}});
  std::string last = "s";
  if (all_reduce) {
    program.push_back({{"out", "sr"}, {"op", "all_reduce"}, {"args", {"s"}}, {"axis", "dp"}});
    last = "sr";
  }
  program.push_back({{"out", "y"}, {"op", "from_local"}, {"args", {last}}, {"placements", {"R"}}, {"run_check", run_check}});
  program.push_back({{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}});
  return {{"format", "meshsim.scenario/1"},
          {"mesh", {{"axes", {"dp"}}, {"shape", {4}}}},
          {"inputs", {{{"name", "x"}, {"shape", {8, 3}}, {"placements", {"S(0)"}}, {"requires_grad", true}}}},
          {"program", program},
          {"backward", "loss"}};
}

TEST(Semantics, FromLocalTrustedIsJudgedByTheOracle) {
  const json bad = run_doc(local_code_doc(false, false));
  EXPECT_EQ(bad["status"], "fail");
  EXPECT_EQ(bad["checks"]["forward_equivalence"], false);
  const json good = run_doc(local_code_doc(true, false));
  EXPECT_EQ(good["status"], "pass") << good.dump(2);
  EXPECT_EQ(bytes_of(good, "forward", "all_reduce"), 36);
}

TEST(Semantics, LocalCodeRefusesMixedOperandsAndDTensorCollectives) {
  json d = local_code_doc(true, false);
  d["program"][2]["args"] = {"x"};  // all_reduce of a DTensor
  json r = run_doc(d);
  EXPECT_EQ(r["status"], "error");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("/program/2"), std::string::npos);
  d = local_code_doc(true, false);
  d["program"][1] = {{"out", "s"}, {"op", "add"}, {"args", {"xl", "x"}}};
  r = run_doc(d);
  EXPECT_EQ(r["status"], "error");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("/program/1/args/1"), std::string::npos);
}

}  // namespace
}  // namespace meshsim

namespace meshsim {
namespace {

// PyTorch's spellings of local code's gradient layout (to_local grad_placements, local_map
// in_grad_placements): the user's fix of a missing gradient reduction, written as in PyTorch.
json example(const std::string& name) {
  return read_json_file(std::string(MESHSIM_SOURCE_DIR) + "/examples/" + name + ".json");
}

// The JSON path at which reading the scenario is refused ("" when it is read).
std::string refused_at(const json& d) {
  try {
    parse_scenario(d, "semantics.json");
  } catch (const InputError& e) {
    return e.json_path();
  }
  return "";
}

int64_t count_of(const json& r, const std::string& phase, const std::string& op) {
  int64_t n = 0;
  for (const auto& c : r["collectives"]) n += c["phase"] == phase && c["op"] == op;
  return n;
}

TEST(GradPlacements, ToLocalPartialSumReducesTheReplicatedWeightsGradient) {
  json d = example("to_local_grad_placements");
  json r = run_doc(d);
  EXPECT_EQ(r["status"], "pass") << r.dump(1);
  EXPECT_EQ(count_of(r, "backward", "all_reduce"), 1);
  // Without the spelling, the ranks' parts are taken as replicas: the missing reduction.
  d["program"][1].erase("grad_placements");
  r = run_doc(d);
  EXPECT_EQ(r["status"], "fail");
  EXPECT_EQ(r["checks"]["gradient_equivalence"], false);
  EXPECT_EQ(count_of(r, "backward", "all_reduce"), 0);
  // Its own placements are the default: the same as leaving it out.
  d["program"][1]["grad_placements"] = json::array({"R"});
  EXPECT_EQ(run_doc(d)["status"], "fail");
}

TEST(GradPlacements, LocalMapInGradPlacementsLikewise) {
  json d = example("local_map_in_grad_placements");
  json r = run_doc(d);
  EXPECT_EQ(r["status"], "pass") << r.dump(1);
  EXPECT_EQ(count_of(r, "backward", "all_reduce"), 1);
  d["program"][0].erase("in_grad_placements");
  EXPECT_EQ(run_doc(d)["status"], "fail");
}

TEST(GradPlacements, WithoutTheHookTheGradientKeepsTheLayoutGiven) {
  // semantics pytorch: w's .grad stays P(sum), as PyTorch leaves it; its value is still right.
  const json r = run_doc(example("to_local_grad_placements"), {{"semantics", "pytorch"}});
  EXPECT_EQ(r["status"], "pass") << r.dump(1);
  EXPECT_EQ(r["grads"]["w"]["placements"], json::array({"P(sum)"}));
  EXPECT_EQ(count_of(r, "backward", "all_reduce"), 0);
}

TEST(GradPlacements, ALayoutThatDoesNotFitIsRefused) {
  json d = example("to_local_grad_placements");
  d["program"][1]["grad_placements"] = json::array({"S(2)"});  // w is 2-D
  EXPECT_EQ(refused_at(d), "/program/1/grad_placements");
  // A local_map's, whose args' shapes are known when it runs: shape_mismatch then.
  d = example("local_map_in_grad_placements");
  d["program"][0]["in_grad_placements"][1] = json::array({"S(2)"});
  json r = run_doc(d);
  EXPECT_EQ(r["status"], "error");
  EXPECT_EQ(r["error"]["kind"], "shape_mismatch") << r.dump(1);
  // A layout whose local shapes are not the locals' (x is S(0): its local gradient is a row block).
  d = example("to_local_grad_placements");
  d["program"][0]["grad_placements"] = json::array({"R"});
  d["inputs"][1]["requires_grad"] = true;
  r = run_doc(d);
  EXPECT_EQ(r["status"], "error");
  EXPECT_EQ(r["error"]["kind"], "shape_mismatch") << r.dump(1);
  // A gradient's partial is a sum.
  d = example("to_local_grad_placements");
  d["program"][1]["grad_placements"] = json::array({"P(max)"});
  r = run_doc(d);
  EXPECT_EQ(r["status"], "error");
  EXPECT_EQ(r["error"]["kind"], "invalid_scenario") << r.dump(1);
  // A tracked body derives its gradients' layout itself: in_grad_placements there would reduce twice.
  d = example("local_map_in_grad_placements");
  d["program"][0]["check_variance"] = true;
  r = run_doc(d);
  EXPECT_EQ(r["status"], "error");
  EXPECT_EQ(r["error"]["kind"], "invalid_scenario") << r.dump(1);
  d = example("local_map_in_grad_placements");
  d["program"][0]["in_grad_placements"] = json::array({json::array({"S(0)"})});
  EXPECT_EQ(refused_at(d), "/program/0/in_grad_placements");
}

}  // namespace
}  // namespace meshsim

namespace meshsim {
namespace {

// Seed 003's open question 2: an op asks for its redistributions below autograd while the run is
// above. The mm's gathered weight then gets its gradient by the op's own backward (a
// reduce_scatter) instead of Redistribute.backward's all_reduce: half the bytes.
TEST(PerOpRedistributeMode, AnOpOptsOutOfAboveAutograd) {
  json d = read_json_file(std::string(MESHSIM_SOURCE_DIR) + "/examples/mm_opt_out_below.json");
  json r = run_doc(d);
  ASSERT_EQ(r["status"], "pass") << r.dump(1);
  EXPECT_EQ(bytes_of(r, "backward", "reduce_scatter"), 384);
  EXPECT_EQ(bytes_of(r, "backward", "all_reduce"), 0);
  d["program"][0].erase("redistribute_mode");
  r = run_doc(d);
  ASSERT_EQ(r["status"], "pass");
  EXPECT_EQ(bytes_of(r, "backward", "all_reduce"), 768);
  EXPECT_EQ(bytes_of(r, "backward", "reduce_scatter"), 0);
  // And the converse: an op above autograd in a run below.
  d["options"]["redistribute"] = "below_autograd";
  d["program"][0]["redistribute_mode"] = "above_autograd";
  r = run_doc(d);
  EXPECT_EQ(bytes_of(r, "backward", "all_reduce"), 768);
  d["program"][0]["redistribute_mode"] = "sideways";
  EXPECT_EQ(refused_at(d), "/program/0/redistribute_mode");
}

}  // namespace
}  // namespace meshsim

// The transformer layers (norms, embedding, losses, masks), by their meaning: each test runs a scenario
// against the single-device oracle and checks where the collectives fall (the norm weight's
// sequence-parallel all_reduce, the vocab-parallel embedding's masked partial, loss parallel's two
// all_reduces and no gather of the logits), that the planted bug of its class makes it fail, and
// that bad input is named with its file, JSON path and numbers.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/scenario.h"
#include "oracles/check.h"

namespace meshsim {
namespace {

using json = nlohmann::json;

json input(const std::string& name, const json& shape, const json& placements, bool grad = false) {
  return {{"name", name}, {"shape", shape}, {"placements", placements}, {"requires_grad", grad}};
}

json doc(const json& axes, const json& shape, const json& inputs, const json& program, const std::string& backward = "loss") {
  json d = {{"format", "meshsim.scenario/1"},
            {"name", "layers"},
            {"mesh", {{"axes", axes}, {"shape", shape}}},
            {"inputs", inputs},
            {"program", program}};
  if (!backward.empty()) d["backward"] = backward;
  return d;
}

json run(const json& d, const std::string& mutant = "") {
  Scenario sc = parse_scenario(d, "layers.json");
  RunOptions options = sc.options;
  if (!mutant.empty()) set_option(options, "mutant", mutant);
  return check_scenario(sc, options).result;
}

// The collectives of a result as "phase op value".
std::vector<std::string> collectives(const json& r) {
  std::vector<std::string> out;
  for (const auto& c : r["collectives"])
    out.push_back(c["phase"].get<std::string>() + " " + c["op"].get<std::string>() + " " + c["value"].get<std::string>());
  return out;
}

bool has(const std::vector<std::string>& v, const std::string& prefix) {
  for (const auto& s : v)
    if (s.rfind(prefix, 0) == 0) return true;
  return false;
}

// y = norm(x, w) over a sequence shard; loss = sum(y * c).
json norm_doc(const std::string& norm) {
  json ins = {input("x", {2, 4, 3}, {"S(1)"}, true), input("w", {3}, {"R"}, true), input("c", {2, 4, 3}, {"R"})};
  json prog = {{{"op", norm}, {"args", {"x", "w"}}, {"normalized_shape", {3}}, {"out", "y"}},
               {{"op", "mul"}, {"args", {"y", "c"}}, {"out", "m"}},
               {{"op", "sum"}, {"args", {"m"}}, {"out", "loss"}}};
  return doc({"sp"}, {2}, ins, prog);
}

TEST(Norms, TheWeightGradientOverASequenceShardIsAllReduced) {
  for (const char* norm : {"layer_norm", "rms_norm"}) {
    const json r = run(norm_doc(norm));
    EXPECT_EQ(r["status"], "pass") << norm << r.dump(1);
    EXPECT_EQ(r["values"]["y"]["placements"], json({"S(1)"})) << norm;  // the sequence shard stays
    EXPECT_EQ(r["grads"]["w"]["placements"], json({"R"})) << norm;
    const auto c = collectives(r);
    EXPECT_FALSE(has(c, "forward")) << norm << json(c).dump();  // nothing moves forward
    EXPECT_TRUE(has(c, "backward all_reduce w")) << norm << json(c).dump();
    const json bug = run(norm_doc(norm), "norm_weight_grad_not_reduced");
    EXPECT_EQ(bug["status"], "fail") << norm;
    EXPECT_EQ(bug["checks"]["forward_equivalence"], true) << norm;
    EXPECT_EQ(bug["checks"]["gradient_equivalence"], false) << norm;
  }
}

TEST(Norms, AShardOfTheNormalizedDimIsGatheredNotMoved) {
  json d = norm_doc("layer_norm");
  d["inputs"][0]["placements"] = {"S(2)"};
  const json r = run(d);
  EXPECT_EQ(r["status"], "pass") << r.dump(1);
  const auto c = collectives(r);
  EXPECT_TRUE(has(c, "forward all_gather y.arg0")) << json(c).dump();
  EXPECT_FALSE(has(c, "forward all_to_all")) << json(c).dump();
  EXPECT_EQ(r["values"]["y"]["placements"], json({"R"}));
}

// h = embedding(ids, weight) with the weight vocab-sharded over 3 ranks (7 rows: 3, 3, 1).
json embedding_doc() {
  json ids = input("ids", {4, 5}, {"R"});
  ids["dtype"] = "int64";
  ids["init"] = {{"ids", 7}};
  json ins = {ids, input("emb", {7, 3}, {"S(0)"}, true), input("c", {4, 5, 3}, {"R"})};
  json prog = {{{"op", "embedding"}, {"args", {"ids", "emb"}}, {"out", "h"}},
               {{"op", "mul"}, {"args", {"h", "c"}}, {"out", "m"}},
               {{"op", "sum"}, {"args", {"m"}}, {"out", "loss"}}};
  return doc({"tp"}, {3}, ins, prog);
}

TEST(Embedding, AVocabShardedWeightGivesTheMaskedPartialAndItsRowsBack) {
  const json r = run(embedding_doc());
  EXPECT_EQ(r["status"], "pass") << r.dump(1);
  EXPECT_EQ(r["values"]["h"]["placements"], json({"P(sum)"}));
  EXPECT_EQ(r["grads"]["emb"]["placements"], json({"S(0)"}));
  const auto c = collectives(r);
  // Nothing moves: P(sum) times a replica stays P(sum) up to the loss, and each rank adds the
  // gradient rows of its own vocab range.
  EXPECT_TRUE(c.empty()) << json(c).dump();
  EXPECT_EQ(r["values"]["loss"]["placements"], json({"P(sum)"}));
  for (const char* bug : {"vocab_lookup_unmasked", "embedding_grad_wrong_rank"}) {
    const json b = run(embedding_doc(), bug);
    EXPECT_EQ(b["status"], "fail") << bug << b.dump(1);
  }
}

TEST(Embedding, IdsOutsideTheVocabAreNamedWithTheirRank) {
  json d = embedding_doc();
  d["inputs"][0]["init"] = {{"ids", 9}};
  const json r = run(d);
  EXPECT_EQ(r["status"], "error");
  EXPECT_EQ(r["error"]["kind"], "invalid_scenario");
  const std::string m = r["error"]["message"];
  EXPECT_NE(m.find("/program/0/args/0: embedding: \"ids\" holds"), std::string::npos) << m;
  EXPECT_NE(m.find("outside [0, 7)"), std::string::npos) << m;
}

TEST(Embedding, OperandsOfTheWrongElementTypeAreNamed) {
  json d = embedding_doc();
  d["program"][0]["args"] = {"emb", "emb"};
  const json r = run(d);
  EXPECT_EQ(r["status"], "error");
  const std::string m = r["error"]["message"];
  EXPECT_NE(m.find("/program/0/args/0: embedding: \"emb\" is float, expected int64"), std::string::npos) << m;
}

// loss = cross_entropy(logits, target): logits [6, 8], their classes or batch sharded on tp=2.
json loss_doc(const json& logits_spec, const json& target_spec, const json& extra = json::object()) {
  json target = input("t", {6}, target_spec);
  target["dtype"] = "int64";
  target["init"] = {{"ids", 8}};
  json x = input("x", {6, 8}, logits_spec, true);
  x["init"] = "randn";
  json op = {{"op", "cross_entropy"}, {"args", {"x", "t"}}, {"out", "loss"}};
  op.update(extra);
  return doc({"tp"}, {2}, json::array({x, target}), json::array({op}));
}

TEST(Losses, LossParallelAllReducesTheMaxAndTheSumAndNeverGathersTheLogits) {
  const json r = run(loss_doc({"S(1)"}, {"R"}));
  EXPECT_EQ(r["status"], "pass") << r.dump(1);
  EXPECT_EQ(r["grads"]["x"]["placements"], json({"S(1)"}));
  const auto c = collectives(r);
  EXPECT_TRUE(has(c, "forward all_reduce loss.log_softmax.shifted.arg1")) << json(c).dump();     // the max
  EXPECT_TRUE(has(c, "forward all_reduce loss.log_softmax.logsumexp.arg0")) << json(c).dump();  // the sum
  EXPECT_FALSE(has(c, "forward all_gather")) << json(c).dump();
  const json b = run(loss_doc({"S(1)"}, {"R"}), "loss_parallel_local_max");
  EXPECT_EQ(b["status"], "fail");
  EXPECT_EQ(b["checks"]["forward_equivalence"], false);
}

TEST(Losses, TheMeanOverAnUnevenBatchShardIsExactWithIgnoredTargets) {
  for (const json& extra : {json::object(), json{{"ignore_index", 3}}, json{{"reduction", "sum"}}}) {
    json d = loss_doc({"S(0)"}, {"S(0)"}, extra);
    d["mesh"]["shape"] = {4};  // 6 rows over 4 ranks: 2, 2, 2, 0
    const json r = run(d);
    EXPECT_EQ(r["status"], "pass") << extra.dump() << r.dump(1);
  }
}

// Every target ignored: the mean is 0/0, NaN on the mesh and in the oracle, and the gradient is
// zero as libtorch's nll_loss gives (not inf * 0).
TEST(Losses, EveryTargetIgnoredGivesANaNLossAndAZeroGradient) {
  json d = loss_doc({"S(0)"}, {"S(0)"}, {{"ignore_index", 1}});
  d["inputs"][1]["init"] = "ones";
  const json r = run(d);
  EXPECT_EQ(r["status"], "pass") << r.dump(1);
}

TEST(Activations, GeluNoneIsDifferentiatedExactly) {
  json x = input("x", {4, 3}, {"S(0)"}, true);
  x["init"] = "randn";
  json d = doc({"tp"}, {2}, json::array({x}),
               {{{"op", "gelu"}, {"args", {"x"}}, {"out", "y"}}, {{"op", "sum"}, {"args", {"y"}}, {"out", "loss"}}});
  EXPECT_EQ(run(d)["status"], "pass");
  const json b = run(d, "gelu_tanh_derivative");
  EXPECT_EQ(b["checks"]["forward_equivalence"], true);
  EXPECT_EQ(b["checks"]["gradient_equivalence"], false);
  d["program"][0]["approximate"] = "tanh";
  EXPECT_EQ(run(d, "gelu_tanh_derivative")["status"], "pass");  // the tanh form is its own derivative
}

// A causal mask from creation ops: scores.masked_fill(triu(ones, 1), -inf).softmax(-1).
TEST(Masks, ACausalMaskFromCreationOpsNeedsNoInput) {
  json s = input("s", {2, 4, 4}, {"S(0)"}, true);
  json d = doc({"dp"}, {2}, json::array({s}),
               {{{"op", "ones"}, {"shape", {4, 4}}, {"placements", {"R"}}, {"dtype", "bool"}, {"out", "all"}},
                {{"op", "triu"}, {"args", {"all"}}, {"diagonal", 1}, {"out", "future"}},
                {{"op", "masked_fill"}, {"args", {"s", "future"}}, {"value", "-inf"}, {"out", "masked"}},
                {{"op", "softmax"}, {"args", {"masked"}}, {"dim", -1}, {"out", "p"}},
                {{"op", "arange"}, {"shape", {2, 4, 4}}, {"placements", {"S(0)"}}, {"out", "c"}},
                {{"op", "mul"}, {"args", {"p", "c"}}, {"out", "m"}},
                {{"op", "sum"}, {"args", {"m"}}, {"out", "loss"}}});
  const json r = run(d);
  EXPECT_EQ(r["status"], "pass") << r.dump(1);
  EXPECT_EQ(r["values"]["p"]["placements"], json({"S(0)"}));
  EXPECT_TRUE(collectives(r).empty()) << r["collectives"].dump();  // the mask is made on every rank
}

void expect_input_error(const json& d, const std::string& path, const std::string& message) {
  try {
    parse_scenario(d, "layers.json");
    ADD_FAILURE() << "no error, expected " << path << ": " << message;
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "layers.json");
    EXPECT_EQ(e.json_path(), path) << e.what();
    EXPECT_NE(e.detail().find(message), std::string::npos) << e.what();
  }
}

TEST(Inputs, BoolAndInt64InputsAreNeverPartialNorDifferentiable) {
  json d = embedding_doc();
  d["inputs"][0]["placements"] = {"P(sum)"};
  expect_input_error(d, "/inputs/0/placements/0", "a int64 input is S, R or Rd on each axis, not P(sum)");
  d = embedding_doc();
  d["inputs"][0]["requires_grad"] = true;
  expect_input_error(d, "/inputs/0/requires_grad", "a int64 input has no gradient");
  d = embedding_doc();
  d["inputs"][0]["dtype"] = "int32";
  expect_input_error(d, "/inputs/0/dtype", "unknown dtype \"int32\" (expected float, bool or int64)");
  d = embedding_doc();
  d["inputs"][2]["init"] = {{"ids", 3}};
  expect_input_error(d, "/inputs/2/init", "makes int64 values");
  d = embedding_doc();
  d["program"][0]["op"] = "ones";
  d["program"][0]["shape"] = {2};
  d["program"][0]["placements"] = {"P(sum)"};
  d["program"][0].erase("args");
  expect_input_error(d, "/program/0/placements/0", "ones makes S, R or Rd values, not P(sum)");
}

// A local_map body's vocab-parallel lookup: embedding {axis, vocab} then the psum the user writes.
TEST(Embedding, ALocalMapBodyLooksUpItsRankVocabRange) {
  json d = embedding_doc();
  d["program"][0] = {{"op", "local_map"},
                     {"args", {"ids", "emb"}},
                     {"out_placements", {{"R"}}},
                     {"body",
                      {{{"op", "embedding"}, {"args", {"ids", "emb"}}, {"axis", "tp"}, {"vocab", 7}, {"out", "part"}},
                       {{"op", "all_reduce"}, {"args", {"part"}}, {"axis", "tp"}, {"out", "whole"}}}},
                     {"returns", {"whole"}},
                     {"reference", {{{"op", "embedding"}, {"args", {"ids", "emb"}}, {"out", "whole"}}}},
                     {"out", "h"}};
  const json r = run(d);
  EXPECT_EQ(r["status"], "pass") << r.dump(1);
  d["program"][0]["body"][0].erase("axis");  // the mask forgotten: ids beyond a rank's rows
  d["program"][0]["body"][0].erase("vocab");
  EXPECT_NE(run(d)["status"], "pass");
}

}  // namespace
}  // namespace meshsim

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

// Class weights, label smoothing and reduction none, against the oracle (libtorch's nll_loss and
// cross_entropy_loss) on meshes [3], [4] and [2, 2], 7 rows and 5 classes (uneven shards), the scores
// sharded by batch or by class and the weight replicated or sharded.
TEST(Losses, ClassWeightsLabelSmoothingAndReductionNoneOnEveryMesh) {
  struct Mesh {
    json axes, shape;
  };
  const std::vector<Mesh> meshes = {{{"a"}, {3}}, {{"a"}, {4}}, {{"a", "b"}, {2, 2}}};
  const std::vector<json> options = {
      {{"reduction", "mean"}}, {{"reduction", "sum"}}, {{"reduction", "none"}},
      {{"reduction", "mean"}, {"ignore_index", 2}}, {{"reduction", "none"}, {"ignore_index", 2}},
      {{"reduction", "mean"}, {"label_smoothing", 0.2}}, {{"reduction", "mean"}, {"label_smoothing", 0.2}, {"ignore_index", 2}},
      {{"reduction", "sum"}, {"label_smoothing", 0.5}}, {{"reduction", "none"}, {"label_smoothing", 0.1}}};
  int runs = 0;
  for (const auto& m : meshes)
    for (const char* op : {"cross_entropy", "nll_loss"})
      for (bool weighted : {false, true})
        for (const json& extra : options) {
          if (std::string(op) == "nll_loss" && extra.contains("label_smoothing")) continue;
          const bool two = m.axes.size() == 2;
          json x = input("x", {7, 5}, two ? json{"S(0)", "S(1)"} : json{runs % 2 ? "S(1)" : "S(0)"}, true);
          x["init"] = "randn";
          json t = input("t", {7}, two ? json{"S(0)", "R"} : json{"S(0)"});
          t["dtype"] = "int64";
          t["init"] = {{"ids", 5}};
          json ins = {x, t};
          json args = {"x", "t"};
          json prog = json::array();
          if (weighted) {
            ins.push_back(input("w", {5}, two ? json{"R", "S(0)"} : json{runs % 3 ? "S(0)" : "R"}));
            prog.push_back({{"op", "exp"}, {"args", {"w"}}, {"out", "wp"}});
            args.push_back("wp");
          }
          json l = {{"op", op}, {"args", args}, {"out", "l"}};
          l.update(extra);
          prog.push_back(l);
          prog.push_back({{"op", "sum"}, {"args", {"l"}}, {"out", "loss"}});
          const json r = run(doc(m.axes, m.shape, ins, prog));
          ++runs;
          SCOPED_TRACE(std::string(op) + " " + m.shape.dump() + " weighted " + std::to_string(weighted) + " " + extra.dump());
          EXPECT_EQ(r["status"], "pass") << r.dump(1);
          EXPECT_EQ(r["values"]["l"]["shape"], extra["reduction"] == "none" ? json({7}) : json::array());
        }
  EXPECT_EQ(runs, 3 * 2 * 2 * 9 - 3 * 2 * 4);
}

// The weighted mean divides by the targets' weights: x = arange [4, 2] (rows [0, 1], [2, 3], [4, 5],
// [6, 7]), targets 0, 1, 0, 1, weights 1 and 3: -(0 + 3 * 3 + 4 + 3 * 7) / (1 + 3 + 1 + 3) = -4.25
// (unweighted: -(0 + 3 + 4 + 7) / 4 = -3.5), on the mesh as in the oracle.
TEST(Losses, AWeightedMeanDividesByTheTargetsWeights) {
  auto loss_of = [](bool weighted) {
    json x = input("x", {4, 2}, {"S(0)"}, true);
    x["init"] = "arange";
    json t = input("t", {4}, {"S(0)"});
    t["dtype"] = "int64";
    t["init"] = "arange";
    json w = input("w", {2}, {"R"});
    w["init"] = "arange";
    json prog = {{{"op", "remainder"}, {"args", {"t"}}, {"value", 2}, {"out", "tc"}},  // 0, 1, 0, 1
                 {{"op", "scale"}, {"args", {"w"}}, {"value", 2}, {"out", "w2"}},
                 {{"op", "add"}, {"args", {"w2"}}, {"value", 1}, {"out", "wp"}}};  // 1, 3
    json args = weighted ? json{"x", "tc", "wp"} : json{"x", "tc"};
    prog.push_back({{"op", "nll_loss"}, {"args", args}, {"out", "loss"}});
    const Scenario sc = parse_scenario(doc({"dp"}, {2}, {x, t, w}, prog), "layers.json");
    const CheckedRun r = check_scenario(sc, sc.options, /*keep_values=*/true);
    EXPECT_EQ(r.result["status"], "pass") << r.result.dump(1);
    for (const auto& k : r.tensors->values)
      if (k.name == "loss") return k.global.item<double>();
    ADD_FAILURE() << "no loss kept";
    return 0.0;
  };
  EXPECT_EQ(loss_of(true), -4.25);
  EXPECT_EQ(loss_of(false), -3.5);
}

TEST(Losses, AWeightThatRequiresGradOrHasTheWrongShapeIsRefused) {
  json x = input("x", {4, 3}, {"S(0)"}, true);
  json t = input("t", {4}, {"S(0)"});
  t["dtype"] = "int64";
  t["init"] = {{"ids", 3}};
  json prog = {{{"op", "cross_entropy"}, {"args", {"x", "t", "w"}}, {"out", "loss"}}};
  const json grad = run(doc({"dp"}, {2}, {x, t, input("w", {3}, {"R"}, true)}, prog));
  EXPECT_EQ(grad["status"], "error");
  EXPECT_EQ(grad["error"]["kind"], "not_differentiable") << grad.dump(1);
  EXPECT_NE(grad["error"]["message"].get<std::string>().find("/program/0/args/2: cross_entropy's class weight \"w\" requires grad"),
            std::string::npos)
      << grad.dump(1);
  const json shape = run(doc({"dp"}, {2}, {x, t, input("w", {4}, {"R"})}, prog));
  EXPECT_EQ(shape["error"]["kind"], "shape_mismatch") << shape.dump(1);
  EXPECT_NE(shape["error"]["message"].get<std::string>().find("takes a class weight [C] = [3], got [4]"), std::string::npos)
      << shape.dump(1);
  json smoothing = doc({"dp"}, {2}, {x, t}, {{{"op", "cross_entropy"}, {"args", {"x", "t"}}, {"out", "loss"},
                                              {"label_smoothing", 1.5}}});
  try {
    parse_scenario(smoothing, "layers.json");
    ADD_FAILURE() << "label_smoothing 1.5 accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.json_path(), "/program/0/label_smoothing");
    EXPECT_NE(std::string(e.what()).find("label_smoothing is in [0, 1], got 1.5"), std::string::npos) << e.what();
  }
}

// A tensor literal is the input's global value, laid out by its placements (an uneven shard here),
// on the mesh and in the oracle: loss = -(2 + 3.5 + 6) picks x[0][1], x[1][0], x[2][1].
TEST(Inputs, ATensorLiteralIsTheGlobalValueOnEveryRank) {
  json x = input("x", {3, 2}, {"S(0)"}, true);
  x["init"] = {{"values", {{1, 2}, {3.5, -4}, {5, 6}}}};
  json t = input("t", {3}, {"R"});
  t["dtype"] = "int64";
  t["init"] = {{"values", {1, 0, 1}}};
  const Scenario sc = parse_scenario(
      doc({"dp"}, {2}, {x, t}, {{{"op", "nll_loss"}, {"args", {"x", "t"}}, {"out", "loss"}, {"reduction", "sum"}}}),
      "layers.json");
  const CheckedRun r = check_scenario(sc, sc.options, /*keep_values=*/true);
  EXPECT_EQ(r.result["status"], "pass") << r.result.dump(1);
  for (const auto& k : r.tensors->values) {
    if (k.name == "x") {
      EXPECT_EQ(k.locals.at(0).size(0), 2);  // rows 0-1 on rank 0, row 2 on rank 1
      EXPECT_EQ(k.locals.at(1)[0][0].item<double>(), 5.0);
    }
    if (k.name == "loss") {
      EXPECT_EQ(k.global.item<double>(), -11.5);
    }
  }
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
  expect_input_error(d, "/inputs/0/dtype",
                     "unknown dtype \"int32\" (expected float, bool, int64, float64, float32, bfloat16 or float16)");
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

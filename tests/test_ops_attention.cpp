// Attention and its friends: repeat, repeat_interleave and scaled_dot_product_attention on every
// placement of meshes [3], [4] and [2, 2] against the oracle (values and gradients), uneven
// shapes; the placements the planner chooses (the batch and the heads kept, a sequence gathered,
// grouped heads and repeat_interleave's dim kept only where the chunks line up); the kernel's
// values by hand (causal top left with sq != sk, a bool mask, a row with no key); the planted bug
// sdpa_sequence_shard_local; and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/propagation.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "sim/local_ops.h"

namespace meshsim {
namespace {

using json = nlohmann::json;

json run(const json& doc) {
  const Scenario sc = parse_scenario(doc, "test.json");
  return check_scenario(sc, sc.options).result;
}

json axes_of(const json& mesh) { return mesh.size() == 1 ? json::array({"a"}) : json::array({"a", "b"}); }

// y = op(operands...) with loss = sum(y * c), c a random replicated weight of y's shape; an
// operand named "mask" is bool (or float, no gradient) and never requires grad.
json program(const std::string& op, const json& attrs, const json& mesh, const std::vector<json>& shapes,
             const std::vector<json>& specs, const json& out_shape, const std::string& mask_dtype = "bool") {
  const std::vector<std::string> names = {"x", "k", "v", "mask"};
  json inputs = json::array(), args = json::array();
  for (size_t i = 0; i < shapes.size(); ++i) {
    json in = {{"name", names[i]}, {"shape", shapes[i]}, {"placements", specs[i]}};
    if (i == 3) {
      in["dtype"] = mask_dtype;
    } else {
      in["requires_grad"] = true;
    }
    inputs.push_back(in);
    args.push_back(names[i]);
  }
  json rep = json::array();
  for (size_t a = 0; a < mesh.size(); ++a) rep.push_back("R");
  inputs.push_back({{"name", "c"}, {"shape", out_shape}, {"placements", rep}});
  json y = {{"out", "y"}, {"op", op}, {"args", args}};
  if (attrs.is_object()) y.update(attrs);
  return {{"format", "meshsim.scenario/1"},
          {"name", op},
          {"mesh", {{"axes", axes_of(mesh)}, {"shape", mesh}}},
          {"inputs", inputs},
          {"program", {y, {{"out", "w"}, {"op", "mul"}, {"args", {"y", "c"}}}, {{"out", "loss"}, {"op", "sum"}, {"args", {"w"}}}}},
          {"backward", "loss"}};
}

std::vector<std::string> placements_of(size_t rank) {
  std::vector<std::string> out;
  for (size_t d = 0; d < rank; ++d) out.push_back("S(" + std::to_string(d) + ")");
  for (const char* p : {"R", "Rd", "P(sum)", "P(avg)"}) out.push_back(p);
  return out;
}

// ---------------------------------------------------------------------------------------------
// repeat, repeat_interleave

struct Unary {
  std::string op;
  json attrs;
  json shape, out;
};

const std::vector<Unary>& unary_cases() {
  static const std::vector<Unary> cases = {
      {"repeat", {{"sizes", {2, 1}}}, {5, 3}, {10, 3}},             // dim 0 repeated (gathered), dim 1 kept
      {"repeat", {{"sizes", {1, 3}}}, {5, 3}, {5, 9}},
      {"repeat", {{"sizes", {2, 1, 1}}}, {5, 3}, {2, 5, 3}},        // a new leading dim: the shards move by one
      {"repeat", {{"sizes", {1, 2, 1}}}, {5, 3, 2}, {5, 6, 2}},
      {"repeat_interleave", {{"repeats", 2}, {"dim", 0}}, {5, 3}, {10, 3}},   // uneven: the dim gathered
      {"repeat_interleave", {{"repeats", 3}, {"dim", -1}}, {5, 3}, {5, 9}},
      {"repeat_interleave", {{"repeats", 2}, {"dim", 0}}, {12, 3}, {24, 3}},  // even on 3, 4 and 2: kept
      {"repeat_interleave", {{"repeats", 2}, {"dim", 1}}, {5, 4, 2}, {5, 8, 2}},
  };
  return cases;
}

TEST(Repeat, EveryPlacementMatchesTheOracleOnUnevenMeshes) {
  size_t cases = 0;
  for (const auto& c : unary_cases()) {
    const auto set = placements_of(c.shape.size());
    for (const json& mesh : {json{3}, json{4}})
      for (const auto& p : set) {
        const json r = run(program(c.op, c.attrs, mesh, {c.shape}, {{p}}, c.out));
        ASSERT_EQ(r["status"], "pass") << c.op << c.attrs << " " << mesh << " " << p << r.dump(1);
        ++cases;
      }
    for (const auto& p : set)
      for (const auto& q : set) {
        const json r = run(program(c.op, c.attrs, {2, 2}, {c.shape}, {{p, q}}, c.out));
        ASSERT_EQ(r["status"], "pass") << c.op << c.attrs << " [2, 2] " << p << " " << q << r.dump(1);
        ++cases;
      }
  }
  EXPECT_GT(cases, 400u);
}

TEST(Repeat, AShardStaysOnlyWhereItsChunksLineUp) {
  auto out = [](const std::string& op, const json& attrs, const json& mesh, const json& shape, const json& spec,
                const json& out_shape) {
    const json r = run(program(op, attrs, mesh, {shape}, {spec}, out_shape));
    EXPECT_EQ(r["status"], "pass") << r.dump(1);
    return r["values"]["y"]["placements"];
  };
  // repeat: a dim repeated once keeps its shard (moved by a new leading dim); a repeated one is gathered.
  EXPECT_EQ(out("repeat", {{"sizes", {2, 1, 1}}}, {3}, {5, 3}, {"S(1)"}, {2, 5, 3}), json::array({"S(2)"}));
  EXPECT_EQ(out("repeat", {{"sizes", {2, 1}}}, {3}, {5, 3}, {"S(0)"}, {10, 3}), json::array({"R"}));
  EXPECT_EQ(out("repeat", {{"sizes", {2, 1}}}, {3}, {5, 3}, {"P(sum)"}, {10, 3}), json::array({"P(sum)"}));
  // repeat_interleave of a shard of its dim: 12 rows over 4 ranks (3 each) repeated twice are 6 each:
  // kept; 5 rows over 4 (2, 2, 1, 0) repeated twice are 4, 4, 2, 0, not torch.chunk's 3, 3, 3, 1: gathered.
  EXPECT_EQ(out("repeat_interleave", {{"repeats", 2}, {"dim", 0}}, {4}, {12, 3}, {"S(0)"}, {24, 3}), json::array({"S(0)"}));
  EXPECT_EQ(out("repeat_interleave", {{"repeats", 2}, {"dim", 0}}, {4}, {5, 3}, {"S(0)"}, {10, 3}), json::array({"R"}));
  EXPECT_EQ(out("repeat_interleave", {{"repeats", 2}, {"dim", 0}}, {2, 2}, {12, 3}, {"S(0)", "S(0)"}, {24, 3}),
            json::array({"S(0)", "S(0)"}));
  EXPECT_EQ(out("repeat_interleave", {{"repeats", 2}, {"dim", 1}}, {4}, {5, 3}, {"S(0)"}, {5, 6}), json::array({"S(0)"}));
}

// ---------------------------------------------------------------------------------------------
// scaled_dot_product_attention

struct Attention {
  json attrs;
  std::vector<json> shapes;  // q, k, v, mask?
  json out;
  std::string mask_dtype = "bool";
};

const std::vector<Attention>& attention_cases() {
  static const std::vector<Attention> cases = {
      // causal, uneven batch (3) and heads (5) on every mesh, sq = sk = 5
      {{{"is_causal", true}}, {{3, 5, 5, 2}, {3, 5, 5, 2}, {3, 5, 5, 3}}, {3, 5, 5, 3}},
      // grouped heads (4 over 2), causal top left with sq 5 < sk 7, a scale
      {{{"is_causal", true}, {"enable_gqa", true}, {"scale", 0.5}}, {{3, 4, 5, 2}, {3, 2, 7, 2}, {3, 2, 7, 2}}, {3, 4, 5, 2}},
      // sq 6 > sk 3 causal: the rows past the keys attend to all of them
      {{{"is_causal", true}}, {{2, 3, 6, 2}, {2, 3, 3, 2}, {2, 3, 3, 2}}, {2, 3, 6, 2}},
      // a bool mask of the sequences alone, broadcast over batch and heads
      {{}, {{3, 2, 5, 2}, {3, 2, 4, 2}, {3, 2, 4, 2}, {5, 4}}, {3, 2, 5, 2}},
      // a float mask broadcast over the heads
      {{{"enable_gqa", true}}, {{3, 4, 5, 2}, {3, 2, 4, 2}, {3, 2, 4, 2}, {3, 1, 5, 4}}, {3, 4, 5, 2}, "float"},
  };
  return cases;
}

TEST(Attention, EveryPlacementMatchesTheOracleOnUnevenMeshes) {
  // q, k and v each S(0), S(1), S(2), S(3), R or P(sum) on [3] and [4] (every mix); alike on each
  // axis of [2, 2] from every placement; the mask R, Rd or a shard of its first dim.
  const std::vector<std::string> mixed = {"S(0)", "S(1)", "S(2)", "S(3)", "R", "P(sum)"};
  size_t cases = 0;
  for (const auto& c : attention_cases()) {
    const bool mask = c.shapes.size() > 3;
    for (const json& mesh : {json{3}, json{4}})
      for (const auto& p : mixed)
        for (const auto& q : mixed)
          for (const auto& r : mixed) {
            std::vector<json> specs = {{p}, {q}, {r}};
            if (mask) specs.push_back({std::vector<std::string>{"R", "Rd", "S(0)"}[cases % 3]});
            const json res = run(program("scaled_dot_product_attention", c.attrs, mesh, c.shapes, specs, c.out, c.mask_dtype));
            ASSERT_EQ(res["status"], "pass") << c.attrs << " " << mesh << " " << p << q << r << res.dump(1);
            ++cases;
          }
    const auto all = placements_of(4);
    for (const auto& p : all)
      for (const auto& q : all) {
        std::vector<json> specs(3, json{p, q});
        if (mask) specs.push_back({"R", std::vector<std::string>{"R", "Rd", "S(0)"}[cases % 3]});
        const json res = run(program("scaled_dot_product_attention", c.attrs, {2, 2}, c.shapes, specs, c.out, c.mask_dtype));
        ASSERT_EQ(res["status"], "pass") << c.attrs << " [2, 2] " << p << " " << q << res.dump(1);
        ++cases;
      }
  }
  EXPECT_GT(cases, 2000u);
}

json decided(const json& attrs, const json& mesh, const std::vector<json>& shapes, const std::vector<json>& specs,
             const json& out) {
  const json r = run(program("scaled_dot_product_attention", attrs, mesh, shapes, specs, out));
  EXPECT_EQ(r["status"], "pass") << r.dump(1);
  return r;
}

TEST(Attention, TheBatchAndTheHeadsStayTheSequenceIsGathered) {
  const json q = {2, 4, 6, 2};
  const std::vector<json> same = {q, q, q};
  // The heads (tensor parallelism) and the batch stay, with no collective in the forward.
  json r = decided({{"is_causal", true}}, {2}, same, {{"S(1)"}, {"S(1)"}, {"S(1)"}}, q);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"S(1)"}));
  for (const auto& c : r["collectives"]) EXPECT_NE(c["phase"], "forward") << c;
  r = decided({}, {2}, same, {{"S(0)"}, {"S(0)"}, {"S(0)"}}, q);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"S(0)"}));
  // A sequence shard of q, k and v is not kept (no context parallelism): the planner moves it to the
  // batch shard by an all_to_all each (as many bytes as an all_gather, and the earlier row).
  r = decided({{"is_causal", true}}, {2}, same, {{"S(2)"}, {"S(2)"}, {"S(2)"}}, q);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"S(0)"}));
  int moves = 0;
  for (const auto& c : r["collectives"]) moves += c["phase"] == "forward" && c["op"] == "all_to_all";
  EXPECT_EQ(moves, 3) << r["collectives"];
  // A sequence shard of q alone, k and v replicated: q is gathered (one operand moved).
  r = decided({{"is_causal", true}}, {2}, same, {{"S(2)"}, {"R"}, {"R"}}, q);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"R"}));
  // q sharded on the heads, k and v replicated: k and v are chunked alike (no communication).
  r = decided({}, {2}, same, {{"S(1)"}, {"R"}, {"R"}}, q);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"S(1)"}));
  // Grouped heads: 4 q heads over 2 k/v heads stay sharded on 2 ranks (heads 0-1 with 0, 2-3 with
  // 1); on 4 ranks rank 1's q head 1 would need k/v head 0, which rank 0 holds: gathered.
  const std::vector<json> grouped = {q, {2, 2, 6, 2}, {2, 2, 6, 2}};
  r = decided({{"enable_gqa", true}}, {2}, grouped, {{"S(1)"}, {"S(1)"}, {"S(1)"}}, q);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"S(1)"}));
  r = decided({{"enable_gqa", true}}, {4}, grouped, {{"S(1)"}, {"S(1)"}, {"S(1)"}}, q);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"R"}));
  // A mask of the batch and sequences is sharded with the batch.
  r = decided({}, {2}, {q, q, q, {2, 1, 6, 6}}, {{"S(0)"}, {"S(0)"}, {"S(0)"}, {"R"}}, q);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"S(0)"}));
}

at::Tensor sdpa(const json& attrs, const std::vector<at::Tensor>& xs) {
  OpDecl d;
  d.op = "scaled_dot_product_attention";
  d.attrs = attrs;
  return local_op(d.op, op_attrs(d), xs);
}

TEST(Attention, TheKernelsValuesByHand) {
  // q = 0: every key a row may attend weighs alike, so row i is the mean of the values it sees.
  // Causal top left with sq 3 < sk 5: row i sees keys 0..i; v = 0, 1, 2, 3, 4 gives 0, 0.5, 1.
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor q = at::zeros({1, 1, 3, 2}, opts), k = at::ones({1, 1, 5, 2}, opts);
  const at::Tensor v = at::arange(5, opts).reshape({1, 1, 5, 1});
  at::Tensor y = sdpa({{"is_causal", true}}, {q, k, v});
  EXPECT_DOUBLE_EQ(y[0][0][0][0].item<double>(), 0.0);
  EXPECT_DOUBLE_EQ(y[0][0][1][0].item<double>(), 0.5);
  EXPECT_DOUBLE_EQ(y[0][0][2][0].item<double>(), 1.0);
  // A bool mask [3, 5] (true: attend): row 0 sees keys 1 and 3 (mean 2), row 1 none (zeros, as
  // PyTorch's _safe_softmax gives), row 2 all (mean 2).
  at::Tensor m = at::zeros({3, 5}, at::TensorOptions().dtype(at::kBool));
  m[0][1] = true;
  m[0][3] = true;
  m[2].fill_(true);
  y = sdpa({}, {q, k, v, m});
  EXPECT_DOUBLE_EQ(y[0][0][0][0].item<double>(), 2.0);
  EXPECT_DOUBLE_EQ(y[0][0][1][0].item<double>(), 0.0);
  EXPECT_DOUBLE_EQ(y[0][0][2][0].item<double>(), 2.0);
  // Scores: q . k = 2 for q = k = ones [.., 2]; with scale 1/sqrt(2) and a float mask of log 3 on
  // key 1, key 1 weighs 3 against 1: row 0 of v = (0, 1) gives 3/4.
  const at::Tensor ones_q = at::ones({1, 1, 1, 2}, opts), ones_k = at::ones({1, 1, 2, 2}, opts);
  const at::Tensor v2 = at::arange(2, opts).reshape({1, 1, 2, 1}), fm = at::tensor({0.0, std::log(3.0)}, opts);
  EXPECT_NEAR(sdpa({}, {ones_q, ones_k, v2, fm})[0][0][0][0].item<double>(), 0.75, 1e-15);
  // Grouped heads: q heads 0 and 1 use k/v head 0, heads 2 and 3 head 1.
  const at::Tensor vq = at::zeros({1, 4, 1, 1}, opts), kk = at::zeros({1, 2, 1, 1}, opts);
  const at::Tensor vv = at::tensor({10.0, 20.0}, opts).reshape({1, 2, 1, 1});
  const at::Tensor g = sdpa({{"enable_gqa", true}}, {vq, kk, vv}).flatten();
  EXPECT_EQ(std::vector<double>(g.data_ptr<double>(), g.data_ptr<double>() + 4), (std::vector<double>{10, 10, 20, 20}));
}

TEST(Attention, ThePlantedBugAttendsOnlyToEachRanksOwnKeys) {
  // Causal attention of q, k, v S(2) on 2 ranks: gathered first (right); under
  // sdpa_sequence_shard_local each rank's queries see only its own block of keys: rank 1's first
  // query (position 3) misses keys 0-2.
  const json q = {1, 2, 6, 2};
  json doc = program("scaled_dot_product_attention", {{"is_causal", true}}, {2}, {q, q, q}, {{"S(2)"}, {"S(2)"}, {"S(2)"}}, q);
  const json right = run(doc);
  ASSERT_EQ(right["status"], "pass") << right.dump(1);
  doc["options"] = {{"mutant", "sdpa_sequence_shard_local"}};
  const json r = run(doc);
  ASSERT_EQ(r["status"], "fail") << r.dump(1);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"S(2)"})) << r.dump(1);
  const std::string f = r["failures"][0];
  EXPECT_EQ(f.rfind("y: ", 0), 0u) << f;
  EXPECT_NE(f.find("(rank 1)"), std::string::npos) << f;  // rank 0's block is the global one's start
}

TEST(Attention, RefusalsNameTheShapes) {
  auto message = [](const json& doc) {
    const json r = run(doc);
    EXPECT_EQ(r["status"], "error") << r.dump(1);
    return r["error"]["kind"].get<std::string>() + ": " + r["error"]["message"].get<std::string>();
  };
  const json q = {2, 4, 3, 2};
  // Fewer k/v heads without enable_gqa; heads that do not divide; a mask that does not broadcast.
  std::string m = message(program("scaled_dot_product_attention", {}, {2}, {q, {2, 2, 3, 2}, {2, 2, 3, 2}}, {{"R"}, {"R"}, {"R"}}, q));
  EXPECT_NE(m.find("shape_mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find("different numbers of heads (enable_gqa is false)"), std::string::npos) << m;
  m = message(program("scaled_dot_product_attention", {{"enable_gqa", true}}, {2}, {q, {2, 3, 3, 2}, {2, 3, 3, 2}},
                      {{"R"}, {"R"}, {"R"}}, q));
  EXPECT_NE(m.find("k's heads 3 do not divide q's 4"), std::string::npos) << m;
  m = message(program("scaled_dot_product_attention", {}, {2}, {q, q, q, {3, 4}}, {{"R"}, {"R"}, {"R"}, {"R"}}, q));
  EXPECT_NE(m.find("attn_mask [3, 4] does not broadcast to the scores [b, h, sq, sk] [2, 4, 3, 3]"), std::string::npos) << m;
  m = message(program("scaled_dot_product_attention", {}, {2}, {q, q, q, {3, 3}}, {{"R"}, {"R"}, {"R"}, {"R"}}, q, "int64"));
  EXPECT_NE(m.find("/program/0/args/3: scaled_dot_product_attention: \"mask\" is int64, expected bool or float"),
            std::string::npos)
      << m;
  m = message(program("scaled_dot_product_attention", {{"is_causal", true}}, {2}, {q, q, q, {3, 3}},
                      {{"R"}, {"R"}, {"R"}, {"R"}}, q));
  EXPECT_NE(m.find("an attn_mask with is_causal (PyTorch refuses both"), std::string::npos) << m;
  m = message(program("repeat", {{"sizes", {2}}}, {2}, {{2, 3}}, {{"R"}}, {2, 3}));
  EXPECT_NE(m.find("repeat: sizes [2] has fewer entries than [2, 3] has dims"), std::string::npos) << m;
  // Sizes whose product passes int64: refused as such, not wrapped to a small shape.
  m = message(program("repeat", {{"sizes", {int64_t{1} << 61, 1}}}, {2}, {{8, 3}}, {{"R"}}, {8, 3}));
  EXPECT_NE(m.find("shape_mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find("give a dim past 2^63 elements"), std::string::npos) << m;
  m = message(program("repeat_interleave", {{"repeats", int64_t{1} << 61}, {"dim", 0}}, {2}, {{8, 3}}, {{"R"}}, {8, 3}));
  EXPECT_NE(m.find("give a dim past 2^63 elements"), std::string::npos) << m;
}

}  // namespace
}  // namespace meshsim

// `meshsim explain` and core/explain.h: explain_propagation() decides as propagate() does for every
// rule family's ops over every placement of their operands (1-D meshes of 2 and 3, and a 2x2
// mesh), each candidate's verdict holds by its cost; the command explains a linear's rows, an
// implicit redistribution with its bytes, an explicit one, a local_map, a value's chain, and
// refuses unknown names (exit 2) and illegal scenarios (exit 3).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/coverage.h"
#include "core/error.h"
#include "core/explain.h"
#include "core/mutants.h"
#include "core/propagation.h"
#include "tests/process_support.h"
#include "tests/spec_sets.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace meshsim;
using namespace meshsim::testing;

namespace {

// ---------------------------------------------------------------------------------------------
// explain_propagation against propagate

struct Case {
  std::string op;
  std::vector<Shape> shapes;
  OpAttrs attrs;
};

OpAttrs with_dim(int64_t d) {
  OpAttrs a;
  a.dim = d;
  return a;
}

// One case (or more) per op of every rule family, in the order of rule_families().
std::vector<Case> cases() {
  std::vector<Case> out;
  const Shape m{4, 6};
  for (const char* op : {"add", "sub", "mul", "div"}) {
    out.push_back({op, {m, m}, {}});
    out.push_back({op, {m, {6}}, {}});  // broadcast
  }
  for (const auto& f : rule_families())
    if (f.name == "linear_unary" || f.name == "nonlinear_unary" || f.name == "random" || f.name == "triangle")
      for (const auto& op : f.ops) out.push_back({op, {m}, {}});
  out.push_back({"mm", {{4, 6}, {6, 4}}, {}});
  out.push_back({"bmm", {{2, 4, 6}, {2, 6, 4}}, {}});
  out.push_back({"matmul", {{2, 4, 6}, {6, 4}}, {}});
  OpAttrs t;
  t.dim0 = 0;
  t.dim1 = 1;
  out.push_back({"transpose", {m}, t});
  OpAttrs p;
  p.dims = {1, 0, 2};
  out.push_back({"permute", {{2, 4, 6}}, p});
  OpAttrs v;
  v.shape = {24};
  out.push_back({"view", {m}, v});
  v.shape = {12};
  out.push_back({"view", {{3, 4}}, v});  // uneven chunks on 2 ranks: the view fix-up
  OpAttrs r;
  r.shape = {2, 2, 6};
  out.push_back({"reshape", {m}, r});
  OpAttrs fl;
  fl.start_dim = 0;
  fl.end_dim = 1;
  out.push_back({"flatten", {{2, 4, 6}}, fl});
  OpAttrs uf = with_dim(1);
  uf.sizes = {2, 3};
  out.push_back({"unflatten", {m}, uf});
  out.push_back({"squeeze", {{4, 1, 6}}, with_dim(1)});
  out.push_back({"unsqueeze", {m}, with_dim(1)});
  OpAttrs ex;
  ex.shape = {4, 6};
  out.push_back({"expand", {{1, 6}}, ex});
  out.push_back({"cat", {m, m}, with_dim(0)});
  out.push_back({"stack", {m, m}, with_dim(0)});
  OpAttrs n = with_dim(1);
  n.start = 1;
  n.length = 3;
  out.push_back({"narrow", {m}, n});
  OpAttrs rep;  // dim 0 repeated (gathered), dim 1 once (kept)
  rep.sizes = {2, 1};
  out.push_back({"repeat", {m}, rep});
  OpAttrs ri = with_dim(0);  // [5] repeated twice: uneven chunks on 2 and 3 ranks, the layout fix-up
  ri.repeats = 2;
  out.push_back({"repeat_interleave", {{5, 2}}, ri});
  out.push_back({"repeat_interleave", {m}, ri});  // 4 rows: even on 2 ranks, not on 3
  // scaled_dot_product_attention: the batch and the heads kept, grouped heads (4 over 2: the fix-up
  // on 3 ranks).
  OpAttrs causal;
  causal.is_causal = true;
  out.push_back({"scaled_dot_product_attention", {{2, 2, 3, 2}, {2, 2, 3, 2}, {2, 2, 3, 2}}, causal});
  OpAttrs gqa;
  gqa.enable_gqa = true;
  out.push_back({"scaled_dot_product_attention", {{2, 4, 3, 2}, {2, 2, 3, 2}, {2, 2, 3, 2}}, gqa});
  for (const char* op : {"sum", "mean", "amax", "amin", "softmax", "log_softmax"}) out.push_back({op, {m}, with_dim(1)});
  out.push_back({"sum", {m}, {}});
  out.push_back({"where", {m, m, m}, {}});
  out.push_back({"masked_fill", {m, m}, {}});
  OpAttrs norm;
  norm.normalized_shape = {6};
  out.push_back({"layer_norm", {m, {6}}, norm});
  out.push_back({"rms_norm", {m, {6}}, norm});
  out.push_back({"rms_norm", {m}, norm});
  out.push_back({"embedding", {{4}, {8, 6}}, {}});
  // gather and index_select along dim 1 (an index as long as x on dim 0: gather's S(0), S(0) row).
  out.push_back({"gather", {m, {4, 3}}, with_dim(1)});
  out.push_back({"index_select", {m, {5}}, with_dim(1)});
  // scatter, scatter_add and index_add into x along dim 1 (an index as long as x on dim 0: their
  // S(0) rows).
  for (const char* op : {"scatter", "scatter_add"}) out.push_back({op, {m, {4, 3}, {4, 3}}, with_dim(1)});
  out.push_back({"index_add", {m, {5}, {4, 5}}, with_dim(1)});
  out.push_back({"cumsum", {m}, with_dim(1)});  // its dim gathered where sharded, the other kept
  OpAttrs cast;
  cast.dtype = DType::BFloat16;
  out.push_back({"to", {m}, cast});  // every placement kept, a Partial of any kind included
  out.push_back({"detach", {m}, {}});  // every placement kept, as to's
  out.push_back({"item", {{1}}, {}});  // its one element read whole: gathered, a Partial reduced
  // linalg_vector_norm over dim 1 (a shard of it gives the norm partial) and over every dim.
  out.push_back({"linalg_vector_norm", {m}, with_dim(1)});
  out.push_back({"linalg_vector_norm", {m}, {}});
  out.push_back({"floor_divide", {m, m}, {}});
  out.push_back({"remainder", {m, {6}}, {}});
  OpAttrs classes;  // one_hot: the shards kept, a new dim whole; bincount: S(0) -> P(sum)
  classes.num_classes = 3;
  out.push_back({"one_hot", {m}, classes});
  OpAttrs bins;
  bins.minlength = 5;
  out.push_back({"bincount", {{6}}, bins});
  out.push_back({"pick_target", {m, {4}}, {}});
  out.push_back({"count_targets", {{4}}, {}});
  // Selection and order along dim 1 (gathered first where sharded), comparisons and logic.
  OpAttrs sel = with_dim(1);
  sel.k = 2;
  for (const char* op : {"max", "min", "sort", "topk", "argmax", "argmin", "argsort"}) out.push_back({op, {m}, sel});
  for (const char* op : {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"}) out.push_back({op, {m, m}, {}});
  out.push_back({"logical_not", {m}, {}});
  return out;
}

// Every combination of one placement per operand from `set`.
std::vector<std::vector<Placement>> combos(const std::vector<Placement>& set, size_t operands) {
  std::vector<std::vector<Placement>> out = {{}};
  for (size_t i = 0; i < operands; ++i) {
    std::vector<std::vector<Placement>> next;
    for (const auto& c : out)
      for (const auto& p : set) {
        auto d = c;
        d.push_back(p);
        next.push_back(d);
      }
    out = next;
  }
  return out;
}

// The candidates of one axis hold by their costs: one chosen, the decision's row; an exact fit
// costs nothing; the cheapest has no legal rival (but a P(max)/P(min) row) of lower cost; an
// illegal row is never chosen and says so.
void check_axis(const AxisExplanation& ax, const std::string& decided_row, const std::string& where) {
  int chosen = 0;
  for (const auto& c : ax.candidates) {
    chosen += c.chosen;
    EXPECT_FALSE(c.verdict.empty()) << where << " " << c.row;
    if (!c.legal) {
      EXPECT_FALSE(c.chosen) << where;
      EXPECT_EQ(c.verdict.rfind("illegal: ", 0), 0u) << where << " " << c.verdict;
    }
  }
  ASSERT_EQ(chosen, 1) << where;
  ASSERT_GE(ax.chosen, 0) << where;
  const RowCandidate& best = ax.candidates[ax.chosen];
  EXPECT_TRUE(best.chosen) << where;
  EXPECT_EQ(ax.candidates[ax.chosen].row, decided_row) << where;
  if (ax.how == kHowExactFit) {
    EXPECT_EQ(best.bytes, 0) << where;
    EXPECT_EQ(best.changed, 0) << where;
    EXPECT_EQ(best.verdict, "fits the operands as they are") << where;
  }
  if (ax.how != kHowExactFit && ax.how != kHowViewFixUp && ax.how != kHowLayoutFixUp) {
    for (const auto& c : ax.candidates) EXPECT_FALSE(c.legal && c.bytes == 0 && c.changed == 0) << where << ": " << c.row << " fits";
  }
  if (ax.how == kHowCheapest)
    for (size_t i = 0; i < ax.candidates.size(); ++i) {
      const RowCandidate& c = ax.candidates[i];
      const bool excluded = c.out.is_partial() && !is_linear(c.out.op);
      if (!c.legal || excluded || c.chosen) continue;
      const std::pair<int64_t, int64_t> mine{c.bytes, c.changed}, theirs{best.bytes, best.changed};
      EXPECT_FALSE(mine < theirs) << where << ": " << c.row << " is cheaper than " << best.row;
      if (mine == theirs) {  // ties go to the earlier row
        EXPECT_GT(static_cast<int>(i), ax.chosen) << where << ": an earlier row of equal cost lost to " << best.row;
        EXPECT_EQ(c.verdict, "tie at equal cost, an earlier row won") << where;
      }
    }
}

// Runs one case; returns the `how` of each axis explained (empty when propagate refuses it).
std::vector<std::string> compare(const Case& c, const Mesh& mesh, const std::vector<Spec>& specs) {
  std::string where = c.op + " " + mesh.str() + " [";
  for (const auto& s : specs) where += spec_str(s);
  where += "]";
  std::optional<ShardingDecision> d;
  std::string refused;
  try {
    d = propagate(c.op, mesh, specs, c.shapes, c.attrs);
  } catch (const SemanticError& e) {
    refused = e.what();
  }
  std::optional<PropagationExplanation> ex;
  try {
    ex = explain_propagation(c.op, mesh, specs, c.shapes, c.attrs);
  } catch (const SemanticError& e) {
    EXPECT_EQ(refused, e.what()) << where << ": explain_propagation threw where propagate did not";
    return {};
  }
  if (!d) {
    EXPECT_EQ(ex->error, refused) << where;
    EXPECT_EQ(ex->axes.back().how, kHowNoneLegal) << where;
    return {};
  }
  EXPECT_TRUE(ex->error.empty()) << where << ": " << ex->error;
  EXPECT_EQ(ex->decision.rows, d->rows) << where;
  EXPECT_EQ(ex->decision.in_specs, d->in_specs) << where;
  EXPECT_EQ(ex->decision.out_spec, d->out_spec) << where;
  EXPECT_EQ(ex->decision.out_shape, d->out_shape) << where;
  std::vector<std::string> hows;
  if (ex->axes.size() != static_cast<size_t>(mesh.ndim())) {
    ADD_FAILURE() << where << ": " << ex->axes.size() << " axes explained";
    return hows;
  }
  for (int a = 0; a < mesh.ndim(); ++a) {
    const std::string row = d->rows[a].substr(c.op.size() + 2);  // "op: row"
    check_axis(ex->axes[a], row, where + " axis " + std::to_string(a));
    hows.push_back(ex->axes[a].how);
  }
  return hows;
}

TEST(Explain, DecidesAsPropagateForEveryFamilyOpAndPlacement) {
  std::map<std::string, int> hows;
  std::set<std::string> ops_explained;
  size_t runs = 0;
  for (const Case& c : cases()) {
    int64_t rank = 0;
    for (const auto& s : c.shapes) rank = std::max<int64_t>(rank, static_cast<int64_t>(s.size()));
    for (int64_t n : {2, 3}) {
      const Mesh mesh({"x"}, {n});
      for (const auto& ps : combos(all_placements(rank), c.shapes.size())) {
        std::vector<Spec> specs;
        for (const auto& p : ps) specs.push_back({p});
        const auto h = compare(c, mesh, specs);
        for (const auto& how : h) ++hows[how];
        if (!h.empty()) ops_explained.insert(c.op);
        ++runs;
      }
    }
  }
  // Every op of every family was explained at least once, and every way of choosing occurred.
  for (const auto& f : rule_families())
    for (const auto& op : f.ops) EXPECT_TRUE(ops_explained.count(op)) << op << " was never explained";
  for (const char* how : {kHowExactFit, kHowOneOperand, kHowReplicateFirst, kHowCheapest, kHowViewFixUp, kHowLayoutFixUp})
    EXPECT_GT(hows[how], 0) << "no case chose by \"" << how << "\"";
  RecordProperty("cases", static_cast<int>(runs));
}

TEST(Explain, DecidesAsPropagateOnATwoAxisMesh) {
  const Mesh mesh({"dp", "tp"}, {2, 2});
  const std::vector<Placement> set = {Placement::shard(0), Placement::shard(1), Placement::replicate(),
                                      Placement::partial(), Placement::reduced()};
  size_t compared = 0;
  for (const Case& c : cases()) {
    if (c.op != "mm" && c.op != "add" && c.op != "view" && c.op != "rms_norm" && c.op != "sum") continue;
    const auto specs = testing_util::specs_over(set, 2);
    std::vector<std::vector<Spec>> all = {{}};
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      std::vector<std::vector<Spec>> next;
      for (const auto& prefix : all)
        for (const auto& s : specs) {
          auto d = prefix;
          d.push_back(s);
          next.push_back(d);
        }
      all = next;
    }
    for (const auto& operand_specs : all) {
      compare(c, mesh, operand_specs);
      ++compared;
    }
  }
  EXPECT_GT(compared, 1000u);
}

TEST(Explain, CandidateCostsAndVerdictsOfMmWithTwoColumnShards) {
  // x [4, 8] S(1) and w [8, 4] S(1) on 2 ranks: no row fits; R, S(1) -> S(1) gathers x (256 B in
  // full, 128 B per rank); S(1), S(0) -> P(sum) moves w at the same cost and comes later.
  const Mesh mesh({"tp"}, {2});
  const auto ex = explain_propagation("mm", mesh, {{Placement::shard(1)}, {Placement::shard(1)}}, {{4, 8}, {8, 4}}, {});
  ASSERT_EQ(ex.axes.size(), 1u);
  const AxisExplanation& ax = ex.axes[0];
  EXPECT_EQ(ax.how, kHowCheapest);
  std::map<std::string, const RowCandidate*> by_row;
  for (const auto& c : ax.candidates) by_row[c.row] = &c;
  ASSERT_TRUE(by_row.count("R, S(1) -> S(1)"));
  const RowCandidate& won = *by_row["R, S(1) -> S(1)"];
  EXPECT_TRUE(won.chosen);
  EXPECT_EQ(won.bytes, 128);
  EXPECT_EQ(won.changed, 1);
  EXPECT_EQ(won.verdict, "cheapest: needs operand 0 S(1) -> R: all_gather, 128 B");
  EXPECT_EQ(by_row["S(1), S(0) -> P(sum)"]->verdict, "tie at equal cost, an earlier row won");
  EXPECT_EQ(by_row["S(0), R -> S(0)"]->verdict, "costs more (256 B vs 128 B)");
  EXPECT_EQ(by_row["R, R -> R"]->verdict, "costs more (256 B vs 128 B)");
  EXPECT_FALSE(by_row["P(sum), R -> P(sum)"]->legal);
  EXPECT_EQ(by_row["P(sum), R -> P(sum)"]->verdict,
            "illegal: operand 0 S(1) -> P(sum) (a shard cannot become a partial)");
  EXPECT_EQ(ex.decision.in_specs[0], Spec{Placement::replicate()});
  EXPECT_EQ(ex.decision.rows, std::vector<std::string>{"mm: R, S(1) -> S(1)"});
}

TEST(Explain, APartialMaxRowIsNotReachedByMovingAReplica) {
  // cat of R and P(max) along dim 0: P(max), P(max) -> P(max) costs nothing (R -> P(max) is local)
  // but would cut the gradient path; S(1), S(1) -> S(1) reduce_scatters the P(max) operand instead
  // (half of R, R -> R's all_reduce).
  const Mesh mesh({"x"}, {2});
  const auto ex = explain_propagation("cat", mesh, {{Placement::replicate()}, {Placement::partial(ReduceOp::Max)}},
                                      {{4, 6}, {4, 6}}, with_dim(0));
  const AxisExplanation& ax = ex.axes.at(0);
  EXPECT_EQ(ax.how, kHowCheapest);
  EXPECT_EQ(ax.candidates.at(ax.chosen).row, "S(1), S(1) -> S(1)");
  bool saw = false;
  for (const auto& c : ax.candidates)
    if (c.row == "P(max), P(max) -> P(max)") {
      saw = true;
      EXPECT_EQ(c.bytes, 0);
      EXPECT_EQ(c.verdict, "gives P(max), which has no cotangent (taken only by operands already there)");
    }
  EXPECT_TRUE(saw);
  // Operands there already take it: an exact fit.
  const auto there = explain_propagation("cat", mesh, {{Placement::partial(ReduceOp::Max)}, {Placement::partial(ReduceOp::Max)}},
                                         {{4, 6}, {4, 6}}, with_dim(0));
  EXPECT_EQ(there.axes.at(0).how, kHowExactFit);
  EXPECT_EQ(there.decision.out_spec, Spec{Placement::partial(ReduceOp::Max)});
}

// ---------------------------------------------------------------------------------------------
// The rules' memo (core/propagation.h, decision_key): a remembered result is the one a fresh call
// gives, under another planted bug, on another mesh, and records the same coverage.

TEST(PropagationMemo, KeysOnThePlantedBug) {
  const Mesh mesh({"x"}, {2});
  const std::vector<Spec> s0 = {{Placement::shard(0)}, {Placement::shard(0)}};
  const std::vector<Shape> shapes = {{4, 6}, {4, 6}};
  // cat along the sharded dim moves the operands off it (S(1)); the planted bug keeps S(0).
  const auto cat = [&] { return spec_str(propagate("cat", mesh, s0, shapes, with_dim(0)).in_specs.at(0)); };
  const auto explained = [&] {
    return spec_str(explain_propagation("cat", mesh, s0, shapes, with_dim(0)).decision.in_specs.at(0));
  };
  EXPECT_EQ(cat(), "[S(1)]");
  {
    MutantScope planted(Mutant::CatShardedDimNotGathered);
    EXPECT_EQ(cat(), "[S(0)]");
    EXPECT_EQ(explained(), "[S(0)]");
  }
  EXPECT_EQ(cat(), "[S(1)]");
  EXPECT_EQ(explained(), "[S(1)]");

  // add of [4, 6] S(0) and a [6] bias: the bias's contribution is the sum over the sharded dim.
  const std::vector<Spec> ins = {{Placement::shard(0)}, {Placement::replicate()}};
  const std::vector<Shape> add_shapes = {{4, 6}, {6}};
  const Spec s0_out{Placement::shard(0)};
  const auto grad = [&] { return spec_str(backward_rule("add", mesh, ins, s0_out, add_shapes, {}, s0_out, 1).grad_out); };
  EXPECT_EQ(grad(), "[P(sum)]");
  {
    MutantScope planted(Mutant::BroadcastGradNotSummed);
    EXPECT_EQ(grad(), "[R]");
  }
  EXPECT_EQ(grad(), "[P(sum)]");
}

TEST(PropagationMemo, KeysOnTheMeshAndRecordsItsCoverageAgain) {
  // The same operands on meshes of 2 and 3 ranks: the explanation names the axis it was asked of.
  const std::vector<Spec> s = {{Placement::shard(0)}, {Placement::replicate()}};
  const std::vector<Shape> shapes = {{6, 4}, {4, 5}};
  const auto axis_of = [&](const Mesh& m) { return explain_propagation("mm", m, s, shapes, {}).axes.at(0).axis_name; };
  EXPECT_EQ(axis_of(Mesh({"dp"}, {2})), "dp");
  EXPECT_EQ(axis_of(Mesh({"tp"}, {2})), "tp");
  const auto cost_of = [&](int64_t n) {
    const auto ex = explain_propagation("mm", Mesh({"x"}, {n}), {{Placement::replicate()}, {Placement::shard(1)}},
                                        shapes, {});
    int64_t most = 0;
    for (const auto& c : ex.axes.at(0).candidates) most = std::max(most, c.bytes);
    return most;
  };
  EXPECT_NE(cost_of(2), cost_of(4));  // a gather's bytes grow with the axis

  const Mesh mesh({"x"}, {2});
  CoverageSink first, second;
  {
    CoverageScope covered(&first);
    propagate("mm", mesh, s, shapes, {});
  }
  {
    CoverageScope covered(&second);
    propagate("mm", mesh, s, shapes, {});  // remembered: its coverage recorded again
  }
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(first, second);
  EXPECT_EQ(first.count("forward mm: S(0), R -> S(0)"), 1u) << ::testing::PrintToString(first);
}

// ---------------------------------------------------------------------------------------------
// The command

const std::string kTransformer = std::string(MESHSIM_SOURCE_DIR) + "/examples/transformer_fsdp_tp_sp.json";
const std::string kLocalMap = std::string(MESHSIM_SOURCE_DIR) + "/examples/lm_context_parallel.json";

class ExplainCli : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fresh_dir("meshsim_test_explain", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override {
    if (!HasFailure()) remove_fresh_dir(dir);
  }
  Outcome meshsim(const std::string& args) const { return run_process(dir, MESHSIM_BIN, args, 120); }
  json explain_json(const std::string& args) const {
    const Outcome o = meshsim("explain " + args + " --json");
    EXPECT_EQ(o.code, 0) << o;
    json doc = json::parse(o.out, nullptr, false);
    EXPECT_FALSE(doc.is_discarded()) << o;
    EXPECT_EQ(doc.value("format", ""), "meshsim.explain/1");
    return doc;
  }
  fs::path write(const std::string& name, const json& doc) const {
    std::ofstream(dir / name) << doc.dump(2);
    return dir / name;
  }
};

json mm_scenario() {
  return json::parse(R"JSON({
    "format": "meshsim.scenario/1", "name": "mm_column_shards",
    "mesh": {"axes": ["tp"], "shape": [2]},
    "inputs": [
      {"name": "x", "shape": [4, 8], "placements": ["S(1)"], "requires_grad": true},
      {"name": "w", "shape": [8, 4], "placements": ["S(1)"], "requires_grad": true}
    ],
    "program": [
      {"out": "y", "op": "mm", "args": ["x", "w"]},
      {"out": "z", "op": "redistribute", "args": ["y"], "placements": ["S(0)"]},
      {"out": "loss", "op": "sum", "args": ["z"]}
    ],
    "backward": "loss"
  })JSON");
}

const json* axis_named(const json& app, const std::string& name) {
  for (const auto& a : app["axes"])
    if (a["axis"] == name) return &a;
  return nullptr;
}

TEST_F(ExplainCli, LinearShowsItsTransposeAndMatmulRowsPerAxis) {
  const json doc = explain_json(q(kTransformer) + " --op /program/15");
  const json& op = doc["op"];
  EXPECT_EQ(op["op"], "linear");
  EXPECT_EQ(op["kind"], "rules");
  ASSERT_EQ(op["applications"].size(), 2u) << op.dump(2);  // no bias: transpose, matmul
  const json& t = op["applications"][0];
  const json& mm = op["applications"][1];
  EXPECT_EQ(t["op"], "transpose");
  EXPECT_EQ(t["out"], "l0_q.weight_t");
  EXPECT_EQ(mm["op"], "matmul");
  EXPECT_EQ(mm["out"], "l0_q");
  // l0_n1_g [S(0), Rd] @ weight_t [Rd, S(1)]: both axes fit as they are.
  const json* dp = axis_named(mm, "dp");
  const json* tp = axis_named(mm, "tp");
  ASSERT_TRUE(dp && tp);
  EXPECT_EQ((*dp)["how"], "exact fit");
  EXPECT_EQ((*dp)["chosen"], "S(0), R -> S(0)");
  EXPECT_EQ((*tp)["chosen"], "R, S(1) -> S(2)");
  EXPECT_EQ(mm["result"]["placements"], json({"S(0)", "S(2)"}));
  EXPECT_TRUE(mm["redistributions"].empty());
  // Every candidate has a cost and a verdict; the gather of the weight's shard costs (n-1)/n of
  // 8 * 8 * 8 B = 256 B on tp.
  bool saw_gather = false;
  for (const auto& c : (*tp)["candidates"]) {
    EXPECT_FALSE(c["verdict"].get<std::string>().empty());
    if (c["row"] == "R, R -> R") {
      EXPECT_EQ(c["bytes"], 256);
      EXPECT_EQ(c["verdict"], "needs operand 1 S(1) -> R: all_gather, 256 B; a row the operands fit as they are won");
      saw_gather = true;
    }
  }
  EXPECT_TRUE(saw_gather);
  // By the output's name, the same explanation; the text names both applications and marks rows.
  EXPECT_EQ(explain_json(q(kTransformer) + " --op l0_q")["op"], op);
  const Outcome text = meshsim("explain " + q(kTransformer) + " --op l0_q");
  ASSERT_EQ(text.code, 0) << text;
  EXPECT_TRUE(contains(text.out, "transpose: l0_q.weight_t = transpose(l0_wq_g [Rd, S(0)] [8, 8])")) << text;
  EXPECT_TRUE(contains(text.out, "* R, S(1) -> S(2)")) << text;
  EXPECT_TRUE(contains(text.out, "mesh axis tp (size 2), given Rd, S(1): exact fit")) << text;
}

TEST_F(ExplainCli, ImplicitRedistributionOfMmWithColumnShards) {
  const fs::path file = write("mm.json", mm_scenario());
  const json doc = explain_json(q(file.string()) + " --op y");
  const json& app = doc["op"]["applications"][0];
  const json& ax = app["axes"][0];
  EXPECT_EQ(ax["how"], "cheapest");
  EXPECT_EQ(ax["chosen"], "R, S(1) -> S(1)");
  ASSERT_EQ(app["redistributions"].size(), 1u) << app.dump(2);
  const json& r = app["redistributions"][0];
  EXPECT_EQ(r["name"], "x");
  EXPECT_EQ(r["from"], json({"S(1)"}));
  EXPECT_EQ(r["to"], json({"R"}));
  ASSERT_EQ(r["steps"].size(), 1u);
  EXPECT_EQ(r["steps"][0]["step"], "all_gather");
  EXPECT_EQ(r["steps"][0]["bytes"], 128);  // x is 4 * 8 * 8 B = 256 B in full; half moves
  const Outcome text = meshsim("explain " + q(file.string()) + " --op /program/0");
  EXPECT_TRUE(contains(text.out, "redistribute operand 0 x: [S(1)] -> [R]")) << text;
  EXPECT_TRUE(contains(text.out, "all_gather over tp, [S(1)] -> [R], 128 B")) << text;
  EXPECT_TRUE(contains(text.out, "tie at equal cost, an earlier row won")) << text;
}

TEST_F(ExplainCli, ExplicitRedistributeShowsThePlan) {
  const fs::path file = write("mm.json", mm_scenario());
  const json doc = explain_json(q(file.string()) + " --op z");
  EXPECT_EQ(doc["op"]["kind"], "redistribute");
  ASSERT_EQ(doc["op"]["steps"].size(), 1u);
  EXPECT_EQ(doc["op"]["steps"][0]["step"], "all_to_all");
  EXPECT_EQ(doc["op"]["steps"][0]["bytes"], 32);  // y [4, 4]: 128 B in full, a quarter moves
  const json t = explain_json(q(kTransformer) + " --op h0");
  EXPECT_EQ(t["op"]["steps"][0]["step"], "reduce_scatter");
  EXPECT_EQ(t["op"]["steps"][0]["axis"], "tp");
}

TEST_F(ExplainCli, LocalMapShowsItsPlacementsAndBody) {
  const json doc = explain_json(q(kLocalMap) + " --op loss");
  EXPECT_EQ(doc["op"]["kind"], "local_map");
  EXPECT_EQ(doc["op"]["out_placements"], json({{"P(sum)"}}));
  EXPECT_EQ(doc["op"]["body"].size(), 3u);
}

TEST_F(ExplainCli, ValueChainFollowsThePlacementBackToAnInput) {
  const Outcome o = meshsim("explain " + q(kTransformer) + " --value l0_h1");
  ASSERT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "h0 [S(0), S(1)] = redistribute(tok [S(0), P(sum)]): reduce_scatter over tp, 128 B")) << o;
  const json doc = explain_json(q(kTransformer) + " --value l0_h1");
  const json& chain = doc["value"]["chain"];
  ASSERT_GE(chain.size(), 3u);
  EXPECT_EQ(chain.front()["op"], "input");
  EXPECT_EQ(chain.back()["value"], "l0_h1");
  for (size_t i = 1; i < chain.size(); ++i)
    EXPECT_EQ(chain[i]["follows"]["name"], chain[i - 1]["value"]) << chain.dump(2);
  // mm of [S(1)] x [S(1)] keeps w's shard (x was gathered): the chain goes back through w.
  const fs::path file = write("mm.json", mm_scenario());
  const json mm = explain_json(q(file.string()) + " --value loss");
  EXPECT_EQ(mm["value"]["chain"][0]["value"], "w");
  EXPECT_EQ(mm["value"]["chain"][1]["follows"]["why"], "its tp placement carried over");
}

TEST_F(ExplainCli, UnknownNamesExitTwoNamingTheClosest) {
  Outcome o = meshsim("explain " + q(kTransformer) + " --op l0_qq");
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(contains(o.err, "--op \"l0_qq\"")) << o;
  EXPECT_TRUE(contains(o.err, "closest: l0_q (/program/15)")) << o;
  EXPECT_TRUE(contains(o.err, kTransformer)) << o;
  o = meshsim("explain " + q(kTransformer) + " --value l0_kk");
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(contains(o.err, "closest: l0_wk, l0_k, l0_k4")) << o;  // one edit away each, in program order
  o = meshsim("explain " + q(kTransformer) + " --op /program/99 --json");
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_EQ(json::parse(o.out).value("status", ""), "error") << o;
  o = meshsim("explain " + q(kTransformer) + " --value l0_q.weight_t");
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(contains(o.err, "intermediate of /program/15 (linear)")) << o;
  o = meshsim("explain " + q(kTransformer));
  EXPECT_EQ(o.code, 2) << o;
  o = meshsim("explain " + q((dir / "missing.json").string()) + " --op y");
  EXPECT_EQ(o.code, 2) << o;
}

TEST_F(ExplainCli, IllegalScenarioExitsThreeAtOrAfterTheOp) {
  json doc = mm_scenario();
  doc["program"][1]["placements"] = {"P(sum)"};  // S(1) -> P(sum): illegal
  const fs::path file = write("illegal.json", doc);
  Outcome o = meshsim("explain " + q(file.string()) + " --op z");
  EXPECT_EQ(o.code, 3) << o;
  EXPECT_TRUE(contains(o.err, "illegal_redistribute")) << o;
  // The op before it is explained whole; the run's later stop is noted.
  o = meshsim("explain " + q(file.string()) + " --op y");
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "R, S(1) -> S(1)")) << o;
  EXPECT_TRUE(contains(o.out, "the run stopped later, at /program/1")) << o;
}

}  // namespace

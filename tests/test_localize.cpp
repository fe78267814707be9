// The first divergence (result "first_divergence"): every planted bug whose effect shows in the
// values or gradients is put at the op that carries it, each with a scenario of tests/localize/
// (shrunk counterexamples of `meshsim check --seed 1 --mutant NAME`, the bug switched on in its
// options); the implicit communication of the planner; the communication table.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>

#include "core/error.h"
#include "core/mutants.h"
#include "core/scenario.h"
#include "api/trace_of.h"
#include "oracles/check.h"
#include "oracles/localize.h"
#include "traces/render.h"
#include "traces/trace.h"

namespace meshsim {
namespace {

namespace fs = std::filesystem;

fs::path source(const std::string& rel) { return fs::path(MESHSIM_SOURCE_DIR) / rel; }

CheckedRun run_file(const fs::path& file, RunOptions* with = nullptr) {
  const Scenario sc = parse_scenario(read_json_file(file.string()), file.string());
  return check_scenario(sc, with ? *with : sc.options);
}

// Where each planted bug is found: the phase, the program op (its JSON path and name) and, inside
// a local_map, the body op whose backward is wrong.
struct Where {
  const char* mutant;
  const char* phase;
  const char* op;
  const char* name;
  const char* body_op;    // "" outside a local_map
  const char* body_name;
};

const Where kWhere[] = {
    // A collective's backward in a local_map body: the adjoint test names it.
    {"all_reduce_backward_all_reduces", "backward", "/program/0", "local_map", "/program/0/body/0", "all_reduce"},
    {"all_to_all_backward_unswapped", "backward", "/program/0", "local_map", "/program/0/body/1", "all_to_all"},
    {"all_to_all_split_backward_untransposed", "backward", "/program/0", "local_map", "/program/0/body/9", "all_to_all"},
    {"reduce_scatter_backward_wrong_dim", "backward", "/program/0", "local_map", "/program/0/body/3", "reduce_scatter"},
    // Variance casts missing or wrong: the body op they belong to.
    {"missing_mark_varying", "backward", "/program/0", "local_map", "/program/0/body/2", "mm"},
    {"mark_varying_for_reduced", "backward", "/program/0", "local_map", "/program/0/body/3", "embedding"},
    {"missing_reduced_invariant_cast", "backward", "/program/0", "local_map", "/program/0/body/2", "mul"},
    // A Function's backward, a kernel's derivative, in a body.
    {"function_backward_wrong_factor", "backward", "/program/0", "local_map", "/program/0/body/0", "call"},
    // A Function of two outputs labelling its kept local invariant: the call, for that output.
    {"function_outputs_share_sets", "backward", "/program/0", "local_map", "/program/0/body/0", "call"},
    {"gelu_tanh_derivative", "backward", "/program/0", "local_map", "/program/0/body/2", "gelu"},
    // The cotangent of Rd at the local_map's boundary (its enter and leave).
    {"cotangent_rd_as_r", "backward", "/program/0", "local_map", "", ""},
    // DTensor ops' backward rules and hooks.
    {"below_autograd_skips_backward", "backward", "/program/1", "mul", "", ""},
    {"bmm_batch_shard_dropped_backward", "backward", "/program/0", "matmul", "", ""},
    {"broadcast_grad_not_summed", "backward", "/program/0", "sub", "", ""},
    {"embedding_grad_wrong_rank", "backward", "/program/1", "embedding", "", ""},
    {"extremum_grad_first_tie", "backward", "/program/0", "amax", "", ""},
    // x is read by mm and mul; mul's contribution arrives first and sets x's layout, mm's is added
    // to it unmoved: mm's use of x carries the wrong gradient.
    {"grad_accumulation_mixed_layouts", "backward", "/program/0", "mm", "", ""},
    {"norm_weight_grad_not_reduced", "backward", "/program/0", "layer_norm", "", ""},
    {"pavg_backward_unscaled", "backward", "/program/1", "mm", "", ""},
    {"partial_seed_on_every_rank", "backward", "/backward", "seed", "", ""},
    // A backward whose gradients libtorch refuses: the op whose node raised.
    {"cat_sharded_dim_not_gathered", "backward", "/program/0", "cat", "", ""},
    {"flatten_keeps_inner_shard", "backward", "/program/0", "reshape", "", ""},
    // Forward bugs: the first op whose result differs.
    {"cumsum_sharded_dim_local", "forward", "/program/0", "cumsum", "", ""},
    {"dropout_replicas_rank_seeded", "forward", "/program/0", "dropout", "", ""},
    {"dropout_shard_offset_ignored", "forward", "/program/0", "dropout", "", ""},
    {"gather_shard_extents_unchecked", "forward", "/program/0", "gather", "", ""},
    {"item_of_partial_unreduced", "forward", "/program/0", "item", "", ""},
    {"local_topk_sharded_dim", "forward", "/program/0", "topk", "", ""},
    {"loss_parallel_local_max", "forward", "/program/0", "log_softmax", "", ""},
    {"mm_s1_s0_labelled_r", "forward", "/program/0", "mm", "", ""},
    {"norm_partial_as_sum", "forward", "/program/0", "linalg_vector_norm", "", ""},
    {"partial_plus_replicate_undivided", "forward", "/program/0", "sub", "", ""},
    {"psum_from_replicate_no_divide", "forward", "/program/0", "sub", "", ""},
    {"scatter_add_sharded_index_replicated", "forward", "/program/0", "scatter_add", "", ""},
    {"sdpa_sequence_shard_local", "forward", "/program/0", "scaled_dot_product_attention", "", ""},
    {"strided_gathered_plain", "forward", "/program/1", "redistribute", "", ""},
    {"vocab_lookup_unmasked", "forward", "/program/1", "embedding", "", ""},
    {"uneven_array_split", "forward", "/inputs/1", "input", "", ""},
};

// The planted bugs that change no value or gradient, with what finds them instead.
const std::pair<const char*, const char*> kNotLocalized[] = {
    {"accumulation_double_reduce", "training steps only: the train check names the step, parameter and state"},
    {"accumulation_lost_gradient", "training steps only: the train check names the step, parameter and state"},
    {"all_gather_varying_drops_axis", "variance sets only: the exclusivity property"},
    {"cotangent_psum_as_r", "a gradient's layout label only: the duality check names the input"},
    {"float32_random_reduction_order", "run to run only: the determinism property"},
    {"reduced_label_dropped", "an error of the semantics at the op (reduced_mismatch)"},
    {"strategy_registry_ignored", "variance sets only: the variance_tracking check"},
    {"unchecked_inserts_mark_varying", "plain local code's verdict: the local_code_verdict property"},
    {"unreduced_all_reduce_any_op", "a refusal the unreduced reading misses: the local_map_partial_entry property"},
};

TEST(Localize, EveryPlantedBugHasARow) {
  std::set<std::string> rows;
  for (const auto& w : kWhere) EXPECT_TRUE(rows.insert(w.mutant).second) << w.mutant;
  for (const auto& [m, why] : kNotLocalized) EXPECT_TRUE(rows.insert(m).second) << m;
  for (const auto& m : mutant_catalog())
    EXPECT_TRUE(rows.count(m.name)) << m.name << ": add it to kWhere (with tests/localize/" << m.name
                                    << ".json) or to kNotLocalized";
  EXPECT_EQ(rows.size(), mutant_catalog().size());
}

TEST(Localize, EveryPlantedBugIsPutAtItsOp) {
  for (const auto& w : kWhere) {
    SCOPED_TRACE(w.mutant);
    const CheckedRun run = run_file(source(std::string("tests/localize/") + w.mutant + ".json"));
    const nlohmann::json& r = run.result;
    ASSERT_EQ(r.value("status", ""), "fail") << r.dump(1);
    ASSERT_TRUE(r.contains("first_divergence")) << r.dump(1);
    const nlohmann::json& d = r["first_divergence"];
    EXPECT_EQ(d.value("phase", ""), w.phase) << d.dump(1);
    EXPECT_EQ(d.value("op", ""), w.op) << d.dump(1);
    EXPECT_EQ(d.value("name", ""), w.name) << d.dump(1);
    if (*w.body_op) {
      ASSERT_TRUE(d.contains("body")) << d.dump(1);
      EXPECT_EQ(d["body"].value("op", ""), w.body_op) << d.dump(1);
      EXPECT_EQ(d["body"].value("name", ""), w.body_name) << d.dump(1);
    } else {
      EXPECT_FALSE(d.contains("body")) << d.dump(1);
    }
    EXPECT_FALSE(d.value("message", "").empty());
  }
}

// The search inside the run (localize always) and the second run (on failure) agree.
TEST(Localize, InTheRunAndInASecondRunAgree) {
  for (const char* m : {"norm_weight_grad_not_reduced", "missing_mark_varying", "partial_seed_on_every_rank"}) {
    SCOPED_TRACE(m);
    const fs::path file = source(std::string("tests/localize/") + m + ".json");
    const Scenario sc = parse_scenario(read_json_file(file.string()), file.string());
    RunOptions always = sc.options;
    always.localize = Localize::Always;
    const CheckedRun a = check_scenario(sc, sc.options), b = check_scenario(sc, always);
    ASSERT_TRUE(a.result.contains("first_divergence"));
    EXPECT_EQ(a.result["first_divergence"], b.result["first_divergence"]);
    RunOptions never = sc.options;
    never.localize = Localize::Never;
    EXPECT_FALSE(check_scenario(sc, never).result.contains("first_divergence"));
    // The search runs the backward again with nothing recorded: the events are the plain run's.
    EXPECT_EQ(a.events, b.events);
  }
}

// The body search's adjoint test passes every op of correct bodies: no culprit without a bug.
TEST(Localize, CorrectRunsHaveNoDivergence) {
  for (const auto& w : kWhere) {
    SCOPED_TRACE(w.mutant);
    const fs::path file = source(std::string("tests/localize/") + w.mutant + ".json");
    const Scenario sc = parse_scenario(read_json_file(file.string()), file.string());
    RunOptions clean = sc.options;
    clean.mutant.clear();
    clean.localize = Localize::Always;
    const CheckedRun run = check_scenario(sc, clean);
    EXPECT_NE(run.result.value("status", ""), "fail") << run.result.dump(1);
    EXPECT_FALSE(run.result.contains("first_divergence"));
    // A passing run never searches: ask the body search itself, on every local_map of the run
    // (kinks and rounding included), and it must blame no op.
    if (run.result.value("status", "") == "error") continue;
    SimRun sim = run_distributed(sc, clean);
    if (!sc.backward.empty() && sim.ran_backward)
      for (const auto& op : sc.program) {
        if (op.op != "local_map") continue;
        const nlohmann::json blamed = body_divergence(sc, op, sim, "", clean.dtype);
        EXPECT_TRUE(blamed.is_null()) << blamed.dump(1);
      }
  }
}

TEST(Localize, FactorsOfABodyCollectiveAreNamedByAxis) {
  const CheckedRun run = run_file(source("tests/localize/all_reduce_backward_all_reduces.json"));
  const nlohmann::json& body = run.result["first_divergence"]["body"];
  ASSERT_TRUE(body.contains("adjoint"));
  const std::string message = run.result["first_divergence"].value("message", "");
  EXPECT_NE(message.find("the size of"), std::string::npos) << message;
  EXPECT_NE(message.find("all_reduce"), std::string::npos) << message;
}

// Forgetting the sequence-parallel all_gather before q/k/v: the planner gathers the weights over tp.
TEST(Implicit, TheForgottenGatherIsListedWithItsReasons) {
  const CheckedRun run = run_file(source("examples/bugs/sp_gather_forgotten.json"));
  const nlohmann::json& r = run.result;
  EXPECT_EQ(r.value("status", ""), "fail");
  EXPECT_EQ(r["checks"]["no_implicit"], false);
  EXPECT_EQ(r["checks"]["forward_equivalence"], true);
  int communicating = 0;
  std::set<std::string> ops;
  for (const auto& m : r["implicit"]) {
    if (m["collectives"].empty()) continue;
    ++communicating;
    ops.insert(m["program_op"].get<std::string>());
    EXPECT_EQ(m["collectives"][0]["phase"], "forward");
    EXPECT_EQ(m["collectives"][0]["op"], "all_gather");
    EXPECT_NE(m["reason"].get<std::string>().find("no row of matmul takes the operands as they are"), std::string::npos);
    EXPECT_FALSE(m["alternatives"].empty());
  }
  EXPECT_EQ(communicating, 6);
  EXPECT_EQ(ops, (std::set<std::string>{"/program/14", "/program/15", "/program/16", "/program/23", "/program/27",
                                        "/program/30"}));
  int failures = 0;
  for (const auto& f : r["failures"]) failures += f.get<std::string>().rfind("implicit: ", 0) == 0;
  EXPECT_EQ(failures, 6);
  // The communication table counts them apart: 6 forward all_gathers and their 6 backward all_reduces.
  EXPECT_EQ(r["communication"]["implicit_count"], 12);
}

TEST(Implicit, TheExamplesThatNeedNoneHaveNone) {
  // Those that need the planner: a weight sharded the other way (mm_sharded_weight_*, and
  // mm_opt_out_below, whose mm moves it below autograd), a softmax over a sharded dim
  // (softmax_sharded); each says why.
  const std::set<std::string> need = {"mm_sharded_weight_above", "mm_sharded_weight_below", "mm_opt_out_below",
                                      "softmax_sharded"};
  for (const auto& entry : fs::directory_iterator(source("examples"))) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    const Scenario sc = parse_scenario(read_json_file(entry.path().string()), entry.path().string());
    RunOptions strict = sc.options;
    strict.implicit = ImplicitPolicy::Error;
    const CheckedRun run = check_scenario(sc, strict);
    const std::string name = entry.path().stem().string();
    if (run.result.value("status", "") == "error") continue;  // an example of an error of the semantics
    if (need.count(name)) {
      EXPECT_EQ(run.result["checks"]["no_implicit"], false);
    } else {
      EXPECT_EQ(run.result["checks"]["no_implicit"], true) << run.result["implicit"].dump(1);
      EXPECT_EQ(run.result.value("status", ""), "pass");
    }
  }
}

TEST(Communication, TheTableAddsUpTheCollectives) {
  const CheckedRun run = run_file(source("examples/transformer_fsdp_tp_sp.json"));
  const nlohmann::json& r = run.result;
  int64_t count = 0, bytes = 0;
  for (const auto& c : r["collectives"]) {
    ++count;
    bytes += c["bytes"].get<int64_t>();
    EXPECT_TRUE(c["program_op"].is_string() || c["program_op"].is_null());
  }
  const nlohmann::json& comm = r["communication"];
  EXPECT_EQ(comm["count"], count);
  EXPECT_EQ(comm["bytes"], bytes);
  int64_t by_axis = 0, by_op = 0;
  for (const auto& row : comm["by_axis"]) by_axis += row["bytes"].get<int64_t>();
  for (const auto& row : comm["by_op"]) by_op += row["bytes"].get<int64_t>();
  EXPECT_EQ(by_axis, bytes);
  EXPECT_EQ(by_op, bytes);
  EXPECT_EQ(comm["implicit_count"], 0);
}

// A local_map whose reference reads, or returns, a name it never defines: said as such, with its
// JSON path (unusable input).
TEST(Reference, AMissingNameIsReportedAsSuch) {
  auto refused = [](const std::string& reference_arg, const std::string& reference_out) -> std::string {
    nlohmann::json doc = nlohmann::json::parse(R"json({
      "format": "meshsim.scenario/1", "name": "missing_name",
      "mesh": {"axes": ["dp"], "shape": [2]},
      "inputs": [{"name": "x", "shape": [4, 2], "placements": ["S(0)"]}],
      "program": [
        {"out": "y", "op": "local_map", "args": ["x"], "out_placements": [["S(0)"]],
         "body": [{"out": "e", "op": "exp", "args": ["x"]}],
         "reference": [{"out": "e", "op": "exp", "args": ["x"]}],
         "returns": ["e"]}]})json");
    doc["program"][0]["reference"][0]["args"][0] = reference_arg;
    doc["program"][0]["reference"][0]["out"] = reference_out;
    try {
      parse_scenario(doc, "missing.json");
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  const std::string reads = refused("xx", "e");
  EXPECT_NE(reads.find("/program/0/reference/0/args/0: the local_map's reference reads \"xx\", which neither"),
            std::string::npos)
      << reads;
  const std::string returns = refused("x", "f");
  EXPECT_NE(returns.find("/program/0/returns/0: the local_map returns \"e\", which its reference does not define"),
            std::string::npos)
      << returns;
  EXPECT_EQ(refused("x", "e"), "");
}

// Uneven shards are spelled out in a failure: a planted bug on a mesh of 3.
TEST(Mismatches, UnevenShardsAreSaid) {
  const nlohmann::json doc = nlohmann::json::parse(R"json({
    "format": "meshsim.scenario/1", "name": "uneven",
    "mesh": {"axes": ["dp"], "shape": [3]},
    "options": {"mutant": "uneven_array_split"},
    "inputs": [{"name": "x", "shape": [7, 2], "placements": ["S(0)"]}],
    "program": [{"out": "y", "op": "exp", "args": ["x"]}]})json");
  const CheckedRun run = check_scenario(parse_scenario(doc, "uneven.json"), parse_scenario(doc, "uneven.json").options);
  ASSERT_EQ(run.result.value("status", ""), "fail") << run.result.dump(1);
  bool said = false;
  for (const auto& m : run.result["mismatches"])
    said |= m.value("uneven", nlohmann::json()).is_string() &&
            m["uneven"].get<std::string>().find("dp=3 shards dim 0 of 7 unevenly: ranks 0, 1, 2 hold") != std::string::npos;
  EXPECT_TRUE(said) << run.result["mismatches"].dump(1);
}

// Both diagram views mark the first divergence (the culprit op's value, and the note's first line),
// and draw the planner's steps dashed with the word "implicit".
TEST(Diagrams, FirstDivergenceAndImplicitStepsAreMarked) {
  const fs::path file = source("tests/localize/norm_weight_grad_not_reduced.json");
  const Scenario sc = parse_scenario(read_json_file(file.string()), file.string());
  const CheckedRun run = check_scenario(sc, sc.options);
  ASSERT_TRUE(run.result.contains("first_divergence"));
  const Trace t = trace_of(sc, sc.options, run);
  for (const RenderView view : {RenderView::Logical, RenderView::Ranks}) {
    const std::string dot = render_dot(t, view);
    EXPECT_NE(dot.find("first divergence (backward)"), std::string::npos);
  }
  const fs::path planned = source("examples/mm_sharded_weight_above.json");
  const Scenario sp = parse_scenario(read_json_file(planned.string()), planned.string());
  const Trace tp = trace_of(sp, sp.options, check_scenario(sp, sp.options));
  const std::string dot = render_dot(tp);
  EXPECT_NE(dot.find("<B>implicit</B>"), std::string::npos);
  EXPECT_NE(dot.find("style=\"filled,dashed\""), std::string::npos);
}

// A trace written before events carried `implicit` replays alike: the annotation is not compared,
// and it round-trips through JSON only where it is set.
TEST(Implicit, TracesWithoutTheAnnotationReplayAlike) {
  const fs::path file = source("examples/mm_sharded_weight_above.json");
  const Scenario sc = parse_scenario(read_json_file(file.string()), file.string());
  const CheckedRun run = check_scenario(sc, sc.options);
  std::vector<Event> old = run.events;
  int marked = 0;
  for (auto& e : old) {
    marked += !e.implicit.empty();
    e.implicit.clear();
  }
  ASSERT_GT(marked, 0);
  EXPECT_FALSE(compare_events(old, run.events).diverged);
  for (const auto& e : run.events) {
    const nlohmann::json j = event_to_json(e);
    EXPECT_EQ(j.contains("implicit"), !e.implicit.empty());
    EXPECT_EQ(event_from_json(j, "t.json", "/events/0").implicit, e.implicit);
  }
}

// A residual: x feeds gelu and the add after it. The add's own use of x agrees (its gradient is the
// incoming one); the gelu's does not: gelu is the culprit, not the later op whose results' paths
// reach back through it.
TEST(Localize, AResidualBlamesTheOpNotTheLaterAdd) {
  const nlohmann::json doc = nlohmann::json::parse(R"json({
    "format": "meshsim.scenario/1", "name": "residual",
    "mesh": {"axes": ["dp"], "shape": [2]},
    "options": {"mutant": "gelu_tanh_derivative"},
    "inputs": [{"name": "x", "shape": [4, 3], "placements": ["S(0)"], "init": "randn", "requires_grad": true}],
    "program": [
      {"out": "h", "op": "gelu", "args": ["x"]},
      {"out": "y", "op": "add", "args": ["x", "h"]},
      {"out": "loss", "op": "sum", "args": ["y"]}],
    "backward": "loss"})json");
  const Scenario sc = parse_scenario(doc, "residual.json");
  for (const Localize mode : {Localize::OnFailure, Localize::Always}) {
    RunOptions options = sc.options;
    options.localize = mode;
    const CheckedRun run = check_scenario(sc, options);
    ASSERT_TRUE(run.result.contains("first_divergence")) << run.result.dump(1);
    EXPECT_EQ(run.result["first_divergence"].value("op", ""), "/program/0") << run.result["first_divergence"].dump(1);
    EXPECT_EQ(run.result["first_divergence"].value("name", ""), "gelu");
  }
}

}  // namespace
}  // namespace meshsim

#include "properties/properties.h"

#include <rapidcheck.h>

#include "core/cotangent.h"
#include "core/propagation.h"
#include "core/mutants.h"
#include "core/redistribute.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "properties/function_backward.h"
#include "properties/generators.h"
#include "properties/kernels.h"
#include "properties/partial_entry.h"
#include "properties/programs.h"
#include "properties/runner.h"
#include "properties/train_programs.h"
#include "traces/trace.h"

#include <torch/csrc/autograd/autograd.h>

#include "sim/data.h"
#include "sim/interpreter.h"
#include "sim/local_ops.h"
#include "sim/runtime.h"

namespace meshsim {

std::string& planted_mutant() {
  static std::string name;
  return name;
}

CoverageSink*& case_coverage() {
  static CoverageSink* sink = nullptr;
  return sink;
}

Failure& latest_failure() {
  static Failure f;
  return f;
}

// Runs a generated scenario against the oracle, with the planted bug of the check run on and the
// rules it exercises covered; a failing case is kept for the trace.
CheckedRun run_generated(const nlohmann::json& doc) {
  note_case_scenario(doc);  // the meshes and shapes the report lists
  Scenario sc = parse_scenario(doc, "<generated>");
  RunOptions options = sc.options;
  options.mutant = planted_mutant();
  CoverageScope covered(case_coverage());
  CheckedRun run = check_scenario(sc, options);
  if (run.result["status"] != "pass") latest_failure() = {doc, options.to_json()};
  return run;
}

namespace {

// The run options a property case draws: every option a scenario may set, and the planted bug of
// the `meshsim check` run (the active mutant).
nlohmann::json draw_options() {
  nlohmann::json o;
  o["redistribute"] = *rc::gen::element<std::string>("above_autograd", "below_autograd");
  o["partial_from_replicate"] = *rc::gen::element<std::string>("divide", "rank0");
  o["reduced_propagation"] = *rc::gen::element<std::string>("intersection", "union");
  o["seed"] = *rc::gen::inRange<uint64_t>(0, 1000);
  return o;
}



// The events of the fake mesh's run of a generated scenario alone (no oracle), with the planted
// bug of the check run on and its rules covered.
std::vector<Event> run_events(const Scenario& sc) {
  RunOptions options = sc.options;
  options.mutant = planted_mutant();
  MutantScope planted(parse_mutant(options.mutant));
  CoverageScope covered(case_coverage());
  ScopedOverride<bool> hashed(local_hashes_enabled(), true);  // its callers compare the locals' hashes
  return run_distributed(sc, options).runtime->events();
}

void assert_scenario_passes(const nlohmann::json& doc) {
  CheckedRun run = run_generated(doc);
  if (run.result["status"] != "pass") {
    std::string why = run.result.contains("failures") ? run.result["failures"].dump()
                                                       : run.result["error"].dump();
    RC_FAIL(run.result["status"].get<std::string>() + ": " + why);
  }
}

// Why p -> q or q -> p is illegal, as a discard's reason: the rule, not the placements (a count
// per rule), "" when both are legal.
std::string illegal_pair_reason(const Spec& p, const Spec& q) {
  std::string why = redistribute_illegal_reason(p, q);
  if (why.empty()) why = redistribute_illegal_reason(q, p);
  const auto rule = why.find("is illegal: ");
  return "illegal redistribution: " + (rule == std::string::npos ? why : why.substr(rule + 12));
}

// cotangent(cotangent(p)) == p on S(d), R, P(sum) and Rd.
void cotangent_involution() {
  const auto p = *rc::gen::elementOf(std::vector<Placement>{
      Placement::shard(0), Placement::shard(1), Placement::replicate(),
      Placement::partial(ReduceOp::Sum), Placement::reduced()});
  latest_failure() = {};
  MutantScope planted(parse_mutant(planted_mutant()));  // the table under test
  const Placement once = cotangent(p).placement;
  RC_ASSERT(cotangent(once).placement == p);
}

// p -> q -> p keeps the value, and the gradient of sum(z * c) w.r.t. x equals the oracle's, on
// random meshes, shapes (uneven and empty chunks) and legal placement pairs; half of the cases
// forward only, over every placement.
void redistribute_roundtrip() {
  const Mesh mesh = *gen::mesh();
  const Shape shape = *gen::shape(1, 3);
  const auto rank = static_cast<int64_t>(shape.size());
  // Half of the cases forward only, over every placement (P(max) and P(min) have no gradient).
  const bool grad = *rc::gen::arbitrary<bool>();
  const auto placement = grad ? gen::differentiable_placement(rank) : gen::any_placement(rank);
  const Spec p = gen::strided_now_and_then(mesh, *gen::spec(mesh, placement), shape);
  const Spec q = gen::strided_now_and_then(mesh, *gen::spec(mesh, placement), shape);
  discard_unless(redistribute_illegal_reason(p, q).empty() && redistribute_illegal_reason(q, p).empty(),
                 illegal_pair_reason(p, q));
  // The weight c is laid out as p or independently (its product with z then redistributes z, above or
  // below autograd as drawn, and the backward moves contributions of every kind).
  const Spec pc = *rc::gen::arbitrary<bool>() ? p : *gen::spec(mesh, placement);
  nlohmann::json doc = {
      {"format", "meshsim.scenario/1"},
      {"name", "redistribute_roundtrip"},
      {"mesh", gen::mesh_json(mesh)},
      {"options", draw_options()},
      {"inputs",
       {{{"name", "x"}, {"shape", shape}, {"placements", gen::spec_json(p)}, {"requires_grad", grad}},
        {{"name", "c"}, {"shape", shape}, {"placements", gen::spec_json(pc)}}}},
      {"program",
       {{{"out", "y"}, {"op", "redistribute"}, {"args", {"x"}}, {"placements", gen::spec_json(q)}},
        {{"out", "z"}, {"op", "redistribute"}, {"args", {"y"}}, {"placements", gen::spec_json(p)}},
        {{"out", "m"}, {"op", "mul"}, {"args", {"z", "c"}}},
        {{"out", "loss"}, {"op", "sum"}, {"args", {"m"}}}}},
      {"backward", "loss"}};
  assert_scenario_passes(doc);
}

void assert_check(const CheckedRun& run, const char* check) {
  const auto& r = run.result;
  if (r["status"] == "error")
    RC_FAIL("error " + r["error"]["kind"].get<std::string>() + ": " + r["error"]["message"].get<std::string>());
  const bool ok = r["checks"].value(check, false);
  if (!ok) RC_FAIL(std::string(check) + " fails: " + r.value("failures", nlohmann::json::array()).dump());
}

// One op on operands of every placement kind: values, gradients and their placements are right.
// An op whose result is bool or int64 (comparisons, indices) runs forward only: its values alone.
// Two ops a case: with about a hundred ops and their rows drawn one a case, a default run of 100
// cases left rows and planted bugs undrawn.
void single_op_equivalence() {
  for (int op = 0; op < 2; ++op) {
    const nlohmann::json doc = gen::single_op_program();
    const CheckedRun run = run_generated(doc);
    for (const char* check : {"forward_equivalence", "gradient_equivalence", "duality"})
      if (doc.contains("backward") || std::string(check) == "forward_equivalence") assert_check(run, check);
  }
}

void dtensor_forward_equivalence() { assert_check(run_generated(gen::dtensor_program()), "forward_equivalence"); }
void dtensor_gradient_equivalence() { assert_check(run_generated(gen::dtensor_program()), "gradient_equivalence"); }
void dtensor_duality() { assert_check(run_generated(gen::dtensor_program()), "duality"); }

// Every body value's variant and reduced axes are what the LTensor rules give it (the
// generator's own model of them).
void assert_labels(const CheckedRun& run, const std::map<std::string, gen::BodyLabels>& labels,
                   const nlohmann::json& doc) {
  const nlohmann::json values = run.result.value("values", nlohmann::json::object());
  for (const auto& [name, v] : values.items()) {
    auto want = labels.find(name);
    if (want == labels.end() || !v.contains("variant")) continue;
    const gen::BodyLabels got{v["variant"].get<std::vector<std::string>>(), v["reduced"].get<std::vector<std::string>>()};
    if (!(got == want->second)) {
      latest_failure() = {doc, run.result["options"]};
      RC_FAIL(name + " is variant over " + nlohmann::json(got.variant).dump() + " and reduced over " +
              nlohmann::json(got.reduced).dump() + "; the LTensor rules give variant " +
              nlohmann::json(want->second.variant).dump() + ", reduced " + nlohmann::json(want->second.reduced).dump());
    }
  }
}

void local_map_equivalence() {
  std::map<std::string, gen::BodyLabels> labels;
  const nlohmann::json doc = gen::local_map_program({}, nullptr, &labels);
  CheckedRun run = run_generated(doc);
  assert_check(run, "forward_equivalence");
  assert_check(run, "gradient_equivalence");
  assert_check(run, "variance_tracking");
  assert_labels(run, labels, doc);
}

// Exclusivity at every LTensor: no body value is both variant and reduced over an axis (a
// violation is an error of the run; the result's sets are checked too).
void local_map_exclusivity() {
  std::map<std::string, gen::BodyLabels> labels;
  const nlohmann::json doc = gen::local_map_program({}, nullptr, &labels);
  CheckedRun run = run_generated(doc);
  if (run.result["status"] == "error") RC_FAIL("error: " + run.result["error"].dump());
  for (const auto& [name, v] : run.result["values"].items()) {
    if (!v.contains("variant")) continue;
    for (const auto& a : v["variant"])
      for (const auto& b : v["reduced"])
        if (a == b) RC_FAIL(name + " is variant and reduced over " + a.get<std::string>());
  }
  assert_labels(run, labels, doc);
}

// A local_map region and the same program in DTensor mode (collectives as redistributions)
// agree on the loss and on every input gradient.
void local_map_agrees_with_dtensor() {
  nlohmann::json twin;
  nlohmann::json doc = gen::local_map_program({}, &twin);
  CheckedRun a = run_generated(doc), b = run_generated(twin);
  assert_check(a, "gradient_equivalence");
  assert_check(b, "gradient_equivalence");
}

// Whether a program (local_map bodies included) has an op named `name`.
bool has_op(const nlohmann::json& program, const std::string& name) {
  for (const auto& op : program) {
    if (op.value("op", "") == name) return true;
    if (op.contains("body") && has_op(op["body"], name)) return true;
  }
  return false;
}

// A value used twice whose gradient contributions come in two layouts (the generators draw few):
// x, replicated, feeds an mm with a weight sharded on its columns and a mul with the mm's result.
// Under PyTorch's semantics (no gradient hook) x's contribution through the mm is S(1) @ S(0), a
// P(sum), and through the mul an R one (the mul's redistribution of x back to x's placements):
// contributions that libtorch may add only once one is moved to the other's layout.
nlohmann::json mixed_gradient_layouts_program() {
  const int64_t n = *rc::gen::inRange<int64_t>(2, 5);
  const int64_t rows = *rc::gen::inRange<int64_t>(1, 5), k = *rc::gen::inRange<int64_t>(1, 6);
  const bool x_first = *rc::gen::arbitrary<bool>();
  nlohmann::json options = {{"redistribute", *rc::gen::element<std::string>("above_autograd", "below_autograd")},
                            {"seed", *rc::gen::inRange<int>(0, 1000)}};
  return {{"format", "meshsim.scenario/1"},
          {"name", "mixed_gradient_layouts"},
          {"mesh", {{"axes", {"tp"}}, {"shape", {n}}}},
          {"options", options},
          {"inputs",
           {{{"name", "x"}, {"shape", {rows, k}}, {"placements", {"R"}}, {"requires_grad", true}},
            {{"name", "w"}, {"shape", {k, k}}, {"placements", {"S(1)"}}, {"requires_grad", *rc::gen::arbitrary<bool>()}}}},
          {"program",
           {{{"out", "h"}, {"op", "mm"}, {"args", {"x", "w"}}},
            {{"out", "m"}, {"op", "mul"}, {"args", x_first ? nlohmann::json{"x", "h"} : nlohmann::json{"h", "x"}}},
            {{"out", "loss"}, {"op", "sum"}, {"args", {"m"}}}}},
          {"backward", "loss"}};
}

// The pytorch profile (core/semantics.h) keeps values and gradients right: single ops and random
// DTensor programs (and a value whose gradient contributions come in two layouts) run with
// semantics pytorch equal the oracle. Discarded, because the profile differs there by design:
// programs with a mean (PyTorch's mean over a sharded dim is P(avg) of the local means, wrong on
// uneven shards: pytorch#162692) and with a local_map (its body is plain local code under PyTorch:
// no automatic mark_varying, so a body that relies on one is the user's bug there); and runs that
// end in an error the meshsim profile gives the same program too (the generators' programs are
// legal, so such an error is a property of the program, not of the profile).
void pytorch_semantics_equivalence() {
  // Drawn at full size: each source a third of the cases from the first on (shrinks toward single ops).
  const int source = *rc::gen::resize(100, rc::gen::inRange(0, 3));
  nlohmann::json doc = source == 0   ? gen::single_op_program()
                       : source == 1 ? gen::dtensor_program()
                                     : mixed_gradient_layouts_program();
  discard_unless(!has_op(doc["program"], "mean"), "a mean (pytorch#162692, differs by design)");
  discard_unless(!has_op(doc["program"], "local_map"), "a local_map (plain local code under pytorch)");
  doc["options"]["semantics"] = "pytorch";
  doc["options"]["partial_from_replicate"] = "divide";  // rank0 is refused under pytorch
  // The strict Reduced policy refuses Rd mixed with other placements, and the generators keep
  // clear of that by meshsim's rows; the pytorch profile's rows give other placements now and
  // then (log_softmax over a sharded class dim gathers it), so strict would refuse programs for the
  // generator's model, not the profile's. Rd is meshsim's own: the default policy stands in.
  if (doc["options"].value("reduced_propagation", "") == "strict") doc["options"]["reduced_propagation"] = "intersection";
  // Rule coverage is meshsim's: without the gradient hook, gradients keep layouts (P(avg) ones, Rd
  // ones met by shards) that the coverage universe lists unreachable, rightly under meshsim's rules.
  // The pytorch runs count toward no rule.
  ScopedOverride<CoverageSink*> uncounted(case_coverage(), nullptr);
  const CheckedRun run = run_generated(doc);
  if (run.result["status"] == "error") {
    const Failure failed = latest_failure();
    nlohmann::json own = doc;
    own["options"]["semantics"] = "meshsim";
    const CheckedRun meshsim = run_generated(own);
    latest_failure() = failed;
    if (meshsim.result["status"] == "error" && meshsim.result["error"]["kind"] == run.result["error"]["kind"])
      discard_case("an error of the program under both profiles: " + run.result["error"]["kind"].get<std::string>());
  }
  assert_check(run, "forward_equivalence");
  if (doc.contains("backward")) assert_check(run, "gradient_equivalence");  // a bool or int64 result: forward only
}

// DTensor-mode local code (to_local ... from_local) with the generator's verdict: a correct SPMD
// program for the placements from_local asserts must pass (values and gradients equal the oracle's,
// which reads the local code as global code), a user bug (a missing all_reduce or pvary, a P(sum)
// through exp, a replicated value added to every part of a P(sum), an all_gather returned as R)
// must fail, never pass and never end in an error.
void local_code_verdict() {
  const gen::LocalCodeCase c = gen::local_code_program();
  // Wrong code must fail: its status is all this reads (a pass has no mismatch to describe).
  ScopedOverride<bool> described(mismatch_numbers_enabled(), c.correct);
  const CheckedRun run = run_generated(c.doc);
  const std::string status = run.result["status"].get<std::string>();
  const std::string want = c.correct ? "pass" : "fail";
  if (status == want) return;
  RunOptions options = parse_scenario(c.doc, "<generated>").options;
  options.mutant = planted_mutant();
  latest_failure() = {c.doc, options.to_json()};
  std::string why = run.result.contains("failures") ? run.result["failures"].dump()
                    : run.result.contains("error")  ? run.result["error"].dump()
                                                    : "";
  RC_FAIL("local code " + std::string(c.correct ? "correct" : "wrong") + " (" + c.why + ") but the run's status is " +
          status + (why.empty() ? "" : ": " + why));
}

// Same seed, same build: the same trace, byte for byte (float32 with randn data, where the
// order of a reduction shows in the bits).
// (The fake mesh's runs alone, without the oracle: only their events are compared.)
void determinism() {
  gen::ProgramOptions o;
  o.float32_randn = true;
  o.max_ops = 6;  // five runs a case
  nlohmann::json doc = gen::dtensor_program(o);
  // Five runs, the first against each other: a nondeterministic order shows in one comparison
  // or another more often than in one (a shuffled sum of three float32 terms has few distinct
  // roundings), which lets a counterexample shrink further.
  // The same trace: every event alike, its `implicit` annotation too (all that trace_hash covers),
  // compared field by field: serializing both traces to hash them was a quarter of the property's time.
  auto same_trace = [](const std::vector<Event>& a, const std::vector<Event>& b) {
    if (a != b) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].implicit != b[i].implicit) return false;
    return true;
  };
  note_case_scenario(doc);
  const Scenario sc = parse_scenario(doc, "<generated>");  // parsed once: the runs are the subject
  Trace t1;
  t1.events = run_events(sc);
  for (int again = 0; again < 4; ++again) {
    Trace t2;
    t2.events = run_events(sc);
    if (same_trace(t1.events, t2.events)) continue;
    RunOptions options = sc.options;
    options.mutant = planted_mutant();
    latest_failure() = {doc, options.to_json()};
    RC_FAIL("two runs of one scenario and seed gave different traces: " + compare_events(t1.events, t2.events).message);
  }
}

// The pairing of a primal laid out by `spec` with its cotangent's locals: the sum over ranks of
// the local inner products, divided by the size of every axis where the primal is R (each rank
// holds the whole of both there). It equals the inner product of the global values.
double pairing(const Mesh& mesh, const Spec& spec, const Locals& primal, const Locals& cotangent) {
  double total = 0;
  for (size_t r = 0; r < primal.size(); ++r)
    total += (primal[r].to(at::kDouble) * cotangent[r].to(at::kDouble)).sum().item<double>();
  for (int a = 0; a < mesh.ndim(); ++a)
    if (spec[a].is_plain_replicate()) total /= static_cast<double>(mesh.axis_size(a));
  return total;
}

// <A* g, dx> = <g, A dx> for the redistribution A: p -> q, on random 1-3 axis meshes, uneven
// shapes and random locals (uneven Partial splits), exactly: the backward is the transpose of the
// forward under the pairing of primals with their cotangents. No finite differences.
void adjoint_identity() {
  const Mesh mesh = *gen::mesh();
  discard_unless(mesh.size() <= 64, "mesh of more than 64 ranks");
  const Shape shape = *gen::shape(1, 3);
  const auto rank = static_cast<int64_t>(shape.size());
  const Spec p = gen::strided_now_and_then(mesh, *gen::spec(mesh, gen::differentiable_placement(rank)), shape);
  const Spec q = gen::strided_now_and_then(mesh, *gen::spec(mesh, gen::differentiable_placement(rank)), shape);
  note_case_layout(mesh, {{shape, p}});
  discard_unless(redistribute_illegal_reason(p, q).empty(), illegal_pair_reason(p, q));
  const uint64_t seed = *rc::gen::inRange<uint64_t>(0, 1000);
  RunOptions options;
  options.partial_from_replicate = *rc::gen::element(PartialFromReplicate::Divide, PartialFromReplicate::Rank0);
  MutantScope planted(parse_mutant(planted_mutant()));
  CoverageScope covered(case_coverage());
  Runtime rt(mesh, options);
  Rng rng(seed, 1);
  DTensor x{"x", shape, p, distribute(mesh, p, make_init("int", shape, DType::Float64, rng), &rng)};
  for (auto& l : x.locals) l = l.detach().requires_grad_(true);
  const DTensor y = rt.redistribute(x, q, "y");
  // The cotangent laid out by the true table (the checks never use a planted bug).
  Spec gq;
  int64_t divisor = 1;
  {
    MutantScope truth(Mutant::None);
    gq = cotangent_spec(q);
    divisor = cotangent_scale_divisor(mesh, q);
  }
  Locals g = distribute(mesh, gq, make_init("int", shape, DType::Float64, rng) / static_cast<double>(divisor), &rng);
  auto back = torch::autograd::grad(y.locals, x.locals, g, false, false, true);
  if (rt.pending_error_) RC_FAIL(std::string("backward raised: ") + rt.pending_error_->what());
  for (size_t r = 0; r < back.size(); ++r)
    if (!back[r].defined()) back[r] = at::zeros_like(x.locals[r]);
  const double lhs = pairing(mesh, p, x.locals, back), rhs = pairing(mesh, q, y.locals, g);
  const double tol = 1e-9 * std::max(1.0, std::abs(rhs));
  if (std::abs(lhs - rhs) > tol) {
    latest_failure() = {};
    RC_FAIL("<A* g, dx> = " + std::to_string(lhs) + " but <g, A dx> = " + std::to_string(rhs) + " for " + spec_str(p) +
            " -> " + spec_str(q) + " on " + mesh.str() + " shape " + shape_str(shape));
  }
}

// In above-autograd mode, the backward of each forward collective of a redistribution is its
// transpose: all_gather (to Rd) <-> reduce_scatter, reduce_scatter <-> all_gather, all_to_all <->
// all_to_all, all_reduce <-> nothing; on one axis, for the transitions where the duality makes
// them so (S(d) -> Rd, P(sum) -> S(d), P(sum) -> R, S(i) -> S(j)).
void collective_transpose() {
  const int64_t n = *rc::gen::inRange<int64_t>(2, 9);
  const Mesh mesh({"a"}, {n});
  const Shape shape = {*rc::gen::inRange<int64_t>(0, 9), *rc::gen::inRange<int64_t>(0, 9)};
  const int64_t d = *rc::gen::inRange<int64_t>(0, 2);
  const std::string sd = "S(" + std::to_string(d) + ")", so = "S(" + std::to_string(1 - d) + ")";
  const auto pair = *rc::gen::elementOf(std::vector<std::pair<std::string, std::string>>{
      {sd, "Rd"}, {"P(sum)", sd}, {"P(sum)", "R"}, {sd, so}});
  nlohmann::json doc = {
      {"format", "meshsim.scenario/1"}, {"name", "collective_transpose"}, {"mesh", gen::mesh_json(mesh)},
      {"inputs", {{{"name", "x"}, {"shape", shape}, {"placements", {pair.first}}, {"requires_grad", true}},
                  {{"name", "c"}, {"shape", shape}, {"placements", {"R"}}}}},
      {"program", {{{"out", "y"}, {"op", "redistribute"}, {"args", {"x"}}, {"placements", {pair.second}}},
                   {{"out", "m"}, {"op", "mul"}, {"args", {"y", "c"}}},
                   {{"out", "loss"}, {"op", "sum"}, {"args", {"m"}}}}},
      {"backward", "loss"}};
  CheckedRun run = run_generated(doc);
  std::vector<std::string> fwd, bwd;
  for (const auto& e : run.events) {
    if (e.kind != "collective" || e.value != "y") continue;
    (e.phase == "forward" ? fwd : bwd).push_back(e.name);
  }
  static const std::map<std::string, std::string> transpose = {
      {"all_gather", "reduce_scatter"}, {"reduce_scatter", "all_gather"}, {"all_to_all", "all_to_all"}, {"all_reduce", ""}};
  std::vector<std::string> want;
  for (const auto& f : fwd)
    if (!transpose.at(f).empty()) want.push_back(transpose.at(f));
  std::reverse(want.begin(), want.end());
  if (bwd != want) {
    latest_failure() = {doc, run.result["options"]};
    nlohmann::json got = bwd, expected = want;
    RC_FAIL(pair.first + " -> " + pair.second + ": backward collectives " + got.dump() + ", the transpose is " + expected.dump());
  }
}

// The Reduced FSDP backward moves half the bytes of the Replicate path: reduce_scatter instead
// of all_reduce (shapes divisible by the group, so no padding).
void communication_volume() {
  const int64_t n = *rc::gen::inRange<int64_t>(2, 9);
  const int64_t rows = n * *rc::gen::inRange<int64_t>(1, 4), cols = *rc::gen::inRange<int64_t>(1, 5);
  auto fsdp = [&](const std::string& gathered) {
    return nlohmann::json{
        {"format", "meshsim.scenario/1"}, {"name", "fsdp_" + gathered}, {"mesh", {{"axes", {"dp"}}, {"shape", {n}}}},
        {"inputs", {{{"name", "x"}, {"shape", {n, rows}}, {"placements", {"S(0)"}}},
                    {{"name", "w"}, {"shape", {rows, cols}}, {"placements", {"S(0)"}}, {"requires_grad", true}}}},
        {"program", {{{"out", "wf"}, {"op", "redistribute"}, {"args", {"w"}}, {"placements", {gathered}}},
                     {{"out", "y"}, {"op", "mm"}, {"args", {"x", "wf"}}},
                     {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}}},
        {"backward", "loss"}};
  };
  auto backward_bytes = [](const CheckedRun& run) {
    int64_t b = 0;
    for (const auto& c : run.result.value("collectives", nlohmann::json::array()))
      if (c["phase"] == "backward") b += c["bytes"].get<int64_t>();
    return b;
  };
  const CheckedRun reduced = run_generated(fsdp("Rd")), replicated = run_generated(fsdp("R"));
  const int64_t rd = backward_bytes(reduced), r = backward_bytes(replicated);
  if (rd == 0 || 2 * rd != r) {
    latest_failure() = {fsdp("Rd"), reduced.result["options"]};
    RC_FAIL("backward bytes: Reduced path " + std::to_string(rd) + ", Replicate path " + std::to_string(r) +
            " (expected exactly half)");
  }
}

// The same program with every Rd written as R (inputs and redistribution targets).
nlohmann::json reduced_as_replicate(nlohmann::json doc) {
  auto relabel = [](nlohmann::json& placements) {
    for (auto& p : placements)
      if (p == "Rd") p = "R";
  };
  for (auto& in : doc["inputs"]) relabel(in["placements"]);
  for (auto& op : doc["program"])
    if (op.contains("placements")) relabel(op["placements"]);
  return doc;
}

// The forward of a run as data: per event but relabels, what it is and the hash of every local it
// made (Rd and R lay out the same data, so their forwards differ in labels only).
std::vector<std::string> forward_data(const std::vector<Event>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) {
    if (e.phase != "forward" || e.name == "relabel") continue;  // R <-> Rd moves no data
    std::string line = e.kind + " " + e.name + " " + e.value + " " + e.axis;
    for (const auto& h : e.hashes) line += " " + h;
    out.push_back(line);
  }
  return out;
}

// Whether every value of a run has the same local shape on every rank (no collective pads).
bool evenly_laid_out(const CheckedRun& run) {
  const nlohmann::json values = run.result.value("values", nlohmann::json::object());
  for (const auto& [name, v] : values.items()) {
    const auto shapes = v.value("local_shapes", nlohmann::json::array());
    for (const auto& s : shapes)
      if (s != shapes.front()) return false;
  }
  return true;
}

int64_t bytes_moved(const std::vector<Event>& events) {
  int64_t b = 0;
  for (const auto& e : events)
    if (e.kind == "collective") b += e.bytes;
  return b;
}

// Whether a run's backward makes a gradient Partial that was not: an R -> P(sum) or S(d) -> P(sum)
// step of a gradient (the cotangent P(sum) of an Rd value receiving a replicated or sharded
// contribution), or the seed of an Rd loss.
bool makes_a_gradient_partial(const CheckedRun& run) {
  for (const auto& e : run.events) {
    // An Rd value times a Partial one (the R, P -> P rows of mul, mm, matmul): the gradient of the
    // Rd value is made partial by its partner, and its reduction, deferred by Rd, can come after
    // an all_gather the R program did on the reduced value (findings.md, section 8).
    if (e.phase == "forward" && e.kind == "op" && e.in_specs.size() == 2) {
      const bool rd = e.in_specs[0].find("Rd") != std::string::npos || e.in_specs[1].find("Rd") != std::string::npos;
      const bool partial = e.in_specs[0].find("P(") != std::string::npos || e.in_specs[1].find("P(") != std::string::npos;
      if (rd && partial) return true;
    }
    // rescale_partial: a P(avg) gradient, made partial by a P(avg) operand of the forward (the
    // R, P(avg) -> P(avg) rows), not by a sum over a sharded dim; its reduction, deferred by Rd
    // past the all_gather of the value that consumed it, moves more bytes.
    if (e.phase == "backward" &&
        (e.name == "partial_from_replicate" || e.name == "pad_to_partial" || e.name == "rescale_partial"))
      return true;
    if (e.kind == "seed" && e.out_spec.find("P(sum)") != std::string::npos) {
      const auto values = run.result.value("values", nlohmann::json::object());
      if (values.contains(e.value))
        for (const auto& p : values[e.value].value("placements", nlohmann::json::array()))
          if (p == "Rd") return true;
    }
  }
  return false;
}

// A lost optimization is a bug too. A program with Rd values passes the oracle and computes the
// same data as the same program with R in their place (the same forward, local by local), and it
// never moves more bytes when every P(sum) gradient it holds is truly partial: Rd trades the
// backward all_reduce of a partial gradient for a reduce_scatter or nothing. Where a replicated
// or sharded gradient is made Partial instead (an Rd loss, an Rd value consumed by replicated or
// sharded ops), Rd does cost more, by a reduction the R program does not need or does as an
// all_gather: the case is discarded here and shown in docs/findings.md; so are programs with
// uneven layouts, whose padded reduce_scatters can move more than an all_reduce. Under the
// intersection policy; under union an Rd and an R operand give an Rd result whose gradient the R
// operand must all_reduce (docs/findings.md).
void reduced_never_costs_more() {
  gen::ProgramOptions o;
  o.max_ops = 6;  // two runs a case: programs a little shorter than the other properties'
  o.even = true;
  o.reduced = true;
  nlohmann::json doc = gen::dtensor_program(o);
  doc["options"]["reduced_propagation"] = "intersection";
  const nlohmann::json plain = reduced_as_replicate(doc);
  const bool has_reduced = plain != doc;
  discard_unless(has_reduced, "no Rd drawn");
  ScopedOverride<bool> hashed(local_hashes_enabled(), true);  // forward_data compares the locals' hashes
  const CheckedRun reduced = run_generated(doc);
  for (const char* check : {"forward_equivalence", "gradient_equivalence"}) assert_check(reduced, check);
  note_case_scenario(plain);
  const std::vector<Event> replicated = run_events(parse_scenario(plain, "<generated>"));  // values: not its concern
  const auto a = forward_data(reduced.events), b = forward_data(replicated);
  if (a != b) {
    latest_failure() = {doc, reduced.result["options"]};
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    RC_FAIL("with Rd and with R the forwards differ at event " + std::to_string(i) + ": " +
            (i < a.size() ? a[i] : "(none)") + " vs " + (i < b.size() ? b[i] : "(none)"));
  }
  const bool made_partial = makes_a_gradient_partial(reduced);
  discard_unless(!made_partial, "a replicated or sharded gradient made Partial (Rd costs more there)");
  // Padded collectives: a reduce_scatter of a dim smaller than its group moves the padded chunks,
  // more than an all_reduce of the whole (a dim of 1 over 3 ranks: 2/3 x 3 rows against 2 x 2/3 x
  // 1 row), so the comparison holds for values laid out evenly (Rd and R lay them out alike).
  const bool even = evenly_laid_out(reduced);
  discard_unless(even, "uneven layout (padded collectives)");
  const int64_t rd = bytes_moved(reduced.events), r = bytes_moved(replicated);
  if (rd > r) {
    latest_failure() = {doc, reduced.result["options"]};
    RC_FAIL("the program with Rd moves " + std::to_string(rd) + " bytes, the same program with R " +
            std::to_string(r) + ", and every P(sum) gradient of the Rd program is truly partial");
  }
}

// The placement of every value after its op is what the op's rows give its operands' placements,
// with the Rd label restored by the run's policy, as SEMANTICS.md section 4 states it (written out
// here, not taken from the runtime): on an axis whose row output is R, Rd when every operand is Rd
// there (intersection, strict) or any is (union); under strict, Rd mixed with another placement is
// refused. A policy that drops or invents an Rd label leaves the values right and moves bytes it
// should not; this finds it.
void placement_follows_rules() {
  const nlohmann::json doc = gen::dtensor_program();
  const CheckedRun run = run_generated(doc);
  if (run.result["status"] == "error") RC_FAIL("error: " + run.result["error"].dump());
  const Scenario sc = parse_scenario(doc, "<generated>");
  const ReducedPropagation policy = sc.options.reduced_propagation;
  const char* policy_name = policy == ReducedPropagation::Union    ? "union"
                            : policy == ReducedPropagation::Strict ? "strict"
                                                                   : "intersection";
  const nlohmann::json values = run.result.value("values", nlohmann::json::object());
  auto spec_of = [&](const std::string& name) {
    if (!values.contains(name)) RC_FAIL("the result lists no value " + name);
    Spec s;
    for (const auto& p : values.at(name).at("placements")) s.push_back(parse_placement(p.get<std::string>()));
    return s;
  };
  for (const auto& op : sc.program) {
    std::vector<Spec> specs;
    std::vector<Shape> shapes;
    for (const auto& a : op.args) {
      specs.push_back(spec_of(a));
      shapes.push_back(values.at(a).at("shape").get<Shape>());
    }

    // The rows' output for `name`, with the Rd label as the policy restores it.
    auto by_rules = [&](const std::string& name, const std::vector<Spec>& in, const std::vector<Shape>& in_shapes,
                        const OpAttrs& attrs) {
      Spec want = propagate(name, sc.mesh, in, in_shapes, attrs).out_spec;
      for (size_t a = 0; a < want.size(); ++a) {
        if (!want[a].is_plain_replicate()) continue;
        size_t reduced = 0;
        for (const auto& s : in) reduced += s[a].is_reduced() ? 1 : 0;
        if (policy == ReducedPropagation::Strict && reduced > 0 && reduced < in.size()) {
          latest_failure() = {doc, run.result["options"]};
          RC_FAIL(op.out + " = " + op.op + " mixes Rd with other placements over mesh axis " + sc.mesh.axes()[a] +
                  "; the strict policy refuses it (reduced_mismatch), the run gave it " +
                  spec_str(spec_of(op.out)));
        }
        if (reduced == in.size() || (policy == ReducedPropagation::Union && reduced > 0)) want[a] = Placement::reduced();
      }
      return want;
    };
    if (is_split_op(op.op)) {  // one narrow per piece
      const auto pieces = split_as_narrows(op, shapes.at(0));
      for (size_t k = 0; k < pieces.size(); ++k) {
        const Spec want = by_rules("narrow", specs, shapes, pieces[k]);
        if (spec_of(op.outs[k]) != want) {
          latest_failure() = {doc, run.result["options"]};
          RC_FAIL(op.outs[k] + " = " + op.op + " piece " + std::to_string(k) + " is " + spec_str(spec_of(op.outs[k])) +
                  "; the narrow rows give " + spec_str(want));
        }
      }
      continue;
    }
    // The decompositions the runtime runs (sim/interpreter.cpp), by the rows of their parts:
    // log_softmax over a sharded dim is loss parallel (amax, sub, exp, sum, log, sub); nll_loss is
    // the target pick, then sum, mean, or sum over the count of the targets kept (count_targets,
    // sum, div); cross_entropy is log_softmax over dim 1, then nll_loss.
    using Part = std::pair<Spec, Shape>;
    auto part = [&](const std::string& name, const OpAttrs& a, const std::vector<Part>& in) -> Part {
      std::vector<Spec> ss;
      std::vector<Shape> hs;
      for (const auto& [sp, sh] : in) {
        ss.push_back(sp);
        hs.push_back(sh);
      }
      return {by_rules(name, ss, hs, a), infer_shape(name, hs, a)};
    };
    auto over = [](int64_t dim, bool keepdim) {
      OpAttrs a;
      a.dim = dim;
      a.keepdim = keepdim;
      return a;
    };
    auto log_softmax = [&](const Part& x, int64_t dim) {
      const int64_t d = dim < 0 ? dim + static_cast<int64_t>(x.second.size()) : dim;
      bool sharded = false;
      for (const auto& p : x.first) sharded |= p.is_shard() && p.dim == d;
      if (!sharded) return part("log_softmax", over(d, false), {x});
      const Part m = part("amax", over(d, true), {x});
      const Part shifted = part("sub", {}, {x, m});
      const Part total = part("sum", over(d, true), {part("exp", {}, {shifted})});
      return part("sub", {}, {shifted, part("log", {}, {total})});
    };
    auto nll_loss = [&](const Part& logp, const Part& target, const OpAttrs& a) {
      OpAttrs pick;
      pick.ignore_index = a.ignore_index;
      const Part picked = part("pick_target", pick, {logp, target});
      if (a.sum_reduction || !a.ignore_index) return part(a.sum_reduction ? "sum" : "mean", {}, {picked});
      const Part count = part("sum", {}, {part("count_targets", pick, {target})});
      return part("div", {}, {part("sum", {}, {picked}), count});
    };
    Spec want;
    OpAttrs attrs = op_attrs(op);
    if (is_creation_op(op.op)) {  // laid out as its placements say
      for (const auto& p : op.attrs.at("placements")) want.push_back(parse_placement(p.get<std::string>()));
      want = normalize_spec(want, static_cast<int64_t>(op.attrs.at("shape").size()));
    } else if (op.op == "log_softmax") {
      want = log_softmax({specs[0], shapes[0]}, *attrs.dim).first;
    } else if (op.op == "nll_loss" || op.op == "cross_entropy") {
      const Part logp = op.op == "nll_loss" ? Part{specs[0], shapes[0]} : log_softmax({specs[0], shapes[0]}, 1);
      want = nll_loss(logp, {specs[1], shapes[1]}, attrs).first;
    } else if (op.op == "redistribute") {
      for (const auto& p : op.attrs.at("placements")) want.push_back(parse_placement(p.get<std::string>()));
    } else if (op.op == "linear") {  // transpose, matmul, add: the runtime's parts
      OpAttrs t;
      t.dim1 = 1;
      const Spec wt = by_rules("transpose", {specs[1]}, {shapes[1]}, t);
      const Shape wt_shape = infer_shape("transpose", {shapes[1]}, t);
      want = by_rules("matmul", {specs[0], wt}, {shapes[0], wt_shape}, {});
      if (specs.size() > 2)
        want = by_rules("add", {want, specs[2]}, {infer_shape("matmul", {shapes[0], wt_shape}, {}), shapes[2]}, {});
    } else {
      if (attrs.scalar && specs.size() == 1) {  // the scalar: a replicated 0-d operand
        specs.push_back(Spec(specs[0].size(), Placement::replicate()));
        shapes.push_back({});
        attrs.scalar = false;
      }
      want = by_rules(op.op, specs, shapes, attrs);
    }
    const Spec got = spec_of(op.out);
    if (got != want) {
      latest_failure() = {doc, run.result["options"]};
      std::string operands;
      for (size_t i = 0; i < specs.size(); ++i) operands += (i ? ", " : "") + op.args[i] + " " + spec_str(specs[i]);
      RC_FAIL(op.out + " = " + op.op + "(" + operands + ") is " + spec_str(got) + "; the rows and the " +
              policy_name + " policy give " + spec_str(want));
    }
  }
}

}  // namespace

const std::vector<Property>& property_catalog() {
  static const std::vector<Property> catalog = {
      {"adjoint_identity", "<A* g, dx> = <g, A dx> for every redistribution, exactly", adjoint_identity},
      {"collective_transpose", "above autograd, each forward collective's backward is its transpose",
       collective_transpose},
      {"communication_volume", "the Reduced FSDP backward moves half the bytes of the Replicate path",
       communication_volume},
      {"cotangent_involution", "the cotangent map is an involution on S(d), R, P(sum) and Rd",
       cotangent_involution},
      {"determinism", "same scenario, seed and build: the same trace hash, three runs (float32, randn data)", determinism},
      {"dtensor_duality", "random DTensor programs: every input gradient's placement is its cotangent", dtensor_duality},
      {"dtensor_forward_equivalence", "random DTensor programs of 1-8 ops: values equal the oracle's",
       dtensor_forward_equivalence},
      {"dtensor_gradient_equivalence", "random DTensor programs of 1-8 ops: input gradients equal the oracle's",
       dtensor_gradient_equivalence},
      {"function_backward_matches_reference",
       "every registered Function's backward (built-in and plugin) equals central finite differences of its "
       "reference on one rank, element by element; a Function without a reference is skipped (a discard)",
       function_backward_matches_reference},
      {"kernels_match_definitions",
       "every op's kernel and its gradients (autograd's and the closed form's) equal the op's definition, element by element",
       kernels_match_definitions},
      {"local_code_verdict",
       "DTensor-mode local code (to_local ... from_local): right SPMD code passes, a user bug fails, by the "
       "generator's own verdict",
       local_code_verdict},
      {"local_map_agrees_with_dtensor", "a local_map region and the same program in DTensor mode agree",
       local_map_agrees_with_dtensor},
      {"local_map_equivalence",
       "random local_map bodies: values, gradients and variance tracking against the reference, labels by the LTensor rules",
       local_map_equivalence},
      {"local_map_exclusivity", "no LTensor is variant and reduced over one axis; labels by the LTensor rules",
       local_map_exclusivity},
      {"local_map_partial_entry",
       "a Partial entering a local_map, partial_in_local_map variant and unreduced: right programs pass both; a "
       "misuse (exp of the locals, a bias on every rank, another all_reduce op) is refused by unreduced and fails the "
       "oracle under variant",
       local_map_partial_entry},
      {"placement_follows_rules", "every value's placement is what the rows and the Reduced policy give its operands",
       placement_follows_rules},
      {"pytorch_semantics_equivalence",
       "under semantics pytorch, single ops and random DTensor programs (no mean, no local_map): values and "
       "gradients equal the oracle's",
       pytorch_semantics_equivalence},
      {"reduced_never_costs_more", "a program with Rd computes what it computes with R, and never moves more bytes",
       reduced_never_costs_more},
      {"redistribute_roundtrip",
       "p -> q -> p keeps values and passes gradient equivalence on 1-3 axis meshes, uneven shapes",
       redistribute_roundtrip},
      {"single_op_equivalence", "one op of every kind on operands of every placement: values, gradients, duality",
       single_op_equivalence},
      {"train_equivalence",
       "random training steps (1-3 steps, 1-3 microbatches, sgd or adamw, states laid out otherwise, clip_grad_norm): "
       "every parameter, optimizer state and total norm equals the oracle's after every step",
       train_equivalence},
  };
  return catalog;
}

}  // namespace meshsim

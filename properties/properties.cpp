#include "properties/properties.h"

#include <rapidcheck.h>

#include "core/cotangent.h"
#include "core/mutants.h"
#include "core/redistribute.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "properties/generators.h"
#include "properties/programs.h"
#include "traces/trace.h"

#include <torch/csrc/autograd/autograd.h>

#include "sim/data.h"
#include "sim/runtime.h"

namespace meshsim {

std::string& planted_mutant() {
  static std::string name;
  return name;
}

Failure& latest_failure() {
  static Failure f;
  return f;
}

namespace {

// The run options a property case draws: every option a scenario may set, and the planted bug of
// the `meshsim check` run (the active mutant).
nlohmann::json draw_options() {
  nlohmann::json o;
  o["partial_from_replicate"] = *rc::gen::element<std::string>("divide", "rank0");
  o["reduced_propagation"] = *rc::gen::element<std::string>("intersection", "union");
  o["seed"] = *rc::gen::inRange<uint64_t>(0, 1000);
  return o;
}


// Runs a generated scenario against the oracle; a failing case is kept for the trace.
void assert_scenario_passes(const nlohmann::json& doc) {
  Scenario sc = parse_scenario(doc, "<generated>");
  RunOptions options = sc.options;
  options.mutant = planted_mutant();
  CheckedRun run = check_scenario(sc, options);
  if (run.result["status"] != "pass") {
    latest_failure() = {doc, options.to_json()};
    std::string why = run.result.contains("failures") ? run.result["failures"].dump()
                                                       : run.result["error"].dump();
    RC_FAIL(run.result["status"].get<std::string>() + ": " + why);
  }
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
// random meshes, shapes (uneven and empty chunks) and legal placement pairs.
void redistribute_roundtrip() {
  const Mesh mesh = *gen::mesh();
  const Shape shape = *gen::shape(1, 3);
  const auto rank = static_cast<int64_t>(shape.size());
  const Spec p = *gen::spec(mesh, gen::differentiable_placement(rank));
  const Spec q = *gen::spec(mesh, gen::differentiable_placement(rank));
  RC_PRE(redistribute_illegal_reason(p, q).empty() && redistribute_illegal_reason(q, p).empty());
  nlohmann::json doc = {
      {"format", "meshsim.scenario/1"},
      {"name", "redistribute_roundtrip"},
      {"mesh", gen::mesh_json(mesh)},
      {"options", draw_options()},
      {"inputs",
       {{{"name", "x"}, {"shape", shape}, {"placements", gen::spec_json(p)}, {"requires_grad", true}},
        {{"name", "c"}, {"shape", shape}, {"placements", gen::spec_json(p)}}}},
      {"program",
       {{{"out", "y"}, {"op", "redistribute"}, {"args", {"x"}}, {"placements", gen::spec_json(q)}},
        {{"out", "z"}, {"op", "redistribute"}, {"args", {"y"}}, {"placements", gen::spec_json(p)}},
        {{"out", "m"}, {"op", "mul"}, {"args", {"z", "c"}}},
        {{"out", "loss"}, {"op", "sum"}, {"args", {"m"}}}}},
      {"backward", "loss"}};
  assert_scenario_passes(doc);
}

// Runs a generated scenario and checks one field of its result; a scenario the semantics refuse
// under its drawn options (strict's reduced_mismatch) is discarded.
CheckedRun run_generated(const nlohmann::json& doc) {
  Scenario sc = parse_scenario(doc, "<generated>");
  RunOptions options = sc.options;
  options.mutant = planted_mutant();
  CheckedRun run = check_scenario(sc, options);
  if (run.result["status"] != "pass") latest_failure() = {doc, options.to_json()};
  return run;
}

void assert_check(const CheckedRun& run, const char* check) {
  const auto& r = run.result;
  if (r["status"] == "error")
    RC_FAIL("error " + r["error"]["kind"].get<std::string>() + ": " + r["error"]["message"].get<std::string>());
  const bool ok = r["checks"].value(check, false);
  if (!ok) RC_FAIL(std::string(check) + " fails: " + r.value("failures", nlohmann::json::array()).dump());
}

void dtensor_forward_equivalence() { assert_check(run_generated(gen::dtensor_program()), "forward_equivalence"); }
void dtensor_gradient_equivalence() { assert_check(run_generated(gen::dtensor_program()), "gradient_equivalence"); }
void dtensor_duality() { assert_check(run_generated(gen::dtensor_program()), "duality"); }

void local_map_equivalence() {
  CheckedRun run = run_generated(gen::local_map_program());
  assert_check(run, "forward_equivalence");
  assert_check(run, "gradient_equivalence");
  assert_check(run, "variance_tracking");
}

// Exclusivity at every LTensor: no body value is both variant and reduced over an axis (a
// violation is an error of the run; the result's sets are checked too).
void local_map_exclusivity() {
  CheckedRun run = run_generated(gen::local_map_program());
  if (run.result["status"] == "error") RC_FAIL("error: " + run.result["error"].dump());
  for (const auto& [name, v] : run.result["values"].items()) {
    if (!v.contains("variant")) continue;
    for (const auto& a : v["variant"])
      for (const auto& b : v["reduced"])
        if (a == b) RC_FAIL(name + " is variant and reduced over " + a.get<std::string>());
  }
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

// Same seed, same build: the same trace, byte for byte (float32 with randn data, where the
// order of a reduction shows in the bits).
void determinism() {
  gen::ProgramOptions o;
  o.float32_randn = true;
  nlohmann::json doc = gen::dtensor_program(o);
  CheckedRun first = run_generated(doc), second = run_generated(doc);
  Trace t1, t2;
  t1.events = first.events;
  t2.events = second.events;
  if (trace_hash(t1) != trace_hash(t2)) {
    latest_failure() = {doc, first.result["options"]};
    RC_FAIL("two runs of one scenario and seed gave different traces: " + compare_events(first.events, second.events).message);
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
  RC_PRE(mesh.size() <= 64);
  const Shape shape = *gen::shape(1, 3);
  const auto rank = static_cast<int64_t>(shape.size());
  const Spec p = *gen::spec(mesh, gen::differentiable_placement(rank));
  const Spec q = *gen::spec(mesh, gen::differentiable_placement(rank));
  RC_PRE(redistribute_illegal_reason(p, q).empty());
  const uint64_t seed = *rc::gen::inRange<uint64_t>(0, 1000);
  RunOptions options;
  options.partial_from_replicate = *rc::gen::element(PartialFromReplicate::Divide, PartialFromReplicate::Rank0);
  MutantScope planted(parse_mutant(planted_mutant()));
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
      {"determinism", "same scenario, seed and build: the same trace hash (float32, randn data)", determinism},
      {"dtensor_duality", "random DTensor programs: every input gradient's placement is its cotangent", dtensor_duality},
      {"dtensor_forward_equivalence", "random DTensor programs of 1-8 ops: values equal the oracle's",
       dtensor_forward_equivalence},
      {"dtensor_gradient_equivalence", "random DTensor programs of 1-8 ops: input gradients equal the oracle's",
       dtensor_gradient_equivalence},
      {"local_map_agrees_with_dtensor", "a local_map region and the same program in DTensor mode agree",
       local_map_agrees_with_dtensor},
      {"local_map_equivalence", "random local_map bodies: values, gradients and variance tracking against the reference",
       local_map_equivalence},
      {"local_map_exclusivity", "no LTensor is variant and reduced over one axis", local_map_exclusivity},
      {"redistribute_roundtrip",
       "p -> q -> p keeps values and passes gradient equivalence on 1-3 axis meshes, uneven shapes",
       redistribute_roundtrip},
  };
  return catalog;
}

}  // namespace meshsim

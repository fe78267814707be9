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

namespace meshsim {

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

std::string active_mutant_name() {
  for (const auto& m : mutant_catalog())
    if (mutant_on(m.id)) return m.name;
  return {};
}

// Runs a generated scenario against the oracle; a failing case is kept for the trace.
void assert_scenario_passes(const nlohmann::json& doc) {
  Scenario sc = parse_scenario(doc, "<generated>");
  RunOptions options = sc.options;
  options.mutant = active_mutant_name();
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
  options.mutant = active_mutant_name();
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
    latest_failure() = {doc, nlohmann::json::object()};
    RC_FAIL("two runs of one scenario and seed gave different traces: " + compare_events(first.events, second.events).message);
  }
}

}  // namespace

const std::vector<Property>& property_catalog() {
  static const std::vector<Property> catalog = {
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

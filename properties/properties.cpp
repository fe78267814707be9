#include "properties/properties.h"

#include <rapidcheck.h>

#include "core/cotangent.h"
#include "core/mutants.h"
#include "core/redistribute.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "properties/generators.h"

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

}  // namespace

const std::vector<Property>& property_catalog() {
  static const std::vector<Property> catalog = {
      {"cotangent_involution", "the cotangent map is an involution on S(d), R, P(sum) and Rd",
       cotangent_involution},
      {"redistribute_roundtrip",
       "p -> q -> p keeps values and passes gradient equivalence on 1-3 axis meshes, uneven shapes",
       redistribute_roundtrip},
  };
  return catalog;
}

}  // namespace meshsim

// Runs one property with RapidCheck under a seed and a case count, reporting progress as it goes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/layout.h"
#include "core/mesh.h"
#include "properties/properties.h"

namespace meshsim {

struct Progress {
  int cases = 0;     // test cases finished (passed or failed)
  int discards = 0;  // cases discarded by a precondition
  int shrinks = 0;   // shrinks tried
};

// What a run of a property tried, for `meshsim check`'s report: its discards by reason, and the
// meshes and input shapes of its cases (those that ran to a verdict; discarded cases and shrink
// runs are not counted). Every count is a function of the seed and the case count.
struct CaseStats {
  std::map<std::string, int64_t> discards;  // reason -> cases discarded for it
  std::map<std::string, int64_t> meshes;    // mesh shape ("2x3") -> cases that ran on it
  std::map<int64_t, int64_t> ranks;         // input tensor rank -> cases with an input of that rank
  int64_t extent_min = -1, extent_max = -1;  // over every dimension of every input (-1: none seen)
  int64_t uneven = 0;     // cases with an input whose sharded dim does not divide evenly over its ranks
  int64_t described = 0;  // cases that noted their layouts (note_case_scenario, note_case_layout)
  // The planner's implicit redistributions that communicate, by what they do ("matmul operand 1
  // [S(1)] -> [R]: forward all_gather over tp"), counted in cases (note_case_implicit).
  std::map<std::string, int64_t> implicit;
  int64_t implicit_cases = 0;  // cases that needed at least one
  void merge(const CaseStats& other);
};
nlohmann::json to_json(const CaseStats& stats);
CaseStats case_stats_from_json(const nlohmann::json& j);

// The layouts of the current test case, noted by the properties' common points: every scenario a
// case runs (run_generated and run_events in properties.cpp, the scenario property) and the layouts
// of properties without a scenario document. A case that runs several scenarios counts once per
// distinct mesh. Nothing is noted outside run_property.
void note_case_scenario(const nlohmann::json& scenario);
void note_case_layout(const Mesh& mesh, const std::vector<std::pair<Shape, Spec>>& inputs);
// The implicit redistributions a case's run needed (a result's "implicit" array; those without
// collectives are not counted): `meshsim check --scenario` reports them per variant.
void note_case_implicit(const nlohmann::json& implicit);

// Discards the current case for `reason` (a short phrase the report counts: the same reason for
// every case discarded for the same cause) unless `holds`. RC_PRE and RC_DISCARD work too:
// their reason is read from RapidCheck's description (discard_reason_of).
void discard_unless(bool holds, const std::string& reason);
[[noreturn]] void discard_case(const std::string& reason);

// Memory ran out in the current case (a run's error of kind out_of_memory): the machine's limit,
// not a property's verdict. The property stops: this case and the rest are discarded, and its
// outcome is OutOfMemory with `message` (meshsim check exits 6). An out-of-memory exception a
// property's body lets through is taken the same way.
[[noreturn]] void out_of_memory_in_case(const std::string& message);

// The reason of a discarded case from RapidCheck's description of it: RC_DISCARD's message,
// "precondition COND" for RC_PRE(COND), "generation failed: ..." for a generator that gave up;
// the description itself for discard_case.
std::string discard_reason_of(const std::string& description);

struct PropertyOutcome {
  enum class Status { Passed, Failed, GaveUp, OutOfMemory } status = Status::Passed;
  Progress progress;
  CaseStats stats;
  std::string description;  // why it failed, gave up or ran out of memory
  std::vector<std::pair<std::string, std::string>> counterexample;  // (type, value), shrunk
  Failure failure;          // the scenario of the shrunk counterexample, when it has one
};

// The seed RapidCheck gets for a property: the run's seed mixed with the property's name, so
// every property draws its own stream and `--property` alone reproduces the same cases.
uint64_t property_seed(uint64_t seed, const std::string& name);

// Rule coverage: per key (core/coverage.h), the number of test cases that exercised it (shrink
// runs are not counted).
using CoverageCounts = std::map<std::string, int64_t>;

// Runs `cases` cases of a property. `unit` > 0 draws another stream (the unit-th run of a property
// split into units, meshsim check): unit 0 is the property's own seed.
PropertyOutcome run_property(const Property& property, uint64_t seed, int cases,
                             const std::function<void(const Progress&)>& on_progress,
                             CoverageCounts* coverage = nullptr, int unit = 0);

}  // namespace meshsim

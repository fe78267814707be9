// Runs one property with RapidCheck under a seed and a case count, reporting progress as it goes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "properties/properties.h"

namespace meshsim {

struct Progress {
  int cases = 0;     // test cases finished (passed or failed)
  int discards = 0;  // cases discarded by a precondition
  int shrinks = 0;   // shrinks tried
};

struct PropertyOutcome {
  enum class Status { Passed, Failed, GaveUp } status = Status::Passed;
  Progress progress;
  std::string description;  // why it failed or gave up
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

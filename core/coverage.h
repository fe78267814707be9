// Rule coverage: which rule rows, backward rules and redistribution transitions the runs of a
// scope exercised, for `meshsim check --coverage`. The rules report a hit through cover() only
// while a sink is installed (a CoverageScope), so a run without one pays a pointer test.
//
// A key names one rule in one place: "forward mm: S(1), S(0) -> P(sum)" (a row of the op's table,
// shard dims written as the table writes them: S(d) for every dim alike, S(dim) for the reduced
// dim), "backward exp d0: mul S(d), S(d) -> S(d)" (the row of the table the backward step of
// operand 0 read, with the incoming gradient in one slot: rules/common.h says which),
// "redistribute: all_gather S -> Rd" (a planner step, by placement kind; "(gradient)" when a
// gradient was planned).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "core/scoped.h"

namespace meshsim {

using CoverageSink = std::set<std::string>;

// The sink of the current thread; null when nothing is covered.
CoverageSink*& coverage_sink();

inline void cover(const std::string& key) {
  if (CoverageSink* s = coverage_sink()) s->insert(key);
}

class CoverageScope : ScopedOverride<CoverageSink*> {
 public:
  explicit CoverageScope(CoverageSink* sink);
};

// Every key there is, derived from the tables themselves (so a new row is a new key), each with
// the reason it cannot be reached by any program ("" when it can), derived from the rules too where
// it can be: in a stated order, forward rows by family, backward rules, redistribution transitions,
// local_map variance rules.
struct CoverageRow {
  std::string key;
  std::string unreachable;
};
std::vector<CoverageRow> coverage_universe();

// The parts, from the files that own the rules.
std::vector<CoverageRow> propagation_coverage();     // rules/coverage.cpp
std::vector<CoverageRow> redistribution_coverage();  // redistribute.cpp

}  // namespace meshsim

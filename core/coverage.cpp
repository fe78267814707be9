#include "core/coverage.h"

#include "core/propagation.h"

namespace meshsim {

CoverageSink*& coverage_sink() {
  thread_local CoverageSink* sink = nullptr;
  return sink;
}

CoverageScope::CoverageScope(CoverageSink* sink) : ScopedOverride(coverage_sink(), sink) {}


std::vector<CoverageRow> coverage_universe() {
  std::vector<CoverageRow> rows = propagation_coverage();
  for (auto& r : redistribution_coverage()) rows.push_back(std::move(r));
  // local_map (SEMANTICS.md section 5): every op of a body under the union / intersection rule,
  // the collectives and casts of the variance table, and the built-in Functions.
  // The ops a body names: those with a table but the losses' internal parts (pick_target,
  // count_targets), and the losses, which a body runs whole.
  for (const auto& f : rule_families())
    for (const auto& op : f.ops)
      if (op != "pick_target" && op != "count_targets") rows.push_back({"local_map: " + op, ""});
  // The losses, and the creation ops a body makes its own invariant values with.
  for (const char* op : {"arange", "cross_entropy", "full", "nll_loss", "ones", "zeros"})
    rows.push_back({std::string("local_map: ") + op, ""});
  for (const char* rule : {"all_gather_to_reduced", "all_gather_to_varying", "all_reduce_sum", "all_reduce_avg",
                           "all_reduce_max", "all_reduce_min", "all_to_all", "all_to_all_split", "call all_reduce_keep_local",
                           "call local_square", "call opaque_all_reduce", "mark_varying", "reduce_scatter",
                           "reduced_invariant_cast", "reduced_vary_cast"})
    rows.push_back({std::string("local_map: ") + rule, ""});
  return rows;
}

}  // namespace meshsim

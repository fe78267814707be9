#include "properties/runner.h"

#include <iostream>
#include <sstream>

#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>

namespace meshsim {

namespace {

class Listener : public rc::detail::TestListener {
 public:
  Listener(Progress& p, const std::function<void(const Progress&)>& cb, CoverageSink& sink, CoverageCounts* counts)
      : progress_(p), cb_(cb), sink_(sink), counts_(counts) {}
  void onTestCaseFinished(const rc::detail::CaseDescription& d) override {
    if (d.result.type == rc::detail::CaseResult::Type::Discard) {
      ++progress_.discards;
    } else {
      ++progress_.cases;
      if (counts_)
        for (const auto& key : sink_) ++(*counts_)[key];
    }
    sink_.clear();
    if (cb_) cb_(progress_);
  }
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {
    ++progress_.shrinks;
    sink_.clear();
    if (cb_) cb_(progress_);
  }
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}

 private:
  Progress& progress_;
  const std::function<void(const Progress&)>& cb_;
  CoverageSink& sink_;
  CoverageCounts* counts_;
};

}  // namespace

uint64_t property_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return seed ^ h;
}

namespace {

// RapidCheck prints its global configuration (a random seed meshsim never uses: every property
// gets its seed from the run) the first time it loads it; load it once with stderr silenced.
void load_rapidcheck_configuration_quietly() {
  static const bool loaded = [] {
    std::ostringstream sink;
    auto* previous = std::cerr.rdbuf(sink.rdbuf());
    rc::detail::configuration();
    std::cerr.rdbuf(previous);
    return true;
  }();
  (void)loaded;
}

}  // namespace

PropertyOutcome run_property(const Property& property, uint64_t seed, int cases,
                             const std::function<void(const Progress&)>& on_progress, CoverageCounts* coverage,
                             int unit) {
  load_rapidcheck_configuration_quietly();
  PropertyOutcome out;
  rc::detail::TestParams params;
  params.seed = property_seed(seed, property.name);
  // Unit k > 0: the seed mixed with k (splitmix64's finalizer), a stream of its own.
  if (unit > 0) {
    uint64_t z = params.seed + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(unit);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    params.seed = z ^ (z >> 31);
  }
  params.maxSuccess = cases;
  params.maxSize = 100;
  params.maxDiscardRatio = 10;
  rc::detail::TestMetadata metadata;
  metadata.id = property.name;
  metadata.description = property.checks;
  CoverageSink sink;
  ScopedOverride<CoverageSink*> covering(case_coverage(), coverage ? &sink : nullptr);
  Listener listener(out.progress, on_progress, sink, coverage);
  latest_failure() = {};
  const auto result = rc::detail::checkProperty(rc::detail::toProperty(property.body), metadata, params, listener);
  rc::detail::FailureResult failure;
  rc::detail::GaveUpResult gave_up;
  if (result.match(failure)) {
    out.status = PropertyOutcome::Status::Failed;
    out.description = failure.description;
    out.counterexample = failure.counterExample;
    out.failure = latest_failure();
  } else if (result.match(gave_up)) {
    out.status = PropertyOutcome::Status::GaveUp;
    out.description = gave_up.description;
  }
  return out;
}

}  // namespace meshsim

#include "properties/runner.h"

#include <algorithm>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>

#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>

#include "core/error.h"
#include "core/scoped.h"
#include "oracles/check.h"
#include "sim/runtime.h"

namespace meshsim {

// ---------------------------------------------------------------------------------------------
// What the cases tried: the current case's layouts, noted while it runs, merged into the run's
// CaseStats when it ends with a verdict.

void CaseStats::merge(const CaseStats& o) {
  for (const auto& [k, n] : o.discards) discards[k] += n;
  for (const auto& [k, n] : o.meshes) meshes[k] += n;
  for (const auto& [k, n] : o.ranks) ranks[k] += n;
  if (o.extent_min >= 0) extent_min = extent_min < 0 ? o.extent_min : std::min(extent_min, o.extent_min);
  extent_max = std::max(extent_max, o.extent_max);
  uneven += o.uneven;
  described += o.described;
  for (const auto& [k, n] : o.implicit) implicit[k] += n;
  implicit_cases += o.implicit_cases;
}

nlohmann::json to_json(const CaseStats& s) {
  nlohmann::json ranks = nlohmann::json::object();
  for (const auto& [r, n] : s.ranks) ranks[std::to_string(r)] = n;
  return {{"discards", s.discards}, {"meshes", s.meshes},         {"ranks", ranks},
          {"extent_min", s.extent_min}, {"extent_max", s.extent_max}, {"uneven", s.uneven},
          {"described", s.described}, {"implicit", s.implicit}, {"implicit_cases", s.implicit_cases}};
}

CaseStats case_stats_from_json(const nlohmann::json& j) {
  CaseStats s;
  s.discards = j.at("discards").get<std::map<std::string, int64_t>>();
  s.meshes = j.at("meshes").get<std::map<std::string, int64_t>>();
  for (const auto& [r, n] : j.at("ranks").items()) s.ranks[std::stoll(r)] = n.get<int64_t>();
  s.extent_min = j.at("extent_min").get<int64_t>();
  s.extent_max = j.at("extent_max").get<int64_t>();
  s.uneven = j.at("uneven").get<int64_t>();
  s.described = j.at("described").get<int64_t>();
  if (j.contains("implicit")) s.implicit = j.at("implicit").get<std::map<std::string, int64_t>>();
  s.implicit_cases = j.value("implicit_cases", int64_t{0});
  return s;
}

namespace {

// The layouts one case noted (a case may run several scenarios: each mesh and rank once).
struct CaseRecord {
  std::set<std::string> meshes;
  std::set<int64_t> ranks;
  int64_t extent_min = -1, extent_max = -1;
  bool uneven = false, described = false;
  std::set<std::string> implicit;

  void clear() { *this = CaseRecord{}; }
  void add_to(CaseStats& s) const {
    for (const auto& k : implicit) ++s.implicit[k];
    s.implicit_cases += implicit.empty() ? 0 : 1;
    if (!described) return;
    ++s.described;
    for (const auto& m : meshes) ++s.meshes[m];
    for (auto r : ranks) ++s.ranks[r];
    if (extent_min >= 0) s.extent_min = s.extent_min < 0 ? extent_min : std::min(s.extent_min, extent_min);
    s.extent_max = std::max(s.extent_max, extent_max);
    s.uneven += uneven ? 1 : 0;
  }
  void mesh(const std::vector<int64_t>& sizes) {
    described = true;
    std::string key;
    for (auto n : sizes) key += (key.empty() ? "" : "x") + std::to_string(n);
    meshes.insert(key.empty() ? "0-d" : key);
  }
  // An input: its rank, its extents, and whether a sharded dim divides unevenly over its ranks
  // (the product of the sizes of the mesh axes that shard it; `spec` may be empty: unknown).
  void input(const std::vector<int64_t>& mesh, const Shape& shape, const Spec& spec) {
    described = true;
    const auto rank = static_cast<int64_t>(shape.size());
    ranks.insert(rank);
    for (auto e : shape) {
      extent_min = extent_min < 0 ? e : std::min(extent_min, e);
      extent_max = std::max(extent_max, e);
    }
    if (spec.size() != mesh.size()) return;
    for (int64_t d = 0; d < rank; ++d) {
      int64_t parts = 1;
      for (size_t a = 0; a < spec.size(); ++a)
        if (spec[a].is_shard() && (spec[a].dim == d || spec[a].dim + rank == d)) parts *= mesh[a];
      if (parts > 1 && shape[static_cast<size_t>(d)] % parts != 0) uneven = true;
    }
  }
};

CaseRecord*& current_case() {
  static thread_local CaseRecord* record = nullptr;
  return record;
}

class Listener : public rc::detail::TestListener {
 public:
  Listener(Progress& p, CaseStats& stats, CaseRecord& record, const std::function<void(const Progress&)>& cb,
           CoverageSink& sink, CoverageCounts* counts)
      : progress_(p), stats_(stats), record_(record), cb_(cb), sink_(sink), counts_(counts) {}
  void onTestCaseFinished(const rc::detail::CaseDescription& d) override {
    if (d.result.type == rc::detail::CaseResult::Type::Discard) {
      ++progress_.discards;
      ++stats_.discards[discard_reason_of(d.result.description)];
    } else {
      ++progress_.cases;
      if (counts_)
        for (const auto& key : sink_) ++(*counts_)[key];
      record_.add_to(stats_);
    }
    sink_.clear();
    record_.clear();
    if (cb_) cb_(progress_);
  }
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {
    ++progress_.shrinks;
    sink_.clear();
    record_.clear();
    if (cb_) cb_(progress_);
  }
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}

 private:
  Progress& progress_;
  CaseStats& stats_;
  CaseRecord& record_;
  const std::function<void(const Progress&)>& cb_;
  CoverageSink& sink_;
  CoverageCounts* counts_;
};

}  // namespace

void note_case_scenario(const nlohmann::json& doc) {
  CaseRecord* record = current_case();
  if (!record || !doc.is_object()) return;
  std::vector<int64_t> mesh;
  try {
    mesh = doc.at("mesh").at("shape").get<std::vector<int64_t>>();
  } catch (const std::exception&) {
    return;  // not a scenario: nothing to note
  }
  record->mesh(mesh);
  for (const auto& in : doc.value("inputs", nlohmann::json::array())) {
    Shape shape;
    Spec spec;
    try {
      shape = in.at("shape").get<Shape>();
    } catch (const std::exception&) {
      continue;
    }
    // A from_local input's shape is each rank's local shape: the same on every rank.
    if (!in.value("from_local", false)) try {
        for (const auto& p : in.at("placements")) spec.push_back(parse_placement(p.get<std::string>()));
      } catch (const std::exception&) {
        spec.clear();
      }
    record->input(mesh, shape, spec);
  }
}

void note_case_layout(const Mesh& mesh, const std::vector<std::pair<Shape, Spec>>& inputs) {
  CaseRecord* record = current_case();
  if (!record) return;
  record->mesh(mesh.shape());
  for (const auto& [shape, spec] : inputs) record->input(mesh.shape(), shape, spec);
}

void note_case_implicit(const nlohmann::json& implicit) {
  CaseRecord* record = current_case();
  if (!record || !implicit.is_array()) return;
  auto spec_text = [](const nlohmann::json& placements) {
    std::string out;
    for (const auto& p : placements) out += (out.empty() ? "" : ", ") + (p.is_string() ? p.get<std::string>() : p.dump());
    return "[" + out + "]";
  };
  for (const auto& m : implicit) {
    if (!m.is_object() || !m.value("collectives", nlohmann::json::array()).is_array() ||
        m.value("collectives", nlohmann::json::array()).empty())
      continue;
    std::string cost;
    for (const auto& c : m["collectives"])
      if (c.value("phase", "") == "forward" || m.value("phase", "") == "backward")
        cost += (cost.empty() ? "" : ", ") + c.value("phase", std::string()) + " " + c.value("op", std::string()) +
                " over " + c.value("axis", std::string());
    std::string key = m.value("op", std::string("?"));
    key += m.value("phase", "") == "backward" ? " backward: incoming gradient"
                                              : " operand " + std::to_string(m.value("operand_index", -1));
    record->implicit.insert(key + " " + spec_text(m.value("from", nlohmann::json::array())) + " -> " +
                            spec_text(m.value("to", nlohmann::json::array())) + (cost.empty() ? "" : ": " + cost));
  }
}

[[noreturn]] void discard_case(const std::string& reason) {
  throw rc::detail::CaseResult(rc::detail::CaseResult::Type::Discard, reason);
}

namespace {

// The out-of-memory message of the property running in this thread ("" while memory lasts);
// null outside run_property.
std::string*& out_of_memory_message() {
  static thread_local std::string* message = nullptr;
  return message;
}

}  // namespace

[[noreturn]] void out_of_memory_in_case(const std::string& message) {
  if (std::string* m = out_of_memory_message(); m && m->empty()) *m = message.empty() ? "out of memory" : message;
  discard_case("out of memory");
}

void discard_unless(bool holds, const std::string& reason) {
  if (!holds) discard_case(reason);
}

std::string discard_reason_of(const std::string& description) {
  std::vector<std::string> lines;
  std::istringstream in(description);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  auto trimmed = [](std::string s) {
    const auto b = s.find_first_not_of(" \t\r");
    const auto e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  if (lines.empty()) return "no reason given";
  static const std::string generation = "Generation failed with message:";
  if (lines[0].rfind(generation, 0) == 0) {
    for (size_t i = 1; i < lines.size(); ++i)
      if (!trimmed(lines[i]).empty()) return "generation failed: " + trimmed(lines[i]);
    return "generation failed";
  }
  // RapidCheck's macros: "FILE:LINE:", the macro's text, a blank line, then the message (RC_DISCARD)
  // or "Expands to:" and the values (RC_PRE).
  size_t i = 0;
  const std::string& first = lines[0];
  static const std::regex source_line(".*:[0-9]+:\\s*");
  if (lines.size() > 1 && std::regex_match(first, source_line)) i = 1;
  const std::string macro = trimmed(lines[i]);
  auto inside = [&](const std::string& name) {
    std::string s = macro.substr(name.size() + 1);
    if (!s.empty() && s.back() == ')') s.pop_back();
    return trimmed(s);
  };
  if (i == 1 && macro.rfind("RC_PRE(", 0) == 0) return "precondition " + inside("RC_PRE");
  if (i == 1 && macro.rfind("RC_DISCARD(", 0) == 0) {
    std::string message;
    for (size_t k = i + 1; k < lines.size(); ++k)
      if (!trimmed(lines[k]).empty()) message += (message.empty() ? "" : " ") + trimmed(lines[k]);
    return message.empty() ? inside("RC_DISCARD") : message;
  }
  std::string all;
  for (const auto& l : lines)
    if (!trimmed(l).empty()) all += (all.empty() ? "" : " ") + trimmed(l);
  return all.empty() ? "no reason given" : all;
}

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
  CaseRecord record;
  ScopedOverride<CaseRecord*> noting(current_case(), &record);
  Listener listener(out.progress, out.stats, record, on_progress, sink, coverage);
  latest_failure() = {};
  // The search does not localize its failing cases (shrinking runs thousands); the counterexample's
  // own run, written after it, does.
  ScopedOverride<bool> no_localization(localization_enabled(), false);
  // Nor does it write traces: no local is hashed but where a property compares runs by their
  // hashes (run_events); the counterexample's own run, written after it, hashes its locals.
  ScopedOverride<bool> no_hashes(local_hashes_enabled(), false);
  // Nor what only a person reads of a result (the implicit moves' alternatives, the communication
  // table): about 4% of a run.
  ScopedOverride<bool> no_detail(result_detail_enabled(), false);
  std::string out_of_memory;
  ScopedOverride<std::string*> oom(out_of_memory_message(), &out_of_memory);
  // Once memory ran out, every case left is discarded at once (RapidCheck then gives up).
  const std::function<void()> body = [&property, &out_of_memory] {
    if (!out_of_memory.empty()) discard_case("out of memory");
    try {
      property.body();
    } catch (const std::exception& e) {
      if (!is_out_of_memory(e)) throw;
      out_of_memory_in_case("out of memory: " + first_line(e.what()));
    }
  };
  const auto result = rc::detail::checkProperty(rc::detail::toProperty(body), metadata, params, listener);
  if (!out_of_memory.empty()) {
    out.status = PropertyOutcome::Status::OutOfMemory;
    out.description = out_of_memory;
    return out;
  }
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

#include "cli/check.h"

#include <unistd.h>

#include <filesystem>
#include <iomanip>
#include <iostream>
#include <random>
#include <set>

#include "cli/trace_of.h"
#include "core/coverage.h"
#include "core/error.h"
#include "core/mutants.h"
#include "properties/runner.h"

namespace meshsim::cli {

namespace {

void print_list(std::ostream& out) {
  out << "properties:\n";
  for (const auto& p : property_catalog()) out << "  " << p.name << "  " << p.checks << "\n";
  out << "mutants:\n";
  for (const auto& m : mutant_catalog()) out << "  " << m.name << "  " << m.bug << "\n";
}

std::vector<const Property*> select(const std::vector<std::string>& names) {
  std::vector<const Property*> out;
  for (const auto& p : property_catalog())
    if (names.empty() || std::find(names.begin(), names.end(), p.name) != names.end()) out.push_back(&p);
  for (const auto& n : names) {
    bool known = false;
    for (const auto& p : property_catalog()) known |= n == p.name;
    if (!known) throw InputError("--property", "", "unknown property \"" + n + "\" (meshsim check --list)");
  }
  return out;
}

// The scenario without the inputs no program op reads (a local_map's body sees only its args, so
// its args count) and that are not the backward value: shrinking drops ops, not their inputs.
nlohmann::json without_unused_inputs(const nlohmann::json& doc) {
  std::set<std::string> used;
  if (doc.contains("backward") && doc["backward"].is_string()) used.insert(doc["backward"].get<std::string>());
  for (const auto& op : doc.value("program", nlohmann::json::array()))
    for (const auto& a : op.value("args", nlohmann::json::array()))
      if (a.is_string()) used.insert(a.get<std::string>());
  nlohmann::json out = doc;
  out["inputs"] = nlohmann::json::array();
  for (const auto& in : doc.value("inputs", nlohmann::json::array()))
    if (used.count(in.value("name", ""))) out["inputs"].push_back(in);
  return out;
}

// What a counterexample shows: its status, error kind and failed checks.
nlohmann::json verdict(const nlohmann::json& result) {
  nlohmann::json failed = nlohmann::json::array();
  if (result.contains("checks") && result["checks"].is_object())
    for (const auto& [check, ok] : result["checks"].items())
      if (ok == false) failed.push_back(check);
  const bool error = result.contains("error") && result["error"].is_object();
  return {result.value("status", ""), error ? result["error"].value("kind", "") : "", failed};
}

// Writes the shrunk counterexample as a trace and returns its path ("" when it has no scenario).
// Its unused inputs are dropped when the failure stays the same without them: an input's data
// come from its position (the seed's stream i), so dropping one changes the data of those after it.
std::string write_counterexample(const Failure& f, const std::string& dir, const std::string& name) {
  if (f.scenario.is_null()) return {};
  Scenario sc = parse_scenario(f.scenario, name);
  RunOptions options = sc.options;
  for (const auto& [key, value] : f.options.items()) set_option(options, key, value);
  CheckedRun run = check_scenario(sc, options);
  const nlohmann::json pruned = without_unused_inputs(f.scenario);
  if (pruned["inputs"].size() < f.scenario["inputs"].size()) {
    Scenario smaller = parse_scenario(pruned, name);
    CheckedRun smaller_run = check_scenario(smaller, options);
    if (verdict(smaller_run.result) == verdict(run.result)) {
      sc = std::move(smaller);
      run = std::move(smaller_run);
    }
  }
  std::filesystem::create_directories(dir);
  std::string path = (std::filesystem::path(dir) / (name + ".trace.json")).string();
  write_trace(trace_of(sc, options, run), path);
  return path;
}

// The rule-coverage report: every key of the universe with the number of cases that exercised it,
// grouped by section; returns the number of problems (a reachable rule never exercised, an
// unreachable one exercised, a key outside the universe).
int report_coverage(const CoverageCounts& counts, std::ostream& out) {
  int never = 0, wrong_reason = 0, unknown = 0;
  std::set<std::string> known;
  std::string section;
  out << "rule coverage (cases that exercised each rule):\n";
  for (const auto& row : coverage_universe()) {
    known.insert(row.key);
    const std::string head = row.key.substr(0, row.key.find_first_of(" :"));
    if (head != section) out << "  " << (section = head) << ":\n";
    auto it = counts.find(row.key);
    const int64_t hits = it == counts.end() ? 0 : it->second;
    out << "    " << std::setw(7) << hits << "  " << row.key;
    if (!row.unreachable.empty()) {
      out << "   [unreachable: " << row.unreachable << "]";
      if (hits > 0) {
        out << "  REACHED, the reason is wrong";
        ++wrong_reason;
      }
    } else if (hits == 0) {
      out << "  NEVER";
      ++never;
    }
    out << "\n";
  }
  for (const auto& [key, hits] : counts)
    if (!known.count(key)) {
      out << "    " << std::setw(7) << hits << "  " << key << "  OUTSIDE the universe (core/coverage.cpp)\n";
      ++unknown;
    }
  out << "coverage: " << known.size() << " rules, " << never << " reachable never exercised, " << wrong_reason
      << " listed unreachable but exercised, " << unknown << " outside the universe\n";
  return never + wrong_reason + unknown;
}

}  // namespace

int cmd_check(const CheckArgs& args, std::ostream& out) {
  if (args.list) {
    print_list(out);
    return 0;
  }
  Mutant mutant;
  try {
    mutant = parse_mutant(args.mutant);
  } catch (const std::invalid_argument& e) {
    throw InputError("--mutant", "", e.what());
  }
  const auto selected = select(args.properties);
  const uint64_t seed = args.seed_given ? args.seed : std::random_device{}() * 4294967296ULL + std::random_device{}();
  out << "SEED=" << seed << "  (meshsim check --seed " << seed << ")\n";
  if (mutant != Mutant::None) out << "planted bug: " << args.mutant << "\n";
  out.flush();

  const bool tty = isatty(STDERR_FILENO);
  ScopedOverride<std::string> planted(planted_mutant(), mutant == Mutant::None ? "" : args.mutant);
  int passed = 0, failed = 0;
  CoverageCounts coverage;
  for (const Property* p : selected) {
    auto show = [&](const Progress& pr) {
      if (tty) std::cerr << "\r  " << p->name << ": " << pr.cases << "/" << args.cases << " cases, "
                         << pr.discards << " discards, " << pr.shrinks << " shrinks   " << std::flush;
    };
    PropertyOutcome o = run_property(*p, seed, args.cases, show, args.coverage ? &coverage : nullptr);
    if (tty) std::cerr << "\r\033[K" << std::flush;
    const auto& pr = o.progress;
    if (o.status == PropertyOutcome::Status::Passed) {
      ++passed;
      out << "  ok    " << p->name << "  (" << pr.cases << " cases, " << pr.discards << " discards)\n";
      continue;
    }
    ++failed;
    out << (o.status == PropertyOutcome::Status::Failed ? "  FAIL  " : "  GAVE UP  ") << p->name
        << " after " << pr.cases << " cases (" << pr.shrinks << " shrinks tried): " << o.description << "\n";
    for (const auto& [type, value] : o.counterexample) out << "        " << type << ": " << value << "\n";
    // The property failed either way: a trace that cannot be written (an --out that is not a
    // directory, a full disk) is reported and the run goes on.
    std::string trace;
    try {
      trace = write_counterexample(o.failure, args.out_dir, p->name);
    } catch (const std::exception& e) {
      out << "        counterexample trace not written: " << e.what() << "\n";
    }
    if (!trace.empty()) out << "        counterexample trace: " << trace << "\n        reproduce: meshsim replay " << trace << "\n";
    out << "        rerun: meshsim check --property " << p->name << " --seed " << seed << " --cases " << args.cases
        << (args.mutant.empty() ? "" : " --mutant " + args.mutant) << "\n";
  }
  if (mutant != Mutant::None)
    out << (failed ? "planted bug " + args.mutant + " found\n" : "planted bug " + args.mutant + " SURVIVED\n");
  const int gaps = args.coverage ? report_coverage(coverage, out) : 0;
  out << passed << " passed, " << failed << " failed\n";
  return failed || gaps ? 1 : 0;
}

}  // namespace meshsim::cli

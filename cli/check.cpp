#include "cli/check.h"

#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <random>

#include "cli/trace_of.h"
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

// Writes the shrunk counterexample as a trace and returns its path ("" when it has no scenario).
std::string write_counterexample(const Failure& f, const std::string& dir, const std::string& name) {
  if (f.scenario.is_null()) return {};
  Scenario sc = parse_scenario(f.scenario, name);
  RunOptions options = sc.options;
  for (const auto& [key, value] : f.options.items()) set_option(options, key, value);
  CheckedRun run = check_scenario(sc, options);
  std::filesystem::create_directories(dir);
  std::string path = (std::filesystem::path(dir) / (name + ".trace.json")).string();
  write_trace(trace_of(sc, options, run), path);
  return path;
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
  for (const Property* p : selected) {
    auto show = [&](const Progress& pr) {
      if (tty) std::cerr << "\r  " << p->name << ": " << pr.cases << "/" << args.cases << " cases, "
                         << pr.discards << " discards, " << pr.shrinks << " shrinks   " << std::flush;
    };
    PropertyOutcome o = run_property(*p, seed, args.cases, show);
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
  out << passed << " passed, " << failed << " failed\n";
  return failed ? 1 : 0;
}

}  // namespace meshsim::cli

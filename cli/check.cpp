#include "cli/check.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <ATen/Parallel.h>

#include "api/trace_of.h"
#include "cli/check_tried.h"
#include "cli/commands.h"
#include "core/coverage.h"
#include "core/error.h"
#include "core/files.h"
#include "core/mutants.h"
#include "gpu_validate/validate.h"
#include "properties/runner.h"
#include "properties/scenario_property.h"

namespace meshsim::cli {

namespace {

void print_list(std::ostream& out) {
  out << "properties:\n";
  for (const auto& p : property_catalog()) out << "  " << p.name << "  " << p.checks << "\n";
  out << "mutants:\n";
  for (const auto& m : mutant_catalog()) out << "  " << m.name << "  " << m.bug << "\n";
}

// The properties of the run: the catalog's (or those named), or the user's scenarios as properties.
std::vector<Property> select(const CheckArgs& args) {
  if (!args.scenarios.empty()) {
    if (!args.properties.empty())
      throw UsageError("--property and --scenario: the scenarios are the properties; give one or the other");
    std::vector<Property> out;
    for (const auto& file : args.scenarios) out.push_back(scenario_property(file, resource_limits()));
    return out;
  }
  std::vector<Property> out;
  for (const auto& p : property_catalog())
    if (args.properties.empty() || std::count(args.properties.begin(), args.properties.end(), p.name)) out.push_back(p);
  for (const auto& n : args.properties) {
    bool known = false;
    for (const auto& p : property_catalog()) known |= n == p.name;
    if (!known) throw UsageError("--property: unknown property \"" + n + "\" (meshsim check --list)");
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

// A file name from a property's name.
std::string file_stem_of(const std::string& name) {
  if (name.rfind("scenario:", 0) == 0)  // "scenario:dir/fsdp.json" -> "scenario_fsdp"
    return "scenario_" + file_stem_of(std::filesystem::path(name.substr(9)).stem().string());
  std::string out;
  for (char c : name) out += std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ? c : '_';
  return out;
}

// The shrunk counterexample, written as a trace and as a scenario file (with the options it ran
// with, so `meshsim run` reproduces it), and its run. Its unused inputs are dropped when the failure
// stays the same without them: an input's data come from its position (the seed's stream i), so
// dropping one changes the data of those after it.
struct Counterexample {
  std::string trace_path, scenario_path;
  nlohmann::json scenario;  // as written
  nlohmann::json result;    // its run's
};

Counterexample write_counterexample(const nlohmann::json& scenario, const nlohmann::json& failure_options,
                                    const std::string& dir, const std::string& name) {
  Counterexample ce;
  if (scenario.is_null()) return ce;
  Scenario sc = parse_scenario(scenario, name);
  RunOptions options = sc.options;
  if (failure_options.is_object())
    for (const auto& [key, value] : failure_options.items()) set_option(options, key, value);
  CheckedRun run = check_scenario(sc, options);
  nlohmann::json doc = scenario;
  const nlohmann::json pruned = without_unused_inputs(scenario);
  if (pruned["inputs"].size() < scenario["inputs"].size()) {
    Scenario smaller = parse_scenario(pruned, name);
    CheckedRun smaller_run = check_scenario(smaller, options);
    if (verdict(smaller_run.result) == verdict(run.result)) {
      sc = std::move(smaller);
      run = std::move(smaller_run);
      doc = pruned;
    }
  }
  std::filesystem::create_directories(dir);
  const std::string file = file_stem_of(name);
  ce.trace_path = (std::filesystem::path(dir) / (file + ".trace.json")).string();
  write_trace(trace_of(sc, options, run), ce.trace_path);
  doc["options"] = options.to_json();
  ce.scenario = doc;
  ce.scenario_path = (std::filesystem::path(dir) / (file + ".scenario.json")).string();
  write_file_atomically(ce.scenario_path, doc.dump(2) + "\n");
  ce.result = run.result;
  return ce;
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

// ---------------------------------------------------------------------------------------------
// Units: (property, chunk), in property order then chunk order; the shard's are every N-th.

struct Unit {
  size_t property = 0;  // index into the selection
  int chunk = 0;
  int cases = 0;
};

std::vector<Unit> units_of(const std::vector<Property>& props, int cases) {
  std::vector<Unit> out;
  for (size_t p = 0; p < props.size(); ++p)
    for (int c = 0; c * kChunkCases < cases; ++c) out.push_back({p, c, std::min(kChunkCases, cases - c * kChunkCases)});
  return out;
}

struct Shard {
  int index = 1, count = 1;  // 1-based
};

Shard parse_shard(const std::string& text) {
  Shard s;
  if (text.empty()) return s;
  const std::regex form("([0-9]{1,6})/([0-9]{1,6})");
  std::smatch m;
  if (!std::regex_match(text, m, form))
    throw UsageError("--shard: expected I/N with 1 <= I <= N (for example 2/4), got \"" + text + "\"");
  s.index = std::stoi(m[1]);
  s.count = std::stoi(m[2]);
  if (s.count < 1 || s.index < 1 || s.index > s.count)
    throw UsageError("--shard: expected I/N with 1 <= I <= N (for example 2/4), got \"" + text + "\"");
  return s;
}

// What one unit found.
struct UnitResult {
  size_t unit = 0;  // position in the shard's unit list
  std::string status = "pass";  // pass | fail | gave_up | out_of_memory
  Progress progress;
  std::string description;
  std::vector<std::pair<std::string, std::string>> counterexample;
  nlohmann::json scenario, options;  // the shrunk failing case's, when it has a scenario
  CoverageCounts coverage;
  CaseStats stats;  // discards by reason, meshes and shapes tried
};

nlohmann::json to_json(const UnitResult& r) {
  nlohmann::json ce = nlohmann::json::array();
  for (const auto& [type, value] : r.counterexample) ce.push_back({type, value});
  return {{"unit", r.unit},         {"status", r.status},
          {"cases", r.progress.cases}, {"discards", r.progress.discards},
          {"shrinks", r.progress.shrinks}, {"description", r.description},
          {"counterexample", ce},   {"scenario", r.scenario},
          {"options", r.options},   {"coverage", r.coverage},
          {"stats", meshsim::to_json(r.stats)}};
}

UnitResult unit_result_from_json(const nlohmann::json& j) {
  UnitResult r;
  r.unit = j.at("unit").get<size_t>();
  r.status = j.at("status").get<std::string>();
  r.progress = {j.at("cases").get<int>(), j.at("discards").get<int>(), j.at("shrinks").get<int>()};
  r.description = j.at("description").get<std::string>();
  for (const auto& pair : j.at("counterexample")) r.counterexample.emplace_back(pair.at(0), pair.at(1));
  r.scenario = j.at("scenario");
  r.options = j.at("options");
  r.coverage = j.at("coverage").get<CoverageCounts>();
  r.stats = case_stats_from_json(j.at("stats"));
  return r;
}

UnitResult run_unit(const Property& p, const Unit& u, size_t position, uint64_t seed, bool coverage,
                    const std::function<void(const Progress&)>& show) {
  UnitResult r;
  r.unit = position;
  PropertyOutcome o = run_property(p, seed, u.cases, show, coverage ? &r.coverage : nullptr, u.chunk);
  r.progress = o.progress;
  r.stats = o.stats;
  if (o.status == PropertyOutcome::Status::Failed) r.status = "fail";
  if (o.status == PropertyOutcome::Status::GaveUp) r.status = "gave_up";
  if (o.status == PropertyOutcome::Status::OutOfMemory) r.status = "out_of_memory";
  r.description = o.description;
  r.counterexample = o.counterexample;
  r.scenario = o.failure.scenario;
  r.options = o.failure.options;
  return r;
}

// Runs the units at `positions` of `units` in this process, in order; a property's later units are
// skipped once one of its units failed (the report stops at its lowest failing unit).
std::vector<UnitResult> run_units(const std::vector<Property>& props, const std::vector<Unit>& units,
                                  const std::vector<size_t>& positions, const CheckArgs& args, uint64_t seed,
                                  bool tty, const std::function<void(const UnitResult&)>& finished) {
  std::vector<UnitResult> out;
  std::set<size_t> failed;
  size_t done = 0;
  for (size_t pos : positions) {
    const Unit& u = units.at(pos);
    ++done;
    if (failed.count(u.property)) continue;
    const Property& p = props[u.property];
    auto show = [&](const Progress& pr) {
      if (tty)
        std::cerr << "\r\033[K  [" << done << "/" << positions.size() << " units] " << p.name << " (unit " << u.chunk + 1
                  << "): " << pr.cases << "/" << u.cases << " cases, " << pr.discards << " discards, " << pr.shrinks
                  << " shrinks" << std::flush;
    };
    out.push_back(run_unit(p, u, pos, seed, args.coverage, show));
    if (out.back().status != "pass") failed.insert(u.property);
    if (finished) finished(out.back());
    if (out.back().status == "out_of_memory") break;  // the run stops: cmd_check exits 6
  }
  if (tty) std::cerr << "\r\033[K" << std::flush;
  return out;
}

// -j N: the units dealt round-robin to N processes of this executable, each printing one JSON line
// per unit; collected in unit order, so the report is the one a single process gives.
std::vector<UnitResult> run_in_workers(const std::vector<Unit>& units, const CheckArgs& args, uint64_t seed, bool tty) {
  const int jobs = std::min<int>(args.jobs, static_cast<int>(units.size()));
  // meshsim-check-HOST-PID-XXXXXX; those of killed runs are removed here (core/files.h).
  const std::filesystem::path dir = make_private_directory(std::filesystem::temp_directory_path().string(), "meshsim-check");
  struct Worker {
    pid_t pid = -1;
    std::string out, err;
    std::vector<size_t> positions;
    int status = 0;
    bool done = false;
  };
  std::vector<Worker> workers(static_cast<size_t>(jobs));
  for (size_t pos = 0; pos < units.size(); ++pos) workers[pos % jobs].positions.push_back(pos);
  const std::string self = self_executable();
  for (int w = 0; w < jobs; ++w) {
    Worker& wk = workers[w];
    wk.out = (dir / ("worker" + std::to_string(w) + ".jsonl")).string();
    wk.err = (dir / ("worker" + std::to_string(w) + ".log")).string();
    std::string list;
    for (size_t pos : wk.positions) list += (list.empty() ? "" : ",") + std::to_string(pos);
    std::vector<std::string> a{self, "check", "--seed", std::to_string(seed), "--cases", std::to_string(args.cases),
                               "--worker-units", list, "--max-input", std::to_string(max_input_bytes()),
                               "--max-ranks", std::to_string(resource_limits().max_ranks)};
    if (resource_limits().max_bytes > 0) {  // the limits of the run, whole bytes
      const double bytes = std::clamp(resource_limits().max_bytes, 1.0, 0x1p62);
      a.insert(a.end(), {"--max-memory", std::to_string(static_cast<uint64_t>(bytes))});
    }
    if (!args.mutant.empty()) a.insert(a.end(), {"--mutant", args.mutant});
    if (args.coverage) a.push_back("--coverage");
    if (!args.shard.empty()) a.insert(a.end(), {"--shard", args.shard});
    for (const auto& p : args.properties) a.insert(a.end(), {"--property", p});
    for (const auto& f : args.scenarios) a.insert(a.end(), {"--scenario", f});
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, wk.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, wk.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int rc = ::posix_spawn(&wk.pid, self.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("cannot start a worker: " + std::string(std::strerror(rc)));
  }
  auto lines_in = [](const std::string& path) {
    std::ifstream in(path);
    return static_cast<size_t>(std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n'));
  };
  for (size_t running = workers.size(); running > 0;) {
    for (auto& wk : workers)
      if (!wk.done && ::waitpid(wk.pid, &wk.status, WNOHANG) == wk.pid) {
        wk.done = true;
        --running;
      }
    if (tty) {
      size_t lines = 0;
      for (const auto& wk : workers) lines += lines_in(wk.out);
      std::cerr << "\r\033[K  " << lines << "/" << units.size() << " units done, " << running << " of " << jobs
                << " workers running" << std::flush;
    }
    if (running) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (tty) std::cerr << "\r\033[K" << std::flush;
  std::vector<UnitResult> out;
  std::string broken;
  for (auto& wk : workers) {
    std::ifstream in(wk.out);
    std::string line;
    std::set<size_t> reported;
    while (std::getline(in, line)) {
      try {
        out.push_back(unit_result_from_json(nlohmann::json::parse(line)));
        reported.insert(out.back().unit);
      } catch (const std::exception&) {
        break;  // a worker killed mid-line
      }
    }
    const bool exited = WIFEXITED(wk.status) && WEXITSTATUS(wk.status) <= 1;
    if (!exited) {
      std::string units_left;
      for (size_t pos : wk.positions)
        if (!reported.count(pos)) units_left += (units_left.empty() ? "" : ", ") + std::to_string(pos);
      std::ifstream log(wk.err);
      std::string last, l;
      while (std::getline(log, l))
        if (!l.empty()) last = l;
      broken += "a worker " +
                (WIFSIGNALED(wk.status) ? "was killed by signal " + std::to_string(WTERMSIG(wk.status))
                                        : "exited with " + std::to_string(WEXITSTATUS(wk.status))) +
                " before it reported units " + units_left + (last.empty() ? "" : " (" + last + ")") + "\n";
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!broken.empty()) throw WorkerError("check -j: " + broken);
  std::sort(out.begin(), out.end(), [](const UnitResult& a, const UnitResult& b) { return a.unit < b.unit; });
  return out;
}

// ---------------------------------------------------------------------------------------------
// The report of each property: its units up to the lowest failing one.

struct PropertyReport {
  const Property* property = nullptr;
  std::string status = "pass";
  Progress progress;
  int unit_count = 0;  // units of this property in the run (its shard's)
  nlohmann::json units = nlohmann::json::array();
  const UnitResult* failing = nullptr;
  int failing_chunk = -1;
  CoverageCounts coverage;
  CaseStats stats;
  Counterexample ce;
  std::string ce_error;  // why the counterexample could not be written
};

std::vector<PropertyReport> reports_of(const std::vector<Property>& props, const std::vector<Unit>& units,
                                       const std::vector<UnitResult>& results) {
  std::vector<PropertyReport> reports(props.size());
  for (size_t p = 0; p < props.size(); ++p) reports[p].property = &props[p];
  for (const auto& r : results) {
    const Unit& u = units.at(r.unit);
    PropertyReport& rep = reports[u.property];
    if (rep.failing) continue;  // after the lowest failing unit
    rep.progress.cases += r.progress.cases;
    rep.progress.discards += r.progress.discards;
    rep.progress.shrinks += r.progress.shrinks;
    for (const auto& [key, n] : r.coverage) rep.coverage[key] += n;
    rep.stats.merge(r.stats);
    rep.units.push_back({{"unit", u.chunk + 1}, {"cases", r.progress.cases}, {"status", r.status}});
    if (r.status != "pass") {
      rep.status = r.status;
      rep.failing = &r;
      rep.failing_chunk = u.chunk;
    }
  }
  for (const auto& u : units) ++reports[u.property].unit_count;
  return reports;
}

// RapidCheck's description without source paths ("properties.cpp:82:") or its macro text.
std::string in_meshsim_words(const std::string& description) {
  static const std::regex source_line("^\\S*\\.(cpp|cc|h|hpp):[0-9]+:?\\s*$");
  std::istringstream in(description);
  std::string line, out;
  while (std::getline(in, line)) {
    if (std::regex_match(line, source_line) || line.empty()) continue;
    if (line.rfind("RC_FAIL(", 0) == 0 || line.rfind("RC_ASSERT", 0) == 0 || line.rfind("RC_DISCARD(", 0) == 0)
      continue;  // the macro's source text
    if (line == "Expands to:") line = "values:";
    out += (out.empty() ? "" : "\n  ") + line;
  }
  return out;
}

// A scenario in one line per input and op: what a person reads first of a counterexample.
std::vector<std::string> program_lines(const nlohmann::json& doc) {
  std::vector<std::string> lines;
  if (!doc.is_object()) return lines;
  std::string mesh = "mesh";
  const auto& m = doc.value("mesh", nlohmann::json::object());
  for (size_t a = 0; a < m.value("axes", nlohmann::json::array()).size(); ++a)
    mesh += std::string(a ? " x " : " ") + m["axes"][a].get<std::string>() + "=" + m["shape"][a].dump();
  lines.push_back(mesh);
  for (const auto& in : doc.value("inputs", nlohmann::json::array()))
    lines.push_back("input " + in.value("name", "?") + " " + in.value("shape", nlohmann::json()).dump() + " " +
                    in.value("placements", nlohmann::json()).dump() + (in.value("requires_grad", false) ? " requires_grad" : ""));
  std::function<void(const nlohmann::json&, const std::string&)> ops = [&](const nlohmann::json& program, const std::string& indent) {
    for (const auto& op : program) {
      nlohmann::json attrs = op;
      for (const char* k : {"out", "outs", "op", "args", "body", "reference", "returns"}) attrs.erase(k);
      std::string args;
      for (const auto& a : op.value("args", nlohmann::json::array())) args += (args.empty() ? "" : ", ") + a.get<std::string>();
      const nlohmann::json named = op.contains("outs") ? op["outs"] : op.value("out", nlohmann::json("?"));
      const std::string out = named.is_string() ? named.get<std::string>() : named.dump();
      lines.push_back(indent + out + " = " + op.value("op", "?") + "(" + args + ")" + (attrs.empty() ? "" : " " + attrs.dump()));
      if (op.contains("body")) {
        ops(op["body"], indent + "  | ");
        lines.push_back(indent + "  | returns " + op.value("returns", nlohmann::json::array()).dump());
      }
    }
  };
  ops(doc.value("program", nlohmann::json::array()), "");
  if (doc.contains("backward")) lines.push_back("backward " + doc["backward"].get<std::string>());
  if (doc.contains("train")) lines.push_back("train " + doc["train"].dump());  // training steps
  return lines;
}

// The failed checks and failures of a result, with their numbers.
std::vector<std::string> failure_lines(const nlohmann::json& result) {
  std::vector<std::string> out;
  if (!result.is_object()) return out;
  std::string checks;
  if (result.contains("checks") && result["checks"].is_object())
    for (const auto& [check, ok] : result["checks"].items())
      if (ok == false) checks += (checks.empty() ? "" : ", ") + check;
  out.push_back("status " + result.value("status", "?") + (checks.empty() ? "" : ", failed checks: " + checks));
  // Where it first goes wrong (the counterexample's own run looks for it; the search does not).
  const nlohmann::json d = result.value("first_divergence", nlohmann::json());
  if (d.is_object() && d.contains("message"))
    out.push_back("first divergence (" + d.value("phase", std::string("?")) + "): " + d["message"].get<std::string>());
  if (result.contains("error") && result["error"].is_object())
    out.push_back("error " + result["error"].value("kind", "") + ": " + result["error"].value("message", ""));
  for (const auto& f : result.value("failures", nlohmann::json::array()))
    out.push_back(f.is_string() ? f.get<std::string>() : f.dump());
  return out;
}

std::string rerun_command(const CheckArgs& args, uint64_t seed, const std::string& name, bool scenario) {
  return "meshsim check " + std::string(scenario ? "--scenario " + name.substr(name.find(':') + 1) : "--property " + name) +
         " --seed " + std::to_string(seed) + " --cases " + std::to_string(args.cases) +
         (args.mutant.empty() ? "" : " --mutant " + args.mutant);
}

bool is_scenario_property(const std::string& name) { return name.rfind("scenario:", 0) == 0; }

std::string xml_escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // XML 1.0 has no other control characters than tab, newline and carriage return.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') out += ' ';
        else out += c;
    }
  }
  return out;
}

// The text of a failure, as the report prints it, the JUnit <failure> holds and JSON's "text" is.
std::vector<std::string> failure_text(const PropertyReport& rep, const CheckArgs& args, uint64_t seed) {
  std::vector<std::string> t;
  const UnitResult& f = *rep.failing;
  const std::string name = rep.property->name;
  t.push_back("checks: " + std::string(rep.property->checks));
  const std::string why = in_meshsim_words(f.description);
  if (!why.empty()) t.push_back("why: " + why);
  if (!rep.ce.scenario_path.empty()) {
    t.push_back("counterexample (shrunk):");
    for (const auto& l : program_lines(rep.ce.scenario)) t.push_back("  " + l);
    t.push_back("its run:");
    for (const auto& l : failure_lines(rep.ce.result)) t.push_back("  " + l);
    t.push_back("scenario: " + rep.ce.scenario_path + "  (meshsim run " + rep.ce.scenario_path + ")");
    t.push_back("counterexample trace: " + rep.ce.trace_path);
    t.push_back("reproduce: meshsim replay " + rep.ce.trace_path);
  } else if (!f.counterexample.empty()) {
    std::string drawn;
    for (const auto& [type, value] : f.counterexample)
      drawn += (drawn.empty() ? "" : "; ") + (value.size() > 300 ? value.substr(0, 300) + "..." : value);
    t.push_back("drawn: " + drawn);
  }
  if (!rep.ce_error.empty()) t.push_back("counterexample trace not written: " + rep.ce_error);
  t.push_back("rerun: " + rerun_command(args, seed, name, is_scenario_property(name)));
  return t;
}

std::string junit_of(const std::vector<PropertyReport>& reports, const CheckArgs& args, uint64_t seed,
                     const std::vector<double>& seconds) {
  int tests = 0, failures = 0;
  for (const auto& r : reports)
    if (r.unit_count) ++tests, failures += r.status != "pass";
  std::ostringstream x;
  x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<testsuites name=\"meshsim check\" tests=\"" << tests << "\" failures=\"" << failures << "\">\n"
    << "  <testsuite name=\"meshsim check\" tests=\"" << tests << "\" failures=\"" << failures
    << "\" errors=\"0\" skipped=\"0\">\n"
    << "    <properties>\n      <property name=\"seed\" value=\"" << seed << "\"/>\n      <property name=\"cases\" value=\""
    << args.cases << "\"/>\n";
  if (!args.shard.empty()) x << "      <property name=\"shard\" value=\"" << xml_escaped(args.shard) << "\"/>\n";
  if (!args.mutant.empty()) x << "      <property name=\"mutant\" value=\"" << xml_escaped(args.mutant) << "\"/>\n";
  x << "    </properties>\n";
  for (size_t i = 0; i < reports.size(); ++i) {
    const auto& r = reports[i];
    if (!r.unit_count) continue;
    x << "    <testcase classname=\"meshsim.check\" name=\"" << xml_escaped(r.property->name) << "\" time=\""
      << seconds[i] << "\">\n";
    // What its cases tried (the report's lines under the property), for CI's viewers.
    std::string tried = std::to_string(r.progress.cases) + " cases, " + std::to_string(r.progress.discards) + " discards\n";
    for (const auto& l : tried_lines(r.stats, r.progress.cases, r.progress.discards)) tried += l + "\n";
    if (r.status != "pass") {
      const auto text = failure_text(r, args, seed);
      std::string body;
      for (const auto& l : text) body += l + "\n";
      const std::string message = r.status == "gave_up" ? "gave up: " + in_meshsim_words(r.failing->description)
                                                        : "failed after " + std::to_string(r.progress.cases) + " cases";
      x << "      <failure type=\"" << r.status << "\" message=\"" << xml_escaped(message) << "\">" << xml_escaped(body)
        << "</failure>\n";
    }
    x << "      <system-out>" << xml_escaped(tried) << "</system-out>\n    </testcase>\n";
  }
  x << "  </testsuite>\n</testsuites>\n";
  return x.str();
}

}  // namespace

int cmd_check(const CheckArgs& args, std::ostream& out) {
  if (args.list) {
    print_list(out);
    return 0;
  }
  if (args.jobs < 1) throw UsageError("-j: expected a number of worker processes, at least 1");
  Mutant mutant;
  try {
    mutant = parse_mutant(args.mutant);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--mutant: ") + e.what());
  }
  const Shard shard = parse_shard(args.shard);
  const std::vector<Property> props = select(args);
  const std::vector<Unit> all = units_of(props, args.cases);
  std::vector<Unit> units;
  for (size_t u = 0; u < all.size(); ++u)
    if (static_cast<int>(u % shard.count) == shard.index - 1) units.push_back(all[u]);
  const uint64_t seed = args.seed_given ? args.seed : std::random_device{}() * 4294967296ULL + std::random_device{}();
  ScopedOverride<std::string> planted(planted_mutant(), mutant == Mutant::None ? "" : args.mutant);

  // A worker of -j: its units, one JSON line each, nothing else on stdout.
  if (!args.worker_units.empty()) {
    std::vector<size_t> positions;
    std::stringstream list(args.worker_units);
    for (std::string item; std::getline(list, item, ',');) positions.push_back(std::stoul(item));
    for (size_t pos : positions)
      if (pos >= units.size()) throw UsageError("--worker-units: no unit " + std::to_string(pos));
    at::set_num_threads(1);
    run_units(props, units, positions, args, seed, false,
              [&](const UnitResult& r) { out << to_json(r).dump() << std::endl; });
    return 0;
  }

  // --junit's directory must take the file before hours of cases run.
  if (!args.junit.empty()) {
    const auto parent = std::filesystem::absolute(args.junit).parent_path();
    std::error_code ec;
    if (!std::filesystem::is_directory(parent, ec))
      throw UsageError("--junit: " + parent.string() + " is not a directory");
    refuse_output_over_input("--junit", args.junit, args.scenarios);
  }
  if (!args.json) {
    out << "SEED=" << seed << "  (meshsim check --seed " << seed << ")";
    if (!args.shard.empty()) out << "  shard " << shard.index << "/" << shard.count << ": " << units.size() << " of " << all.size() << " units";
    out << "\n";
    if (mutant != Mutant::None) out << "planted bug: " << args.mutant << "\n";
    out.flush();
  }
  const bool tty = isatty(STDERR_FILENO);
  std::vector<double> seconds(props.size(), 0);
  std::vector<UnitResult> results;
  if (args.jobs > 1 && units.size() > 1) {
    results = run_in_workers(units, args, seed, tty);
  } else {
    std::vector<size_t> positions(units.size());
    std::iota(positions.begin(), positions.end(), size_t{0});
    auto last = std::chrono::steady_clock::now();
    results = run_units(props, units, positions, args, seed, tty, [&](const UnitResult& r) {
      const auto now = std::chrono::steady_clock::now();
      seconds[units[r.unit].property] += std::chrono::duration<double>(now - last).count();
      last = now;
    });
  }
  // Memory that ran out is the machine's limit, not a verdict: the run stops with exit 6.
  for (const auto& r : results)
    if (r.status == "out_of_memory")
      throw SemanticError(ErrorKind::OutOfMemory, std::string(props[units[r.unit].property].name) + ": " + r.description);
  std::vector<PropertyReport> reports = reports_of(props, units, results);

  int passed = 0, failed = 0;
  CoverageCounts coverage;
  nlohmann::json jprops = nlohmann::json::array();
  for (auto& rep : reports) {
    if (!rep.unit_count) continue;  // none of its units in this shard
    for (const auto& [key, n] : rep.coverage) coverage[key] += n;
    const std::string name = rep.property->name;
    nlohmann::json jp = {{"name", name},         {"checks", rep.property->checks}, {"status", rep.status},
                         {"cases", rep.progress.cases}, {"discards", rep.progress.discards},
                         {"shrinks", rep.progress.shrinks}, {"units", rep.units}};
    add_tried(jp, rep.stats);
    const auto tried = tried_lines(rep.stats, rep.progress.cases, rep.progress.discards);
    if (rep.status == "pass") {
      ++passed;
      if (!args.json) {
        out << "  ok    " << name << "  (" << rep.progress.cases << " cases, " << rep.progress.discards << " discards)\n";
        for (const auto& l : tried) out << "        " << l << "\n";
      }
      jprops.push_back(jp);
      continue;
    }
    ++failed;
    // The property failed either way: a counterexample that cannot be written (an --out that is
    // not a directory, a full disk) is reported and the run goes on.
    try {
      rep.ce = write_counterexample(rep.failing->scenario, rep.failing->options, args.out_dir, name);
    } catch (const std::exception& e) {
      rep.ce_error = e.what();
    }
    const auto text = failure_text(rep, args, seed);
    if (!args.json) {
      out << (rep.status == "fail" ? "  FAIL  " : "  GAVE UP  ") << name << " after " << rep.progress.cases << " cases ("
          << rep.progress.shrinks << " shrinks tried)\n";
      for (const auto& l : text) out << "        " << l << "\n";
      for (const auto& l : tried) out << "        " << l << "\n";
    }
    nlohmann::json jf = {{"unit", rep.failing_chunk + 1},
                         {"description", in_meshsim_words(rep.failing->description)},
                         {"text", text},
                         {"rerun", rerun_command(args, seed, name, is_scenario_property(name))}};
    if (!rep.ce.scenario_path.empty()) {
      jf["scenario_file"] = rep.ce.scenario_path;
      jf["trace_file"] = rep.ce.trace_path;
      jf["replay"] = "meshsim replay " + rep.ce.trace_path;
      jf["scenario"] = rep.ce.scenario;
      jf["result"] = rep.ce.result;
    }
    if (!rep.ce_error.empty()) jf["counterexample_error"] = rep.ce_error;
    jp["failure"] = jf;
    jprops.push_back(jp);
  }
  std::ostringstream json_sink;  // with --json, the coverage table is in the document, not printed
  const int gaps = args.coverage ? report_coverage(coverage, args.json ? json_sink : out) : 0;
  const int exit_code = failed || gaps ? 1 : 0;
  if (!args.junit.empty()) write_file_atomically(args.junit, junit_of(reports, args, seed, seconds));
  if (args.json) {
    nlohmann::json doc = {{"format", "meshsim.check/1"},
                          {"version", MESHSIM_VERSION},
                          {"seed", seed},
                          {"cases", args.cases},
                          {"unit_cases", kChunkCases},
                          {"shard", args.shard.empty() ? nlohmann::json(nullptr)
                                                        : nlohmann::json{{"index", shard.index}, {"count", shard.count}}},
                          {"units", units.size()},
                          {"mutant", args.mutant.empty() ? nlohmann::json(nullptr) : nlohmann::json(args.mutant)},
                          {"properties", jprops},
                          {"passed", passed},
                          {"failed", failed},
                          {"exit_code", exit_code}};
    if (mutant != Mutant::None) doc["planted_bug_found"] = failed > 0;
    if (args.coverage) {
      doc["coverage"] = coverage;
      doc["coverage_problems"] = gaps;
    }
    out << doc.dump(2) << "\n";
    return exit_code;
  }
  if (mutant != Mutant::None)
    out << (failed ? "planted bug " + args.mutant + " found\n" : "planted bug " + args.mutant + " SURVIVED\n");
  out << passed << " passed, " << failed << " failed\n";
  return exit_code;
}

}  // namespace meshsim::cli

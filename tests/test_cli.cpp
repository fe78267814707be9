// The meshsim command line (DESIGN.md, contract 1), run as a process in a fresh temporary
// directory: exit codes, the human and JSON output, traces and replay, rendering, messages for
// malformed input, and the property suite with and without planted bugs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/json_support.h"
#include "tests/process_support.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace meshsim::testing;

namespace {

const std::string kExample = std::string(MESHSIM_SOURCE_DIR) + "/examples/fsdp_reduced.json";

// Each test gets a fresh directory and runs meshsim in it.
class Cli : public ::testing::Test {
 protected:
  fs::path dir;

  void SetUp() override { dir = fresh_dir("meshsim_test_cli", ::testing::UnitTest::GetInstance()->current_test_info()->name()); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir);
  }

  // Runs `meshsim ARGS` (ARGS already quoted as needed) in `dir`, killed after `limit_s`.
  Outcome meshsim(const std::string& args, int limit_s = 60) const { return run_process(dir, MESHSIM_BIN, args, limit_s); }

  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name, std::ios::binary) << text;
    return dir / name;
  }
  fs::path write(const std::string& name, const json& doc) const { return write(name, doc.dump(2)); }
};

json example() { return json::parse(read_text(kExample)); }

// The names listed under a heading ("properties:", "mutants:") of `check --list`.
std::vector<std::string> listed(const std::string& text, const std::string& heading) {
  std::vector<std::string> names;
  std::istringstream in(text);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != ' ') {
      inside = line == heading;
      continue;
    }
    if (inside && line.size() > 2) {
      std::istringstream words(line);
      std::string name;
      words >> name;
      names.push_back(name);
    }
  }
  return names;
}

// "N passed, M failed" of a `check` run, as {N, M}; {-1, -1} when missing.
std::pair<int, int> tally(const std::string& text) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(R"((\d+) passed, (\d+) failed)"))) return {-1, -1};
  return {std::stoi(m[1]), std::stoi(m[2])};
}

// Every "reproduce: meshsim replay PATH" of an output.
std::vector<std::string> reproduce_paths(const std::string& text) {
  std::vector<std::string> out;
  const std::regex re(R"(reproduce: meshsim replay (\S+))");
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) out.push_back((*it)[1]);
  return out;
}

// The ops a counterexample's generator drew: a local_map counts its body ops, and the fixed
// scaffolding that turns a value into a loss (m, weighted, loss) does not count.
int drawn_ops(const json& trace) {
  int n = 0;
  for (const auto& op : trace["scenario"]["program"]) {
    const std::string out = op["out"].is_string() ? op["out"].get<std::string>() : "";
    if (op["op"] == "local_map") n += static_cast<int>(op["body"].size());
    else if (out != "m" && out != "weighted" && out != "loss") ++n;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// run

TEST_F(Cli, RunExamplePasses) {
  Outcome o = meshsim("run " + q(kExample));
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "fsdp_reduced_linear: pass")) << o;
  EXPECT_TRUE(contains(o.out, "forward all_gather over dp, 384 B per rank (wf)")) << o;
  EXPECT_TRUE(contains(o.out, "backward reduce_scatter over dp, 384 B per rank")) << o;
}

TEST_F(Cli, RunJsonPrintsTheResult) {
  Outcome o = meshsim("run " + q(kExample) + " --json");
  ASSERT_EQ(o.code, 0) << o;
  json r = json::parse(o.out);
  EXPECT_EQ(r["format"], "meshsim.result/1");
  EXPECT_EQ(r["name"], "fsdp_reduced_linear");
  EXPECT_EQ(r["status"], "pass");
  EXPECT_TRUE(r["error"].is_null());
  EXPECT_EQ(r["collectives"].size(), 2u);
  for (const auto& [name, ok] : r["checks"].items()) EXPECT_EQ(ok, true) << name;
}

TEST_F(Cli, RunOptionOverridesTheScenario) {
  Outcome o = meshsim("run " + q(kExample) + " --json --option seed=5 --option partial_from_replicate=rank0");
  ASSERT_EQ(o.code, 0) << o;
  json r = json::parse(o.out);
  EXPECT_EQ(r["options"]["seed"], 5);
  EXPECT_EQ(r["options"]["partial_from_replicate"], "rank0");
  Outcome bad = meshsim("run " + q(kExample) + " --option colour=red");
  EXPECT_EQ(bad.code, 2) << bad;
  EXPECT_TRUE(contains(bad.err, "--option")) << bad;
  EXPECT_TRUE(contains(bad.err, "colour")) << bad;
}

// A scenario with one local_map over x [4, 3] S(0) on dp=2 whose body makes "z" (returned as
// S(0)); `reference` is added when not null; loss = sum(y).
json local_map_scenario(const json& body, const json& reference) {
  json lm = {{"out", "y"}, {"op", "local_map"}, {"args", {"x"}}, {"out_placements", {{"S(0)"}}},
             {"body", body}, {"returns", {"z"}}};
  if (!reference.is_null()) lm["reference"] = reference;
  return {{"format", "meshsim.scenario/1"},
          {"name", "lm"},
          {"mesh", {{"axes", {"dp"}}, {"shape", {2}}}},
          {"inputs", {{{"name", "x"}, {"shape", {4, 3}}, {"placements", {"S(0)"}}, {"requires_grad", true}}}},
          {"program", {lm, {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}}},
          {"backward", "loss"}};
}

// Without a reference, the comparisons after the local_map do not run: the summary says
// "unchecked", never "pass" or "ok", for them (exit 0: nothing failed).
TEST_F(Cli, RunWithoutReferenceSaysUnchecked) {
  write("noref.json", local_map_scenario(json::array({{{"out", "z"}, {"op", "scale"}, {"args", {"x"}}, {"value", 2}}}), nullptr));
  Outcome o = meshsim("run noref.json");
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "lm: unchecked")) << o;
  EXPECT_TRUE(contains(o.out, "gradient_equivalence=unchecked")) << o;
  EXPECT_TRUE(contains(o.out, "forward_equivalence=unchecked")) << o;
  EXPECT_TRUE(contains(o.out, "unchecked (no oracle value: a local_map without reference): y loss grad x")) << o;
  Outcome j = meshsim("run noref.json --json");
  json r = json::parse(j.out);
  EXPECT_EQ(r["status"], "unchecked");
  EXPECT_TRUE(r["checks"]["gradient_equivalence"].is_null()) << j;
}

// The values the runtime names for an operand are drawn as such, with what they stand for: a
// local_map argument moved to its in_placements ("y.in0") and a body input cast reduced ->
// invariant ("z.in1.invariant.dp").
TEST_F(Cli, RenderNamesEveryKindOfImplicitValue) {
  json doc = local_map_scenario(json::array({{{"out", "z"}, {"op", "mm"}, {"args", {"x", "w"}}}}),
                                json::array({{{"out", "z"}, {"op", "mm"}, {"args", {"x", "w"}}}}));
  doc["inputs"].push_back({{"name", "w"}, {"shape", {3, 2}}, {"placements", {"Rd"}}, {"requires_grad", true}});
  doc["program"][0]["args"] = {"x", "w"};
  doc["program"][0]["in_placements"] = {{"R"}, {"Rd"}};
  doc["program"][0]["out_placements"] = {{"R"}};
  write("implicit.json", doc);
  ASSERT_EQ(meshsim("render implicit.json -o implicit.dot").code, 0);
  const std::string dot = read_text(dir / "implicit.dot");
  EXPECT_TRUE(contains(dot, "x as operand 0 of y")) << dot;
  EXPECT_TRUE(contains(dot, "operand 1 of z, cast reduced -&gt; invariant over dp")) << dot;
  EXPECT_FALSE(contains(dot, "over invariant.dp")) << dot;
}

// A run that libtorch stops (a body mm whose local shapes do not fit) is a failed check whose
// result has no values, collectives or grads: the summary prints what there is (it used to abort
// on the missing keys).
TEST_F(Cli, RunThatRaisedPrintsItsSummary) {
  write("raises.json", local_map_scenario(json::array({{{"out", "z"}, {"op", "mm"}, {"args", {"x", "x"}}}}), nullptr));
  Outcome o = meshsim("run raises.json");
  EXPECT_EQ(o.code, 1) << o;
  EXPECT_TRUE(contains(o.out, "lm: fail")) << o;
  EXPECT_TRUE(contains(o.out, "runs=FAIL")) << o;
  EXPECT_TRUE(contains(o.out, "failure: the run raised: ")) << o;
}

// A reference that libtorch refuses is unusable input: exit 2 with the JSON path, no abort.
TEST_F(Cli, RunWithAReferenceLibtorchRefusesExits2) {
  write("badref.json", local_map_scenario(json::array({{{"out", "z"}, {"op", "scale"}, {"args", {"x"}}, {"value", 2}}}),
                                          json::array({{{"out", "z"}, {"op", "mm"}, {"args", {"x", "x"}}}})));
  for (const char* flags : {"", " --json"}) {
    Outcome o = meshsim(std::string("run badref.json") + flags);
    EXPECT_EQ(o.code, 2) << o;
    EXPECT_TRUE(contains(o.out, "invalid_scenario")) << o;
    EXPECT_TRUE(contains(o.out, "/program/0/reference/0: ")) << o;
  }
}

// The opaque all_reduce kernel called with no argument is unusable input (exit 2), not a crash.
TEST_F(Cli, CallWithoutArgumentsExits2) {
  json doc = local_map_scenario(
      json::array({{{"out", "z"}, {"op", "call"}, {"args", json::array()}, {"function", "opaque_all_reduce"}, {"axis", "dp"}}}),
      nullptr);
  doc["program"][0]["out_placements"] = {{"R"}};
  write("noargs.json", doc);
  Outcome o = meshsim("run noargs.json");
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(contains(o.out, "invalid_scenario: /program/0/body/0/args: opaque_all_reduce takes 1 argument, got 0")) << o;
}

// ---------------------------------------------------------------------------------------------
// traces and replay

TEST_F(Cli, TraceReplaysExactly) {
  Outcome run = meshsim("run " + q(kExample) + " --trace t.json");
  ASSERT_EQ(run.code, 0) << run;
  ASSERT_TRUE(fs::exists(dir / "t.json"));
  EXPECT_EQ(json::parse(read_text(dir / "t.json"))["format"], "meshsim.trace/1");
  Outcome replay = meshsim("replay t.json");
  EXPECT_EQ(replay.code, 0) << replay;
  EXPECT_TRUE(contains(replay.out, "reproduced")) << replay;
}

TEST_F(Cli, EditedHashMakesReplayDiverge) {
  ASSERT_EQ(meshsim("run " + q(kExample) + " --trace t.json").code, 0);
  json trace = json::parse(read_text(dir / "t.json"));
  int64_t edited = -1;
  for (auto& e : trace["events"])
    if (!e["hashes"].empty()) {
      std::string& h = e["hashes"][0].get_ref<std::string&>();
      h.back() = h.back() == '0' ? '1' : '0';
      edited = e["seq"].get<int64_t>();
      break;
    }
  ASSERT_GE(edited, 0);
  write("edited.json", trace);
  Outcome o = meshsim("replay edited.json");
  EXPECT_EQ(o.code, 1) << o;
  EXPECT_TRUE(contains(o.out, "replay diverged")) << o;
  EXPECT_TRUE(contains(o.out, "event " + std::to_string(edited))) << o;
  EXPECT_TRUE(contains(o.out, "hashes[0] differs")) << o;
}

TEST_F(Cli, ReplayOfAMalformedTraceIsUnusableInput) {
  write("broken.json", json{{"format", "meshsim.trace/1"}, {"events", 3}});
  Outcome o = meshsim("replay broken.json");
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(contains(o.err, "broken.json")) << o;
}

// ---------------------------------------------------------------------------------------------
// render

TEST_F(Cli, RenderWritesSvgPngAndDot) {
  for (const char* name : {"out.svg", "out.png", "out.dot"}) {
    Outcome o = meshsim("render " + q(kExample) + " -o " + name);
    EXPECT_EQ(o.code, 0) << o;
    EXPECT_TRUE(fs::exists(dir / name) && fs::file_size(dir / name) > 0) << name;
  }
  EXPECT_TRUE(contains(read_text(dir / "out.svg"), "<svg"));
  EXPECT_EQ(read_text(dir / "out.png").substr(0, 4), "\x89PNG");
  EXPECT_EQ(read_text(dir / "out.dot").rfind("digraph", 0), 0u);
}

TEST_F(Cli, RenderFromATraceAndFromRun) {
  ASSERT_EQ(meshsim("run " + q(kExample) + " --trace t.json --render run.dot").code, 0);
  Outcome o = meshsim("render t.json -o trace.dot");
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_EQ(read_text(dir / "trace.dot"), read_text(dir / "run.dot"));
  Outcome bad = meshsim("render " + q(kExample) + " -o out.gif");
  EXPECT_EQ(bad.code, 2) << bad;
  EXPECT_TRUE(contains(bad.err, "out.gif")) << bad;
}

// ---------------------------------------------------------------------------------------------
// unusable and illegal input

struct Malformed {
  std::string file, text;
  std::string json_path, message;
};

TEST_F(Cli, MalformedScenariosExit2NamingFileAndPath) {
  const std::vector<Malformed> cases = {
      {"not_json.json", "{ not json", "/", "invalid JSON at line 1"},
      {"no_mesh.json", without(example(), "/mesh").dump(), "/mesh", "missing required field \"mesh\""},
      {"unknown_op.json", with(example(), "/program/1/op", "frobnicate").dump(), "/program/1/op",
       "unknown op \"frobnicate\""},
      {"unknown_value.json", with(example(), "/program/1/args/1", "w2").dump(), "/program/1/args/1",
       "unknown value \"w2\""},
      {"bad_shard.json", with(example(), "/inputs/0/placements", {"S(2)"}).dump(), "/inputs/0/placements",
       "S(2)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    write(c.file, c.text);
    Outcome o = meshsim("run " + c.file);
    EXPECT_EQ(o.code, 2) << o;
    EXPECT_TRUE(contains(o.err, c.file + ": " + c.json_path + ": ")) << o;
    EXPECT_TRUE(contains(o.err, c.message)) << o;
  }
  Outcome missing = meshsim("run nowhere.json");
  EXPECT_EQ(missing.code, 2) << missing;
  EXPECT_TRUE(contains(missing.err, "nowhere.json")) << missing;
}

TEST_F(Cli, BadFlagsExit2) {
  for (const char* args : {"", "frobnicate", "run x.json --frobnicate", "check --cases 0",
                           "check --mutant no_such_mutant"}) {
    Outcome o = meshsim(args);
    EXPECT_EQ(o.code, 2) << "meshsim " << args << "\n" << o;
  }
}

TEST_F(Cli, HelpExits0) {
  for (const char* args : {"--help", "check --help"}) {
    Outcome o = meshsim(args);
    EXPECT_EQ(o.code, 0) << "meshsim " << args << "\n" << o;
    EXPECT_TRUE(contains(o.out, "Usage")) << o;
  }
}

TEST_F(Cli, IllegalRedistributeExits3) {
  write("illegal.json", with(example(), "/program/0/placements", {"P(sum)"}));
  Outcome o = meshsim("run illegal.json");
  EXPECT_EQ(o.code, 3) << o;
  EXPECT_TRUE(contains(o.out, "illegal_redistribute")) << o;
  Outcome j = meshsim("run illegal.json --json");
  EXPECT_EQ(j.code, 3) << j;
  json r = json::parse(j.out);
  EXPECT_EQ(r["status"], "error");
  EXPECT_EQ(r["error"]["kind"], "illegal_redistribute");
}

// ---------------------------------------------------------------------------------------------
// check

TEST_F(Cli, CheckListNamesPropertiesAndMutants) {
  Outcome o = meshsim("check --list");
  ASSERT_EQ(o.code, 0) << o;
  auto properties = listed(o.out, "properties:"), mutants = listed(o.out, "mutants:");
  EXPECT_FALSE(properties.empty()) << o;
  EXPECT_FALSE(mutants.empty()) << o;
  for (const auto& n : properties) EXPECT_TRUE(std::regex_match(n, std::regex("[a-z0-9_]+"))) << n;
  for (const auto& n : mutants) EXPECT_TRUE(std::regex_match(n, std::regex("[a-z0-9_]+"))) << n;
}

TEST_F(Cli, CheckPassesEveryProperty) {
  const auto properties = listed(meshsim("check --list").out, "properties:");
  Outcome o = meshsim("check --seed 1 --cases 30 --out ce");
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "SEED=1")) << o;
  EXPECT_EQ(tally(o.out), std::make_pair(static_cast<int>(properties.size()), 0)) << o;
  for (const auto& p : properties) EXPECT_TRUE(contains(o.out, "ok    " + p)) << p << "\n" << o;
}

TEST_F(Cli, CheckOneProperty) {
  const auto properties = listed(meshsim("check --list").out, "properties:");
  ASSERT_FALSE(properties.empty());
  Outcome o = meshsim("check --seed 2 --cases 10 --property " + properties.front());
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_EQ(tally(o.out), std::make_pair(1, 0)) << o;
}

// A run of 2500 cases exercises every reachable rule row, backward rule,
// redistribution transition and local_map variance rule, and none of those listed unreachable (a
// row added without generator support fails here). The report names every rule with its count.
TEST_F(Cli, CheckCoverageExercisesEveryReachableRule) {
  // 2500 cases: the rarest rows (bmm with a P(avg) operand, squeeze of a P(min) value, among 707
  // rules) need more than 1000 on some seeds.
  Outcome o = meshsim("check --seed 1 --cases 2500 --coverage --out ce", 600);
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, " 0 reachable never exercised, 0 listed unreachable but exercised, 0 outside the universe"))
      << o;
  EXPECT_FALSE(contains(o.out, "NEVER")) << o;
  for (const char* rule : {"forward mm: S(1), S(0) -> P(sum)", "backward softmax d0: mul S(d), S(d) -> S(d)",
                           "redistribute: reduce_scatter P(sum) -> S (gradient)", "local_map: reduced_vary_cast"})
    EXPECT_TRUE(contains(o.out, rule)) << rule << "\n" << o;
  std::printf("[   INFO   ] check --cases 2500 --coverage took %.1f s\n", o.seconds);
}

// The coverage gate can fail: a property that runs no op leaves the rows unexercised (exit 1),
// and names them.
TEST_F(Cli, CheckCoverageNamesWhatNoCaseExercised) {
  Outcome o = meshsim("check --seed 1 --cases 20 --coverage --property cotangent_involution --out ce");
  EXPECT_EQ(o.code, 1) << o;
  EXPECT_TRUE(contains(o.out, "forward mm: S(1), S(0) -> P(sum)  NEVER")) << o;
  EXPECT_TRUE(contains(o.out, "1 passed, 0 failed")) << o;
}

// A counterexample trace that cannot be written (--out names a path under a file) is reported,
// and the run still ends with the property's failure (exit 1): no abort.
TEST_F(Cli, CheckReportsACounterexampleItCannotWrite) {
  write("afile", std::string("not a directory"));
  Outcome o = meshsim("check --property dtensor_duality --mutant cotangent_psum_as_r --seed 1 --cases 50 --out afile/sub");
  EXPECT_EQ(o.code, 1) << o;
  EXPECT_TRUE(contains(o.out, "counterexample trace not written: ")) << o;
  EXPECT_TRUE(contains(o.out, "planted bug cotangent_psum_as_r found")) << o;
}

// Every planted bug is found by the default check, and its counterexample trace replays: the replay
// reproduces the recorded failure (exit 0).
TEST_F(Cli, CheckFindsEveryMutantAndItsTraceReplays) {
  const auto mutants = listed(meshsim("check --list").out, "mutants:");
  ASSERT_FALSE(mutants.empty());
  int traces = 0;
  for (const auto& m : mutants) {
    SCOPED_TRACE(m);
    Outcome o = meshsim("check --seed 1 --mutant " + m + " --out ce", 30);
    EXPECT_EQ(o.code, 1) << o;
    // The time is reported, not asserted (timings belong to benchmarks): docs/performance.md.
    std::printf("[   INFO   ] %s found in %.1f s\n", m.c_str(), o.seconds);
    EXPECT_TRUE(contains(o.out, "planted bug " + m + " found")) << o;
    EXPECT_GE(tally(o.out).second, 1) << o;
    // Every failing property wrote its counterexample; the smallest after shrinking has at most 3 ops.
    const std::vector<std::string> paths = reproduce_paths(o.out);
    ASSERT_FALSE(paths.empty()) << o;
    int smallest = 1000;
    for (const auto& t : paths) smallest = std::min(smallest, drawn_ops(json::parse(read_text(dir / t))));
    EXPECT_LE(smallest, 3) << o;
    const std::string trace = paths.front();
    ++traces;
    ASSERT_TRUE(fs::exists(dir / trace)) << trace;
    EXPECT_EQ(json::parse(read_text(dir / trace))["options"]["mutant"], m);
    if (m == "float32_random_reduction_order") {
      // This bug is nondeterminism itself: its replay diverges, and says where. One replay may
      // draw an order whose float32 sum happens to round like the recorded one (sums of three
      // terms have few distinct roundings), so up to 20 replays are run and one must diverge.
      Outcome replay;
      for (int attempt = 0; attempt < 20; ++attempt) {
        replay = meshsim("replay " + q(trace));
        if (replay.code != 0) break;
      }
      EXPECT_EQ(replay.code, 1) << replay;
      EXPECT_TRUE(contains(replay.out, "diverged")) << replay;
      continue;
    }
    Outcome replay = meshsim("replay " + q(trace));
    EXPECT_EQ(replay.code, 0) << replay;
    EXPECT_TRUE(contains(replay.out, "reproduced")) << replay;
  }
  std::printf("[   INFO   ] %zu mutants found, %d counterexample traces replayed\n", mutants.size(), traces);
}

}  // namespace

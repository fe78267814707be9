// `meshsim check` for CI, run as a process: shards whose union is the whole run, -j N with the
// results of -j 1, --json and --junit, counterexamples in meshsim's words, usage errors; and
// --scenario, the user's scenario as a property, finding a planted bug in it.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/process_fixture.h"

namespace {

using json = nlohmann::json;
using namespace meshsim::testing;
namespace fs = std::filesystem;

const std::string kSource = MESHSIM_SOURCE_DIR;
const std::string kFsdp = kSource + "/examples/fsdp_reduced.json";

class Check : public ProcessTest {
 protected:
  Check() : ProcessTest("meshsim_test_check", 300) {}
  json check_json(const std::string& args) {
    Outcome o = meshsim("check " + args + " --json");
    EXPECT_LE(o.code, 1) << o;
    return json::parse(o.out);
  }
};

// (property, unit) -> status, over every property of a meshsim.check/1 document.
std::map<std::pair<std::string, int>, std::string> unit_statuses(const json& doc) {
  std::map<std::pair<std::string, int>, std::string> out;
  for (const auto& p : doc["properties"])
    for (const auto& u : p["units"]) out[{p["name"], u["unit"].get<int>()}] = u["status"];
  return out;
}

// Each property's verdict in a run made of shards: failed where any shard failed it, at the lowest
// failing unit; passed where every shard that ran some of it passed.
std::map<std::string, std::pair<std::string, int>> verdicts(const std::vector<json>& docs) {
  std::map<std::string, std::pair<std::string, int>> out;
  for (const auto& doc : docs)
    for (const auto& p : doc["properties"]) {
      auto& v = out.emplace(p["name"].get<std::string>(), std::make_pair(std::string("pass"), 0)).first->second;
      if (p["status"] == "pass") continue;
      const int unit = p["failure"]["unit"].get<int>();
      if (v.first == "pass" || unit < v.second) v = {p["status"].get<std::string>(), unit};
    }
  return out;
}

const std::string kProperties =
    "--property pytorch_semantics_equivalence --property dtensor_forward_equivalence --property cotangent_involution";

TEST_F(Check, ShardsTogetherAreTheWholeRun) {
  for (const std::string mutant : {"", " --mutant mm_s1_s0_labelled_r"}) {
    SCOPED_TRACE(mutant);
    const std::string args = "--seed 1 --cases 100 " + kProperties + mutant + " --out ce";
    const json whole = check_json(args);
    std::vector<json> shards;
    std::map<std::pair<std::string, int>, std::string> union_of;
    size_t units = 0;
    for (int i = 1; i <= 3; ++i) {
      shards.push_back(check_json(args + " --shard " + std::to_string(i) + "/3"));
      units += shards.back()["units"].get<size_t>();
      for (const auto& [key, status] : unit_statuses(shards.back()))
        EXPECT_TRUE(union_of.emplace(key, status).second) << "unit run by two shards: " << key.first << " " << key.second;
    }
    // Every unit belongs to exactly one shard (3 properties of 4 units), and each unit the whole run
    // ran has the same outcome in its shard.
    EXPECT_EQ(units, 12u);
    for (const auto& [key, status] : unit_statuses(whole)) {
      ASSERT_TRUE(union_of.count(key)) << key.first << " unit " << key.second;
      EXPECT_EQ(union_of[key], status) << key.first << " unit " << key.second;
    }
    // The whole run's verdicts are the shards' together.
    std::map<std::string, std::pair<std::string, int>> whole_verdicts;
    for (const auto& p : whole["properties"])
      whole_verdicts[p["name"]] = p["status"] == "pass" ? std::make_pair(std::string("pass"), 0)
                                                        : std::make_pair(p["status"].get<std::string>(),
                                                                         p["failure"]["unit"].get<int>());
    EXPECT_EQ(verdicts(shards), whole_verdicts);
    if (!mutant.empty()) {
      EXPECT_EQ(whole["failed"].get<int>(), 2) << whole.dump();
    }
  }
}

TEST_F(Check, ParallelWorkersGiveTheSameRun) {
  for (const std::string mutant : {"", " --mutant mm_s1_s0_labelled_r"}) {
    SCOPED_TRACE(mutant);
    const std::string args = "--seed 4 --cases 60 " + kProperties + mutant + " --out ce";
    Outcome one = meshsim("check " + args + " --json");
    Outcome two = meshsim("check " + args + " --json -j 2");
    EXPECT_EQ(one.code, two.code) << one << two;
    EXPECT_EQ(json::parse(one.out), json::parse(two.out));
    // The human report too.
    EXPECT_EQ(meshsim("check " + args).out, meshsim("check " + args + " -j 3").out);
  }
}

TEST_F(Check, JsonAndJunitDescribeTheRun) {
  Outcome o = meshsim("check --seed 1 --cases 30 " + kProperties +
                      " --mutant mm_s1_s0_labelled_r --out ce --json --junit report.xml");
  EXPECT_EQ(o.code, 1) << o;
  const json doc = json::parse(o.out);
  EXPECT_EQ(doc["format"], "meshsim.check/1");
  EXPECT_EQ(doc["seed"], 1);
  EXPECT_EQ(doc["mutant"], "mm_s1_s0_labelled_r");
  EXPECT_EQ(doc["planted_bug_found"], true);
  EXPECT_EQ(doc["passed"].get<int>() + doc["failed"].get<int>(), 3);
  bool saw_failure = false;
  for (const auto& p : doc["properties"]) {
    for (const char* key : {"name", "checks", "status", "cases", "discards", "shrinks", "units"})
      EXPECT_TRUE(p.contains(key)) << key;
    if (p["status"] == "pass") continue;
    saw_failure = true;
    const json& f = p["failure"];
    EXPECT_TRUE(f["rerun"].get<std::string>().rfind("meshsim check --property ", 0) == 0) << f;
    ASSERT_TRUE(f.contains("scenario_file")) << f;
    EXPECT_TRUE(fs::exists(dir / f["scenario_file"].get<std::string>()));
    EXPECT_EQ(f["result"]["status"], "fail");
    // The scenario file reproduces the failure with the stock command.
    EXPECT_EQ(meshsim("run " + q(f["scenario_file"].get<std::string>())).code, 1);
  }
  EXPECT_TRUE(saw_failure);

  const std::string xml = read_text(dir / "report.xml");
  EXPECT_TRUE(contains(xml, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>")) << xml;
  EXPECT_TRUE(contains(xml, "<testsuite name=\"meshsim check\" tests=\"3\" failures=\"" +
                                std::to_string(doc["failed"].get<int>()) + "\"")) << xml;
  const std::regex testcase("<testcase classname=\"meshsim.check\" name=\"([a-z_]+)\"");
  std::set<std::string> cases;
  for (std::sregex_iterator it(xml.begin(), xml.end(), testcase), end; it != end; ++it) cases.insert((*it)[1]);
  EXPECT_EQ(cases, (std::set<std::string>{"cotangent_involution", "dtensor_forward_equivalence", "pytorch_semantics_equivalence"}));
  EXPECT_EQ(std::count(xml.begin(), xml.end(), '<') , std::count(xml.begin(), xml.end(), '>')) << xml;
  EXPECT_TRUE(contains(xml, "<failure type=\"fail\" message=\"failed after ")) << xml;
  EXPECT_FALSE(fs::exists(dir / "report.xml.tmp"));
}

TEST_F(Check, CounterexamplesAreInMeshsimsWords) {
  Outcome o = meshsim("check --seed 1 --cases 50 --property dtensor_duality --property cotangent_involution "
                      "--mutant cotangent_psum_as_r --out ce");
  EXPECT_EQ(o.code, 1) << o;
  for (const char* raw : {".cpp:", "Expands to", "RC_FAIL", "RC_ASSERT", "std::", "nlohmann"})
    EXPECT_FALSE(contains(o.out, raw)) << raw << "\n" << o;
  for (const char* part : {"counterexample (shrunk):", "  mesh ", "its run:", "status fail, failed checks: duality",
                           "scenario: ce/dtensor_duality.scenario.json", "reproduce: meshsim replay ce/dtensor_duality.trace.json",
                           "rerun: meshsim check --property dtensor_duality --seed 1 --cases 50 --mutant cotangent_psum_as_r"})
    EXPECT_TRUE(contains(o.out, part)) << part << "\n" << o;
  // A property without a scenario shows what was drawn, values only.
  Outcome table = meshsim("check --seed 1 --cases 50 --property cotangent_involution --mutant cotangent_psum_as_r --out ce");
  EXPECT_EQ(table.code, 1) << table;
  EXPECT_TRUE(contains(table.out, "drawn: ")) << table;
  EXPECT_FALSE(contains(table.out, ".cpp:")) << table;
}

TEST_F(Check, UsageErrorsExit2WithAPlainMessage) {
  for (const char* args : {"check --shard 0/3", "check --shard 4/3", "check --shard two", "check -j 0",
                           "check --property no_such_property", "check --mutant no_such_mutant",
                           "check --junit no/such/dir/r.xml", "check --scenario no_such_file.json",
                           "check --scenario " MESHSIM_SOURCE_DIR "/examples/fsdp_reduced.json --property dtensor_duality"}) {
    Outcome o = meshsim(args);
    EXPECT_EQ(o.code, 2) << args << "\n" << o;
    EXPECT_FALSE(o.err.empty()) << args;
    EXPECT_FALSE(contains(o.err, "internal error")) << args << "\n" << o;
  }
}

TEST_F(Check, AScenarioAsAPropertyPassesAndFindsAPlantedBug) {
  Outcome ok = meshsim("check --scenario " + q(kFsdp) + " --seed 1 --cases 50");
  EXPECT_EQ(ok.code, 0) << ok;
  EXPECT_TRUE(contains(ok.out, "ok    scenario:" + kFsdp + "  (50 cases")) << ok;

  // An uneven split of array chunks: found only because the property draws mesh sizes and shapes
  // the file does not have (it runs [8, 16] on 4 ranks).
  Outcome bug = meshsim("check --scenario " + q(kFsdp) + " --seed 1 --cases 100 --mutant uneven_array_split --out ce");
  EXPECT_EQ(bug.code, 1) << bug;
  EXPECT_TRUE(contains(bug.out, "planted bug uneven_array_split found")) << bug;
  const fs::path scenario = dir / "ce" / "scenario_fsdp_reduced.scenario.json";
  ASSERT_TRUE(fs::exists(scenario)) << bug;
  const json shrunk = json::parse(read_text(scenario));
  EXPECT_EQ(shrunk["options"]["mutant"], "uneven_array_split");
  Outcome replay = meshsim("run " + q(scenario.string()));
  EXPECT_EQ(replay.code, 1) << replay;

  // Placements redrawn: S(1) @ S(0) labelled R is found in a program that has no such product.
  Outcome mm = meshsim("check --scenario " + q(kFsdp) + " --seed 1 --cases 100 --mutant mm_s1_s0_labelled_r --out ce -j 2");
  EXPECT_EQ(mm.code, 1) << mm;
}

// The scenario as written is every run's first case: a scenario that fails as written fails the
// property at once, a refused one too.
TEST_F(Check, TheScenarioAsWrittenIsTheFirstCase) {
  for (const char* file : {"/examples/bugs/missing_pvary_dp_weight.json", "/examples/reduced_policy_strict.json"}) {
    Outcome o = meshsim("check --scenario " + q(kSource + file) + " --seed 7 --cases 25 --out ce");
    EXPECT_EQ(o.code, 1) << o;
    EXPECT_TRUE(contains(o.out, "after 1 cases")) << o;
    EXPECT_TRUE(contains(o.out, "why: the scenario as written: ")) << o;
  }
}

}  // namespace

// --emit writes the generators' programs as scenario files: every generator's, the same files for
// the same seed, a manifest naming each case's generator, and every file a scenario meshsim runs
// (each passes, or meets the local-code generator's verdict in its expect block).
TEST_F(Check, EmitWritesTheGeneratorsProgramsReproducibly) {
  const fs::path a = dir / "a", b = dir / "b";
  Outcome o = meshsim("check --emit " + a.string() + " --cases 25 --seed 3");
  ASSERT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "--seed 3")) << o;
  ASSERT_EQ(meshsim("check --emit " + b.string() + " --cases 25 --seed 3").code, 0);
  const json manifest = json::parse(std::ifstream(a / "emitted.json"));
  EXPECT_EQ(manifest["format"], "meshsim.emit/1");
  ASSERT_EQ(manifest["cases"].size(), 25u);
  std::set<std::string> generators;
  for (const auto& c : manifest["cases"]) {
    generators.insert(c["generator"].get<std::string>());
    const std::string file = c["file"];
    std::ifstream fa(a / file), fb(b / file);
    const std::string ta((std::istreambuf_iterator<char>(fa)), {}), tb((std::istreambuf_iterator<char>(fb)), {});
    EXPECT_FALSE(ta.empty()) << file;
    EXPECT_EQ(ta, tb) << file << ": seed 3 drew another program the second time";
  }
  EXPECT_EQ(generators, (std::set<std::string>{"dtensor", "dtensor_even", "single_op", "local_map", "local_code"}));
  Outcome other = meshsim("check --emit " + (dir / "c").string() + " --cases 25 --seed 4");
  ASSERT_EQ(other.code, 0) << other;
  std::ifstream f3(a / "0000-dtensor.json"), f4(dir / "c" / "0000-dtensor.json");
  EXPECT_NE(std::string((std::istreambuf_iterator<char>(f3)), {}), std::string((std::istreambuf_iterator<char>(f4)), {}));
  Outcome run = meshsim("run " + a.string());
  EXPECT_EQ(run.code, 0) << run;
  EXPECT_TRUE(contains(run.err + run.out, "25 scenarios: 25 passed")) << run;
  Outcome clash = meshsim("check --emit " + (dir / "d").string() + " --property dtensor_duality");
  EXPECT_EQ(clash.code, 2) << clash;
  // --generators keeps to the named ones, in turn; an unknown one is a usage error naming the known.
  Outcome only = meshsim("check --emit " + (dir / "e").string() + " --cases 4 --seed 3 --generators local_map,single_op");
  ASSERT_EQ(only.code, 0) << only;
  const json m = json::parse(std::ifstream(dir / "e" / "emitted.json"));
  EXPECT_EQ(m["generators"], json({"local_map", "single_op"}));
  EXPECT_EQ(m["cases"][2]["file"], "0002-local_map.json");
  EXPECT_EQ(m["cases"][3]["generator"], "single_op");
  Outcome unknown = meshsim("check --emit " + (dir / "f").string() + " --generators local_mapp");
  EXPECT_EQ(unknown.code, 2) << unknown;
  EXPECT_TRUE(contains(unknown.err, "no generator local_mapp (known: dtensor,")) << unknown;
  EXPECT_FALSE(fs::exists(dir / "f")) << "a usage error wrote nothing";
}

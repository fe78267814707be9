// What `meshsim check` reports beside the verdicts: the seed first (in the report, the JSON and the
// JUnit XML, under -j, --shard and --scenario too), the discards by reason, and the meshes and input
// shapes each property tried; the same counts from -j 2 as from -j 1. And the runner's collector
// (properties/runner.h) on a property of this file, whose cases are known.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>
#include <rapidcheck.h>

#include "properties/runner.h"
#include "tests/process_fixture.h"

namespace {

using json = nlohmann::json;
using namespace meshsim::testing;
namespace fs = std::filesystem;

const std::string kSource = MESHSIM_SOURCE_DIR;
const std::string kFsdp = kSource + "/examples/fsdp_reduced.json";

class CheckReport : public ProcessTest {
 protected:
  CheckReport() : ProcessTest("meshsim_test_check_report", 120) {}
  json check_json(const std::string& args) {
    Outcome o = meshsim("check " + args + " --json");
    EXPECT_EQ(o.code, 0) << o;
    return json::parse(o.out);
  }
};

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// The seed JUnit's testsuite records, or "" when none.
std::string junit_seed(const std::string& xml) {
  std::smatch m;
  static const std::regex seed(R"re(<testsuite [^>]*>\s*<properties>\s*<property name="seed" value="([0-9]+)"/>)re");
  return std::regex_search(xml, m, seed) ? m[1].str() : "";
}

const json& property(const json& doc, const std::string& name) {
  for (const auto& p : doc.at("properties"))
    if (p.at("name") == name) return p;
  throw std::runtime_error("no property " + name + " in " + doc.dump());
}

int64_t sum(const json& counts) {
  int64_t n = 0;
  for (const auto& [k, v] : counts.items()) n += v.get<int64_t>();
  return n;
}

TEST_F(CheckReport, SeedIsTheFirstLine) {
  const std::vector<std::string> runs = {
      "--seed 7 --cases 5 --property cotangent_involution",
      "--seed 7 --cases 60 --property cotangent_involution --property redistribute_roundtrip -j 2",
      "--seed 7 --cases 60 --property cotangent_involution --shard 2/3",
      "--seed 7 --cases 3 --scenario " + q(kFsdp),
  };
  for (const auto& args : runs) {
    SCOPED_TRACE(args);
    Outcome o = meshsim("check " + args);
    ASSERT_EQ(o.code, 0) << o;
    EXPECT_EQ(first_line(o.out).rfind("SEED=7  (meshsim check --seed 7)", 0), 0u) << o.out;
  }
  // Without --seed: a fresh seed, first, and the one the rerun command names.
  Outcome o = meshsim("check --cases 3 --property cotangent_involution");
  ASSERT_EQ(o.code, 0) << o;
  std::smatch m;
  const std::string line = first_line(o.out);
  ASSERT_TRUE(std::regex_match(line, m, std::regex(R"(SEED=([0-9]+)  \(meshsim check --seed ([0-9]+)\))"))) << o.out;
  EXPECT_EQ(m[1], m[2]);
}

TEST_F(CheckReport, JsonAndJunitCarryTheSeed) {
  const std::vector<std::string> runs = {
      "--seed 11 --cases 5 --property cotangent_involution",
      "--seed 11 --cases 60 --property cotangent_involution --property adjoint_identity -j 2 --shard 1/2",
      "--seed 11 --cases 3 --scenario " + q(kFsdp),
  };
  for (const auto& args : runs) {
    SCOPED_TRACE(args);
    const json doc = check_json(args + " --junit r.xml");
    EXPECT_EQ(doc.at("seed"), 11);
    EXPECT_EQ(junit_seed(read_text(dir / "r.xml")), "11") << read_text(dir / "r.xml");
  }
  // A fresh seed: JSON and JUnit record the same one, and it reruns the same cases.
  const json doc = check_json("--cases 30 --property redistribute_roundtrip --junit r.xml");
  const std::string seed = std::to_string(doc.at("seed").get<uint64_t>());
  EXPECT_EQ(junit_seed(read_text(dir / "r.xml")), seed);
  const json again = check_json("--cases 30 --property redistribute_roundtrip --seed " + seed);
  EXPECT_EQ(property(again, "redistribute_roundtrip"), property(doc, "redistribute_roundtrip"));
}

// redistribute_roundtrip discards the pairs p -> q -> p where a step is illegal (a shard or a
// partial made another partial): each counted under the rule that refuses it.
TEST_F(CheckReport, DiscardsCountedByReason) {
  const json doc = check_json("--seed 1 --cases 50 --property redistribute_roundtrip --property cotangent_involution");
  const json& p = property(doc, "redistribute_roundtrip");
  ASSERT_GT(p.at("discards").get<int>(), 0) << p;
  EXPECT_EQ(sum(p.at("discard_reasons")), p.at("discards").get<int64_t>()) << p;
  std::set<std::string> reasons;
  for (const auto& [reason, n] : p.at("discard_reasons").items()) {
    reasons.insert(reason);
    EXPECT_EQ(reason.rfind("illegal redistribution: ", 0), 0u) << reason;
    EXPECT_GT(n.get<int>(), 0);
  }
  EXPECT_TRUE(reasons.count("illegal redistribution: a shard cannot become a partial")) << p;
  // A property without discards has none listed.
  EXPECT_EQ(property(doc, "cotangent_involution").at("discard_reasons"), json::object());

  // The report prints them under the property's line, most first.
  Outcome o = meshsim("check --seed 1 --cases 50 --property redistribute_roundtrip");
  ASSERT_EQ(o.code, 0) << o;
  std::string expected = "        discarded " + std::to_string(p.at("discards").get<int>()) + ":";
  std::vector<std::pair<int, std::string>> by_count;
  for (const auto& [reason, n] : p.at("discard_reasons").items()) by_count.emplace_back(-n.get<int>(), reason);
  std::stable_sort(by_count.begin(), by_count.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < by_count.size(); ++i)
    expected += (i ? ", " : " ") + std::to_string(-by_count[i].first) + " " + by_count[i].second;
  EXPECT_TRUE(contains(o.out, "  ok    redistribute_roundtrip  (50 cases, ")) << o.out;
  EXPECT_TRUE(contains(o.out, expected + "\n")) << expected << "\n" << o.out;

  // JUnit's testcase carries the same lines in its system-out.
  ASSERT_EQ(meshsim("check --seed 1 --cases 50 --property redistribute_roundtrip --junit r.xml").code, 0);
  const std::string xml = read_text(dir / "r.xml");
  EXPECT_TRUE(contains(xml, "<system-out>50 cases, " + std::to_string(p.at("discards").get<int>()) + " discards\n" +
                                expected.substr(8) + "\nmeshes: "))
      << xml;

  // The same seed, the same counts.
  EXPECT_EQ(property(check_json("--seed 1 --cases 50 --property redistribute_roundtrip"), "redistribute_roundtrip"), p);
}

// The meshes and shapes: one entry per mesh shape, each case counted once (these properties run
// one scenario or layout a case), input ranks and extents as the generators draw them.
TEST_F(CheckReport, MeshesAndShapesListed) {
  const json doc = check_json("--seed 3 --cases 50 --property redistribute_roundtrip --property adjoint_identity "
                              "--property cotangent_involution");
  for (const std::string name : {"redistribute_roundtrip", "adjoint_identity"}) {
    SCOPED_TRACE(name);
    const json& p = property(doc, name);
    const int64_t cases = p.at("cases").get<int64_t>();
    EXPECT_EQ(sum(p.at("meshes")), cases) << p;
    EXPECT_EQ(p.at("shapes").at("cases"), cases);
    EXPECT_GT(p.at("meshes").size(), 3u) << p;
    for (const auto& [mesh, n] : p.at("meshes").items()) {
      // 1 to 3 axes of 1 to 4 or 8 ranks (gen::mesh)
      EXPECT_TRUE(std::regex_match(mesh, std::regex("[1-48](x[1-48]){0,2}"))) << mesh;
    }
    for (const auto& [rank, n] : p.at("shapes").at("ranks").items()) {
      EXPECT_GE(std::stoi(rank), 1);
      EXPECT_LE(std::stoi(rank), 3);
      EXPECT_LE(n.get<int64_t>(), cases);
    }
    EXPECT_GE(p.at("shapes").at("extent_min").get<int>(), 0);
    EXPECT_LE(p.at("shapes").at("extent_max").get<int>(), 7);
    EXPECT_GT(p.at("shapes").at("uneven_cases").get<int>(), 0) << p;
    EXPECT_LT(p.at("shapes").at("uneven_cases").get<int64_t>(), cases) << p;
  }
  // cotangent_involution draws placements only.
  EXPECT_EQ(property(doc, "cotangent_involution").at("meshes"), json::object());
  EXPECT_EQ(property(doc, "cotangent_involution").at("shapes").at("cases"), 0);

  Outcome o = meshsim("check --seed 3 --cases 50 --property redistribute_roundtrip --property cotangent_involution");
  ASSERT_EQ(o.code, 0) << o;
  const json& p = property(doc, "redistribute_roundtrip");
  const std::string meshes_line = "        meshes: " + std::to_string(p.at("meshes").size()) + " shapes, 1 to 3 axes, ";
  EXPECT_TRUE(contains(o.out, meshes_line)) << o.out;
  EXPECT_TRUE(std::regex_search(o.out, std::regex("        inputs of rank [1-3]( to [1-3])?, extents [0-7]( to [0-7])?, "
                                                  "uneven shards in " +
                                                  std::to_string(p.at("shapes").at("uneven_cases").get<int>()) +
                                                  " of 50 cases\n")))
      << o.out;
  EXPECT_TRUE(contains(o.out, "  ok    cotangent_involution  (50 cases, 0 discards)\n"
                              "        meshes and shapes: not noted (no scenario or layout in its cases)\n"))
      << o.out;
}

// The user's scenario as a property: its variants' meshes keep its axes (one for fsdp_reduced:
// dp), and a refused variant is counted by its error kind.
TEST_F(CheckReport, ScenarioPropertyListsItsMeshes) {
  const json doc = check_json("--seed 2 --cases 40 --scenario " + q(kFsdp));
  const json& p = doc.at("properties").at(0);
  EXPECT_EQ(sum(p.at("meshes")), p.at("cases").get<int64_t>()) << p;
  for (const auto& [mesh, n] : p.at("meshes").items()) EXPECT_TRUE(std::regex_match(mesh, std::regex("[1-8]"))) << mesh;
  EXPECT_EQ(p.at("shapes").at("ranks"), json({{"2", p.at("cases")}})) << p;  // x and w are matrices
  for (const auto& [reason, n] : p.at("discard_reasons").items())
    EXPECT_TRUE(reason == "the variant is not a valid scenario" || reason.rfind("the variant is refused: ", 0) == 0)
        << reason;
  EXPECT_EQ(sum(p.at("discard_reasons")), p.at("discards").get<int64_t>());
}

// Workers report their units' counts back: -j 2 and -j 1 give the same discards, meshes and shapes.
TEST_F(CheckReport, WorkersGiveTheSameCounts) {
  const std::string args = "--seed 5 --cases 50 --property adjoint_identity --property redistribute_roundtrip";
  const json one = check_json(args);
  const json two = check_json(args + " -j 2");
  for (const std::string name : {"adjoint_identity", "redistribute_roundtrip"}) {
    SCOPED_TRACE(name);
    const json &a = property(one, name), &b = property(two, name);
    EXPECT_GT(sum(a.at("discard_reasons")), 0) << a;
    for (const char* key : {"discards", "discard_reasons", "meshes", "shapes"}) EXPECT_EQ(a.at(key), b.at(key)) << key;
  }
  EXPECT_EQ(meshsim("check " + args).out, meshsim("check " + args + " -j 2").out);
}

// ---------------------------------------------------------------------------------------------
// The collector itself: a property of known draws.

TEST(CaseStats, DiscardReasonsFromRapidCheck) {
  auto description = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const rc::detail::CaseResult& r) {
      EXPECT_EQ(r.type, rc::detail::CaseResult::Type::Discard);
      return r.description;
    }
    ADD_FAILURE() << "no discard";
    return std::string();
  };
  const int x = 3;
  EXPECT_EQ(meshsim::discard_reason_of(description([&] { RC_PRE(x < 2); })), "precondition x < 2");
  EXPECT_EQ(meshsim::discard_reason_of(description([&] { RC_DISCARD("too big: " + std::to_string(x)); })), "too big: 3");
  EXPECT_EQ(meshsim::discard_reason_of(description([&] { meshsim::discard_case("scenario too large"); })),
            "scenario too large");
  EXPECT_EQ(meshsim::discard_reason_of(description([&] { meshsim::discard_unless(x < 2, "x of 2 or more"); })),
            "x of 2 or more");
  EXPECT_EQ(meshsim::discard_reason_of("Generation failed with message:\nGave up after 100 tries"),
            "generation failed: Gave up after 100 tries");
  meshsim::discard_unless(true, "never");  // holds: no discard
}

TEST(CaseStats, CountsWhatTheCasesNoted) {
  struct Drawn {
    int64_t n, extent;
  };
  std::vector<Drawn> ran;
  int multiples = 0, ones = 0;
  const meshsim::Property p{"stats_probe", "a probe", [&] {
                              const int64_t n = *rc::gen::inRange<int64_t>(1, 7);
                              const int64_t extent = *rc::gen::inRange<int64_t>(0, 9);
                              if (n == 1) {
                                ++ones;
                                RC_PRE(n > 1);
                              }
                              if (n % 3 == 0) ++multiples;
                              meshsim::discard_unless(n % 3 != 0, "a multiple of 3");
                              // Noted twice: a case counts each mesh once.
                              for (int twice = 0; twice < 2; ++twice)
                                meshsim::note_case_layout(
                                    meshsim::Mesh({"a", "b"}, {2, n}),
                                    {{{extent, 5}, {meshsim::Placement::replicate(), meshsim::Placement::shard(0)}}});
                              ran.push_back({n, extent});
                            }};
  const meshsim::PropertyOutcome o = meshsim::run_property(p, 9, 60, nullptr);
  ASSERT_EQ(o.status, meshsim::PropertyOutcome::Status::Passed) << o.description;
  ASSERT_EQ(o.progress.cases, 60);
  ASSERT_EQ(static_cast<int>(ran.size()), 60);
  std::map<std::string, int64_t> discards;
  if (multiples) discards["a multiple of 3"] = multiples;
  if (ones) discards["precondition n > 1"] = ones;
  EXPECT_EQ(o.stats.discards, discards);
  EXPECT_EQ(o.progress.discards, multiples + ones);
  std::map<std::string, int64_t> meshes;
  int64_t uneven = 0, lo = 5, hi = 5;
  for (const auto& d : ran) {
    ++meshes["2x" + std::to_string(d.n)];
    uneven += d.extent % d.n != 0;  // dim 0 sharded over b (n ranks)
    lo = std::min(lo, d.extent), hi = std::max(hi, d.extent);
  }
  EXPECT_EQ(o.stats.meshes, meshes);
  EXPECT_EQ(o.stats.ranks, (std::map<int64_t, int64_t>{{2, 60}}));
  EXPECT_EQ(o.stats.uneven, uneven);
  EXPECT_EQ(o.stats.extent_min, lo);
  EXPECT_EQ(o.stats.extent_max, hi);
  EXPECT_EQ(o.stats.described, 60);
  // Through JSON (the -j workers' report) and back.
  const meshsim::CaseStats back = meshsim::case_stats_from_json(meshsim::to_json(o.stats));
  EXPECT_EQ(meshsim::to_json(back), meshsim::to_json(o.stats));
  // Outside run_property nothing is noted (and nothing breaks).
  meshsim::note_case_scenario(json{{"mesh", {{"axes", {"a"}}, {"shape", {2}}}}, {"inputs", json::array()}});
}

}  // namespace

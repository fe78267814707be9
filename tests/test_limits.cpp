// Resource limits (issue #37, items 1 and 3): the memory estimate counts every value the program
// makes, created values (ones, zeros, full, arange) and what is computed from them included; and
// `meshsim check --scenario` holds the scenario and its variants to run's --max-memory and
// --max-ranks, and reports memory that runs out as exit 6.
#include <gtest/gtest.h>

#include <fstream>
#include <new>
#include <string>

#include <nlohmann/json.hpp>

#include "core/resources.h"
#include "core/scenario.h"
#include "properties/runner.h"
#include "tests/process_fixture.h"

namespace {

using json = nlohmann::json;
using namespace meshsim::testing;

// `ones` of `shape` laid out as `placements` on a mesh of `ranks`, and its square.
json created(int64_t ranks, const json& shape, const std::string& placement) {
  return {{"format", "meshsim.scenario/1"},
          {"name", "created"},
          {"mesh", {{"axes", {"dp"}}, {"shape", {ranks}}}},
          {"inputs", {{{"name", "x"}, {"shape", {2}}, {"placements", {"R"}}}}},
          {"program",
           {{{"out", "o"}, {"op", "ones"}, {"shape", shape}, {"placements", {placement}}},
            {{"out", "y"}, {"op", "mul"}, {"args", {"o", "o"}}}}}};
}

TEST(Estimate, CountsCreatedValuesOnEveryRankThatHoldsThem) {
  const double bytes = 8000.0 * 8000.0 * 8;  // ones [8000, 8000] in float64
  const meshsim::Scenario r = meshsim::parse_scenario(created(4, {8000, 8000}, "R"), "r.json");
  const meshsim::ResourceEstimate e = meshsim::estimate_resources(r, r.options);
  // The created value on each of the 4 ranks, and its square likewise (it was 32 KiB in all).
  EXPECT_GE(e.mesh_bytes, 2 * 4 * bytes) << meshsim::format_bytes(e.mesh_bytes);
  EXPECT_GE(e.oracle_bytes, 2 * bytes);
  EXPECT_EQ(e.largest, "o");
  EXPECT_EQ(e.largest_path, "/program/0");
  EXPECT_DOUBLE_EQ(e.largest_bytes, 4 * bytes);
  // Sharded, each rank holds a quarter: the whole once over the mesh. A bool value is a byte each.
  const meshsim::Scenario s = meshsim::parse_scenario(created(4, {8000, 8000}, "S(0)"), "s.json");
  EXPECT_DOUBLE_EQ(meshsim::estimate_resources(s, s.options).largest_bytes, bytes);
  json bools = created(4, {8000, 8000}, "R");
  bools["program"][0]["dtype"] = "bool";
  const meshsim::Scenario b = meshsim::parse_scenario(bools, "b.json");
  EXPECT_DOUBLE_EQ(meshsim::estimate_resources(b, b.options).largest_bytes, 4 * 8000.0 * 8000.0);
}

// A local_map's body values are every rank's too: an outer product made inside the body counts
// as what it is, not as its arguments.
TEST(Estimate, CountsLocalMapBodyValues) {
  json doc = {{"format", "meshsim.scenario/1"},
              {"name", "outer"},
              {"mesh", {{"axes", {"dp"}}, {"shape", {2}}}},
              {"inputs",
               {{{"name", "a"}, {"shape", {4000, 1}}, {"placements", {"R"}}},
                {{"name", "b"}, {"shape", {1, 4000}}, {"placements", {"R"}}}}},
              {"program",
               {{{"out", "c"},
                 {"op", "local_map"},
                 {"args", {"a", "b"}},
                 {"out_placements", {{"R"}}},
                 {"body", {{{"out", "p"}, {"op", "mm"}, {"args", {"a", "b"}}}}},
                 {"returns", {"p"}},
                 {"reference", {{{"out", "p"}, {"op", "mm"}, {"args", {"a", "b"}}}}}}}}};
  const meshsim::Scenario sc = meshsim::parse_scenario(doc, "outer.json");
  const meshsim::ResourceEstimate e = meshsim::estimate_resources(sc, sc.options);
  EXPECT_GE(e.mesh_bytes, 2 * 2 * 4000.0 * 4000.0 * 8) << meshsim::format_bytes(e.mesh_bytes);
}

// Memory that runs out in a case is no verdict of the property: it stops at that case, out of memory
// (check exits 6), and shrinks nothing.
TEST(Runner, OutOfMemoryInACaseStopsThePropertyAsOutOfMemory) {
  int ran = 0;
  const meshsim::Property p{"oom_probe", "a probe", [&] {
                              ++ran;
                              throw std::bad_alloc();
                            }};
  const meshsim::PropertyOutcome o = meshsim::run_property(p, 1, 25, nullptr);
  EXPECT_EQ(o.status, meshsim::PropertyOutcome::Status::OutOfMemory) << o.description;
  EXPECT_EQ(o.description, "out of memory: std::bad_alloc");
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(o.progress.shrinks, 0);
}

class Limits : public ProcessTest {
 protected:
  Limits() : ProcessTest("meshsim_test_limits", 120) {}
  void write(const std::string& name, const json& doc) {
    std::ofstream(dir / name) << doc.dump(2);
  }
};

// ones [40000, 40000] on 4 ranks: 12.8 GB a replica, estimated at 32 KiB before; refused now.
TEST_F(Limits, RunRefusesACreatedValueOverTheLimit) {
  write("ones.json", created(4, {40000, 40000}, "R"));
  Outcome o = meshsim("run ones.json --max-memory 1G --json", 30);
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(contains(o.err, "ones.json: /program/0: resource_limit: the run needs about ")) << o;
  EXPECT_TRUE(contains(o.err, "the largest value is \"o\"")) << o;
  ASSERT_FALSE(o.out.empty()) << o;
  EXPECT_EQ(json::parse(o.out)["error"]["kind"], "resource_limit") << o;
}

// check --scenario: the scenario as written is refused as run refuses it, before any case.
TEST_F(Limits, CheckRefusesTheScenarioAsWrittenLikeRun) {
  json mesh = created(16385, {4}, "R");
  write("mesh.json", mesh);
  Outcome m = meshsim("check --scenario mesh.json --seed 1 --cases 25", 60);
  EXPECT_EQ(m.code, 2) << m;
  EXPECT_TRUE(contains(m.err, "mesh.json: /mesh/shape: resource_limit: the mesh has 16385 ranks, more than the limit of 16384")) << m;
  write("s.json", created(4, {64, 64}, "R"));
  Outcome r = meshsim("check --scenario s.json --seed 1 --cases 25 --max-ranks 2");
  EXPECT_EQ(r.code, 2) << r;
  EXPECT_TRUE(contains(r.err, "resource_limit: the mesh has 4 ranks, more than the limit of 2")) << r;
  Outcome b = meshsim("check --scenario s.json --seed 1 --cases 25 --max-memory 1K --json");
  EXPECT_EQ(b.code, 2) << b;
  EXPECT_TRUE(contains(b.err, "s.json: /program/0: resource_limit: the run needs about ")) << b;
  ASSERT_FALSE(b.out.empty()) << b;
  EXPECT_EQ(json::parse(b.out)["error"]["kind"], "resource_limit") << b;
}

// The variants stay within the limits: on 1 rank the file fits 40 MiB; drawn on 2 to 8 ranks, its
// replicated values do not, and those variants are discards (-j 2 passes the limits on).
TEST_F(Limits, CheckDiscardsVariantsOverTheLimits) {
  write("one.json", created(1, {1000, 1000}, "R"));
  for (const char* jobs : {"1", "2"}) {
    Outcome o = meshsim(std::string("check --scenario one.json --seed 1 --cases 50 --max-memory 40M --json -j ") + jobs);
    ASSERT_EQ(o.code, 0) << o;
    const json p = json::parse(o.out)["properties"][0];
    EXPECT_EQ(p["status"], "pass") << p;
    ASSERT_TRUE(p["discard_reasons"].contains("the variant is refused: resource_limit")) << p;
    EXPECT_GT(p["discard_reasons"]["the variant is refused: resource_limit"].get<int>(), 0) << p;
    for (const auto& [mesh, n] : p["meshes"].items()) EXPECT_EQ(mesh, "1") << p;  // no case ran on more
  }
}

// Memory that runs out during check is exit 6 (DESIGN.md), not "a property failed".
TEST_F(Limits, CheckOutOfMemoryIsExit6) {
  json big = {{"format", "meshsim.scenario/1"}, {"name", "big"}, {"mesh", {{"axes", {"dp"}}, {"shape", {2}}}},
              {"inputs", {{{"name", "x"}, {"shape", {500000000}}, {"placements", {"S(0)"}}}}},
              {"program", {{{"out", "y"}, {"op", "mul"}, {"args", {"x", "x"}}}}}};
  write("big.json", big);
  Outcome o = run_process(dir, "/bin/bash",
                          "-c " + q("ulimit -v 3000000; exec " + q(MESHSIM_BIN) +
                                    " check --scenario big.json --seed 1 --cases 25 --max-memory 1T"),
                          120);
  EXPECT_EQ(o.code, 6) << o;
  EXPECT_TRUE(contains(o.err, "out_of_memory: out of memory")) << o;
  EXPECT_FALSE(contains(o.out, "FAIL")) << o;
}

}  // namespace

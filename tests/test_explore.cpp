// meshsim explore (issue #34, item 1): the page's model by its meaning (layers, a `group` field,
// each rank's local shapes, the failure it opens at, two runs' differences, recorded values), its
// determinism (a golden of the model and the graphs' DOT text; MESHSIM_UPDATE_GOLDEN=1 rewrites
// it), its size, and the command's exits on bad input. tests/explore_browser.py drives the page in
// headless Chromium.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "api/trace_of.h"
#include "core/error.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "tests/process_fixture.h"
#include "traces/explore.h"

namespace meshsim {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace meshsim::testing;

const fs::path kExamples = fs::path(MESHSIM_SOURCE_DIR) / "examples";

ExploreRun run_of_doc(const json& doc, const std::string& file = "test.json") {
  Scenario sc = parse_scenario(doc, file);
  CheckedRun run = check_scenario(sc, sc.options);
  ExploreRun out;
  out.file = file;
  out.trace = trace_of(sc, sc.options, run);
  return out;
}

ExploreRun run_of_file(const std::string& name) {
  std::ifstream in(kExamples / name);
  return run_of_doc(json::parse(in), name);
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Explore, TransformerFoldsByLayerWithAGraphPerLayer) {
  const ExploreRun run = run_of_file("transformer_fsdp_tp_sp.json");
  const json m = explore_model(run);
  EXPECT_EQ(m["layers"], json::array({"layer l0", "layer l1", "loss = cross_entropy, decomposed"}));
  const std::string overview = m["graphs"]["overview"];
  for (const char* node : {"<title>g0</title>", "<title>g1</title>", "<title>g2</title>"})
    EXPECT_TRUE(has(overview, node)) << node;
  EXPECT_FALSE(has(overview, ">l0_q&#45;") || has(overview, ">l0_q\n")) << "l0's ops are folded";
  ASSERT_EQ(m["graphs"]["layers"].size(), 3u);
  EXPECT_TRUE(has(m["graphs"]["layers"][0].get<std::string>(), ">l0_q</text>")) << "layer l0's graph draws l0_q";
  // A collective is drawn on the op whose value it makes, with its axis and bytes.
  EXPECT_TRUE(has(m["graphs"]["layers"][0].get<std::string>(), "⇄ reduce_scatter tp 128 B"));
  const json& q = m["values"]["l0_q"];
  EXPECT_EQ(q["spec"], "[S(0), S(2)]");
  EXPECT_EQ(q["shape"], json::array({2, 4, 8}));
  EXPECT_EQ(q["local"], json::parse("[[4, [1, 4, 4]]]")) << "four ranks of one local shape: one run";
  EXPECT_EQ(q["layer"], 0);
  EXPECT_EQ(q["gspec"], "[S(0), S(2)]");
}

TEST(Explore, UnevenShardsKeepEachRanksLocalShape) {
  const json doc = {{"format", "meshsim.scenario/1"},
                    {"mesh", {{"axes", {"dp"}}, {"shape", {4}}}},
                    {"inputs", {{{"name", "x"}, {"shape", {7, 4}}, {"placements", {"S(0)"}}, {"requires_grad", true}}}},
                    {"program", {{{"out", "y"}, {"op", "relu"}, {"args", {"x"}}}, {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}}},
                    {"backward", "loss"}};
  const json m = explore_model(run_of_doc(doc));
  EXPECT_EQ(m["values"]["y"]["local"], json::parse("[[3, [2, 4]], [1, [1, 4]]]")) << "7 rows over 4 ranks: 2, 2, 2, 1";
}

TEST(Explore, GroupFieldNamesTheLayer) {
  json doc = {{"format", "meshsim.scenario/1"},
              {"mesh", {{"axes", {"dp"}}, {"shape", {2}}}},
              {"inputs", {{{"name", "x"}, {"shape", {4, 4}}, {"placements", {"S(0)"}}, {"group", "embed"}}}},
              {"program",
               {{{"out", "a"}, {"op", "relu"}, {"args", {"x"}}, {"group", "block"}},
                {{"out", "b"}, {"op", "exp"}, {"args", {"a"}}, {"group", "block"}},
                {{"out", "loss"}, {"op", "sum"}, {"args", {"b"}}}}}};
  const json m = explore_model(run_of_doc(doc));
  EXPECT_EQ(m["layers"], json::array({"layer block"}));
  EXPECT_EQ(m["values"]["a"]["layer"], 0);
  EXPECT_EQ(m["values"]["loss"]["layer"], -1);
  EXPECT_TRUE(has(explore_dot_texts(run_of_doc(doc).trace)[0], "\"g0\" [label=\"▸ layer block\\n2 ops"));
  // A group that is not a name is refused, naming its path.
  doc["program"][1]["group"] = "";
  try {
    parse_scenario(doc, "bad.json");
    FAIL() << "an empty group was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "bad.json");
    EXPECT_EQ(e.json_path(), "/program/1/group");
  }
  doc["program"][1]["group"] = 3;
  EXPECT_THROW(parse_scenario(doc, "bad.json"), InputError);
}

TEST(Explore, FailingRunCarriesItsFirstDivergenceAndMismatch) {
  const ExploreRun run = run_of_file("bugs/partial_bias_in_local_map.json");
  // local_map's entry makes "h" from "h": its edge comes from the input, not from itself.
  EXPECT_TRUE(has(explore_dot_texts(run.trace)[0], "\"v:h\" -> \"e2\";"));
  const json m = explore_model(run);
  EXPECT_EQ(m["status"], "fail");
  const json& fd = m["failure"]["first_divergence"];
  EXPECT_EQ(fd["value"], "y");
  EXPECT_EQ(fd["mismatch"]["mismatched"], 24);
  EXPECT_FALSE(m["values"]["y"]["errors"].empty());
}

TEST(Explore, TwoRunsListWhatDiffers) {
  const json d = explore_diff(run_of_file("dp_reduced.json"), run_of_file("dp_replicated.json"));
  EXPECT_EQ(d["values"], json::parse(R"([{"value": "w", "what": ["placement [Rd] vs [R]", "gradient [P(sum)] vs [R]"]}])"));
  EXPECT_EQ(d["collectives"], json::parse(R"([{"a": 0, "b": 1, "collective": "backward all_reduce dp 768 B of w"}])"));
  const json same = explore_diff(run_of_file("dp_reduced.json"), run_of_file("dp_reduced.json"));
  EXPECT_TRUE(same["values"].empty() && same["collectives"].empty());
}

// The model and the graphs' DOT text, byte for byte (the SVG is dot's, from this DOT text).
TEST(Explore, GoldenModelOfFsdpReduced) {
  const ExploreRun run = run_of_file("fsdp_reduced.json");
  json m = explore_model(run);
  m.erase("graphs");
  m.erase("version");
  m["dots"] = explore_dot_texts(run.trace);
  const std::string actual = m.dump(1) + "\n";
  const fs::path path = fs::path(MESHSIM_SOURCE_DIR) / "tests/golden/explore/fsdp_reduced.model.json";
  const char* update = std::getenv("MESHSIM_UPDATE_GOLDEN");
  if (update && std::string(update) == "1") {
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << actual;
    return;
  }
  ASSERT_TRUE(fs::exists(path)) << path << " is missing; run with MESHSIM_UPDATE_GOLDEN=1";
  EXPECT_EQ(read_text(path), actual) << path << " differs; MESHSIM_UPDATE_GOLDEN=1 rewrites it";
}

TEST(Explore, PageIsSelfContainedDeterministicAndSmall) {
  const ExploreRun run = run_of_file("transformer_fsdp_tp_sp.json");
  const std::string page = explore_html({run});
  EXPECT_EQ(page, explore_html({run})) << "same run, same bytes";
  EXPECT_LT(page.size(), 1u << 20) << "an 8-rank-class page under 1 MB";
  EXPECT_TRUE(has(page, "default-src 'none'")) << "the page may load nothing";
  for (const char* fetches : {"<link", " src=", "fetch(", "XMLHttpRequest", "import("})
    EXPECT_FALSE(has(page, fetches)) << fetches;
  EXPECT_FALSE(has(page.substr(page.find("meshsim-model")), "</script><script")) << "the model cannot end its element";
}

TEST(Explore, RecordedValuesAreRead) {
  const fs::path dir = fresh_dir("meshsim_test_explore", "values");
  fs::create_directories(dir / "values");
  // A 2 x 2 float64 .npy, as numpy.save writes it (version 1.0, a 118-byte header).
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }";
  header += std::string(117 - header.size(), ' ') + "\n";
  std::string npy = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header;
  for (double v : {1.5, -2.0, 3.25, 4.0}) npy += std::string(reinterpret_cast<const char*>(&v), 8);
  std::ofstream(dir / "values/x.npy", std::ios::binary) << npy;
  std::ofstream(dir / "index.json") << R"({"files": [{"value": "x", "kind": "value", "path": "values/x.npy", "shape": [2, 2], "dtype": "float64"}]})";
  const json r = read_recorded_values(dir.string());
  EXPECT_EQ(r["x"]["value"]["head"], json::parse("[1.5, -2.0, 3.25, 4.0]"));
  EXPECT_EQ(r["x"]["value"]["elements"], 4);
  std::ofstream(dir / "index.json") << R"({"files": [{"value": "x", "kind": "value", "path": "values/none.npy"}]})";
  try {
    read_recorded_values(dir.string());
    FAIL() << "a missing file was read";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), (dir / "index.json").string());
    EXPECT_EQ(e.json_path(), "/files/0/path");
  }
  remove_fresh_dir(dir);
}

class ExploreCli : public ProcessTest {
 protected:
  ExploreCli() : ProcessTest("meshsim_test_explore", 120) {}
};

TEST_F(ExploreCli, WritesThePageAndRefusesBadInput) {
  const std::string file = (kExamples / "fsdp_reduced.json").string();
  Outcome o = meshsim("explore " + file + " -o page.html");
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(has(read_text(dir / "page.html"), "meshsim-model")) << o;
  o = meshsim("run " + file + " --values vals");
  ASSERT_EQ(o.code, 0) << o;
  o = meshsim("explore " + file + " -o with_values.html --values vals");
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(has(read_text(dir / "with_values.html"), "\"recorded\":{\"grad\"")) << "w's recorded gradient";
  // run --explore writes the same page in the run's own process (scripts/setup.sh's main job).
  o = meshsim("run " + file + " --explore from_run.html");
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_EQ(read_text(dir / "from_run.html"), read_text(dir / "page.html")) << "one run, one page";
  o = meshsim("run " + file + " --explore from_run.txt");
  EXPECT_EQ(o.code, 2) << o;
  o = meshsim("explore " + file + " -o page.svg");
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(has(o.err, ".html")) << o;
  o = meshsim("explore " + file + " " + file + " " + file + " -o three.html");
  EXPECT_EQ(o.code, 2) << o;
  std::ofstream(dir / "broken.json") << R"({"format": "meshsim.scenario/1", "mesh": {"axes": ["dp"], "shape": [2]}, "inputs": [{"name": "x", "shape": [2], "placements": ["R"]}], "program": [{"out": "y", "op": "relu", "args": ["x"], "group": 7}]})";
  o = meshsim("explore broken.json -o broken.html");
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(has(o.err, "broken.json") && has(o.err, "/program/0/group")) << o;
  EXPECT_FALSE(fs::exists(dir / "broken.html"));
  // A failing bug with its expect block met exits 0, as `meshsim run` does; the page shows the failure.
  o = meshsim("explore " + (kExamples / "bugs/partial_bias_in_local_map.json").string() + " -o bug.html");
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(has(read_text(dir / "bug.html"), "\"status\":\"fail\""));
}

}  // namespace
}  // namespace meshsim

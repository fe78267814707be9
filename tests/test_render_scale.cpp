// Diagrams of long programs (traces/render.h, "Large programs"): a 20,000-op program, run by the
// simulator, renders to SVG collapsed (repeated runs folded, the title saying how many ops), in
// both views; a program that stopped before its first event draws its first and last ops; a
// failing value stays drawn; a bundled example renders exactly as its golden DOT text. How long
// rendering takes is measured in bench/bench_render.cpp, not here.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>

#include "api/trace_of.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "traces/render.h"

namespace meshsim {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kOps = 20000;

json scenario(const std::string& name, json inputs, json program) {
  return {{"format", "meshsim.scenario/1"}, {"name", name}, {"mesh", {{"axes", {"dp"}}, {"shape", {4}}}},
          {"inputs", std::move(inputs)}, {"program", std::move(program)}, {"backward", "loss"}};
}

// x -> add 1 -> mul 0.5 -> add 1 -> ... on an [8, 4] tensor sharded S(0), then sum: `ops` ops.
json chain_scenario(int ops) {
  json program = json::array();
  std::string prev = "x";
  for (int i = 0; i + 1 < ops; ++i) {
    const std::string out = "h" + std::to_string(i);
    program.push_back({{"out", out}, {"op", i % 2 ? "mul" : "add"}, {"args", {prev}}, {"value", i % 2 ? 0.5 : 1.0}});
    prev = out;
  }
  program.push_back({{"out", "loss"}, {"op", "sum"}, {"args", {prev}}});
  return scenario("long_chain", json::array({{{"name", "x"}, {"shape", {8, 4}}, {"placements", {"S(0)"}},
                                              {"requires_grad", true}}}),
                  program);
}

// Blocks of four distinct ops (add b, tanh, mul w, sub 0.25); before every 50th block the value
// is gathered and sharded again (redistribute to R: an all_gather; back to S(0): a local step).
json pattern_scenario(int ops) {
  json program = json::array();
  std::string prev = "x";
  for (int block = 0; static_cast<int>(program.size()) + 1 < ops; ++block) {
    const std::string n = std::to_string(block);
    if (block % 50 == 49 && static_cast<int>(program.size()) + 3 < ops) {
      program.push_back({{"out", "r" + n}, {"op", "redistribute"}, {"args", {prev}}, {"placements", {"R"}}});
      program.push_back({{"out", "s" + n}, {"op", "redistribute"}, {"args", {"r" + n}}, {"placements", {"S(0)"}}});
      prev = "s" + n;
    }
    const json ops_of_block[] = {
        {{"out", "a" + n}, {"op", "add"}, {"args", {prev, "b"}}},
        {{"out", "t" + n}, {"op", "tanh"}, {"args", {"a" + n}}},
        {{"out", "m" + n}, {"op", "mul"}, {"args", {"t" + n, "w"}}},
        {{"out", "d" + n}, {"op", "sub"}, {"args", {"m" + n}}, {"value", 0.25}},
    };
    for (const auto& op : ops_of_block) {
      if (static_cast<int>(program.size()) + 1 >= ops) break;
      program.push_back(op);
      prev = op["out"].get<std::string>();
    }
  }
  program.push_back({{"out", "loss"}, {"op", "sum"}, {"args", {prev}}});
  json inputs = json::array();
  for (const char* name : {"x", "b", "w"})
    inputs.push_back({{"name", name}, {"shape", {8, 4}}, {"placements", {"S(0)"}}, {"requires_grad", true}});
  return scenario("long_pattern", inputs, program);
}

Trace run(const json& doc) {
  Scenario sc = parse_scenario(doc, "generated");
  CheckedRun checked = check_scenario(sc, sc.options);
  EXPECT_EQ(checked.result["status"], "pass") << checked.result.dump(2).substr(0, 2000);
  return trace_of(sc, sc.options, checked);
}

// The traces are long to simulate: each is made once.
const Trace& chain_trace() {
  static const Trace t = run(chain_scenario(kOps));
  return t;
}
const Trace& pattern_trace() {
  static const Trace t = run(pattern_scenario(kOps));
  return t;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

int64_t number(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), ','), text.end());
  return std::stoll(text);
}

// The title's "collapsed: F of N ops ..." as {F, N}; {-1, -1} when the diagram is not collapsed.
std::pair<int64_t, int64_t> folded_ops(const std::string& dot) {
  std::smatch m;
  static const std::regex kLine("collapsed: ([0-9,]+) of ([0-9,]+) ops");
  if (!std::regex_search(dot, m, kLine)) return {-1, -1};
  return {number(m[1]), number(m[2])};
}

// The ops each fold node says it holds, added up ("12 events, 8 ops" in its gray line).
int64_t ops_in_fold_nodes(const std::string& dot) {
  int64_t total = 0;
  static const std::regex kFold("\"(r[0-9]+:)?fold[0-9]+\" \\[label=<[^\\n]*?([0-9,]+) ops?[ ;<,]");
  for (auto it = std::sregex_iterator(dot.begin(), dot.end(), kFold); it != std::sregex_iterator(); ++it)
    total += number((*it)[2]);
  return total;
}

// The node statements of the folds, one a line.
std::string fold_lines(const std::string& dot) {
  static const std::regex kFoldNode("^ *\"(r[0-9]+:)?fold[0-9]+\" \\[label=");
  std::istringstream in(dot);
  std::string out;
  for (std::string line; std::getline(in, line);)
    if (std::regex_search(line, kFoldNode)) out += line + "\n";
  return out;
}

void expect_collapsed_svg(const std::string& dot) {
  EXPECT_LE(count(dot, " [label="), kRenderMaxLayoutSize);
  const std::string svg = layout_dot(dot, "svg");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("collapsed: "), std::string::npos) << "the drawing itself says it is collapsed";
}

TEST(RenderScale, LongChainIsCollapsedAndSaysHowManyOpsWereFolded) {
  const Trace& t = chain_trace();
  const std::string dot = render_dot(t);
  const auto [folded, total] = folded_ops(dot);
  EXPECT_EQ(total, kOps);
  EXPECT_GT(folded, kOps - 20) << "a chain of add, mul folds but for a few ops";
  EXPECT_EQ(ops_in_fold_nodes(dot), folded) << "the fold nodes hold the ops the title counts";
  // Every op is drawn or folded: the drawn ones are the op ellipses, less the legend's.
  EXPECT_EQ(static_cast<int64_t>(count(dot, "shape=\"ellipse\"")) - 1 + folded, kOps);
  EXPECT_NE(dot.find("(add \xe2\x86\x92 mul) \xc3\x97"), std::string::npos) << "the fold names its pattern";
  EXPECT_NE(dot.find("repetitions folded"), std::string::npos);
  expect_collapsed_svg(dot);
}

TEST(RenderScale, RepeatedBlocksWithCollectivesFoldTwice) {
  const Trace& t = pattern_trace();
  const std::string dot = render_dot(t);
  const auto [folded, total] = folded_ops(dot);
  EXPECT_EQ(total, kOps);
  EXPECT_GT(folded, kOps * 9 / 10);
  EXPECT_EQ(ops_in_fold_nodes(dot), folded);
  // The blocks fold into runs of 50, and the runs (with their all_gather) fold again.
  EXPECT_NE(dot.find("(add \xe2\x86\x92 tanh \xe2\x86\x92 mul \xe2\x86\x92 sub) \xc3\x97" "50"), std::string::npos);
  EXPECT_NE(fold_lines(dot).find("all_gather"), std::string::npos) << "the outer fold's pattern";
  EXPECT_LT(count(dot, " [label="), 200u) << "runs of runs fold: no elision needed";
  expect_collapsed_svg(dot);
}

TEST(RenderScale, RankViewOfALongProgramIsCollapsedToo) {
  const std::string dot = render_dot(pattern_trace(), RenderView::Ranks);
  EXPECT_EQ(folded_ops(dot).second, kOps);
  expect_collapsed_svg(dot);
}

TEST(RenderScale, ProgramWithoutRepetitionIsElidedInTheMiddle) {
  // add, mul and sub drawn at random (mt19937's sequence is the same everywhere): runs of a
  // pattern are few and short, so folding them leaves the diagram too large.
  json doc = chain_scenario(4000);
  std::mt19937 rng(7);
  const char* kinds[] = {"add", "mul", "sub"};
  for (size_t i = 0; i + 1 < doc["program"].size(); ++i) doc["program"][i]["op"] = kinds[rng() % 3];
  const std::string dot = render_dot(run(doc));
  const auto [folded, total] = folded_ops(dot);
  EXPECT_EQ(total, 4000);
  EXPECT_GT(folded, 0);
  EXPECT_NE(dot.find("not drawn"), std::string::npos) << "an elision, with what it holds";
  expect_collapsed_svg(dot);
}

TEST(RenderScale, FailingValueOfALongProgramStaysDrawn) {
  Trace t = chain_trace();
  t.result["status"] = "fail";
  t.result["checks"]["forward_equivalence"] = false;
  t.result["failures"] = json::array({"h9999: differs from the oracle by 1"});
  const std::string dot = render_dot(t);
  const auto at = dot.find("\"v:h9999\" [label=");
  ASSERT_NE(at, std::string::npos) << "a failing value is never folded";
  const std::string node = dot.substr(at, dot.find('\n', at) - at);
  EXPECT_NE(node.find("differs from the oracle"), std::string::npos);
  EXPECT_NE(node.find("penwidth=\"3\""), std::string::npos);
  expect_collapsed_svg(dot);
}

TEST(RenderScale, LongProgramStoppedBeforeItsFirstEventDrawsItsEnds) {
  Trace t;
  t.version = "0.1.0";
  t.scenario = chain_scenario(kOps);
  t.result = {{"format", "meshsim.result/1"}, {"status", "error"},
              {"error", {{"kind", "invalid_scenario"}, {"message", "h5000: an example error"}}}};
  const std::string dot = render_dot(t);
  EXPECT_NE(dot.find("ops not drawn"), std::string::npos);
  EXPECT_NE(dot.find("\"p0\""), std::string::npos) << "the first op";
  EXPECT_NE(dot.find("\"p" + std::to_string(kOps - 1) + "\""), std::string::npos) << "the last op";
  EXPECT_NE(dot.find("\"p5000\""), std::string::npos) << "the op the error names, in the middle";
  EXPECT_LE(count(dot, " [label="), kRenderMaxLayoutSize);
  EXPECT_NE(layout_dot(dot, "svg").find("<svg"), std::string::npos);
}

TEST(RenderScale, SmallExampleIsDrawnInFullAsItsGoldenText) {
  const fs::path root(MESHSIM_SOURCE_DIR);
  Scenario sc = load_scenario((root / "examples" / "fsdp_reduced.json").string());
  CheckedRun checked = check_scenario(sc, sc.options);
  const Trace t = trace_of(sc, sc.options, checked);
  for (const auto& [view, golden] : {std::pair{RenderView::Logical, "fsdp_reduced.dot"},
                                     std::pair{RenderView::Ranks, "fsdp_reduced.ranks.dot"}}) {
    std::ifstream in(root / "tests" / "golden" / "dot" / golden);
    std::stringstream expected;
    expected << in.rdbuf();
    const std::string dot = render_dot(t, view);
    EXPECT_EQ(dot, expected.str()) << golden;
    EXPECT_EQ(folded_ops(dot).first, -1) << "not collapsed";
    EXPECT_EQ(dot.find("fold"), std::string::npos);
  }
}

}  // namespace
}  // namespace meshsim

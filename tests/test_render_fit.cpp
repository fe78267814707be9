// Static diagrams that fit a screen (issue #34, item 2): render folds layers into one box each with
// their collectives summed (the default above kFoldAboveNodes nodes), --ops draws a range of the
// program, and the rank view draws the block of the tensor each rank holds.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "api/trace_of.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "tests/process_fixture.h"
#include "traces/render.h"
#include "traces/render_common.h"

namespace meshsim {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace meshsim::testing;

const fs::path kExamples = fs::path(MESHSIM_SOURCE_DIR) / "examples";

Trace trace_of_file(const fs::path& file) {
  Scenario sc = load_scenario(file.string());
  CheckedRun run = check_scenario(sc, sc.options);
  return trace_of(sc, sc.options, run);
}

Trace trace_of_doc(const json& doc) {
  Scenario sc = parse_scenario(doc, "test.json");
  CheckedRun run = check_scenario(sc, sc.options);
  return trace_of(sc, sc.options, run);
}

const Trace& transformer() {
  static const Trace t = trace_of_file(kExamples / "transformer_fsdp_tp_sp.json");
  return t;
}

RenderOptions opts(RenderView view, FoldMode fold, const std::string& ops = "") {
  RenderOptions o;
  o.view = view;
  o.fold = fold;
  o.ops = ops;
  return o;
}

// The laid-out SVG's long side in pixels at 96 dpi (Graphviz writes points, 72 to the inch).
double long_side_px(const std::string& dot) {
  const std::string svg = layout_dot(dot, "svg");
  std::smatch m;
  const std::regex size("<svg width=\"([0-9.]+)pt\" height=\"([0-9.]+)pt\"");
  EXPECT_TRUE(std::regex_search(svg, m, size));
  return std::max(std::stod(m[1]), std::stod(m[2])) * 96.0 / 72.0;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The goal of the issue: the whole transformer step, 17,837 px tall drawn in full, fits 3,000 px on
// its long side folded, in both views; folding is the default at its size.
TEST(RenderFit, TransformerStepFoldedFitsThreeThousandPixels) {
  for (RenderView view : {RenderView::Logical, RenderView::Ranks}) {
    SCOPED_TRACE(render_view_name(view));
    const std::string folded = render_dot(transformer(), opts(view, FoldMode::Auto));
    EXPECT_TRUE(has(folded, "folded by layer: 2 layers (l0, l1)")) << "folded by default at this size";
    EXPECT_EQ(folded, render_dot(transformer(), opts(view, FoldMode::Always)));
    EXPECT_LE(long_side_px(folded), 3000.0);
    const std::string full = render_dot(transformer(), opts(view, FoldMode::Never));
    EXPECT_FALSE(has(full, "folded by layer"));
    EXPECT_GT(long_side_px(full), 3000.0) << "folding is what makes it fit";
  }
}

// Each layer's box sums its collectives: per kind and axis, the count and the bytes per rank of the
// collective events of its values, counted here from the trace.
TEST(RenderFit, LayerBoxSumsTheCollectivesOfItsValues) {
  const Trace& t = transformer();
  for (const std::string layer : {"l0", "l1"}) {
    std::map<std::string, std::pair<int64_t, int64_t>> expected;
    for (const auto& e : t.events) {
      if (e.phase != "forward" || e.kind != "collective" || e.value.compare(0, layer.size() + 1, layer + "_") != 0)
        continue;
      auto& [count, bytes] = expected[e.name + " " + e.axis];
      ++count;
      bytes += e.bytes;
    }
    ASSERT_FALSE(expected.empty());
    const std::string dot = render_dot(t, opts(RenderView::Logical, FoldMode::Always));
    const auto box = dot.find("<B>layer " + layer + "</B>");
    ASSERT_NE(box, std::string::npos) << layer;
    const std::string label = dot.substr(box, dot.find('\n', box) - box);
    for (const auto& [what, sum] : expected) {
      const std::string line = "<B>" + what + "</B> \u00d7" + std::to_string(sum.first) + ": " +
                               render_detail::bytes_str(sum.second) + "/rank";
      EXPECT_TRUE(has(label, line)) << line << " in " << label;
    }
  }
}

// A program under the size stays drawn in full by default (a golden text unchanged), and folds when
// asked where it has layers.
TEST(RenderFit, SmallProgramIsFoldedOnlyWhenAsked) {
  json doc = json::parse(std::ifstream(kExamples / "fsdp_reduced.json"));
  const Trace small = trace_of_doc(doc);
  EXPECT_EQ(render_dot(small), render_dot(small, opts(RenderView::Logical, FoldMode::Never)));
  EXPECT_FALSE(has(render_dot(small, opts(RenderView::Logical, FoldMode::Always)), "folded by layer"))
      << "no layers, nothing to fold";
  // The first layer of the transformer alone: 188 nodes in full, under kFoldAboveNodes, so drawn in
  // full by default; it has a layer, so --fold folds it.
  const RenderOptions first_layer = opts(RenderView::Logical, FoldMode::Auto, "0..40");
  const std::string full = render_dot(transformer(), first_layer);
  size_t nodes = 0;
  for (auto at = full.find(" [label="); at != std::string::npos; at = full.find(" [label=", at + 1)) ++nodes;
  EXPECT_LT(nodes, kFoldAboveNodes);
  EXPECT_FALSE(has(full, "folded by layer")) << "under the size, drawn in full";
  EXPECT_TRUE(has(render_dot(transformer(), opts(RenderView::Logical, FoldMode::Always, "0..40")),
                  "folded by layer: 1 layer (l0)"));
}

// An imported program's layers are its modules, cut after their numbered part.
TEST(RenderFit, ImportedProgramFoldsByModule) {
  const Trace t = trace_of_file(kExamples / "imported" / "llama_tp.json");
  const std::string dot = render_dot(t, opts(RenderView::Logical, FoldMode::Always));
  EXPECT_TRUE(has(dot, "<B>layer layers.0</B>")) << "module layers.0.attention.wq is in layer layers.0";
  EXPECT_FALSE(has(dot, "<B>layer layers.0.attention")) << "cut after the numbered part";
}

// --ops by index and by name draw the same range: its ops, not the others; a value made before the
// range is a gray node that says so.
TEST(RenderFit, OpsRangeDrawsOnlyItsOps) {
  const Trace& t = transformer();
  const std::string by_name = render_dot(t, opts(RenderView::Logical, FoldMode::Never, "l0_n1..l0_h2"));
  EXPECT_EQ(by_name, render_dot(t, opts(RenderView::Logical, FoldMode::Never, "13..40")));
  EXPECT_TRUE(has(by_name, "\"v:l0_q\"")) << "an op inside";
  EXPECT_FALSE(has(by_name, "\"v:l1_q\"")) << "an op after";
  EXPECT_FALSE(has(by_name, "\"v:tok\"")) << "an op before";
  EXPECT_TRUE(has(by_name, "h0<BR/><FONT COLOR=\"#8c8c8c\" POINT-SIZE=\"8\">made outside --ops 13..40</FONT>"))
      << "h0 comes from before the range";
  EXPECT_TRUE(has(by_name, "ops 13..40 of 84 drawn (program[13] l0_n1 to program[40] l0_h2)"));
  const std::string with_input = render_dot(t, opts(RenderView::Logical, FoldMode::Never, "5..13"));
  EXPECT_TRUE(has(with_input, "\"v:l0_norm1\" [label=<<B>l0_norm1</B>")) << "an input program[5] reads";
  EXPECT_FALSE(has(with_input, "\"v:emb\"")) << "an input only ops before it read";
  const std::string open_end = render_dot(t, opts(RenderView::Logical, FoldMode::Never, "77.."));
  EXPECT_TRUE(has(open_end, "\"v:loss\"") && !has(open_end, "\"v:l1_h1\""));
  EXPECT_EQ(parse_op_range(t, "..l0_h2"), std::make_pair(size_t{0}, size_t{40}));
}

TEST(RenderFit, BadOpsRangesAreRefusedNamingTheArgument) {
  const Trace& t = transformer();
  for (const std::string bad : {"40..5", "0..84", "zz..", "5-9", "..ids", "1..2..3"}) {
    SCOPED_TRACE(bad);
    try {
      parse_op_range(t, bad);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(has(e.what(), "--ops \"" + bad + "\": ")) << e.what();
    }
  }
}

// The rank view draws the block each rank holds: 7 rows over 2 ranks are 4 and 3 (torch.chunk),
// in cells of unequal height.
TEST(RenderFit, RankViewDrawsTheUnevenBlockEachRankHolds) {
  const json doc = {
      {"format", "meshsim.scenario/1"},
      {"name", "uneven"},
      {"mesh", {{"axes", {"dp"}}, {"shape", {2}}}},
      {"inputs", {{{"name", "w"}, {"shape", {7, 4}}, {"placements", {"S(0)"}}, {"requires_grad", true}}}},
      {"program", {{{"out", "loss"}, {"op", "sum"}, {"args", {"w"}}}}},
      {"backward", "loss"}};
  const std::string dot = render_dot(trace_of_doc(doc), RenderView::Ranks);
  EXPECT_TRUE(has(dot, ">[0:4, :] of [7, 4]<")) << dot;
  EXPECT_TRUE(has(dot, ">[4:7, :] of [7, 4]<")) << dot;
  // Rows 0:4 and 4:7 across 56 points: 32 and 24 points wide, the held one filled.
  EXPECT_TRUE(has(dot, "WIDTH=\"32\" HEIGHT=\"10\" BGCOLOR=\"#9ecae1\"")) << dot;
  EXPECT_TRUE(has(dot, "WIDTH=\"24\" HEIGHT=\"10\" BGCOLOR=\"#9ecae1\"")) << dot;
  EXPECT_TRUE(has(dot, "WIDTH=\"32\" HEIGHT=\"10\" BGCOLOR=\"#ffffff\"")) << "rank 1 does not hold rows 0:4";
  EXPECT_FALSE(has(render_dot(trace_of_doc(doc)), "[0:4, :] of [7, 4]")) << "the logical view draws no blocks";
}

class RenderFitCli : public ProcessTest {
 protected:
  RenderFitCli() : ProcessTest("meshsim_test_render_fit", 120) {}
};

TEST_F(RenderFitCli, FlagsAndBadRanges) {
  const std::string file = (kExamples / "transformer_fsdp_tp_sp.json").string();
  Outcome o = meshsim("render " + file + " -o folded.dot --fold --ops l0_n1..40");
  EXPECT_EQ(o.code, 0) << o;
  o = meshsim("render " + file + " -o full.dot --no-fold");
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_FALSE(has(read_text(dir / "full.dot"), "folded by layer"));
  o = meshsim("render " + file + " -o both.dot --fold --no-fold");
  EXPECT_EQ(o.code, 2) << o;
  for (const std::string bad : {"40..5", "0..999", "nothing..", "5"}) {
    o = meshsim("render " + file + " -o bad.dot --ops " + bad);
    EXPECT_EQ(o.code, 2) << o;
    EXPECT_TRUE(has(o.err, "--ops \"" + bad + "\": ")) << o;
    EXPECT_FALSE(fs::exists(dir / "bad.dot")) << "nothing drawn";
  }
}

}  // namespace
}  // namespace meshsim

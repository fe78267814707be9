// What meshsim says about the user's strings, and what its exit says about the runs it draws
// (issue #37, item 7): a key or name of any length is shown bounded, a control character in one is
// shown escaped (in messages and in diagrams); `render` exits as the run it draws does; an error in
// a trace's scenario names the trace's own path.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/process_fixture.h"
#include "traces/render_common.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace meshsim::testing;

namespace {

const fs::path kExamples = fs::path(MESHSIM_SOURCE_DIR) / "examples";

class Messages : public ProcessTest {
 protected:
  Messages() : ProcessTest("meshsim_test_messages", 60) {}
  std::string write(const std::string& name, const json& doc) const {
    std::ofstream(dir / name) << doc.dump();
    return name;
  }
  json example(const std::string& rel) const { return json::parse(read_text(kExamples / rel)); }
};

bool has_control(const std::string& s) {
  for (char c : s)
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') || c == 0x7f) return true;
  return false;
}

// A 10 MiB unknown key: the message names it in a few hundred bytes, with its length (it printed the
// key twice, 20 MiB on stderr).
TEST_F(Messages, AHugeKeyIsShownBounded) {
  json doc = example("dp_replicated.json");
  doc[std::string(10 << 20, 'k')] = 1;
  Outcome o = meshsim("run " + write("huge.json", doc));
  EXPECT_EQ(o.code, 2) << o.err.substr(0, 500);
  EXPECT_LT(o.err.size(), 2000u) << o.err.substr(0, 500);
  EXPECT_TRUE(contains(o.err, "(10485760 bytes)")) << o.err.substr(0, 500);
  EXPECT_TRUE(contains(o.err, "unknown field")) << o.err.substr(0, 500);
}

// A name with an escape sequence or a NUL is refused, shown escaped: nothing reaches the terminal
// as a control character.
TEST_F(Messages, ControlCharactersInANameAreRefusedAndShownEscaped) {
  for (const std::string& bad : {std::string("x\x1b[31mred"), std::string("x\0y", 3), std::string("a\nb")}) {
    json doc = example("dp_replicated.json");
    doc["inputs"][0]["name"] = bad;
    Outcome o = meshsim("run " + write("bad.json", doc));
    EXPECT_EQ(o.code, 2) << o;
    EXPECT_TRUE(contains(o.err, "/inputs/0/name: a name without control characters expected")) << o;
    EXPECT_FALSE(has_control(o.err) || has_control(o.out)) << o;
  }
  json doc = example("dp_replicated.json");
  doc["inputs"][0]["name"] = std::string(300, 'n');
  Outcome o = meshsim("run " + write("long.json", doc));
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(contains(o.err, "a name of at most 256 bytes expected")) << o;
  EXPECT_TRUE(contains(o.err, "(300 bytes)")) << o;
  // An unknown op or placement with an escape sequence: shown escaped.
  doc = example("dp_replicated.json");
  doc["inputs"][0]["placements"][0] = "S(\x1b[0m)";
  o = meshsim("run " + write("placement.json", doc));
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(contains(o.err, "\\x1b")) << o;
  EXPECT_FALSE(has_control(o.err)) << o;
}

// The diagram is written whatever the run, but its exit is the run's: a failing bug 1, a refused
// program 3, a pass 0; a bug whose expect block is met 0, as `run` gives it; a failing trace 1.
TEST_F(Messages, RenderExitsAsTheRunItDraws) {
  json bug = example("bugs/bias_grad_off_by_tp.json");
  bug.erase("expect");
  Outcome failing = meshsim("render " + write("bug.json", bug) + " -o bug.dot");
  EXPECT_EQ(failing.code, 1) << failing;
  EXPECT_TRUE(fs::exists(dir / "bug.dot"));
  EXPECT_TRUE(contains(failing.err, "the run it draws is not a pass: status fail")) << failing;

  Outcome met = meshsim("render " + (kExamples / "bugs/bias_grad_off_by_tp.json").string() + " -o met.dot");
  EXPECT_EQ(met.code, 0) << met;

  json strict = example("reduced_policy_strict.json");
  strict.erase("expect");
  Outcome refused = meshsim("render " + write("strict.json", strict) + " -o strict.dot");
  EXPECT_EQ(refused.code, 3) << refused;
  Outcome passing = meshsim("render " + (kExamples / "dp_replicated.json").string() + " -o pass.dot");
  EXPECT_EQ(passing.code, 0) << passing;

  Outcome traced = meshsim("run " + std::string("bug.json") + " --trace bug.trace.json");
  EXPECT_EQ(traced.code, 1) << traced;
  Outcome from_trace = meshsim("render bug.trace.json -o trace.dot");
  EXPECT_EQ(from_trace.code, 1) << from_trace;
  EXPECT_TRUE(fs::exists(dir / "trace.dot"));
}

// Strings of the user's reach a diagram only validated (a source's file is a name: control
// characters refused, shown escaped); what the writer gets anyway is escaped for Graphviz, as \xNN.
TEST_F(Messages, ControlCharactersNeverReachADiagram) {
  json doc = example("dp_replicated.json");
  doc["program"][0]["source"] = {{"module", "layer"}, {"file", "m\x1b[1m.py"}, {"line", 3}, {"code", "y = f(x)"}};
  Outcome o = meshsim("render " + write("src.json", doc) + " -o src.dot");
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(contains(o.err, "/program/0/source/file: a name without control characters expected, got \"m\\x1b[1m.py\""))
      << o;
  EXPECT_FALSE(has_control(o.err)) << o;
  EXPECT_EQ(meshsim::render_detail::quote(std::string("a\x1b[1m\0b\n", 8)), "\"a\\\\x1b[1m\\\\x00b\\n\"");
  EXPECT_EQ(meshsim::render_detail::esc(std::string("<\x07>", 3)), "&lt;\\x07&gt;");
}

// An error in a trace's scenario names the path in the trace ("/scenario/program/0/op"), not the
// path in a scenario file that does not exist.
TEST_F(Messages, ErrorsInATracesScenarioNameTheTracesPath) {
  Outcome traced = meshsim("run " + (kExamples / "dp_replicated.json").string() + " --trace t.json");
  ASSERT_EQ(traced.code, 0) << traced;
  json trace = json::parse(read_text(dir / "t.json"));
  trace["scenario"]["program"][0]["op"] = "no_such_op";
  write("broken.json", trace);
  Outcome replay = meshsim("replay broken.json");
  EXPECT_EQ(replay.code, 2) << replay;
  EXPECT_TRUE(contains(replay.err, "broken.json: /scenario/program/0/op: unknown op")) << replay;
  Outcome render = meshsim("render broken.json -o b.dot");
  EXPECT_EQ(render.code, 2) << render;
  EXPECT_TRUE(contains(render.err, "/scenario/program/0/op")) << render;
}

}  // namespace

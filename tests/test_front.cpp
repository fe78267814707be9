// `meshsim` without libtorch (cli/front.cpp): the commands that compute nothing with tensors run in
// the front itself, every other one is handed to meshsim-torch with the same arguments, so that the
// output and exit code are the full command's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/process_support.h"

namespace fs = std::filesystem;
using meshsim::testing::contains;
using meshsim::testing::fresh_dir;
using meshsim::testing::Outcome;
using meshsim::testing::q;
using meshsim::testing::remove_fresh_dir;
using meshsim::testing::run_process;

namespace {

const std::string kExamples = std::string(MESHSIM_SOURCE_DIR) + "/examples/";

// The libraries the dynamic loader maps for BINARY (ld.so's own listing: ldd's mechanism).
std::string loaded_libraries(const fs::path& dir, const std::string& binary) {
  const Outcome o = run_process(dir, "env", "LD_TRACE_LOADED_OBJECTS=1 " + q(binary), 30, "_ldd");
  EXPECT_EQ(o.code, 0) << o;
  return o.out;
}

TEST(Front, LoadsNoLibtorchWhereTheFullCommandDoes) {
  const fs::path dir = fresh_dir("meshsim_front", "ldd");
  const std::string front = loaded_libraries(dir, MESHSIM_BIN);
  EXPECT_FALSE(contains(front, "libtorch")) << front;
  EXPECT_FALSE(contains(front, "libc10")) << front;
  // The check above can fail: the full command maps libtorch.
  const std::string full = loaded_libraries(dir, MESHSIM_TORCH_BIN);
  EXPECT_TRUE(contains(full, "libtorch_cpu")) << full;
  remove_fresh_dir(dir);
}

// A copy of `meshsim` alone, with no meshsim-torch to hand anything to: what it still does, it
// does without libtorch.
TEST(Front, RunsHelpVersionOpsRenderAndExploreOfATraceAlone) {
  const fs::path dir = fresh_dir("meshsim_front", "alone");
  const Outcome traced =
      run_process(dir, MESHSIM_BIN, "run " + q(kExamples + "tp_rowwise_partial.json") + " --trace t.json", 120);
  ASSERT_EQ(traced.code, 0) << traced;
  fs::create_directories(dir / "bin");
  const fs::path alone = dir / "bin" / "meshsim";
  fs::copy_file(MESHSIM_BIN, alone);

  const Outcome version = run_process(dir, alone.string(), "--version", 30);
  EXPECT_EQ(version.code, 0) << version;
  EXPECT_EQ(version.out, run_process(dir, MESHSIM_TORCH_BIN, "--version", 60).out);
  const Outcome help = run_process(dir, alone.string(), "--help", 30);
  EXPECT_EQ(help.code, 0) << help;
  EXPECT_TRUE(contains(help.out, "validate")) << help;
  const Outcome run_help = run_process(dir, alone.string(), "run --help", 30);
  EXPECT_EQ(run_help.code, 0) << run_help;
  EXPECT_TRUE(contains(run_help.out, "--no-implicit")) << run_help;

  const Outcome ops = run_process(dir, alone.string(), "ops --json", 30);
  ASSERT_EQ(ops.code, 0) << ops;
  EXPECT_EQ(nlohmann::json::parse(ops.out).value("format", ""), "meshsim.ops/1");

  const Outcome render = run_process(dir, alone.string(), "render t.json -o t.dot", 30);
  EXPECT_EQ(render.code, 0) << render;
  EXPECT_GT(fs::file_size(dir / "t.dot"), 100u);
  const Outcome explore = run_process(dir, alone.string(), "explore t.json -o t.html", 30);
  EXPECT_EQ(explore.code, 0) << explore;
  EXPECT_GT(fs::file_size(dir / "t.html"), 1000u);

  // A command that computes with tensors says what is missing (exit 1), and so does render of a
  // scenario, which runs it.
  for (const std::string& args : {"run " + q(kExamples + "tp_rowwise_partial.json"),
                                  "render " + q(kExamples + "tp_rowwise_partial.json") + " -o s.dot",
                                  std::string("check --cases 1")}) {
    const Outcome o = run_process(dir, alone.string(), args, 30);
    EXPECT_EQ(o.code, 1) << args << "\n" << o;
    EXPECT_TRUE(contains(o.err, "needs meshsim-torch")) << o;
  }
  remove_fresh_dir(dir);
}

// Whatever `meshsim` hands over, or refuses itself, reads as the full command's: the same output
// and the same exit code, byte for byte.
TEST(Front, SaysWhatTheFullCommandSays) {
  const fs::path dir = fresh_dir("meshsim_front", "same");
  const std::string pass = q(kExamples + "tp_rowwise_partial.json");
  // A bug's example without its expect block: the run fails (exit 1).
  nlohmann::json doc = nlohmann::json::parse(meshsim::testing::read_text(kExamples + "bugs/tp_bias_every_rank.json"));
  doc.erase("expect");
  std::ofstream(dir / "bug.json") << doc.dump(2);
  const std::string bug = "bug.json";
  struct Case {
    std::string args;
    int code;
  };
  for (const Case& c : {Case{"run " + pass, 0},
                        Case{"run " + bug + " --quiet", 1},
                        Case{"run " + pass + " --json", 0},
                        Case{"run missing.json", 2},
                        Case{"check --cases 0", 2},
                        Case{"render " + pass + " -o s.dot", 0},
                        Case{"render missing.json -o s.dot", 2},
                        Case{"--plugin missing.so ops", 2},
                        Case{"frobnicate", 2}}) {
    const Outcome front = run_process(dir, MESHSIM_BIN, c.args, 120, "_front");
    const Outcome full = run_process(dir, MESHSIM_TORCH_BIN, c.args, 120, "_full");
    EXPECT_EQ(front.code, c.code) << c.args << "\n" << front;
    EXPECT_EQ(front.code, full.code) << c.args;
    EXPECT_EQ(front.err, full.err) << c.args;
    if (!contains(c.args, "--json")) EXPECT_EQ(front.out, full.out) << c.args;
    else EXPECT_EQ(nlohmann::json::parse(front.out).value("status", ""), "pass") << front;
  }
  remove_fresh_dir(dir);
}

// A stream can be read once: render and explore of a pipe hand it over unread (a scenario there
// runs in meshsim-torch), and a trace through a pipe is drawn like its file.
TEST(Front, DrawsAScenarioOrATraceReadFromAPipe) {
  const fs::path dir = fresh_dir("meshsim_front", "pipe");
  const std::string scenario = q(kExamples + "tp_rowwise_partial.json");
  ASSERT_EQ(run_process(dir, MESHSIM_BIN, "run " + scenario + " --trace t.json", 120).code, 0);
  for (const std::string& file : {scenario, std::string("t.json")}) {
    const std::string meshsim = q(MESHSIM_BIN);
    const Outcome render =
        run_process(dir, "sh", "-c " + q("cat " + file + " | " + meshsim + " render /dev/stdin -o p.dot"), 120);
    EXPECT_EQ(render.code, 0) << file << "\n" << render;
    EXPECT_GT(fs::file_size(dir / "p.dot"), 100u);
    const Outcome explore =
        run_process(dir, "sh", "-c " + q("cat " + file + " | " + meshsim + " explore /dev/stdin -o p.html"), 120);
    EXPECT_EQ(explore.code, 0) << file << "\n" << explore;
    fs::remove(dir / "p.dot");
  }
  remove_fresh_dir(dir);
}

}  // namespace

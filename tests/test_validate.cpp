// `meshsim validate` on the Gloo engine (one process per rank, run as real processes here): every
// example agrees with the simulation; a corrupted engine result is caught and located; a killed,
// hung or stopped (SIGSTOP) worker is reported by rank within the timeout, its waiting peers are
// not blamed, and no process or file is left behind, an interrupted coordinator's included;
// workers started by hand meet through a TCP store; the NCCL engine skips cleanly where there is
// no GPU. And (#37 item 6): the workers run the document the coordinator checked, never its path;
// a worker that computes is not hung; a --fault that would inject nothing is refused.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/process_support.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace meshsim::testing;

namespace {

const fs::path kExamples = fs::path(MESHSIM_SOURCE_DIR) / "examples";

// Processes whose command line mentions `part` (a test's private path): none may outlive a run.
std::vector<std::string> processes_mentioning(const std::string& part) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos || pid == std::to_string(getpid())) continue;
    std::string cmdline = read_text(entry.path() / "cmdline");
    for (auto& c : cmdline)
      if (c == '\0') c = ' ';
    if (contains(cmdline, part) && contains(cmdline, "validate")) found.push_back(pid + ": " + cmdline);
  }
  return found;
}

class Validate : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override { dir = fresh_dir("meshsim_test_validate", ::testing::UnitTest::GetInstance()->current_test_info()->name()); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir);
  }
  Outcome meshsim(const std::string& args, int limit_s = 120, const std::string& tag = "") const {
    return run_process(dir, MESHSIM_BIN, args, limit_s, tag);
  }
  // A copy of an example in this test's directory (so its path names this test's processes).
  std::string example(const std::string& name) const {
    fs::copy_file(kExamples / name, dir / name, fs::copy_options::overwrite_existing);
    return (dir / name).string();
  }
  // The TMPDIR of meshsim_in_tmp's runs: the coordinator makes the workers' directory there.
  fs::path tmp() const {
    fs::create_directories(dir / "tmp");
    return dir / "tmp";
  }
  // meshsim with TMPDIR set to tmp(), so that what a run leaves there can be seen.
  Outcome meshsim_in_tmp(const std::string& args, int limit_s = 120, const std::string& tag = "") const {
    return run_process(dir, "env", "TMPDIR=" + q(tmp().string()) + " " + q(MESHSIM_BIN) + " " + args, limit_s, tag);
  }
  std::vector<std::string> left_in_tmp() const {
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(tmp())) left.push_back(e.path().filename().string());
    return left;
  }
  // A run of `file` left no process (a stopped one included) and nothing in TMPDIR.
  void expect_nothing_left(const std::string& file, const std::string& report) const {
    const std::vector<std::string> left = processes_mentioning(file);
    EXPECT_TRUE(left.empty()) << json(left).dump();
    EXPECT_TRUE(left_in_tmp().empty()) << json(left_in_tmp()).dump() << report;
  }
};

// The line of a rank in a report ("rank 2: ..."), or "" when there is none.
std::string line_of(const std::string& out, int rank) {
  const std::string key = "  rank " + std::to_string(rank) + ": ";
  const auto at = out.find(key);
  return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
}

// What blames a rank in a report: a healthy rank's line holds none of these.
bool blames(const std::string& line) {
  for (const char* word : {"hung", "SIGSTOP", "died", "not responding", "debugger"})
    if (contains(line, word)) return true;
  return false;
}

// Ranks 0, 2 and 3 of a report each have an error line that says `where` (their wait) and that
// they waited for rank 1, and blames none of them.
void expect_peers_wait_for_rank_1(const Outcome& o, const std::string& where) {
  for (int peer : {0, 2, 3}) {
    const std::string line = line_of(o.out, peer);
    EXPECT_TRUE(contains(line, "rank " + std::to_string(peer) + ": error: ")) << o;
    EXPECT_TRUE(contains(line, where)) << line;
    EXPECT_TRUE(contains(line, "for rank 1")) << line;
    EXPECT_FALSE(blames(line)) << line;
  }
}

// A C++ backtrace, which libtorch's errors carry after their message.
bool has_backtrace(const std::string& text) { return contains(text, "frame #") || contains(text, "Exception raised from"); }

// Every bundled example, one worker process per rank of its mesh (2 to 8: the 2x2 meshes among
// them, and the transformer step on dp=2 x cp=2 x tp=2): the same exit code as `meshsim run`, and
// every rank agrees with the simulation.
class EveryExample : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryExample, ValidatesOnGloo) {
  const fs::path d = fresh_dir("meshsim_test_validate", "example_" + GetParam());
  const std::string file = (kExamples / (GetParam() + ".json")).string();
  const Outcome run = run_process(d, MESHSIM_BIN, "run " + q(file), 120, "run");
  const Outcome v = run_process(d, MESHSIM_BIN, "validate " + q(file) + " --backend gloo", 120, "validate");
  // An example whose expect block records its exit code (an illegal one, exit 3) makes `run` exit 0
  // when it is met: the run's own code is the recorded one.
  const nlohmann::json doc = nlohmann::json::parse(read_text(file));
  const int own = doc.contains("expect") && doc["expect"].contains("exit") ? doc["expect"]["exit"].get<int>() : run.code;
  EXPECT_EQ(run.code, 0) << run;
  EXPECT_EQ(v.code, own) << v;
  if (own == 0) {
    EXPECT_TRUE(contains(v.out, "status: pass")) << v;
    EXPECT_FALSE(contains(v.out, ": fail")) << v;
  } else {
    EXPECT_EQ(own, 3) << run;  // an illegal scenario has nothing to validate
  }
  if (!HasFailure()) fs::remove_all(d);
}

std::vector<std::string> example_names() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(kExamples))
    if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

INSTANTIATE_TEST_SUITE_P(Examples, EveryExample, ::testing::ValuesIn(example_names()),
                         [](const auto& info) { return info.param; });

TEST_F(Validate, TheExamplesCoverEveryCollectiveAndATwoByTwoMesh) {
  // So that "every example validates" means something: between them the examples run each
  // collective (their golden results list the collectives a run makes, test_examples keeps them
  // current) and include 2x2 meshes.
  std::set<std::string> ran;
  bool two_by_two = false;
  for (const auto& name : example_names()) {
    const json doc = json::parse(read_text(kExamples / (name + ".json")));
    two_by_two |= doc["mesh"]["shape"] == json::parse("[2, 2]");
    const json result = json::parse(read_text(fs::path(MESHSIM_SOURCE_DIR) / "tests/golden/results" / (name + ".json")));
    for (const auto& c : result.value("collectives", json::array()))
      if (c.is_object()) ran.insert(c.value("op", ""));
  }
  EXPECT_TRUE(two_by_two);
  for (const char* c : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}) EXPECT_TRUE(ran.count(c)) << c;
}

TEST_F(Validate, ACorruptedEngineResultIsCaughtAndLocated) {
  const Outcome o = meshsim("validate " + q(example("fsdp_reduced.json")) + " --fault corrupt:2:1");
  EXPECT_EQ(o.code, 1) << o;
  EXPECT_TRUE(contains(o.out, "rank 2: fail")) << o;
  EXPECT_TRUE(contains(o.out, "first difference at event")) << o;
  EXPECT_TRUE(contains(o.out, "all_gather")) << o;
  EXPECT_TRUE(contains(o.out, "rank 0: pass")) << o;
  EXPECT_TRUE(contains(o.out, "status: fail")) << o;
}

// Training steps (examples/hsdp_adamw_clip.json: 3 AdamW steps of 2 microbatches, clip_grad_norm):
// the steps after the first backward run on the engine too, every parameter and optimizer state of
// every step is compared, and a result corrupted in a later step's collective is caught.
TEST_F(Validate, TrainingStepsRunOnTheEngineAndACorruptedStepIsCaught) {
  const Outcome ok = meshsim("validate " + q(example("hsdp_adamw_clip.json")));
  EXPECT_EQ(ok.code, 0) << ok;
  EXPECT_TRUE(contains(ok.out, "18 parameters and optimizer states after the training steps")) << ok;
  EXPECT_TRUE(contains(ok.out, "39 collectives on gloo")) << ok;  // 6 in the checked run's forward and backward
  const Outcome bad = meshsim("validate " + q(example("hsdp_adamw_clip.json")) + " --fault corrupt:1:30");
  EXPECT_EQ(bad.code, 1) << bad;
  EXPECT_TRUE(contains(bad.out, "rank 1: fail")) << bad;
  EXPECT_TRUE(contains(bad.out, "status: fail")) << bad;
}

TEST_F(Validate, ACustomFunctionsOwnCollectiveGoesThroughTheEngine) {
  // opaque_all_reduce sums inside a user kernel: on the engine, rank 1's sum is the engine's.
  const Outcome o = meshsim("validate " + q(example("lm_call_opaque_all_reduce.json")) + " --fault corrupt:1:1");
  EXPECT_EQ(o.code, 1) << o;
  EXPECT_TRUE(contains(o.out, "rank 1: fail")) << o;
  EXPECT_TRUE(contains(o.out, "first difference at event 2 (forward op call opaque_all_reduce")) << o;
}

TEST_F(Validate, AKilledWorkerIsReportedByRankAndNothingIsLeft) {
  const std::string file = example("fsdp_reduced.json");
  const Outcome o = meshsim_in_tmp("validate " + q(file) + " --fault kill:1:2 --timeout 20");
  EXPECT_EQ(o.code, 4) << o;
  EXPECT_LT(o.seconds, 20) << o;  // reported when it dies, not at the timeout
  EXPECT_TRUE(contains(o.out, "rank 1: error: died (signal 9")) << o;
  EXPECT_TRUE(contains(o.out, "after collective #1")) << o;
  EXPECT_TRUE(contains(o.out, "status: error")) << o;
  expect_nothing_left(file, o.out + o.err);
  EXPECT_FALSE(contains(o.out + o.err, "kept in")) << o;
}

TEST_F(Validate, AHungWorkerIsReportedWithinTheTimeoutAndNothingIsLeft) {
  const std::string file = example("fsdp_reduced.json");
  const Outcome o = meshsim_in_tmp("validate " + q(file) + " --fault hang:1:2 --timeout 3", 60);
  EXPECT_EQ(o.code, 4) << o;
  EXPECT_LT(o.seconds, 30) << o;
  // The hung rank left collective 1 and never entered 2; a peer timed out in 2.
  EXPECT_TRUE(contains(o.out, "rank 1: error: hung after collective #1: never entered its next collective")) << o;
  // Its peers are each either timed out in collective 2 or stopped there (which, is a race), and
  // say that they waited for rank 1.
  expect_peers_wait_for_rank_1(o, "collective #2");
  EXPECT_TRUE(contains(o.out, "timed out")) << o;
  expect_nothing_left(file, o.out + o.err);
}

TEST_F(Validate, AStoppedWorkerIsNamedAndItsPeersAreNotBlamed) {
  // Rank 1 stops itself (SIGSTOP) before its second collective: the whole process freezes, its
  // heartbeat too. Its peers wait in collective 2 for it until the timeout.
  const std::string file = example("fsdp_reduced.json");
  const Outcome o = meshsim_in_tmp("validate " + q(file) + " --fault stop:1:2 --timeout 2", 60);
  EXPECT_EQ(o.code, 4) << o;
  EXPECT_LT(o.seconds, 30) << o;
  EXPECT_TRUE(contains(o.out, "rank 1: error: stopped (SIGSTOP) after collective #1")) << o;
  expect_peers_wait_for_rank_1(o, "waiting in collective #2");
  EXPECT_TRUE(contains(o.out, "status: error")) << o;
  EXPECT_FALSE(has_backtrace(o.out + o.err)) << o;
  expect_nothing_left(file, o.out + o.err);
}

TEST_F(Validate, RanksWaitingInTheClosingBarrierAreNotBlamedForAStoppedPeer) {
  // On dp=2 x tp=2 the collectives go over dp, groups {0,2} and {1,3}: with rank 1 stopped at its
  // second collective, rank 3 waits there for it, while ranks 0 and 2 finish theirs and wait in the
  // closing barrier for ranks 1 and 3. Their last collective is behind them; they are not hung.
  const std::string file = example("fsdp_tp_2d.json");
  const Outcome o = meshsim_in_tmp("validate " + q(file) + " --fault stop:1:2 --timeout 2 --json", 60);
  ASSERT_EQ(o.code, 4) << o;
  const json r = json::parse(o.out);
  EXPECT_EQ(r["status"], "error");
  ASSERT_EQ(r["rank_results"].size(), 4u) << o;
  const json& stopped = r["rank_results"][1]["error"];
  EXPECT_EQ(stopped["kind"], "suspended") << stopped;
  EXPECT_TRUE(contains(stopped["message"].get<std::string>(), "stopped (SIGSTOP) after collective #1")) << stopped;
  const std::map<int, json> waits{{0, json{1, 3}}, {2, json{1, 3}}, {3, json{1}}};
  for (const auto& [rank, waited] : waits) {
    const json& e = r["rank_results"][rank]["error"];
    EXPECT_TRUE(e["kind"] == "stopped" || e["kind"] == "engine_failure") << e;
    EXPECT_EQ(e["waiting_for"], waited) << e;
    const std::string message = e["message"].get<std::string>();
    EXPECT_FALSE(blames(message)) << message;
    EXPECT_TRUE(contains(message, rank == 3 ? "collective #2" : "the closing barrier")) << message;
  }
  EXPECT_FALSE(has_backtrace(o.out + o.err)) << o;
  expect_nothing_left(file, o.out + o.err);
}

TEST_F(Validate, TheWorkersDirectoryIsRemovedWhateverTheOutcomeAndKeptOnlyWithKeep) {
  const std::string file = example("fsdp_reduced.json");
  Outcome o = meshsim_in_tmp("validate " + q(file), 120, "pass");
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(left_in_tmp().empty()) << json(left_in_tmp()).dump() << o;
  o = meshsim_in_tmp("validate " + q(file) + " --fault corrupt:2:1", 120, "fail");
  EXPECT_EQ(o.code, 1) << o;
  EXPECT_TRUE(left_in_tmp().empty()) << json(left_in_tmp()).dump() << o;
  // With --keep, an engine failure's directory stays, named, with each worker's files.
  o = meshsim_in_tmp("validate " + q(file) + " --fault kill:1:1 --keep", 120, "keep");
  EXPECT_EQ(o.code, 4) << o;
  const std::vector<std::string> left = left_in_tmp();
  ASSERT_EQ(left.size(), 1u) << json(left).dump() << o;
  EXPECT_TRUE(contains(o.out, "workers' files kept in " + (tmp() / left[0]).string())) << o;
  EXPECT_TRUE(fs::exists(tmp() / left[0] / "rank1.progress")) << o;
}

TEST_F(Validate, AnInterruptedCoordinatorStopsItsWorkersAndRemovesTheirFiles) {
  // SIGTERM once the workers are past their first collective (rank 1 then hangs, so the run would
  // otherwise last the timeout): the coordinator stops them, removes their directory, and dies of
  // the signal.
  const std::string file = example("fsdp_reduced.json");
  const fs::path tmpdir = tmp(), out = dir / ".stdout_interrupted";
  // Made before fork: the child only opens, duplicates and execs.
  std::vector<std::string> env{"TMPDIR=" + tmpdir.string()};
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("TMPDIR=", 0) != 0) env.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execle(MESHSIM_BIN, MESHSIM_BIN, "validate", file.c_str(), "--fault", "hang:1:2", "--timeout", "60", nullptr,
             envp.data());
    ::_exit(127);
  }
  auto past_first_collective = [&] {
    for (const auto& e : fs::directory_iterator(tmpdir))
      if (contains(read_text(e.path() / "rank0.progress"), "after collective #1")) return true;
    return false;
  };
  const auto start = std::chrono::steady_clock::now();
  while (!past_first_collective() && std::chrono::steady_clock::now() - start < std::chrono::seconds(90))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(past_first_collective()) << read_text(out);
  ::kill(pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 300 && ::waitpid(pid, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (::waitpid(pid, &status, WNOHANG) == 0) {  // still there after 30 s: a failure, not a leftover
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the coordinator outlived SIGTERM by 30 s";
  }
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status << "\n" << read_text(out);
  EXPECT_TRUE(contains(read_text(out), "interrupted")) << read_text(out);
  expect_nothing_left(file, read_text(out));
}

// A coordinator killed by SIGKILL cannot remove its workers' directory (its workers die with it);
// the next validate of this host removes it (#37, item 8), and leaves its own name for the next.
TEST_F(Validate, ASigkilledCoordinatorsDirectoryIsRemovedByTheNextRun) {
  const std::string file = example("fsdp_reduced.json");
  const std::string script =
      "export TMPDIR=" + q(tmp().string()) + "; " + q(MESHSIM_BIN) + " validate " + q(file) +
      " --fault hang:1:2 --timeout 60 & pid=$!; "
      "for i in $(seq 600); do ls \"$TMPDIR\"/meshsim-validate-*/rank0.progress >/dev/null 2>&1 && break; sleep 0.1; done; "
      "kill -9 $pid; wait $pid; exit 0";
  Outcome killed = run_process(dir, "/bin/bash", "-c " + q(script), 90, "killed");
  ASSERT_EQ(killed.code, 0) << killed;
  ASSERT_EQ(left_in_tmp().size(), 1u) << json(left_in_tmp()).dump() << killed;
  const Outcome o = meshsim_in_tmp("validate " + q(file), 120, "next");
  EXPECT_EQ(o.code, 0) << o;
  expect_nothing_left(file, o.out);
}

TEST_F(Validate, EngineMessagesCarryNoBacktrace) {
  // A worker started by hand whose peers never come: its rendezvous times out in libtorch, whose
  // error carries a C++ backtrace after its first line. The verdict keeps the first line only.
  const std::string file = example("fsdp_reduced.json");
  const Outcome o = meshsim("validate " + q(file) + " --rank 1 --ranks 4 --store " + q((dir / "store").string()) +
                            " --timeout 1 --json");
  EXPECT_EQ(o.code, 4) << o;
  const json v = json::parse(o.out);
  EXPECT_EQ(v["error"]["kind"], "engine_failure") << v;
  const std::string message = v["error"]["message"].get<std::string>();
  EXPECT_TRUE(contains(message, "gloo rendezvous failed: ")) << message;
  // libtorch's words vary by version ("Timeout waiting for key" in 1.13, "Wait timeout" in 2.x).
  std::string lower = message;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  EXPECT_TRUE(contains(lower, "timeout")) << message;
  EXPECT_FALSE(contains(message, "\n")) << message;
  EXPECT_FALSE(has_backtrace(o.out)) << o;
}

TEST_F(Validate, NonIntegerDataAgreeWithinTheStatedTolerance) {
  json doc = json::parse(read_text(kExamples / "fsdp_reduced.json"));
  for (auto& in : doc["inputs"]) in["init"] = "randn";
  std::ofstream(dir / "randn.json") << doc.dump(2);
  const Outcome o = meshsim("validate " + q((dir / "randn.json").string()) + " --json");
  ASSERT_EQ(o.code, 0) << o;
  const json r = json::parse(o.out);
  EXPECT_EQ(r["format"], "meshsim.validate/1");
  EXPECT_EQ(r["status"], "pass");
  ASSERT_EQ(r["rank_results"].size(), 4u);
  for (const auto& v : r["rank_results"]) {
    EXPECT_FALSE(v["exact"].get<bool>()) << v;  // the gradient's reduce_scatter sums non-integers
    EXPECT_TRUE(v["tolerance"].is_object()) << v;
  }
}

TEST_F(Validate, UnevenAndEmptyPiecesCrossGloo) {
  // 5 rows over 4 ranks (torch.chunk: 2, 2, 1, 0) gathered; 6 columns moved to rows by an
  // all_to_all (pieces 2, 2, 2, 0 one way, 2, 2, 1, 1 the other); the gradients go back the same way.
  const json doc = json::parse(R"json({"format": "meshsim.scenario/1", "name": "uneven_gather",
    "mesh": {"axes": ["dp"], "shape": [4]},
    "inputs": [{"name": "x", "shape": [5, 3], "placements": ["S(0)"], "requires_grad": true},
               {"name": "y", "shape": [6, 3], "placements": ["S(1)"], "requires_grad": true}],
    "program": [{"out": "xr", "op": "redistribute", "args": ["x"], "placements": ["R"]},
                {"out": "yr", "op": "redistribute", "args": ["y"], "placements": ["S(0)"]},
                {"out": "ys", "op": "redistribute", "args": ["yr"], "placements": ["R"]},
                {"out": "s1", "op": "sum", "args": ["xr"]},
                {"out": "s2", "op": "sum", "args": ["ys"]},
                {"out": "loss", "op": "add", "args": ["s1", "s2"]}],
    "backward": "loss"})json");
  std::ofstream(dir / "uneven.json") << doc.dump(2);
  const Outcome o = meshsim("validate " + q((dir / "uneven.json").string()));
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "rank 3: pass: 8 values and 2 gradients, 10 equal bit for bit; 4 collectives")) << o;
}

TEST_F(Validate, SplitSizesAllToAllCrossesGlooWithEmptyPieces) {
  // all_to_all with split sizes (all_to_all_single's alltoallv): 2 rows over 4 ranks, so ranks 2
  // and 3 send nothing and most pieces are empty; each row goes to the rank its id names and comes
  // back by the swapped sizes, scaled there by that rank's row of w. The counts cross as int64.
  // Seed 2: rank 0's row goes to rank 0, rank 1's to rank 3.
  const json doc = json::parse(R"json({"format": "meshsim.scenario/1", "name": "split_sizes",
    "mesh": {"axes": ["ep"], "shape": [4]}, "options": {"seed": 2},
    "inputs": [{"name": "x", "shape": [2, 3], "placements": ["S(0)"], "requires_grad": true},
               {"name": "dest", "shape": [2], "placements": ["S(0)"], "dtype": "int64", "init": {"ids": 4}},
               {"name": "w", "shape": [4, 3], "placements": ["S(0)"], "requires_grad": true},
               {"name": "ranks", "shape": [4], "placements": ["R"], "dtype": "int64", "init": "arange"}],
    "program": [{"out": "y", "op": "local_map", "args": ["x", "dest", "w", "ranks"], "out_placements": [["S(0)"]],
      "body": [{"out": "zero_n", "op": "mul", "args": ["ranks"], "value": 0},
               {"out": "zero_rows", "op": "mul", "args": ["dest"], "value": 0},
               {"out": "one", "op": "add", "args": ["zero_rows"], "value": 1},
               {"out": "counts", "op": "scatter_add", "args": ["zero_n", "dest", "one"], "dim": 0},
               {"out": "recv", "op": "all_to_all", "args": ["counts"], "axis": "ep"},
               {"out": "there", "op": "all_to_all", "args": ["x", "counts", "recv"], "axis": "ep"},
               {"out": "scaled", "op": "mul", "args": ["there", "w"]},
               {"out": "back", "op": "all_to_all", "args": ["scaled", "recv", "counts"], "axis": "ep"}],
      "returns": ["back"]},
      {"out": "loss", "op": "sum", "args": ["y"]}],
    "backward": "loss"})json");
  std::ofstream(dir / "split.json") << doc.dump(2);
  const Outcome o = meshsim("validate " + q((dir / "split.json").string()));
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "rank 3: pass")) << o;
  EXPECT_TRUE(contains(o.out, "status: pass")) << o;
  // The engine's result is what the rank computes from: corrupted at the move there (rank 0's
  // second collective, after the counts' exchange), rank 0 fails there.
  const Outcome bad = meshsim("validate " + q((dir / "split.json").string()) + " --fault corrupt:0:2");
  EXPECT_EQ(bad.code, 1) << bad;
  EXPECT_TRUE(contains(bad.out, "rank 0: fail")) << bad;
  EXPECT_TRUE(contains(bad.out, "first difference at event 15 (forward collective all_to_all -> there over ep)")) << bad;
}

TEST_F(Validate, BoolAndInt64LocalsCrossGloo) {
  // Gloo takes no bool tensor ("Invalid scalar type"): a mask travels as uint8 and comes back as
  // bool. Int64 ids go as they are: gathered, moved by an all_to_all, gathered again, then looked
  // up; a bool made by a creation op and a bool input are gathered and meet in a where.
  const json doc = json::parse(R"json({"format": "meshsim.scenario/1", "name": "int_bool_collectives",
    "mesh": {"axes": ["dp"], "shape": [4]},
    "inputs": [{"name": "flags", "shape": [6, 8], "placements": ["S(1)"], "dtype": "bool"},
               {"name": "ids", "shape": [8, 4], "placements": ["S(0)"], "dtype": "int64", "init": {"ids": 6}},
               {"name": "emb", "shape": [6, 3], "placements": ["R"], "requires_grad": true}],
    "program": [{"out": "flags_r", "op": "redistribute", "args": ["flags"], "placements": ["R"]},
                {"out": "mask", "op": "ones", "shape": [8, 6], "placements": ["S(0)"], "dtype": "bool"},
                {"out": "mask_r", "op": "redistribute", "args": ["mask"], "placements": ["R"]},
                {"out": "mask_t", "op": "transpose", "args": ["mask_r"], "dim0": 0, "dim1": 1},
                {"out": "both", "op": "where", "args": ["flags_r", "mask_t", "flags_r"]},
                {"out": "ids_t", "op": "redistribute", "args": ["ids"], "placements": ["S(1)"]},
                {"out": "ids_r", "op": "redistribute", "args": ["ids_t"], "placements": ["R"]},
                {"out": "h", "op": "embedding", "args": ["ids_r", "emb"]},
                {"out": "z", "op": "zeros", "shape": [6, 8], "placements": ["R"]},
                {"out": "fill", "op": "masked_fill", "args": ["z", "both"], "value": 1.0},
                {"out": "s1", "op": "sum", "args": ["h"]},
                {"out": "s2", "op": "sum", "args": ["fill"]},
                {"out": "loss", "op": "add", "args": ["s1", "s2"]}],
    "backward": "loss"})json");
  std::ofstream(dir / "int_bool.json") << doc.dump(2);
  const std::string file = (dir / "int_bool.json").string();
  Outcome o = meshsim("validate " + q(file));
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "status: pass")) << o;
  EXPECT_TRUE(contains(o.out, "rank 3: pass")) << o;
  EXPECT_TRUE(contains(o.out, "4 collectives on gloo (every sum over integers: exact)")) << o;
  // A corrupted bool (the first collective: flags' all_gather) is caught, as a float would be.
  o = meshsim("validate " + q(file) + " --fault corrupt:2:1");
  EXPECT_EQ(o.code, 1) << o;
  EXPECT_TRUE(contains(o.out, "rank 2: fail")) << o;
  EXPECT_TRUE(contains(o.out, "first difference at event")) << o;
  EXPECT_TRUE(contains(o.out, "flags_r")) << o;
  EXPECT_TRUE(contains(o.out, "rank 0: pass")) << o;
}

TEST_F(Validate, Float32RunsOnGlooToo) {
  const Outcome o = meshsim("validate " + q(example("fsdp_tp_2d.json")) + " --option dtype=float32");
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "status: pass")) << o;
}

TEST_F(Validate, WorkersStartedByHandMeetThroughATcpStore) {
  const std::string file = example("q1_shard_reduced_2d.json");
  const int port = 20000 + static_cast<int>(std::random_device{}() % 30000);
  std::vector<std::thread> threads;
  std::vector<Outcome> outcomes(4);
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      outcomes[r] = meshsim("validate " + q(file) + " --rank " + std::to_string(r) + " --ranks 4 --master-addr 127.0.0.1 --master-port " +
                                std::to_string(port) + " --hostname 127.0.0.1 --timeout 30",
                            90, std::to_string(r));
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(outcomes[r].code, 0) << outcomes[r];
    EXPECT_TRUE(contains(outcomes[r].out, "rank " + std::to_string(r) + ": pass")) << outcomes[r];
  }
}

// #37 item 6: the workers run the document the coordinator read and checked, never the path again.
// A pipe's path (process substitution) names nothing a worker could open (every worker failed to
// parse /dev/fd/63, exit 4).
TEST_F(Validate, APipedScenarioValidates) {
  const Outcome o = run_process(dir, "/bin/bash", "-c " + q(q(MESHSIM_BIN) + " validate <(cat " + q(example("fsdp_reduced.json")) + ")"), 120);
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "validate /dev/fd/")) << o;
  EXPECT_TRUE(contains(o.out, "rank 3: pass")) << o;
  EXPECT_TRUE(contains(o.out, "status: pass")) << o;
}

// The file replaced by garbage as soon as the coordinator, having read and simulated it, makes the
// workers' directory: the workers (starting libtorch then) run what it checked, and pass; they
// read the garbage before (exit 4, every rank "invalid JSON").
TEST_F(Validate, AFileChangedMidRunIsNotWhatTheWorkersRun) {
  const std::string file = example("fsdp_reduced.json");
  const std::string script =
      "export TMPDIR=" + q(tmp().string()) + "; " + q(MESHSIM_BIN) + " validate " + q(file) + " & pid=$!; "
      "for i in $(seq 10000); do ls -d \"$TMPDIR\"/meshsim-validate-* >/dev/null 2>&1 && break; sleep 0.002; done; "
      "echo 'not a scenario' > " + q(file + ".new") + " && mv " + q(file + ".new") + " " + q(file) + "; wait $pid";
  const Outcome o = run_process(dir, "/bin/bash", "-c " + q(script), 120);
  EXPECT_EQ(read_text(file), "not a scenario\n");
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "status: pass")) << o;
  EXPECT_FALSE(contains(o.out, "invalid JSON")) << o;
  expect_nothing_left(file, o.out + o.err);
}

// A valid scenario whose worker computes for longer than the timeout and its grace before its
// first wait (it simulates the scenario twice before the rendezvous: 450 matrix products of
// 64x4096 by 4096x64, about 16 s on 2 loaded cores): alive and computing, not hung. It was reported
// "hung: no rank started a collective for 11 s", exit 4, though the worker was busy. One rank, so
// that no peer's wait (which --timeout 1 also bounds) depends on how far two loaded workers drift.
TEST_F(Validate, AWorkerComputingLongerThanTheTimeoutIsNotHung) {
  json doc = json::parse(R"json({"format": "meshsim.scenario/1", "name": "slow_products",
    "mesh": {"axes": ["dp"], "shape": [1]},
    "inputs": [{"name": "x", "shape": [64, 4096], "placements": ["R"]},
               {"name": "w", "shape": [4096, 64], "placements": ["R"]}],
    "program": []})json");
  for (int i = 0; i < 450; ++i) doc["program"].push_back({{"out", "y" + std::to_string(i)}, {"op", "mm"}, {"args", {"x", "w"}}});
  std::ofstream(dir / "slow.json") << doc.dump();
  const std::string file = (dir / "slow.json").string();
  const Outcome o = meshsim_in_tmp("validate " + q(file) + " --timeout 1", 300);
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "rank 0: pass")) << o;
  EXPECT_TRUE(contains(o.out, "status: pass")) << o;
  EXPECT_FALSE(contains(o.out, "hung")) << o;
  expect_nothing_left(file, o.out + o.err);
}

// A fault that would inject nothing is refused before any worker starts (it ran, passed and
// injected nothing), and a spec is parsed strictly (kill:1:2junk was kill:1:2).
TEST_F(Validate, AFaultThatWouldInjectNothingIsRefused) {
  const std::string file = example("fsdp_reduced.json");  // 4 ranks, 2 collectives each
  const std::map<std::string, std::string> refused{
      {"kill:9:1", "rank 9 is not a rank of the mesh (dp=4: ranks 0 to 3)"},
      {"kill:4:1", "rank 4 is not a rank of the mesh"},
      {"corrupt:1:3", "rank 1 takes part in 2 collectives in this scenario, so its collective #3 never comes"},
      {"kill:1:2junk", "RANK and AT are whole decimal numbers"},
      {"kill:1junk:2", "RANK and AT are whole decimal numbers"},
      {"kill: 1:2", "RANK and AT are whole decimal numbers"},
      {"kill:+1:2", "RANK and AT are whole decimal numbers"},
      {"kill:1:", "RANK and AT are whole decimal numbers"},
      {"kill:1:99999999999999999999", "RANK and AT are whole decimal numbers"},
      {"kill:1:2:3", "expected kill:RANK:AT"},
      {"kill:1:0", "RANK >= 0 and AT >= 1"}};
  for (const auto& [fault, why] : refused) {
    const Outcome o = meshsim_in_tmp("validate " + q(file) + " --fault " + q(fault), 60, "coordinator");
    EXPECT_EQ(o.code, 2) << fault << "\n" << o;
    EXPECT_TRUE(contains(o.err, "--fault: fault \"" + fault + "\": " + why)) << o;
    EXPECT_TRUE(o.out.empty()) << o;  // no worker started, no report
  }
  // A worker started by hand refuses it too, in its verdict, before it meets its peers.
  const Outcome w = meshsim("validate " + q(file) + " --rank 1 --ranks 4 --store " + q((dir / "store").string()) +
                            " --fault corrupt:1:3 --json", 60, "worker");
  EXPECT_EQ(w.code, 2) << w;
  EXPECT_EQ(json::parse(w.out)["error"]["kind"], "invalid_input") << w;
  EXPECT_TRUE(contains(w.out, "its collective #3 never comes")) << w;
  // A fault at a rank's last collective is injected: the limit is the count, not one before it.
  const Outcome last = meshsim("validate " + q(file) + " --fault corrupt:1:2", 120, "last");
  EXPECT_EQ(last.code, 1) << last;
  EXPECT_TRUE(contains(last.out, "rank 1: fail")) << last;
  expect_nothing_left(file, "");
}

TEST_F(Validate, BadRequestsAreUnusableInput) {
  Outcome o = meshsim("validate " + q(example("fsdp_reduced.json")) + " --ranks 8");
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(contains(o.err, "fsdp_reduced.json: /mesh/shape:")) << o;
  EXPECT_TRUE(contains(o.err, "--ranks asks for 8")) << o;
  o = meshsim("validate " + q(example("fsdp_reduced.json")) + " --fault explode:1:1");
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(contains(o.err, "kill:RANK:AT")) << o;
  EXPECT_TRUE(contains(o.err, "stop:RANK:AT")) << o;
  o = meshsim("validate " + q(example("fsdp_reduced.json")) + " --backend mpi");
  EXPECT_EQ(o.code, 2) << o;
  o = meshsim("validate " + q(example("fsdp_reduced.json")) + " --rank 1");
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(contains(o.err, "--store")) << o;
}

TEST_F(Validate, NcclSkipsCleanlyWithoutGpus) {
  const Outcome o = meshsim("validate " + q(example("fsdp_reduced.json")) + " --backend nccl");
  EXPECT_TRUE(processes_mentioning(dir.string()).empty());
  if (o.code == 0) {  // a machine with 4 GPUs or more
    EXPECT_TRUE(contains(o.out, "status: pass")) << o;
    return;
  }
  EXPECT_EQ(o.code, 5) << o;
  EXPECT_TRUE(contains(o.out, "on nccl: skipped: ")) << o;
}

// Local code's collectives over an axis of one rank (a psum over dp=1) go through the engine, which
// has a communicator for a group of one (found on the GPU: every such example of one rank stopped
// with "no communicator for meshsim/group/0" on NCCL and on Gloo alike). On NCCL where a GPU is.
TEST_F(Validate, CollectivesOverAOneRankAxisRunOnTheEngine) {
  json doc = json::parse(read_text(kExamples / "lm_data_parallel.json"));
  doc["mesh"]["shape"] = json::array({1});
  std::ofstream(dir / "one_rank.json") << doc.dump(2);
  const std::string file = (dir / "one_rank.json").string();
  for (const std::string backend : {"gloo", "nccl"}) {
    const Outcome o = meshsim("validate " + q(file) + " --backend " + backend);
    if (backend == "nccl" && o.code == 5) continue;  // no GPU here
    EXPECT_EQ(o.code, 0) << o;
    EXPECT_TRUE(contains(o.out, "rank 0: pass")) << o;
    EXPECT_FALSE(contains(o.out, " 0 collectives on " + backend)) << o;
    EXPECT_TRUE(contains(o.out, "status: pass")) << o;
  }
}

// What one GPU can validate on NCCL: a one-rank mesh (scripts/gpu_check.sh runs this test there).
// Skipped, with NCCL's reason, on a machine without a GPU or a build without NCCL.
TEST_F(Validate, NcclValidatesAOneRankMeshOnAGpu) {
  const fs::path file = kExamples / "regressions" / "gelu_strided_grad_float32.json";
  const Outcome o = meshsim("validate " + q(file.string()) + " --backend nccl");
  EXPECT_TRUE(processes_mentioning(dir.string()).empty());
  if (o.code == 5) GTEST_SKIP() << "no GPU for NCCL here: " << o.out;
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "validate " + file.string() + " on nccl: 1 worker processes")) << o;
  EXPECT_TRUE(contains(o.out, "rank 0: pass: 6 values and 1 gradient, 7 equal bit for bit")) << o;
  EXPECT_TRUE(contains(o.out, "status: pass")) << o;
}

}  // namespace

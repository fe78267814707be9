// `meshsim validate` on the Gloo engine (one process per rank, run as real processes here): every
// example agrees with the simulation; a corrupted engine result is caught and located; a killed or
// hung worker is reported by rank within the timeout and no process is left behind; workers started
// by hand meet through a TCP store; the NCCL engine skips cleanly where there is no GPU.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <algorithm>
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
  // Removes the directory a failed run kept, named in its output.
  static void remove_kept(const Outcome& o) {
    const std::string key = "workers' files kept in ";
    const auto at = o.out.find(key);
    if (at == std::string::npos) return;
    const auto end = o.out.find('\n', at);
    fs::remove_all(o.out.substr(at + key.size(), end - at - key.size()));
  }
};

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

TEST_F(Validate, ACustomFunctionsOwnCollectiveGoesThroughTheEngine) {
  // opaque_all_reduce sums inside a user kernel: on the engine, rank 1's sum is the engine's.
  const Outcome o = meshsim("validate " + q(example("lm_call_opaque_all_reduce.json")) + " --fault corrupt:1:1");
  EXPECT_EQ(o.code, 1) << o;
  EXPECT_TRUE(contains(o.out, "rank 1: fail")) << o;
  EXPECT_TRUE(contains(o.out, "first difference at event 2 (forward op call opaque_all_reduce")) << o;
}

TEST_F(Validate, AKilledWorkerIsReportedByRankAndNothingIsLeft) {
  const std::string file = example("fsdp_reduced.json");
  const Outcome o = meshsim("validate " + q(file) + " --fault kill:1:2 --timeout 20");
  remove_kept(o);
  EXPECT_EQ(o.code, 4) << o;
  EXPECT_LT(o.seconds, 20) << o;  // reported when it dies, not at the timeout
  EXPECT_TRUE(contains(o.out, "rank 1: error: died (signal 9")) << o;
  EXPECT_TRUE(contains(o.out, "after collective #1")) << o;
  EXPECT_TRUE(contains(o.out, "status: error")) << o;
  const std::vector<std::string> left = processes_mentioning(file);
  EXPECT_TRUE(left.empty()) << json(left).dump();
}

TEST_F(Validate, AHungWorkerIsReportedWithinTheTimeoutAndNothingIsLeft) {
  const std::string file = example("fsdp_reduced.json");
  const Outcome o = meshsim("validate " + q(file) + " --fault hang:1:2 --timeout 3", 60);
  remove_kept(o);
  EXPECT_EQ(o.code, 4) << o;
  EXPECT_LT(o.seconds, 30) << o;
  // The hung rank left collective 1 and never entered 2; a peer timed out in 2.
  EXPECT_TRUE(contains(o.out, "rank 1: error: hung after collective #1: never entered its next collective")) << o;
  // Its peers are each either timed out in collective 2 or stopped there (which, is a race).
  for (const char* peer : {"rank 0: error: ", "rank 2: error: ", "rank 3: error: "}) {
    const auto at = o.out.find(peer);
    ASSERT_NE(at, std::string::npos) << o;
    const std::string line = o.out.substr(at, o.out.find('\n', at) - at);
    EXPECT_TRUE(contains(line, "timed out") || contains(line, "still running in collective #2")) << line;
  }
  EXPECT_TRUE(contains(o.out, "timed out")) << o;
  const std::vector<std::string> left = processes_mentioning(file);
  EXPECT_TRUE(left.empty()) << json(left).dump();
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

TEST_F(Validate, BadRequestsAreUnusableInput) {
  Outcome o = meshsim("validate " + q(example("fsdp_reduced.json")) + " --ranks 8");
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(contains(o.err, "fsdp_reduced.json: /mesh/shape:")) << o;
  EXPECT_TRUE(contains(o.err, "--ranks asks for 8")) << o;
  o = meshsim("validate " + q(example("fsdp_reduced.json")) + " --fault explode:1:1");
  EXPECT_EQ(o.code, 2) << o;
  EXPECT_TRUE(contains(o.err, "kill:RANK:AT")) << o;
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

}  // namespace

// Long programs (issue #37, item 10): `meshsim run` of a 100,000-op chain in under 30 s and 1 GiB.
// What a test can hold without timing anything: the memory a run keeps per op, measured as the
// peak resident size of the process (getrusage of the children) on two chains of different
// lengths, so that what every run loads (libtorch: about 170 MB) cancels out. A 100,000-op chain
// within 1 GiB needs at most about 9 KB per op. The runtime kept about 15 KB before it freed a
// node's backward once it ran, kept one copy of the document and of the events, and ran small ops
// (at most 4096 elements in a rank's operands) again in the backward past its first 32,768 kept
// per-rank graphs (9.7 KB a op when it keeps every graph). A large op always keeps its graph from
// the forward; both kinds must give the oracle's gradients.
#include <sys/resource.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/process_fixture.h"

namespace {

using json = nlohmann::json;
using namespace meshsim::testing;

// x [4, 4] sharded over dp=2, then `ops` ops alternating scale by 1 and neg, a sum and its
// backward: the audit's chain.
json chain(int ops) {
  json program = json::array();
  std::string prev = "x";
  for (int i = 0; i < ops; ++i) {
    const std::string out = "v" + std::to_string(i);
    json op = {{"out", out}, {"op", i % 2 == 0 ? "scale" : "neg"}, {"args", {prev}}};
    if (i % 2 == 0) op["value"] = 1.0;
    program.push_back(op);
    prev = out;
  }
  program.push_back({{"out", "loss"}, {"op", "sum"}, {"args", {prev}}});
  return {{"format", "meshsim.scenario/1"},
          {"name", "chain" + std::to_string(ops)},
          {"mesh", {{"axes", {"dp"}}, {"shape", {2}}}},
          {"inputs", {{{"name", "x"}, {"shape", {4, 4}}, {"placements", {"S(0)"}}, {"requires_grad", true}}}},
          {"program", program},
          {"backward", "loss"}};
}

class LongPrograms : public ProcessTest {
 protected:
  LongPrograms() : ProcessTest("meshsim_long", 300) {}

  // Runs the chain of `ops` ops; the largest resident size of any child so far (KB), which is this
  // run's where runs are made from the shortest up.
  long run_chain(int ops) {
    const std::string file = "chain" + std::to_string(ops) + ".json";
    std::ofstream(dir / file) << chain(ops).dump();
    const Outcome o = meshsim("run " + q(file));
    EXPECT_EQ(o.code, 0) << o;
    EXPECT_TRUE(contains(o.out, "gradient_equivalence=ok")) << o;
    rusage usage{};
    getrusage(RUSAGE_CHILDREN, &usage);
    return usage.ru_maxrss;
  }
};

TEST_F(LongPrograms, AChainKeepsAtMostNineKilobytesPerOp) {
  // Both past the first 16,384 ops (on 2 ranks), whose graphs the runtime keeps from the forward.
  const int short_ops = 20000, long_ops = 50000;
  const long short_kb = run_chain(short_ops);
  const long long_kb = run_chain(long_ops);
  const double per_op = static_cast<double>(long_kb - short_kb) / (long_ops - short_ops);
  EXPECT_LE(per_op, 9.0) << "peak resident " << short_kb << " KB with " << short_ops << " ops, " << long_kb
                         << " KB with " << long_ops << " ops: " << per_op << " KB per op, so about "
                         << (long_kb + per_op * (100000 - long_ops)) / 1024
                         << " MiB for 100,000 ops (within 1 GiB needs at most about 9 KB per op)";
}

// Ops on both sides of the 4096-element line, after 16,400 small ops that use up the graphs kept
// from the forward: x [130, 64] sharded over dp=2 (4160 elements a rank) through matmul, softmax,
// mul and gelu (graphs kept), then small ops on 65-element locals and on [65, 4] x [4, 4]
// (graphs made again in the backward); values and gradients against the oracle.
TEST_F(LongPrograms, LargeOpsKeepTheirGraphsAndSmallOnesRunAgainAlike) {
  json program = chain(16400)["program"];
  program.back() = {{"out", "first"}, {"op", "sum"}, {"args", {"v16399"}}};
  const json rest = {{{"out", "h"}, {"op", "matmul"}, {"args", {"x", "w"}}},
                     {{"out", "p"}, {"op", "softmax"}, {"args", {"h"}}, {"dim", 1}},
                     {{"out", "q"}, {"op", "mul"}, {"args", {"p", "x"}}},
                     {{"out", "g"}, {"op", "gelu"}, {"args", {"q"}}},
                     {{"out", "s"}, {"op", "sum"}, {"args", {"g"}}, {"dim", 1}},
                     {{"out", "t"}, {"op", "tanh"}, {"args", {"s"}}},
                     {{"out", "u"}, {"op", "mul"}, {"args", {"t", "s"}}},
                     {{"out", "k"}, {"op", "narrow"}, {"args", {"q"}}, {"dim", 1}, {"start", 0}, {"length", 4}},
                     {{"out", "m"}, {"op", "matmul"}, {"args", {"k", "v"}}},
                     {{"out", "n"}, {"op", "softmax"}, {"args", {"m"}}, {"dim", 1}},
                     {{"out", "a"}, {"op", "sum"}, {"args", {"u"}}},
                     {{"out", "c"}, {"op", "mul"}, {"args", {"n", "m"}}},
                     {{"out", "b"}, {"op", "sum"}, {"args", {"c"}}},
                     {{"out", "ab"}, {"op", "add"}, {"args", {"a", "b"}}},
                     {{"out", "loss"}, {"op", "add"}, {"args", {"ab", "first"}}}};
  for (const auto& op : rest) program.push_back(op);
  json doc = chain(0);
  doc["name"] = "both";
  doc["inputs"].push_back({{"name", "w"}, {"shape", {64, 64}}, {"placements", {"R"}}, {"requires_grad", true}});
  doc["inputs"].push_back({{"name", "v"}, {"shape", {4, 4}}, {"placements", {"R"}}, {"requires_grad", true}});
  doc["inputs"].push_back({{"name", "x"}, {"shape", {130, 64}}, {"placements", {"S(0)"}}, {"requires_grad", true}});
  doc["inputs"][0]["name"] = "x0";
  program.front()["args"] = {"x0"};
  doc["program"] = program;
  std::ofstream(dir / "both.json") << doc.dump();
  const Outcome o = meshsim("run both.json");
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_TRUE(contains(o.out, "forward_equivalence=ok gradient_equivalence=ok")) << o;
}

}  // namespace

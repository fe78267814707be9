// Tests of sim/ and oracles/: the in-process collectives, distribute/assemble, the exhaustive
// redistribution round trip through the runtime with values and gradients (checked by the
// single-device oracle), the FSDP example and its replicated counterpart, determinism, the error
// kinds of contract 3, and the sharding propagation the runtime relies on (SEMANTICS.md 1-4).
#include <gtest/gtest.h>

#include "tests/spec_sets.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/layout.h"
#include "core/propagation.h"
#include "core/reduced_policy.h"
#include "core/redistribute.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "sim/collectives.h"
#include "sim/data.h"

using namespace meshsim;
using json = nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------
// Helpers

Placement S(int64_t d) { return Placement::shard(d); }
const Placement kR = Placement::replicate();
const Placement kRd = Placement::reduced();
Placement P(ReduceOp op = ReduceOp::Sum) { return Placement::partial(op); }

at::Tensor f64(std::vector<double> v, std::vector<int64_t> shape) {
  return at::tensor(v, at::TensorOptions().dtype(at::kDouble)).reshape(shape);
}

// A float64 tensor of small integers, deterministic in `seed`.
at::Tensor ints(const Shape& shape, uint64_t seed) {
  Rng rng(seed, 99);
  return make_init("int", shape, DType::Float64, rng);
}

Mesh mesh_of(const std::vector<int64_t>& shape) {
  static const std::vector<std::string> names = {"dp", "tp", "pp"};
  return Mesh(std::vector<std::string>(names.begin(), names.begin() + shape.size()), shape);
}

using testing_util::specs_over;

json spec_json(const Spec& spec) {
  json out = json::array();
  for (const auto& p : spec) out.push_back(p.str());
  return out;
}

json mesh_json(const Mesh& mesh) { return {{"axes", mesh.axes()}, {"shape", mesh.shape()}}; }

// A scenario document; program and inputs are filled by the caller.
json scenario_doc(const std::string& name, const Mesh& mesh, json options = json::object()) {
  return {{"format", "meshsim.scenario/1"}, {"name", name},          {"mesh", mesh_json(mesh)},
          {"options", options},             {"inputs", json::array()}, {"program", json::array()}};
}

json input(const std::string& name, const Shape& shape, const Spec& spec, bool requires_grad = false) {
  json in = {{"name", name}, {"shape", shape}, {"placements", spec_json(spec)}};
  if (requires_grad) in["requires_grad"] = true;
  return in;
}

json op(const std::string& out, const std::string& name, std::vector<std::string> args) {
  return {{"out", out}, {"op", name}, {"args", args}};
}

json redistribute_op(const std::string& out, const std::string& arg, const Spec& to) {
  json o = op(out, "redistribute", {arg});
  o["placements"] = spec_json(to);
  return o;
}

// As properties/properties.cpp's redistribute_roundtrip: x (p) -> y (q) -> z (p), m = z * c,
// loss = sum(m); with `backward` the gradient of x is checked too.
json roundtrip_doc(const Mesh& mesh, const Shape& shape, const Spec& p, const Spec& q,
                   const std::string& convention, bool backward) {
  json doc = scenario_doc("roundtrip", mesh, {{"seed", 7}, {"partial_from_replicate", convention}});
  doc["inputs"] = {input("x", shape, p, backward), input("c", shape, p)};
  doc["program"] = {redistribute_op("y", "x", q), redistribute_op("z", "y", p), op("m", "mul", {"z", "c"}),
                    op("loss", "sum", {"m"})};
  if (backward) doc["backward"] = "loss";
  return doc;
}

CheckedRun check_doc(const json& doc, const RunOptions* options = nullptr) {
  Scenario sc = parse_scenario(doc, "<test>");
  return check_scenario(sc, options ? *options : sc.options);
}

// Status pass and every check true; the message shows the result otherwise.
::testing::AssertionResult passes(const CheckedRun& run) {
  const json& r = run.result;
  bool ok = r.value("status", "") == "pass" && run.exit_code == 0 && r.contains("checks");
  if (ok)
    for (const auto& [name, value] : r["checks"].items()) ok &= value == true;
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "result: " << r.dump();
}

json example_doc() { return read_json_file(std::string(MESHSIM_SOURCE_DIR) + "/examples/fsdp_reduced.json"); }

// The collectives of a result matching phase and op.
std::vector<json> collectives(const json& result, const std::string& phase, const std::string& op_name) {
  std::vector<json> out;
  for (const auto& c : result["collectives"])
    if (c["phase"] == phase && c["op"] == op_name) out.push_back(c);
  return out;
}

std::string what(const Mesh& mesh, const Spec& spec, const Shape& shape) {
  return "mesh " + mesh.str() + " spec " + spec_str(spec) + " shape " + shape_str(shape);
}

// ---------------------------------------------------------------------------------------------
// 0. Comparisons: the direct loop over contiguous float data (what nearly every check meets) and
// the tensor path (other dtypes, strided views) give the same numbers, NaN and infinities included.

TEST(Compare, DirectAndTensorPathsAgree) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  at::Tensor a = at::randn({6, 5}, at::TensorOptions().dtype(at::kDouble).device(at::kCPU));
  at::Tensor b = a + 1e-9 * at::randn({6, 5}, at::kDouble);
  const std::vector<std::pair<std::pair<int, int>, std::pair<double, double>>> plants = {
      {{0, 0}, {nan, nan}}, {{1, 1}, {inf, inf}}, {{2, 2}, {-inf, -inf}}, {{3, 3}, {1.5, 1.5}}};
  for (const auto& [at_, v] : plants) {
    a[at_.first][at_.second] = v.first;
    b[at_.first][at_.second] = v.second;
  }
  auto both = [](const at::Tensor& x, const at::Tensor& y) {
    // x.t() is a strided view: the tensor path; its contiguous copy: the direct loop.
    const double strided = max_abs_diff(x.t(), y.t()), direct = max_abs_diff(x.t().contiguous(), y.t().contiguous());
    if (std::isnan(strided)) {
      EXPECT_TRUE(std::isnan(direct));
    } else {
      EXPECT_EQ(strided, direct);
    }
    EXPECT_EQ(within(direct, 1e-6, x.t()), within(direct, 1e-6, x.t().contiguous()));
    return direct;
  };
  const double small = both(a, b);
  EXPECT_GT(small, 0.0);
  EXPECT_LT(small, 1e-7);
  EXPECT_EQ(both(a.to(at::kFloat), a.to(at::kFloat)), 0.0);     // float32 against itself
  EXPECT_GT(both(a, a.to(at::kFloat).to(at::kDouble)), 0.0);    // float64 against its float32 rounding
  at::Tensor c = b.clone();
  c[4][4] = 7.0 + a[4][4].item<double>();
  EXPECT_DOUBLE_EQ(both(a, c), 7.0);                            // the largest difference, exactly
  c[5][0] = nan;
  EXPECT_TRUE(std::isnan(both(a, c)));                          // NaN on one side only
  c = b.clone();
  c[1][1] = -inf;
  EXPECT_EQ(both(a, c), inf);                                   // inf against -inf
  // within is relative to the largest finite magnitude of the reference.
  const at::Tensor ref = at::tensor({1000.0, -inf, 2.0}, at::kDouble);
  EXPECT_TRUE(within(0.5, 1e-3, ref));
  EXPECT_FALSE(within(1.5, 1e-3, ref));
  EXPECT_TRUE(within(0.5, 1e-3, ref.to(at::kFloat)));
  EXPECT_FALSE(within(nan, 1e-3, ref));
}

// Each local against its block of the reference (no assembly) gives assemble's number exactly, on
// uneven shards over two axes with replicas; and gives nothing where assembling must explain
// (replicas that differ, a Partial, a local of the wrong shape), so the caller assembles.
TEST(Compare, LaidOutBlocksAgreeWithTheAssembledGlobal) {
  const Mesh mesh({"a", "b"}, {2, 3});
  at::Tensor ref = at::randn({7, 5}, at::kDouble);
  ref[6][4] = std::numeric_limits<double>::quiet_NaN();
  for (const Spec& spec : {Spec{Placement::shard(0), Placement::shard(1)}, Spec{Placement::replicate(), Placement::shard(0)},
                           Spec{Placement::shard(1), Placement::replicate()}, Spec{Placement::replicate(), Placement::replicate()}}) {
    SCOPED_TRACE(spec_str(spec));
    at::Tensor got = ref + 1e-6 * at::randn({7, 5}, at::kDouble);
    got[6][4] = std::numeric_limits<double>::quiet_NaN();
    got[2][3] += 0.25;  // the largest difference
    Locals locals = distribute(mesh, spec, got, nullptr);
    for (auto& l : locals) l = l.contiguous().clone();  // each rank its own storage
    const auto direct = max_abs_diff_laid_out(mesh, spec, locals, ref);
    ASSERT_TRUE(direct.has_value());
    EXPECT_EQ(*direct, max_abs_diff(assemble(mesh, spec, locals), ref));
    EXPECT_NEAR(*direct, 0.25, 1e-5);
    Locals f32_locals = distribute(mesh, spec, got.to(at::kFloat), nullptr);
    for (auto& l : f32_locals) l = l.contiguous();
    const auto f32 = max_abs_diff_laid_out(mesh, spec, f32_locals, ref.to(at::kFloat));
    ASSERT_TRUE(f32.has_value());
    EXPECT_EQ(*f32, max_abs_diff(got.to(at::kFloat), ref.to(at::kFloat)));
    if (spec[0].is_replicate()) {  // rank 3 is rank 0's replica along "a": a differing replica is assemble's to explain
      locals[3] = locals[3].clone();
      locals[3].view(-1)[0] += 1.0;
      EXPECT_FALSE(max_abs_diff_laid_out(mesh, spec, locals, ref).has_value());
    }
  }
  EXPECT_FALSE(max_abs_diff_laid_out(mesh, {Placement::partial(), Placement::shard(0)},
                                     distribute(mesh, {Placement::partial(), Placement::shard(0)}, ref, nullptr), ref)
                   .has_value());
  Locals wrong = distribute(mesh, {Placement::shard(0), Placement::shard(1)}, ref, nullptr);
  wrong[1] = at::zeros({1, 1}, at::kDouble);
  EXPECT_FALSE(max_abs_diff_laid_out(mesh, {Placement::shard(0), Placement::shard(1)}, wrong, ref).has_value());
}

// ---------------------------------------------------------------------------------------------
// 1. Collectives

TEST(Collectives, ChunkPieceFollowsTorchChunk) {
  const at::Tensor t = at::arange(5, at::kDouble);
  std::vector<int64_t> sizes;
  for (int64_t k = 0; k < 4; ++k) sizes.push_back(chunk_piece(t, 0, 4, k).size(0));
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_TRUE(at::equal(chunk_piece(t, 0, 4, 2), f64({4}, {1})));
}

TEST(Collectives, AllGatherConcatenatesInGroupOrder) {
  Locals group = {f64({1, 2, 3, 4}, {2, 2}), f64({5, 6}, {1, 2}), f64({}, {0, 2})};
  Locals out = all_gather(group, 0);
  ASSERT_EQ(out.size(), 3u);
  const at::Tensor want = f64({1, 2, 3, 4, 5, 6}, {3, 2});
  for (const auto& t : out) EXPECT_TRUE(at::equal(t, want));
  Locals cols = all_gather({f64({1, 2}, {2, 1}), f64({3, 4}, {2, 1})}, 1);
  EXPECT_TRUE(at::equal(cols[1], f64({1, 3, 2, 4}, {2, 2})));
}

TEST(Collectives, AllReduceEveryOp) {
  Locals group = {f64({1, -2, 3}, {3}), f64({4, 0, -6}, {3}), f64({-1, 5, 3}, {3}), f64({0, 1, 4}, {3})};
  struct Case {
    ReduceOp op;
    at::Tensor want;
  };
  for (const auto& c : std::vector<Case>{{ReduceOp::Sum, f64({4, 4, 4}, {3})},
                                         {ReduceOp::Avg, f64({1, 1, 1}, {3})},
                                         {ReduceOp::Max, f64({4, 5, 4}, {3})},
                                         {ReduceOp::Min, f64({-1, -2, -6}, {3})}}) {
    SCOPED_TRACE(reduce_op_name(c.op));
    Locals out = all_reduce(group, c.op);
    ASSERT_EQ(out.size(), group.size());
    for (const auto& t : out) EXPECT_TRUE(at::equal(t, c.want)) << t;
  }
  // The inputs are not written.
  EXPECT_TRUE(at::equal(group[0], f64({1, -2, 3}, {3})));
}

TEST(Collectives, ReductionIsALeftFoldInRankOrder) {
  // ((1 + 1e16) - 1e16) + 0.5 == 0.5 in float64; a tree or the reverse order gives 0 or 1.
  Locals group = {f64({1}, {1}), f64({1e16}, {1}), f64({-1e16}, {1}), f64({0.5}, {1})};
  EXPECT_EQ(all_reduce(group, ReduceOp::Sum)[0].item<double>(), 0.5);
  EXPECT_EQ(all_reduce(group, ReduceOp::Avg)[0].item<double>(), 0.125);
  EXPECT_EQ(reduce_scatter(group, ReduceOp::Sum, 0)[0].item<double>(), 0.5);
}

TEST(Collectives, ReplicatedResultSharesOneStorageAcrossDistinctTensors) {
  Locals group = {f64({1, 2}, {2}), f64({3, 4}, {2}), f64({5, 6}, {2})};
  for (const Locals& out : {all_reduce(group, ReduceOp::Sum), all_gather(group, 0)}) {
    for (size_t k = 1; k < out.size(); ++k) {
      EXPECT_EQ(out[k].data_ptr(), out[0].data_ptr());
      EXPECT_FALSE(out[k].is_same(out[0])) << "ranks must hold distinct tensor objects";
    }
  }
}

TEST(Collectives, ReduceScatterUnevenFollowsTorchChunk) {
  // Four ranks, 5 rows: chunks of 2, 2, 1 and 0 rows of the sum.
  Locals group;
  at::Tensor sum = at::zeros({5, 2}, at::kDouble);
  for (uint64_t k = 0; k < 4; ++k) {
    group.push_back(ints({5, 2}, k));
    sum = sum + group.back();
  }
  Locals out = reduce_scatter(group, ReduceOp::Sum, 0);
  ASSERT_EQ(out.size(), 4u);
  std::vector<int64_t> rows;
  for (const auto& t : out) rows.push_back(t.size(0));
  EXPECT_EQ(rows, (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_TRUE(at::equal(at::cat(out, 0), sum));
  Locals by_max = reduce_scatter(group, ReduceOp::Max, 1);
  EXPECT_TRUE(at::equal(at::cat(by_max, 1), all_reduce(group, ReduceOp::Max)[0]));
}

TEST(Collectives, AllToAllTurnsRowShardsIntoColumnShards) {
  const at::Tensor g = ints({5, 6}, 3);
  for (int64_t n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    Locals rows, cols;
    for (int64_t k = 0; k < n; ++k) {
      rows.push_back(chunk_piece(g, 0, n, k));
      cols.push_back(chunk_piece(g, 1, n, k));
    }
    Locals out = all_to_all(rows, /*split_dim=*/1, /*concat_dim=*/0);
    ASSERT_EQ(out.size(), static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) EXPECT_TRUE(at::equal(out[k], cols[k])) << "rank " << k;
    Locals back = all_to_all(out, 0, 1);
    for (int64_t k = 0; k < n; ++k) EXPECT_TRUE(at::equal(back[k], rows[k])) << "rank " << k;
  }
}

TEST(Collectives, ApplyStepActsPerGroupOfATwoAxisMesh) {
  const Mesh mesh = mesh_of({2, 3});
  const at::Tensor g = ints({5, 7}, 4);
  const Spec from = {S(0), S(1)}, to = {S(0), kR};
  auto plan = plan_redistribute(mesh, from, to);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].kind, StepKind::AllGather);
  Locals out = apply_step(mesh, plan[0], distribute(mesh, from, g, nullptr));
  Locals want = distribute(mesh, to, g, nullptr);
  for (int64_t r = 0; r < mesh.size(); ++r) EXPECT_TRUE(at::equal(out[r], want[r])) << "rank " << r;
}

TEST(Collectives, StepBytesFollowTheCostModel) {
  const Mesh mesh = mesh_of({4});
  const at::Tensor w = ints({16, 4}, 1);  // 512 bytes in float64
  auto gather = plan_redistribute(mesh, {S(0)}, {kR});
  EXPECT_EQ(step_bytes(mesh, gather[0], distribute(mesh, {S(0)}, w, nullptr)), 384);
  auto reduce = plan_redistribute(mesh, {P()}, {kR});
  EXPECT_EQ(step_bytes(mesh, reduce[0], distribute(mesh, {P()}, w, nullptr)), 768);
  auto scatter = plan_redistribute(mesh, {P()}, {S(0)});
  EXPECT_EQ(step_bytes(mesh, scatter[0], distribute(mesh, {P()}, w, nullptr)), 384);
}

// ---------------------------------------------------------------------------------------------
// 2. distribute / assemble

const std::vector<std::vector<int64_t>> kMeshShapes = {{1}, {2}, {3}, {4}, {2, 2}, {2, 3}, {3, 2}};
// Uneven chunks (5 over 4: 2,2,1,0), empty tensors and a dim of extent 1 (empty chunks on dim 1).
const std::vector<Shape> kDataShapes = {{5, 3}, {4, 6}, {0, 3}, {3, 1}};

bool is_max_or_min(const Placement& p) {
  return p.is_partial() && (p.op == ReduceOp::Max || p.op == ReduceOp::Min);
}

// Calls f(mesh, spec, shape) for every mesh, spec over all_placements(2) and data shape.
void for_every_layout(const std::function<void(const Mesh&, const Spec&, const Shape&)>& f) {
  for (const auto& ms : kMeshShapes) {
    const Mesh mesh = mesh_of(ms);
    for (const auto& spec : specs_over(all_placements(2), mesh.ndim()))
      for (const auto& shape : kDataShapes) f(mesh, spec, shape);
  }
}

// The round trip and the local shapes of layout.h; returns the number of layouts checked.
int check_round_trip(bool with_rng, const std::function<bool(const Spec&)>& include) {
  int checked = 0;
  for_every_layout([&](const Mesh& mesh, const Spec& spec, const Shape& shape) {
    if (!include(spec)) return;
    SCOPED_TRACE(what(mesh, spec, shape) + (with_rng ? " with rng" : " without rng"));
    const at::Tensor g = ints(shape, 11);
    Rng rng(5, 0);
    Locals locals = distribute(mesh, spec, g, with_rng ? &rng : nullptr);
    ASSERT_EQ(locals.size(), static_cast<size_t>(mesh.size()));
    for (int64_t r = 0; r < mesh.size(); ++r)
      EXPECT_EQ(locals[r].sizes().vec(), local_layout(mesh, spec, shape, r).shape) << "rank " << r;
    std::string problem;
    at::Tensor back = assemble(mesh, spec, locals, &problem);
    EXPECT_EQ(problem, "");
    EXPECT_TRUE(at::equal(back, g)) << "assembled " << back << "\nglobal " << g;
    ++checked;
  });
  return checked;
}

TEST(Distribute, RoundTripWithRngEverySpec) {
  int n = check_round_trip(true, [](const Spec&) { return true; });
  EXPECT_EQ(n, 4 * (4 * 8 + 3 * 64));
  SUCCEED() << n << " layouts";
}

TEST(Distribute, RoundTripWithoutRngEverySpecButMaxMin) {
  int n = check_round_trip(false, [](const Spec& spec) {
    for (const auto& p : spec)
      if (is_max_or_min(p)) return false;
    return true;
  });
  EXPECT_GT(n, 0);
}

// Regression: without an Rng, distribute() once gave the non-coordinate-0 ranks of a P(max) / P(min) group
// zeros, so the locals assemble to max(value, 0) / min(value, 0), not the value: the round trip
// fails whenever the value has a negative (max) or positive (min) element. Reproduction:
//   distribute(Mesh({"dp"}, {2}), {P(max)}, tensor([-1.]), nullptr) -> {[-1], [0]};
//   assemble(...) -> [0].
// (Not reached by the runtime today: only backward seeds are distributed without an Rng, and a
// seed is never P(max) / P(min).) The fix would fill the other ranks with the value itself (or
// the lowest / highest value of the dtype).
TEST(Distribute, RoundTripWithoutRngMaxMin) {
  const Mesh mesh = mesh_of({2});
  Locals locals = distribute(mesh, {P(ReduceOp::Max)}, f64({-1}, {1}), nullptr);
  if (!at::equal(assemble(mesh, {P(ReduceOp::Max)}, locals), f64({-1}, {1})))
    FAIL() << "distribute without an Rng does not represent P(max)/P(min) values "
                    "(assembles to max(value, 0)); see the comment above this test";
  check_round_trip(false, [](const Spec&) { return true; });
}

TEST(Distribute, WithoutRngCoordinateZeroHoldsThePartialValue) {
  const at::Tensor g = ints({5, 3}, 2);
  for (int64_t n : {1, 2, 3, 4}) {
    const Mesh mesh = mesh_of({n});
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      SCOPED_TRACE(std::to_string(n) + " " + reduce_op_name(op));
      Locals locals = distribute(mesh, {P(op)}, g, nullptr);
      const at::Tensor want0 = op == ReduceOp::Avg ? g * static_cast<double>(n) : g;
      EXPECT_TRUE(at::equal(locals[0], want0));
      // The others hold what leaves the reduction unchanged: zeros for sum and avg, the value
      // itself for max and min.
      const bool extremum = op == ReduceOp::Max || op == ReduceOp::Min;
      for (int64_t k = 1; k < n; ++k)
        EXPECT_TRUE(at::equal(locals[k], extremum ? g : at::zeros_like(g))) << "rank " << k;
    }
  }
}

TEST(Distribute, WithRngPartialLocalsDifferAcrossTheGroup) {
  int checked = 0;
  for_every_layout([&](const Mesh& mesh, const Spec& spec, const Shape& shape) {
    const at::Tensor g = ints(shape, 11);
    if (g.numel() == 0 || !g.ne(0).any().item<bool>()) return;
    Rng rng(5, 0);
    Locals locals = distribute(mesh, spec, g, &rng);
    for (int a = 0; a < mesh.ndim(); ++a) {
      if (!spec[a].is_partial() || mesh.axis_size(a) == 1) continue;
      SCOPED_TRACE(what(mesh, spec, shape) + " axis " + mesh.axes()[a]);
      bool differ = false;
      for (const auto& group : mesh.groups(a))
        for (auto r : group) differ |= !at::equal(locals[r], locals[group[0]]);
      EXPECT_TRUE(differ) << "every group over a Partial axis holds equal locals";
      ++checked;
    }
  });
  EXPECT_GT(checked, 100);
}

TEST(Distribute, MaxMinPartsBoundTheValue) {
  const Mesh mesh = mesh_of({4});
  const at::Tensor g = ints({5, 3}, 6);
  Rng rng(1, 0);
  Locals mx = distribute(mesh, {P(ReduceOp::Max)}, g, &rng);
  Locals mn = distribute(mesh, {P(ReduceOp::Min)}, g, &rng);
  EXPECT_TRUE(at::equal(mx[0], g));
  EXPECT_TRUE(at::equal(mn[0], g));
  for (int k = 1; k < 4; ++k) {
    EXPECT_TRUE(mx[k].lt(g).all().item<bool>()) << "rank " << k;
    EXPECT_TRUE(mn[k].gt(g).all().item<bool>()) << "rank " << k;
  }
}

// Regression (sim/data.cpp, distribute with an Rng): Partial axes were split group by group with fresh
// random parts, so on a spec such as [R, P(sum)] the ranks that differ only on the R axis (dp) hold
// different splits of the inner P(sum): their locals differ although R says they are equal. The
// global value is still right (each split sums to it), but a step that relies on equal replicas,
// R -> P(max) (no data moves), then computes max over different splits: see
// RedistributeSweep.ReplicateToPartialMaxBesideInnerPartial. Reproduction: mesh dp=2 x tp=2,
// distribute({R, P(sum)}, g [5, 3], &rng) -> locals[0] != locals[2] (ranks 0 and 2 differ only on dp).
// (assemble() does not see it either: it compares replicas only after reducing the Partial axes;
// see Assemble.ReportsReplicasThatDifferBesideAPartial.)
TEST(Distribute, ReplicateAxisHoldsEqualLocalsBesidePartial) {
  std::vector<std::string> violations;
  for_every_layout([&](const Mesh& mesh, const Spec& spec, const Shape& shape) {
    Rng rng(5, 0);
    Locals locals = distribute(mesh, spec, ints(shape, 11), &rng);
    for (int a = 0; a < mesh.ndim(); ++a) {
      if (!spec[a].is_replicate()) continue;
      for (const auto& group : mesh.groups(a))
        for (auto r : group)
          if (!at::equal(locals[r], locals[group[0]])) {
            violations.push_back(what(mesh, spec, shape) + ": ranks " + std::to_string(group[0]) + " and " +
                                 std::to_string(r) + " differ over " + mesh.axes()[a]);
            return;
          }
    }
  });
  if (!violations.empty())
    FAIL() << violations.size() << " layouts hold different locals over a Replicate axis, e.g. "
                 << violations.front();
}

// Regression (sim/data.cpp, assemble): the replicas of a Replicate axis were compared only after the
// Partial axes are reduced, so locals that differ over R beside a Partial pass unnoticed, and the
// oracle's forward check cannot see a runtime that breaks R's equal-locals invariant there.
// Reproduction: mesh dp=2 x tp=2, spec [R, P(sum)], locals {1, 2, 0, 3} (scalars): assemble
// reports no problem although ranks 0 and 2 (which differ only on dp) hold 1 and 0.
TEST(Assemble, ReportsReplicasThatDifferBesideAPartial) {
  const Mesh mesh = mesh_of({2, 2});
  Locals locals = {f64({1}, {1}), f64({2}, {1}), f64({0}, {1}), f64({3}, {1})};
  std::string problem;
  at::Tensor g = assemble(mesh, {kR, P()}, locals, &problem);
  EXPECT_EQ(g.item<double>(), 3.0);
  ASSERT_FALSE(problem.empty()) << "assemble must reject locals that differ over an R axis beside a Partial one";
  EXPECT_NE(problem.find("\"dp\""), std::string::npos) << problem;
}

TEST(Assemble, ReportsDifferingReplicatedLocals) {
  const at::Tensor g = ints({4, 3}, 8);
  struct Case {
    std::vector<int64_t> mesh;
    Spec spec;
    int64_t rank;  // whose local is changed
    std::string axis;
  };
  for (const auto& c : std::vector<Case>{{{2}, {kR}, 1, "dp"},
                                         {{3}, {kRd}, 2, "dp"},
                                         {{2, 2}, {S(0), kR}, 3, "tp"},
                                         {{2, 2}, {kR, S(1)}, 2, "dp"},
                                         {{2, 2}, {P(), kRd}, 1, "tp"}}) {
    const Mesh mesh = mesh_of(c.mesh);
    SCOPED_TRACE(what(mesh, c.spec, {4, 3}));
    Locals locals = distribute(mesh, c.spec, g, nullptr);
    std::string problem;
    assemble(mesh, c.spec, locals, &problem);
    EXPECT_EQ(problem, "");
    locals[c.rank] = locals[c.rank] + 1.0;
    assemble(mesh, c.spec, locals, &problem);
    EXPECT_NE(problem.find("hold different locals across mesh axis \"" + c.axis + "\""), std::string::npos) << problem;
  }
}

TEST(Data, TensorHashIsStableAndSeesShapeAndBytes) {
  const at::Tensor a = f64({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(tensor_hash(a), tensor_hash(a.clone()));
  EXPECT_EQ(tensor_hash(a).size(), 16u);
  EXPECT_NE(tensor_hash(a), tensor_hash(a.reshape({4})));
  EXPECT_NE(tensor_hash(a), tensor_hash(a + 1.0));
  EXPECT_EQ(tensor_hash(a.t()), tensor_hash(a.t().contiguous()));
}

// ---------------------------------------------------------------------------------------------
// 3. Exhaustive redistribution round trip through the runtime, checked by the oracle

const std::vector<Placement> kDifferentiable = {S(0), S(1), kR, P(ReduceOp::Sum), P(ReduceOp::Avg), kRd};
const std::vector<Placement> kForwardOnly = {P(ReduceOp::Max), P(ReduceOp::Min)};

std::vector<Placement> sweep_placements() {
  std::vector<Placement> all = kDifferentiable;
  all.insert(all.end(), kForwardOnly.begin(), kForwardOnly.end());
  return all;
}

bool differentiable(const Spec& s) {
  for (const auto& p : s)
    if (is_max_or_min(p)) return false;
  return true;
}

bool legal_both_ways(const Spec& p, const Spec& q) {
  return redistribute_illegal_reason(p, q).empty() && redistribute_illegal_reason(q, p).empty();
}

// The pairs hit by the distribute() bug of Distribute.ReplicateAxisHoldsEqualLocalsBesidePartial:
// an R or Rd axis of p relabelled to P(max) / P(min) (no data moves) while an inner axis keeps a
// Partial: the inputs' replicas over the outer axis hold different splits of the inner Partial, so
// max / min over the outer axis mixes them.
bool hits_replica_split_bug(const Spec& p, const Spec& q) {
  for (size_t a = 0; a < p.size(); ++a)
    for (size_t b = a + 1; b < p.size(); ++b)
      if (p[a].is_replicate() && is_max_or_min(q[a]) && p[b].is_partial() && !is_max_or_min(p[b]) &&
          q[b] == p[b])
        return true;
  return false;
}

struct SweepCounts {
  int with_backward = 0, forward_only = 0, failed = 0;
  std::string str() const {
    return std::to_string(with_backward) + " round trips with backward, " + std::to_string(forward_only) +
           " forward only";
  }
};

struct Sweep {
  std::vector<std::vector<int64_t>> meshes;
  std::vector<Shape> shapes;
  std::vector<std::string> conventions = {"divide", "rank0"};
  std::vector<std::string> modes = {"above_autograd"};
  // Which legal pairs to run (all when null).
  std::function<bool(const Spec&, const Spec&)> keep;
  // false: count failures instead of reporting them (for the known-bug test).
  bool expect_pass = true;

  // Every ordered pair (p, q) of specs over the sweep placements, legal both ways: the round trip
  // scenario must pass with every check true (with the gradient unless p or q is P(max) / P(min)).
  SweepCounts run() const {
    SweepCounts counts;
    for (const auto& ms : meshes) {
      const Mesh mesh = mesh_of(ms);
      const auto specs = specs_over(sweep_placements(), mesh.ndim());
      for (const auto& shape : shapes)
        for (const auto& convention : conventions)
          for (const auto& mode : modes)
            for (const auto& p : specs)
              for (const auto& q : specs) {
                if (!legal_both_ways(p, q) || (keep && !keep(p, q))) continue;
                const bool backward = differentiable(p) && differentiable(q);
                json doc = roundtrip_doc(mesh, shape, p, q, convention, backward);
                doc["options"]["redistribute"] = mode;
                CheckedRun run = check_doc(doc);
                auto ok = passes(run);
                if (!ok) ++counts.failed;
                if (expect_pass) {
                  EXPECT_TRUE(ok) << mesh.str() << " shape " << shape_str(shape) << " " << spec_str(p) << " -> "
                                  << spec_str(q) << " -> " << spec_str(p) << " (" << convention << ", " << mode
                                  << (backward ? ", with backward)" : ", forward only)");
                }
                if (backward) {
                  EXPECT_TRUE(run.result["checks"].contains("gradient_equivalence"));
                  ++counts.with_backward;
                } else {
                  ++counts.forward_only;
                }
              }
    }
    return counts;
  }
};

void report(const SweepCounts& counts) {
  ::testing::Test::RecordProperty("round_trips_with_backward", counts.with_backward);
  ::testing::Test::RecordProperty("round_trips_forward_only", counts.forward_only);
  std::printf("[   INFO   ] %s\n", counts.str().c_str());
  SUCCEED() << counts.str();
}

// 1-axis meshes of sizes 1-4, uneven and empty shapes, both R -> P(sum) conventions and both
// redistribution modes (mul may redistribute its operands).
TEST(RedistributeSweep, OneAxisMeshesEveryPair) {
  Sweep sweep;
  sweep.meshes = {{1}, {2}, {3}, {4}};
  sweep.shapes = {{5, 3}, {4, 6}, {0, 3}};
  sweep.modes = {"above_autograd", "below_autograd"};
  SweepCounts counts = sweep.run();
  // 36 of the 64 ordered pairs are legal both ways; 10 of them involve P(max) or P(min).
  const int configs = 4 * 3 * 2 * 2;
  EXPECT_EQ(counts.with_backward + counts.forward_only, configs * 36);
  EXPECT_EQ(counts.forward_only, configs * 10);
  report(counts);
}

// 2-axis meshes 2x2, 2x3 and 3x2, all pairs of per-axis placements (both axes from the set), shape
// [5, 3], both conventions; the pairs of the known distribute() bug run in their own test below.
TEST(RedistributeSweep, TwoAxisMeshesEveryPair) {
  Sweep sweep;
  sweep.meshes = {{2, 2}, {2, 3}, {3, 2}};
  sweep.shapes = {{5, 3}};
  const SweepCounts counts = sweep.run();
  // 36 * 36 pairs per mesh and convention.
  EXPECT_EQ(counts.with_backward + counts.forward_only, 3 * 2 * 36 * 36);
  report(counts);
}

// Empty tensors on a 2-axis mesh.
TEST(RedistributeSweep, TwoAxisMeshEmptyShape) {
  Sweep sweep;
  sweep.meshes = {{2, 3}};
  sweep.shapes = {{0, 3}};
  sweep.conventions = {"divide"};
  report(sweep.run());
}

// Regression (sim/data.cpp, distribute): replicas of an inner Partial hold the same split.
// Reproduction: mesh dp=2 x tp=2, input x [5, 3] ["R", "P(sum)"], y = redistribute(x,
// ["P(max)", "P(sum)"]): forward_equivalence fails for y (differs from the oracle by 6, seed 7).
TEST(RedistributeSweep, ReplicateToPartialMaxBesideInnerPartial) {
  Sweep sweep;
  sweep.meshes = {{2, 2}, {2, 3}};
  sweep.shapes = {{5, 3}};
  sweep.keep = hits_replica_split_bug;
  SweepCounts counts = sweep.run();
  EXPECT_EQ(counts.forward_only, 2 * 2 * 8);
  EXPECT_EQ(counts.failed, 0) << "round trips [R|Rd, P(sum|avg)] -> [P(max|min), P(sum|avg)] -> back: the "
                                 "replicas of an inner Partial must hold the same split";
}

// A P(max) input that requires grad in a forward-only run: nothing reaches a backward, so the
// result lists the gradient without placements and the run must not throw.
TEST(RedistributeSweep, ForwardOnlyPartialMaxInputRequiringGrad) {
  json doc = scenario_doc("fwd_pmax", mesh_of({2}));
  doc["inputs"] = {input("x", {4, 3}, {P(ReduceOp::Max)}, true)};
  doc["program"] = {redistribute_op("y", "x", {kR})};
  CheckedRun run;
  try {
    run = check_doc(doc);
  } catch (const std::exception& e) {
    // Regression: check_scenario (oracles/check.cpp) computed cotangent_spec() of every input that
    // requires grad even when no backward ran, and cotangent(P(max)) throws
    // SemanticError(NotDifferentiable) outside its try block, breaking "never throws for a
    // scenario that parsed" (`meshsim run` then exits 3 without a result). Reproduction: mesh
    // dp=2, input x [4,3] ["P(max)"] requires_grad, program y = redistribute(x, ["R"]), no
    // "backward".
    FAIL() << "check_scenario throws for a forward-only P(max) input requiring grad: " << e.what();
  }
  EXPECT_TRUE(passes(run));
}

// ---------------------------------------------------------------------------------------------
// 4. The FSDP example and its data-parallel counterpart

TEST(Fsdp, ExampleGathersForwardAndReduceScattersBackward) {
  CheckedRun run = check_doc(example_doc());
  ASSERT_TRUE(passes(run));
  const json& r = run.result;
  EXPECT_EQ(r["format"], "meshsim.result/1");
  ASSERT_EQ(r["collectives"].size(), 2u) << r["collectives"].dump();
  auto gathers = collectives(r, "forward", "all_gather");
  ASSERT_EQ(gathers.size(), 1u);
  EXPECT_EQ(gathers[0], json({{"phase", "forward"}, {"op", "all_gather"}, {"axis", "dp"}, {"bytes", 384}, {"value", "wf"},
                              {"program_op", "/program/0"}}));
  auto scatters = collectives(r, "backward", "reduce_scatter");
  ASSERT_EQ(scatters.size(), 1u);
  EXPECT_EQ(scatters[0]["axis"], "dp");
  EXPECT_EQ(scatters[0]["bytes"], 384);
  EXPECT_EQ(scatters[0]["value"], "wf");
  EXPECT_TRUE(collectives(r, "backward", "all_reduce").empty());
  EXPECT_EQ(r["grads"]["w"]["placements"], json({"S(0)"}));
  EXPECT_EQ(r["grads"]["w"]["cotangent"], json({"S(0)"}));
  EXPECT_EQ(r["values"]["wf"]["placements"], json({"Rd"}));
  EXPECT_EQ(r["max_abs_error"], 0.0);
}

// Data parallel with a replicated weight (w R, wf R): SEMANTICS.md section 3 gives the gradient of
// an R primal the placement R, so the P(sum) contribution of mm is all_reduced (2(n-1)/n * 512 =
// 768 bytes) and nothing is reduce_scattered: twice the FSDP bytes.
TEST(Fsdp, ReplicatedWeightAllReducesTheGradient) {
  json doc = example_doc();
  doc["inputs"][1]["placements"] = {"R"};
  doc["program"][0]["placements"] = {"R"};
  CheckedRun run = check_doc(doc);
  ASSERT_TRUE(passes(run));
  const json& r = run.result;
  EXPECT_TRUE(collectives(r, "forward", "all_gather").empty());
  EXPECT_TRUE(collectives(r, "backward", "reduce_scatter").empty());
  auto reduces = collectives(r, "backward", "all_reduce");
  ASSERT_EQ(reduces.size(), 1u) << r["collectives"].dump();
  EXPECT_EQ(reduces[0]["axis"], "dp");
  EXPECT_EQ(reduces[0]["bytes"], 768);
  EXPECT_EQ(r["collectives"].size(), 1u) << r["collectives"].dump();
  EXPECT_EQ(r["grads"]["w"]["placements"], json({"R"}));
  EXPECT_EQ(r["grads"]["w"]["cotangent"], json({"R"}));
  EXPECT_EQ(r["max_abs_error"], 0.0);
}

// ---------------------------------------------------------------------------------------------
// 5. Determinism

std::vector<std::string> input_hashes(const std::vector<Event>& events) {
  std::vector<std::string> out;
  for (const auto& e : events)
    if (e.kind == "input") out.insert(out.end(), e.hashes.begin(), e.hashes.end());
  return out;
}

TEST(Determinism, SameScenarioSameEventsAndResult) {
  for (const json& doc : {example_doc(), roundtrip_doc(mesh_of({2, 3}), {5, 3}, {S(1), P(ReduceOp::Avg)},
                                                       {kRd, kR}, "rank0", true)}) {
    ASSERT_TRUE(passes(check_doc(doc)));
    CheckedRun a = check_doc(doc), b = check_doc(doc);
    ASSERT_FALSE(a.events.empty());
    EXPECT_TRUE(a.events == b.events);
    EXPECT_EQ(a.result.dump(), b.result.dump());
  }
}

TEST(Determinism, SeedChangesTheInputHashes) {
  const json doc = example_doc();
  Scenario sc = parse_scenario(doc, "<test>");
  RunOptions other = sc.options;
  other.seed = sc.options.seed + 1;
  CheckedRun a = check_scenario(sc, sc.options), b = check_scenario(sc, other);
  auto ha = input_hashes(a.events), hb = input_hashes(b.events);
  ASSERT_EQ(ha.size(), 8u);  // x and w on 4 ranks
  for (size_t k = 0; k < ha.size(); ++k) EXPECT_NE(ha[k], hb[k]) << "local " << k;
  EXPECT_TRUE(passes(b));
}

// ---------------------------------------------------------------------------------------------
// 6. Errors

void expect_error(const json& doc, const std::string& kind, int exit_code) {
  CheckedRun run = check_doc(doc);
  EXPECT_EQ(run.result["status"], "error") << run.result.dump();
  EXPECT_EQ(run.result["error"]["kind"], kind) << run.result.dump();
  EXPECT_FALSE(run.result["error"].value("message", "").empty());
  EXPECT_EQ(run.exit_code, exit_code);
}

TEST(Errors, ShardToPartialIsIllegal) {
  json doc = scenario_doc("illegal", mesh_of({2}));
  doc["inputs"] = {input("x", {4, 3}, {S(0)})};
  doc["program"] = {redistribute_op("y", "x", {P()})};
  expect_error(doc, "illegal_redistribute", 3);
}

TEST(Errors, PartialMaxReachingTheBackwardIsNotDifferentiable) {
  json doc = scenario_doc("pmax_grad", mesh_of({2}));
  doc["inputs"] = {input("x", {4, 3}, {P(ReduceOp::Max)}, true)};
  doc["program"] = {op("loss", "sum", {"x"})};
  doc["backward"] = "loss";
  expect_error(doc, "not_differentiable", 3);
}

TEST(Errors, MmInnerDimsMismatch) {
  json doc = scenario_doc("mm_shapes", mesh_of({2}));
  doc["inputs"] = {input("a", {4, 3}, {S(0)}), input("b", {5, 2}, {kR})};
  doc["program"] = {op("y", "mm", {"a", "b"})};
  expect_error(doc, "shape_mismatch", 2);
}

// A P(max) input that requires grad but that no gradient reaches (it feeds a value off the
// loss's path) has no cotangent, and needs none: the run passes, listing its gradient without
// placements; the oracle agrees that its gradient is zero.
TEST(Errors, PartialMaxOffTheBackwardPathIsNoError) {
  json doc = scenario_doc("pmax_off_path", mesh_of({2}));
  doc["inputs"] = {input("x", {4, 3}, {P(ReduceOp::Max)}, true), input("w", {4, 3}, {S(0)}, true)};
  doc["program"] = {redistribute_op("y", "x", {kR}), op("loss", "sum", {"w"})};
  doc["backward"] = "loss";
  CheckedRun run = check_doc(doc);
  ASSERT_TRUE(passes(run));
  EXPECT_EQ(run.result["grads"]["x"], json({{"placements", nullptr}, {"cotangent", nullptr}}));
  EXPECT_EQ(run.result["grads"]["w"]["placements"], json({"S(0)"}));
  bool listed = false;
  for (const auto& e : run.events)
    if (e.kind == "input_grad" && e.value == "x") {
      listed = true;
      EXPECT_EQ(e.out_spec, "none");
    }
  EXPECT_TRUE(listed);
  // On the path it still is an error (Errors.PartialMaxReachingTheBackwardIsNotDifferentiable).
  doc["program"] = {redistribute_op("y", "x", {kR}), op("s", "add", {"y", "w"}), op("loss", "sum", {"s"})};
  expect_error(doc, "not_differentiable", 3);
}

// ---------------------------------------------------------------------------------------------
// 6b. The oracle's verdicts

// One local_map on dp=2: x [4, 3] S(0) (arange, so x[0][0] is 0) enters, `body` makes "y",
// returned as S(0); `reference` (when not null) is the oracle's "y"; loss = sum(y).
json local_map_doc(const json& body, const json& reference) {
  json doc = scenario_doc("lm", mesh_of({2}));
  doc["inputs"] = {input("x", {4, 3}, {S(0)}, true)};
  doc["inputs"][0]["init"] = "arange";
  json lm = {{"out", "y"}, {"op", "local_map"}, {"args", {"x"}}, {"out_placements", {{"S(0)"}}},
             {"body", body}, {"returns", {"z"}}};
  if (!reference.is_null()) lm["reference"] = reference;
  doc["program"] = {lm, op("loss", "sum", {"y"})};
  doc["backward"] = "loss";
  return doc;
}

// Without a reference the oracle knows nothing after the local_map: those comparisons do not
// run, so the checks that hold them are null (not true) and the status is "unchecked" (not
// "pass"); nothing failed, so the exit code stays 0.
TEST(Oracle, LocalMapWithoutReferenceIsUncheckedNotPass) {
  json scale2 = {{"out", "z"}, {"op", "scale"}, {"args", {"x"}}, {"value", 2}};
  CheckedRun run = check_doc(local_map_doc(json::array({scale2}), nullptr));
  const json& r = run.result;
  EXPECT_EQ(r["status"], "unchecked") << r.dump();
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_TRUE(r["checks"]["forward_equivalence"].is_null()) << r.dump();
  EXPECT_TRUE(r["checks"]["gradient_equivalence"].is_null()) << r.dump();
  EXPECT_EQ(r["checks"]["duality"], true);
  EXPECT_EQ(r["unchecked"], json({"y", "loss", "grad x"}));
  // With the reference every check runs and passes.
  json ref = {{"out", "z"}, {"op", "scale"}, {"args", {"x"}}, {"value", 2}};
  EXPECT_TRUE(passes(check_doc(local_map_doc(json::array({scale2}), json::array({ref})))));
  // A comparison that runs and fails makes the check false, skipped ones or not.
  json wrong = {{"out", "z"}, {"op", "scale"}, {"args", {"x"}}, {"value", 3}};
  CheckedRun failed = check_doc(local_map_doc(json::array({scale2}), json::array({wrong})));
  EXPECT_EQ(failed.result["status"], "fail");
  EXPECT_EQ(failed.result["checks"]["forward_equivalence"], false);
  EXPECT_EQ(failed.exit_code, 1);
}

// A reference libtorch refuses (shapes mm cannot multiply) is invalid input naming the op's JSON
// path, reported in the result: check_scenario does not throw (the command does not abort).
TEST(Oracle, AReferenceLibtorchRefusesIsInvalidScenario) {
  json scale2 = {{"out", "z"}, {"op", "scale"}, {"args", {"x"}}, {"value", 2}};
  json mm = {{"out", "z"}, {"op", "mm"}, {"args", {"x", "x"}}};
  CheckedRun run;
  ASSERT_NO_THROW(run = check_doc(local_map_doc(json::array({scale2}), json::array({mm}))));
  EXPECT_EQ(run.result["status"], "error") << run.result.dump();
  EXPECT_EQ(run.result["error"]["kind"], "invalid_scenario");
  const std::string message = run.result["error"].value("message", "");
  EXPECT_NE(message.find("/program/0/reference/0: "), std::string::npos) << message;
  EXPECT_NE(message.find("mm"), std::string::npos) << message;
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_FALSE(run.events.empty());  // the mesh's run, for the trace
}

// NaN where the oracle has a number (0/0 on the mesh, 1 in the reference) is a mismatch, and
// max_abs_error says so (null: not a finite number) instead of dropping it; NaN on both sides at
// the same place is agreement.
TEST(Oracle, NaNOnOneSideIsAMismatchAndOnBothAnAgreement) {
  json div = {{"out", "z"}, {"op", "div"}, {"args", {"x", "x"}}};  // x[0][0] = 0: NaN there, 1 elsewhere
  json ones = {{"out", "z0"}, {"op", "scale"}, {"args", {"x"}}, {"value", 0}};
  json exp0 = {{"out", "z"}, {"op", "exp"}, {"args", {"z0"}}};
  CheckedRun one_side = check_doc(local_map_doc(json::array({div}), json::array({ones, exp0})));
  const json& r = one_side.result;
  EXPECT_EQ(r["status"], "fail") << r.dump();
  EXPECT_EQ(r["checks"]["forward_equivalence"], false);
  EXPECT_TRUE(r["max_abs_error"].is_null()) << r.dump();  // was 0.0: std::max dropped the NaN
  bool named = false;
  for (const auto& f : r["failures"]) {
    const std::string text = f.get<std::string>();
    named |= text.rfind("y: 1 of 12 elements differ", 0) == 0 &&
             text.find("NaN at [0, 0] (expected 1)") != std::string::npos;
  }
  EXPECT_TRUE(named) << r["failures"].dump();

  CheckedRun both = check_doc(local_map_doc(json::array({div}), json::array({div})));
  EXPECT_EQ(both.result["checks"]["forward_equivalence"], true) << both.result.dump();
}

// ---------------------------------------------------------------------------------------------
// 7. Propagation

TEST(Propagation, MmRulesNeedNoRedistribution) {
  const Mesh mesh = mesh_of({4});
  const std::vector<Shape> shapes = {{8, 16}, {16, 4}};
  struct Case {
    Spec a, b, out;
  };
  for (const auto& c : std::vector<Case>{{{S(0)}, {kR}, {S(0)}},
                                         {{kR}, {S(1)}, {S(1)}},
                                         {{S(1)}, {S(0)}, {P()}},
                                         {{kR}, {kR}, {kR}}}) {
    SCOPED_TRACE(spec_str(c.a) + " @ " + spec_str(c.b));
    ShardingDecision d = propagate("mm", mesh, {c.a, c.b}, shapes, {});
    EXPECT_EQ(d.in_specs, (std::vector<Spec>{c.a, c.b}));
    EXPECT_EQ(d.out_spec, c.out);
    EXPECT_EQ(d.out_shape, (Shape{8, 4}));
  }
}

// S(0) @ S(0): the cheapest row is S(0) @ R -> S(0), reached by all_gathering the weight (384
// bytes) rather than all_to_all-ing the activation to S(1) (768 bytes).
TEST(Propagation, MmOfTwoRowShardsGathersTheWeight) {
  const Mesh mesh = mesh_of({4});
  const std::vector<Spec> given = {{S(0)}, {S(0)}};
  const std::vector<Shape> shapes = {{8, 16}, {16, 4}};
  ShardingDecision d = propagate("mm", mesh, given, shapes, {});
  EXPECT_EQ(d.in_specs, (std::vector<Spec>{{S(0)}, {kR}}));
  EXPECT_EQ(d.out_spec, (Spec{S(0)}));
  ShardingDecision again = propagate("mm", mesh, given, shapes, {});
  EXPECT_EQ(again.in_specs, d.in_specs);
  EXPECT_EQ(again.rows, d.rows);

  json doc = scenario_doc("mm_s0_s0", mesh);
  doc["inputs"] = {input("x", {8, 16}, {S(0)}, true), input("w", {16, 4}, {S(0)}, true)};
  doc["program"] = {op("y", "mm", {"x", "w"}), op("loss", "sum", {"y"})};
  doc["backward"] = "loss";
  for (const char* mode : {"above_autograd", "below_autograd"}) {
    SCOPED_TRACE(mode);
    doc["options"]["redistribute"] = mode;
    CheckedRun run = check_doc(doc);
    EXPECT_TRUE(passes(run));
    auto gathers = collectives(run.result, "forward", "all_gather");
    ASSERT_EQ(gathers.size(), 1u) << run.result["collectives"].dump();
    EXPECT_EQ(gathers[0]["bytes"], 384);
    EXPECT_EQ(run.result["grads"]["w"]["placements"], json({"S(0)"}));
  }
}

TEST(Propagation, AddOfPartialAndReplicateMakesTheReplicatePartial) {
  const Mesh mesh = mesh_of({4});
  ShardingDecision d = propagate("add", mesh, {{P()}, {kR}}, {{5, 3}, {5, 3}}, {});
  EXPECT_EQ(d.in_specs, (std::vector<Spec>{{P()}, {P()}}));
  EXPECT_EQ(d.out_spec, (Spec{P()}));

  json doc = scenario_doc("add_p_r", mesh);
  doc["inputs"] = {input("a", {5, 3}, {P()}, true), input("b", {5, 3}, {kR}, true)};
  doc["program"] = {op("s", "add", {"a", "b"}), op("loss", "sum", {"s"})};
  doc["backward"] = "loss";
  for (const char* convention : {"divide", "rank0"}) {
    SCOPED_TRACE(convention);
    doc["options"]["partial_from_replicate"] = convention;
    CheckedRun run = check_doc(doc);
    EXPECT_TRUE(passes(run));
    EXPECT_TRUE(collectives(run.result, "forward", "all_reduce").empty()) << run.result["collectives"].dump();
  }
}

TEST(ReducedPolicy, AddOfReducedAndReplicate) {
  const Mesh mesh = mesh_of({4});
  const std::vector<Spec> given = {{kRd}, {kR}};
  ShardingDecision d = propagate("add", mesh, given, {{5, 3}, {5, 3}}, {});
  EXPECT_EQ(d.in_specs, given) << "Rd is read as R: no redistribution";
  EXPECT_EQ(d.out_spec, (Spec{kR}));
  EXPECT_EQ(restore_reduced("add", mesh, given, d.out_spec, ReducedPropagation::Intersection), (Spec{kR}));
  EXPECT_EQ(restore_reduced("add", mesh, given, d.out_spec, ReducedPropagation::Union), (Spec{kRd}));
  try {
    restore_reduced("add", mesh, given, d.out_spec, ReducedPropagation::Strict);
    ADD_FAILURE() << "strict accepted Rd + R";
  } catch (const SemanticError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::ReducedMismatch);
  }
  // Every operand Rd: Rd under every policy.
  for (auto policy : {ReducedPropagation::Intersection, ReducedPropagation::Union, ReducedPropagation::Strict})
    EXPECT_EQ(restore_reduced("add", mesh, {{kRd}, {kRd}}, {kR}, policy), (Spec{kRd}));

  // Through the runtime: strict is reported as reduced_mismatch (exit 3); the others run.
  json doc = scenario_doc("add_rd_r", mesh);
  doc["inputs"] = {input("a", {5, 3}, {kRd}), input("b", {5, 3}, {kR})};
  doc["program"] = {op("s", "add", {"a", "b"})};
  for (const char* policy : {"intersection", "union"}) {
    doc["options"]["reduced_propagation"] = policy;
    CheckedRun run = check_doc(doc);
    EXPECT_TRUE(passes(run)) << policy;
    EXPECT_EQ(run.result["values"]["s"]["placements"], json({policy == std::string("union") ? "Rd" : "R"}));
  }
  doc["options"]["reduced_propagation"] = "strict";
  expect_error(doc, "reduced_mismatch", 3);
}

}  // namespace

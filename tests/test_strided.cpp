// Tests of strided shards SS(d,k) (PyTorch's _StridedShard) and negative shard dims: spelling,
// layouts (local_layout, local_indices, distribute / assemble), check_strided, the planner's
// strided steps (the FSDP2-over-TP rows) and apply_step, checked against distribute() of the
// target, and the scenario and runtime paths that normalize negative dims (SEMANTICS.md, "Strided
// shards" and "Negative dims").
#include <gtest/gtest.h>

#include "tests/spec_sets.h"

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "core/cost_model.h"
#include "core/error.h"
#include "core/layout.h"
#include "core/redistribute.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "sim/collectives.h"
#include "sim/data.h"

using namespace meshsim;
using json = nlohmann::json;

namespace {

Placement S(int64_t d) { return Placement::shard(d); }
Placement SS(int64_t d, int64_t k) { return Placement::strided_shard(d, k); }
const Placement kR = Placement::replicate();
const Placement kRd = Placement::reduced();
const Placement kPsum = Placement::partial(ReduceOp::Sum);

Mesh mesh_of(const std::vector<int64_t>& shape) {
  static const std::vector<std::string> names = {"dp", "tp", "pp"};
  return Mesh(std::vector<std::string>(names.begin(), names.begin() + shape.size()), shape);
}

at::Tensor ints(const Shape& shape, uint64_t seed) {
  Rng rng(seed, 99);
  return make_init("int", shape, DType::Float64, rng);
}

at::Tensor arange(const Shape& shape) {
  return at::arange(numel(shape), at::TensorOptions().dtype(at::kDouble)).reshape(shape);
}

using testing_util::specs_over;

bool has_strided(const Spec& spec) {
  for (const auto& p : spec)
    if (p.is_strided()) return true;
  return false;
}

// global[indices[0]][indices[1]]...: the values a local with these index lists holds.
at::Tensor gather_indices(const at::Tensor& global, const std::vector<std::vector<int64_t>>& indices) {
  at::Tensor t = global;
  for (size_t d = 0; d < indices.size(); ++d)
    t = t.index_select(static_cast<int64_t>(d), at::tensor(indices[d], at::TensorOptions().dtype(at::kLong)));
  return t;
}

std::string what(const Mesh& mesh, const Spec& spec, const Shape& shape) {
  return "mesh " + mesh.str() + " spec " + spec_str(spec) + " shape " + shape_str(shape);
}

// ---------------------------------------------------------------------------------------------
// Spelling

TEST(StridedPlacement, ParsesEverySpelling) {
  for (const char* text : {"SS(0,2)", "SS(0, 2)", " SS( 0 , 2 ) ", "_StridedShard(0, 2)",
                           "_StridedShard(dim=0, split_factor=2)", "StridedShard(dim=0, split_factor=2)",
                           "_StridedShard(0, split_factor=2)"}) {
    Placement p = parse_placement(text);
    EXPECT_EQ(p, SS(0, 2)) << text;
    EXPECT_TRUE(p.is_shard()) << text;
    EXPECT_TRUE(p.is_strided()) << text;
    EXPECT_EQ(p.split, 2) << text;
  }
  EXPECT_EQ(parse_placement("SS(1,4)"), SS(1, 4));
  EXPECT_EQ(parse_placement("SS(-1,2)").dim, -1);
  EXPECT_EQ(parse_placement("SS(-1,2)").split, 2);
}

TEST(StridedPlacement, PrintsCanonicallyAndRoundTrips) {
  EXPECT_EQ(SS(0, 2).str(), "SS(0,2)");
  EXPECT_EQ(SS(0, 2).pytorch_str(), "_StridedShard(dim=0, split_factor=2)");
  EXPECT_EQ(SS(-1, 3).str(), "SS(-1,3)");
  EXPECT_EQ(spec_str({SS(0, 2), S(0)}), "[SS(0,2), S(0)]");
  for (const auto& p : all_placements_with_strided(3, 4)) {
    EXPECT_EQ(parse_placement(p.str()), p) << p.str();
    EXPECT_EQ(parse_placement(p.pytorch_str()), p) << p.pytorch_str();
  }
}

TEST(StridedPlacement, SplitOneIsThePlainShard) {
  EXPECT_EQ(parse_placement("SS(1,1)"), S(1));
  EXPECT_EQ(parse_placement("_StridedShard(dim=1, split_factor=1)").str(), "S(1)");
  EXPECT_FALSE(parse_placement("SS(1,1)").is_strided());
  EXPECT_EQ(Placement::strided_shard(1, 1), S(1));
}

TEST(StridedPlacement, EqualityComparesTheSplit) {
  EXPECT_NE(SS(0, 2), S(0));
  EXPECT_NE(SS(0, 2), SS(0, 4));
  EXPECT_NE(SS(0, 2), SS(1, 2));
  EXPECT_EQ(SS(0, 2), SS(0, 2));
  EXPECT_FALSE(S(0).is_strided());
  EXPECT_FALSE(kR.is_strided());
}

TEST(StridedPlacement, RejectsMalformedSpellings) {
  for (const char* text : {"SS(0)", "SS", "SS(0,0)", "SS(0,-2)", "SS(0,x)", "SS(0,2,3)", "SS(x,2)", "SS(65,2)",
                           "_StridedShard(dim=0, split=2)", "_StridedShard(axis=0, split_factor=2)", "SS(0,99999999)",
                           "S(0,2)"}) {
    EXPECT_THROW(parse_placement(text), std::invalid_argument) << text;
  }
  try {
    parse_placement("SS(0)");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("SS(d,k)"), std::string::npos) << e.what();
  }
}

TEST(StridedPlacement, AllPlacementsIsUnchanged) {
  const std::vector<std::string> want = {"S(0)", "S(1)", "R", "P(sum)", "P(avg)", "P(max)", "P(min)", "Rd"};
  std::vector<std::string> got;
  for (const auto& p : all_placements(2)) got.push_back(p.str());
  EXPECT_EQ(got, want);
  std::vector<std::string> with;
  for (const auto& p : all_placements_with_strided(2, 2)) with.push_back(p.str());
  std::vector<std::string> want_with = want;
  want_with.push_back("SS(0,2)");
  want_with.push_back("SS(1,2)");
  EXPECT_EQ(with, want_with);
}

// ---------------------------------------------------------------------------------------------
// Negative dims

TEST(NegativeDims, ParseInRange) {
  EXPECT_EQ(parse_placement("S(-1)").dim, -1);
  EXPECT_EQ(parse_placement("Shard(dim=-1)").dim, -1);
  EXPECT_EQ(parse_placement("Shard(-2)").dim, -2);
  EXPECT_EQ(parse_placement("S(-64)").dim, -64);
  EXPECT_EQ(parse_placement("S(-1)").str(), "S(-1)");
  EXPECT_THROW(parse_placement("S(-65)"), std::invalid_argument);
  EXPECT_THROW(parse_placement("S(--1)"), std::invalid_argument);
  EXPECT_THROW(parse_placement("S(-)"), std::invalid_argument);
}

TEST(NegativeDims, NormalizeWrapsByTheRankAndPrintsNormalized) {
  Spec spec = {S(-1), SS(-2, 2), kR, kPsum};
  Spec norm = normalize_spec(spec, 2);
  EXPECT_EQ(norm, (Spec{S(1), SS(0, 2), kR, kPsum}));
  EXPECT_EQ(spec_str(norm), "[S(1), SS(0,2), R, P(sum)]");
  EXPECT_EQ(normalize_spec({S(1), S(0)}, 2), (Spec{S(1), S(0)}));
  EXPECT_EQ(normalize_spec({S(-3)}, 3), (Spec{S(0)}));
}

TEST(NegativeDims, NormalizeRefusesOutOfRangeNamingTheDimAsWritten) {
  for (const Placement& p : {S(-3), S(2), SS(-3, 2)}) {
    try {
      normalize_spec({p}, 2);
      FAIL() << p.str();
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(p.str()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("2 dims"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(normalize_spec({S(-1)}, 0), std::invalid_argument);
}

TEST(NegativeDims, CheckSpecAcceptsInRangeAndReportsAsWritten) {
  const Mesh mesh = mesh_of({2, 2});
  EXPECT_EQ(check_spec(mesh, {S(-1), S(-2)}, 2), "");
  EXPECT_EQ(check_spec(mesh, {SS(-2, 2), kR}, 2), "");
  const std::string why = check_spec(mesh, {S(-3), kR}, 2);
  EXPECT_NE(why.find("S(-3)"), std::string::npos) << why;
  EXPECT_NE(why.find("dim -3"), std::string::npos) << why;
  EXPECT_NE(check_spec(mesh, {S(2), kR}, 2), "");
}

// ---------------------------------------------------------------------------------------------
// check_strided

TEST(CheckStrided, PassesEvenPiecesAndPlainSpecs) {
  EXPECT_EQ(check_strided(mesh_of({2, 2}), {SS(0, 2), S(0)}, {8, 4}), "");
  EXPECT_EQ(check_strided(mesh_of({2, 2}), {SS(0, 2), kR}, {4, 3}), "");
  EXPECT_EQ(check_strided(mesh_of({2, 2}), {S(0), S(0)}, {5, 3}), "");  // plain: uneven is fine
  EXPECT_EQ(check_strided(mesh_of({4}), {SS(1, 2)}, {3, 8}), "");
  EXPECT_EQ(check_strided(mesh_of({2}), {SS(-1, 2)}, {3, 4}), "");
  EXPECT_EQ(check_strided(mesh_of({2}), {SS(0, 2)}, {0, 4}), "");  // empty pieces divide evenly
}

TEST(CheckStrided, NamesPlacementAxisDimExtentSplitAndGroup) {
  std::string why = check_strided(mesh_of({2}), {SS(0, 2)}, {6, 4});  // pieces of 3 over 2
  for (const char* part : {"SS(0,2)", "\"dp\"", "size 2", "dim 0", "extent 6", "2 equal pieces", "3"})
    EXPECT_NE(why.find(part), std::string::npos) << part << " in: " << why;
  why = check_strided(mesh_of({2}), {SS(1, 4)}, {4, 6});  // 6 is no multiple of 4
  for (const char* part : {"SS(1,4)", "dim 1", "extent 6", "4 equal pieces"})
    EXPECT_NE(why.find(part), std::string::npos) << part << " in: " << why;
  // After an outer axis: [8] over 2 is 4 rows, cut into 2 pieces of 2, over 4 does not divide.
  why = check_strided(mesh_of({2, 4}), {S(0), SS(0, 2)}, {8});
  EXPECT_NE(why.find("extent 4 there"), std::string::npos) << why;
  EXPECT_NE(why.find("\"tp\""), std::string::npos) << why;
  // Uneven outer chunks: 10 over 3 is 4, 4, 2; only the 2 fails SS(0,2) over 2.
  EXPECT_NE(check_strided(mesh_of({3, 2}), {S(0), SS(0, 2)}, {10}), "");
  EXPECT_EQ(check_strided(mesh_of({3, 2}), {S(0), SS(0, 2)}, {12}), "");
  // Out of range dims are reported.
  EXPECT_NE(check_strided(mesh_of({2}), {SS(-3, 2)}, {4, 4}), "");
}

// ---------------------------------------------------------------------------------------------
// Layouts

// FSDP2 over TP: [SS(0,2), S(0)] on dp=2 x tp=2: rank (i, j) holds chunk i of piece j, rows
// [4j + 2i, 4j + 2i + 2) of an [8, 4] tensor.
TEST(StridedLayout, Fsdp2OverTpHoldsChunkIOfPieceJ) {
  const Mesh mesh = mesh_of({2, 2});
  const Spec spec = {SS(0, 2), S(0)};
  const Shape shape = {8, 4};
  const at::Tensor global = arange(shape);
  const Locals locals = distribute(mesh, spec, global, nullptr);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t r = mesh.rank_of({i, j});
      std::vector<double> want;
      for (int64_t row = 4 * j + 2 * i; row < 4 * j + 2 * i + 2; ++row)
        for (int64_t col = 0; col < 4; ++col) want.push_back(static_cast<double>(row * 4 + col));
      const at::Tensor expect = at::tensor(want, at::TensorOptions().dtype(at::kDouble)).reshape({2, 4});
      EXPECT_TRUE(at::equal(locals[r], expect)) << "rank (" << i << ", " << j << "): " << locals[r];
      LocalLayout l = local_layout(mesh, spec, shape, r);
      EXPECT_EQ(l.shape, (Shape{2, 4}));
      EXPECT_EQ(l.offset, (Shape{4 * j + 2 * i, 0}));
      auto idx = local_indices(mesh, spec, shape, r);
      EXPECT_EQ(idx[0], (std::vector<int64_t>{4 * j + 2 * i, 4 * j + 2 * i + 1}));
      EXPECT_EQ(idx[1], (std::vector<int64_t>{0, 1, 2, 3}));
    }
  EXPECT_TRUE(at::equal(assemble(mesh, spec, locals), global));
}

// [SS(0,2)] over 4 ranks, 8 rows: rank c holds rows c and 4 + c; [SS(0,2), R] over dp=2 of [8]:
// rank i holds rows 2i, 2i+1, 4+2i, 4+2i+1.
TEST(StridedLayout, OneAxisInterleavesPieces) {
  const at::Tensor global = arange({8});
  {
    const Mesh mesh = mesh_of({4});
    const Locals locals = distribute(mesh, {SS(0, 2)}, global, nullptr);
    for (int64_t c = 0; c < 4; ++c) {
      EXPECT_TRUE(at::equal(locals[c], at::tensor({double(c), double(4 + c)}, at::kDouble))) << c << ": " << locals[c];
      EXPECT_EQ(local_layout(mesh, {SS(0, 2)}, {8}, c).shape, (Shape{2}));
      EXPECT_EQ(local_layout(mesh, {SS(0, 2)}, {8}, c).offset, (Shape{c}));
    }
  }
  {
    const Mesh mesh = mesh_of({2, 2});
    const Locals locals = distribute(mesh, {SS(0, 2), kR}, global, nullptr);
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 2; ++j)
        EXPECT_TRUE(at::equal(locals[mesh.rank_of({i, j})],
                              at::tensor({double(2 * i), double(2 * i + 1), double(4 + 2 * i), double(5 + 2 * i)},
                                         at::kDouble)));
  }
}

// Every spec over {S(0), S(1), SS(0,2), SS(1,2), SS(0,4), R, Rd, P(sum)} on 1-, 2- and 3-axis meshes
// that divides evenly: distribute's locals are the values local_indices names, their shapes are
// local_layout's, and assemble inverts distribute (with random Partial splits too).
TEST(StridedLayout, DistributeAssembleRoundTripOneTwoThreeAxes) {
  const std::vector<Placement> set = {S(0), S(1), SS(0, 2), SS(1, 2), SS(0, 4), kR, kRd, kPsum};
  int checked = 0, strided = 0;
  for (const auto& ms : std::vector<std::vector<int64_t>>{{2}, {4}, {2, 2}, {2, 4}, {2, 2, 2}}) {
    const Mesh mesh = mesh_of(ms);
    for (const Shape& shape : {Shape{8, 4}, Shape{16, 8}, Shape{5, 8}})
      for (const auto& spec : specs_over(set, mesh.ndim())) {
        if (!check_strided(mesh, spec, shape).empty()) continue;
        const at::Tensor global = ints(shape, 3);
        const Locals plain = distribute(mesh, spec, global, nullptr);
        for (int64_t r = 0; r < mesh.size(); ++r) {
          const LocalLayout l = local_layout(mesh, spec, shape, r);
          const auto idx = local_indices(mesh, spec, shape, r);
          EXPECT_EQ(plain[r].sizes().vec(), l.shape) << what(mesh, spec, shape);
          for (size_t d = 0; d < idx.size(); ++d) {
            EXPECT_EQ(static_cast<int64_t>(idx[d].size()), l.shape[d]) << what(mesh, spec, shape);
            if (!idx[d].empty()) {
              EXPECT_EQ(l.offset[d], idx[d][0]) << what(mesh, spec, shape) << " rank " << r;
            }
          }
          bool partial = false;
          for (const auto& p : spec) partial |= p.is_partial();
          if (!partial) {
            EXPECT_TRUE(at::equal(plain[r], gather_indices(global, idx))) << what(mesh, spec, shape) << " rank " << r;
          }
        }
        EXPECT_TRUE(at::equal(assemble(mesh, spec, plain), global)) << what(mesh, spec, shape);
        Rng rng(5, 1);
        const Locals random = distribute(mesh, spec, global, &rng);
        std::string problem;
        EXPECT_TRUE(at::equal(assemble(mesh, spec, random, &problem), global)) << what(mesh, spec, shape);
        EXPECT_EQ(problem, "") << what(mesh, spec, shape);
        ++checked;
        strided += has_strided(spec);
      }
  }
  EXPECT_GT(strided, 300);
  std::printf("[   INFO   ] %d specs, %d with a strided shard\n", checked, strided);
}

TEST(StridedLayout, AssembleRefusesLocalsThatDoNotSplit) {
  const Mesh mesh = mesh_of({2});
  const Locals locals = {arange({3}), arange({3})};
  EXPECT_THROW(assemble(mesh, {SS(0, 2)}, locals), c10::Error);
}

// ---------------------------------------------------------------------------------------------
// Planner and apply_step

std::vector<RedistStep> plan(const Mesh& mesh, const Spec& from, const Spec& to, bool gradient = false) {
  return plan_redistribute(mesh, from, to, {PartialFromReplicate::Divide, gradient});
}

std::string plan_str(const std::vector<RedistStep>& steps) {
  std::string out;
  for (const auto& s : steps) out += (out.empty() ? "" : "; ") + s.str();
  return out;
}

void expect_one_step(const Mesh& mesh, const Spec& from, const Spec& to, StepKind kind, int axis, int64_t split,
                     bool gradient = false) {
  auto steps = plan(mesh, from, to, gradient);
  ASSERT_EQ(steps.size(), 1u) << spec_str(from) << " -> " << spec_str(to) << ": " << plan_str(steps);
  EXPECT_EQ(steps[0].kind, kind) << plan_str(steps);
  EXPECT_EQ(steps[0].axis, axis) << plan_str(steps);
  EXPECT_EQ(steps[0].split_factor, split) << plan_str(steps);
  EXPECT_EQ(steps[0].dim, 0) << plan_str(steps);
}

TEST(StridedPlan, Fsdp2OverTpIsOneCollective) {
  const Mesh mesh = mesh_of({2, 2});
  // Unshard FSDP's dim keeping TP's: one all_gather on dp, nothing on tp.
  expect_one_step(mesh, {SS(0, 2), S(0)}, {kR, S(0)}, StepKind::AllGather, 0, 1);
  expect_one_step(mesh, {SS(0, 2), S(0)}, {kRd, S(0)}, StepKind::AllGather, 0, 1);
  // Reshard: one local_chunk on dp.
  expect_one_step(mesh, {kR, S(0)}, {SS(0, 2), S(0)}, StepKind::LocalChunk, 0, 1);
  // The gradient: one reduce_scatter on dp.
  expect_one_step(mesh, {kPsum, S(0)}, {SS(0, 2), S(0)}, StepKind::ReduceScatter, 0, 1);
  expect_one_step(mesh, {kPsum, S(0)}, {SS(0, 2), S(0)}, StepKind::ReduceScatter, 0, 1, true);
  expect_one_step(mesh, {Placement::partial(ReduceOp::Avg), S(0)}, {SS(0, 2), S(0)}, StepKind::ReduceScatter, 0, 1);
  // Without the inner TP shard the local holds both pieces: split 2.
  expect_one_step(mesh, {SS(0, 2), kR}, {kR, kR}, StepKind::AllGather, 0, 2);
  expect_one_step(mesh, {kR, kR}, {SS(0, 2), kR}, StepKind::LocalChunk, 0, 2);
  expect_one_step(mesh, {kPsum, kR}, {SS(0, 2), kR}, StepKind::ReduceScatter, 0, 2);
  // A 1-axis mesh.
  expect_one_step(mesh_of({4}), {SS(0, 2)}, {kR}, StepKind::AllGather, 0, 2);
  // Three axes: dp=2 x tp=2 x cp=2 with SS(0,4) over both inner S(0).
  expect_one_step(mesh_of({2, 2, 2}), {SS(0, 4), S(0), S(0)}, {kR, S(0), S(0)}, StepKind::AllGather, 0, 1);
  expect_one_step(mesh_of({2, 2, 2}), {kPsum, S(0), S(0)}, {SS(0, 4), S(0), S(0)}, StepKind::ReduceScatter, 0, 1);
}

TEST(StridedPlan, NotNestedWhenTheSplitIsNotTheInnerShardCount) {
  const Mesh mesh = mesh_of({2, 2});
  // SS(0,4) over an inner S(0) of 2: the inner axis is gathered first, then dp with split 4.
  auto steps = plan(mesh, {SS(0, 4), S(0)}, {kR, S(0)});
  ASSERT_EQ(steps.size(), 3u) << plan_str(steps);
  EXPECT_EQ(steps[0].kind, StepKind::AllGather);
  EXPECT_EQ(steps[0].axis, 1);
  EXPECT_EQ(steps[1].kind, StepKind::AllGather);
  EXPECT_EQ(steps[1].axis, 0);
  EXPECT_EQ(steps[1].split_factor, 4);
  EXPECT_EQ(steps[2].kind, StepKind::LocalChunk);
  EXPECT_EQ(steps[2].axis, 1);
  // An SS that changes into a shard is gathered and re-chunked (no all_to_all).
  steps = plan(mesh_of({2}), {SS(0, 2)}, {S(1)});
  ASSERT_EQ(steps.size(), 2u) << plan_str(steps);
  EXPECT_EQ(steps[0].kind, StepKind::AllGather);
  EXPECT_EQ(steps[0].split_factor, 2);
  EXPECT_EQ(steps[1].kind, StepKind::LocalChunk);
  EXPECT_EQ(steps[1].split_factor, 1);
  steps = plan(mesh_of({2}), {S(1)}, {SS(0, 2)});
  ASSERT_EQ(steps.size(), 2u) << plan_str(steps);
  EXPECT_EQ(steps[1].kind, StepKind::LocalChunk);
  EXPECT_EQ(steps[1].split_factor, 2);
}

TEST(StridedPlan, StepStringShowsTheSplit) {
  auto steps = plan(mesh_of({2, 2}), {SS(0, 2), kR}, {kR, kR});
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].str(), "all_gather(axis 0, dim=0, split=2): SS(0,2) -> R");
  steps = plan(mesh_of({2, 2}), {SS(0, 2), S(0)}, {kR, S(0)});
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].str(), "all_gather(axis 0, dim=0): SS(0,2) -> R");
}

TEST(StridedPlan, CoverageKeysAreThePlainOnes) {
  auto steps = plan(mesh_of({2}), {SS(0, 2)}, {kR});
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(coverage_key(steps[0], false), "redistribute: all_gather S -> R");
  steps = plan(mesh_of({2}), {kPsum}, {SS(1, 2)});
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(coverage_key(steps[0], true), "redistribute: reduce_scatter P(sum) -> S (gradient)");
  steps = plan(mesh_of({2}), {kR}, {SS(1, 2)});
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(coverage_key(steps[0], false), "redistribute: local_chunk R -> S");
}

TEST(StridedPlan, StridedToPartialIsIllegalOutsideGradients) {
  try {
    plan(mesh_of({2}), {SS(0, 2)}, {kPsum});
    FAIL();
  } catch (const SemanticError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::IllegalRedistribute);
    EXPECT_NE(std::string(e.what()).find("SS(0,2) -> P(sum) is illegal"), std::string::npos) << e.what();
  }
  EXPECT_NE(redistribute_illegal_reason({SS(0, 2)}, {Placement::partial(ReduceOp::Max)}, true), "");
  auto steps = plan(mesh_of({2}), {SS(0, 2)}, {kPsum}, true);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].kind, StepKind::PadToPartial);
  EXPECT_EQ(steps[0].split_factor, 2);
}

// Runs a plan step by step: the locals after it.
Locals run_plan(const Mesh& mesh, const std::vector<RedistStep>& steps, Locals locals) {
  for (const auto& s : steps) locals = apply_step(mesh, s, locals);
  return locals;
}

// Every legal pair over {S(0), S(1), SS(0,2), SS(1,2), R, Rd, P(sum)} (forward and gradient
// plans): the planned steps turn distribute(global, from) into distribute(global, to) exactly (a
// Partial target: its assembled value is the global), and every strided step moves the bytes of
// the plain step over the same locals.
struct PairSweep {
  int pairs = 0, strided_pairs = 0, strided_steps = 0;

  void run(const Mesh& mesh, const Shape& shape,
           const std::vector<Placement>& set = {S(0), S(1), SS(0, 2), SS(1, 2), kR, kRd, kPsum}) {
    const at::Tensor global = ints(shape, 11);
    for (bool gradient : {false, true})
      for (const auto& from : specs_over(set, mesh.ndim()))
        for (const auto& to : specs_over(set, mesh.ndim())) {
          if (!redistribute_illegal_reason(from, to, gradient).empty()) continue;
          if (!check_strided(mesh, from, shape).empty() || !check_strided(mesh, to, shape).empty()) continue;
          const std::string label = mesh.str() + " " + shape_str(shape) + " " + spec_str(from) + " -> " +
                                    spec_str(to) + (gradient ? " (gradient)" : "");
          std::vector<RedistStep> steps;
          try {
            steps = plan(mesh, from, to, gradient);
          } catch (const std::exception& e) {
            ADD_FAILURE() << label << ": " << e.what();
            continue;
          }
          Rng rng(17, static_cast<uint64_t>(pairs));
          Locals locals = distribute(mesh, from, global, &rng);
          for (const auto& s : steps) {
            if (s.split_factor > 1) {
              ++strided_steps;
              RedistStep plain = s;
              plain.split_factor = 1;
              EXPECT_EQ(step_bytes(mesh, s, locals), step_bytes(mesh, plain, locals)) << label << ": " << s.str();
            }
            locals = apply_step(mesh, s, locals);
          }
          bool partial = false;
          for (const auto& p : to) partial |= p.is_partial();
          if (partial) {
            EXPECT_TRUE(at::equal(assemble(mesh, to, locals), global)) << label << ": " << plan_str(steps);
          } else {
            const Locals want = distribute(mesh, to, global, nullptr);
            for (int64_t r = 0; r < mesh.size(); ++r)
              EXPECT_TRUE(locals[r].sizes() == want[r].sizes() && at::equal(locals[r], want[r]))
                  << label << ": rank " << r << " " << plan_str(steps) << "\ngot " << locals[r] << "\nwant " << want[r];
          }
          ++pairs;
          strided_pairs += has_strided(from) || has_strided(to);
        }
  }
};

TEST(StridedRedistribute, EveryPairTwoByTwo) {
  PairSweep sweep;
  sweep.run(mesh_of({2, 2}), {8, 4});
  sweep.run(mesh_of({2, 2}), {8, 8});
  EXPECT_GT(sweep.strided_pairs, 1000);
  EXPECT_GT(sweep.strided_steps, 100);
  std::printf("[   INFO   ] %d pairs, %d with a strided shard, %d strided steps\n", sweep.pairs, sweep.strided_pairs,
              sweep.strided_steps);
}

TEST(StridedRedistribute, EveryPairOneAxis) {
  PairSweep sweep;
  sweep.run(mesh_of({2}), {8, 4});
  sweep.run(mesh_of({4}), {8, 8});
  sweep.run(mesh_of({1}), {4, 2});
  EXPECT_GT(sweep.strided_pairs, 50);
  EXPECT_GT(sweep.strided_steps, 10);
}

TEST(StridedRedistribute, EveryPairTwoByFourAndThreeAxes) {
  PairSweep sweep;
  sweep.run(mesh_of({2, 4}), {16, 8});
  sweep.run(mesh_of({2, 1}), {8, 4});
  // Three axes: a smaller set (7^3 specs squared would take half a minute).
  sweep.run(mesh_of({2, 2, 2}), {8, 8}, {S(0), SS(0, 2), SS(0, 4), kR, kPsum});
  EXPECT_GT(sweep.strided_steps, 100);
}

// The FSDP2 rows on real values, and their bytes: those of the plain step of the same size.
TEST(StridedRedistribute, Fsdp2ValuesAndBytes) {
  const Mesh mesh = mesh_of({2, 2});
  const Shape shape = {8, 4};
  const at::Tensor global = ints(shape, 23);
  const int64_t elem = 8;  // float64
  // all_gather on dp of [2, 4] locals: the full tensor per group is [4, 4].
  {
    auto steps = plan(mesh, {SS(0, 2), S(0)}, {kR, S(0)});
    Locals in = distribute(mesh, {SS(0, 2), S(0)}, global, nullptr);
    EXPECT_EQ(step_bytes(mesh, steps[0], in), collective_bytes(StepKind::AllGather, 4 * 4 * elem, 2));
    Locals out = run_plan(mesh, steps, in);
    Locals want = distribute(mesh, {kR, S(0)}, global, nullptr);
    for (int64_t r = 0; r < 4; ++r) EXPECT_TRUE(at::equal(out[r], want[r])) << r;
  }
  // reduce_scatter on dp of [4, 4] Partial locals into [2, 4].
  {
    auto steps = plan(mesh, {kPsum, S(0)}, {SS(0, 2), S(0)}, true);
    Rng rng(3, 3);
    Locals in = distribute(mesh, {kPsum, S(0)}, global, &rng);
    EXPECT_EQ(step_bytes(mesh, steps[0], in), collective_bytes(StepKind::ReduceScatter, 4 * 4 * elem, 2));
    Locals out = run_plan(mesh, steps, in);
    Locals want = distribute(mesh, {SS(0, 2), S(0)}, global, nullptr);
    for (int64_t r = 0; r < 4; ++r) EXPECT_TRUE(at::equal(out[r], want[r])) << r;
  }
  // [SS(0,2), R] -> [R, R]: all_gather with split 2 of [4, 4] locals: the full [8, 4].
  {
    auto steps = plan(mesh, {SS(0, 2), kR}, {kR, kR});
    Locals in = distribute(mesh, {SS(0, 2), kR}, global, nullptr);
    RedistStep plain = steps[0];
    plain.split_factor = 1;
    EXPECT_EQ(step_bytes(mesh, steps[0], in), collective_bytes(StepKind::AllGather, 8 * 4 * elem, 2));
    EXPECT_EQ(step_bytes(mesh, steps[0], in), step_bytes(mesh, plain, in));
    Locals out = run_plan(mesh, steps, in);
    for (int64_t r = 0; r < 4; ++r) EXPECT_TRUE(at::equal(out[r], global)) << r;
    // The plain all_gather of the same locals is member-major: not the global.
    Locals wrong = apply_step(mesh, plain, in);
    EXPECT_FALSE(at::equal(wrong[0], global));
  }
}

// A gradient's zero pad from a strided shard: the pieces land where they belong.
TEST(StridedRedistribute, PadToPartialFromAStridedShard) {
  const Mesh mesh = mesh_of({2});
  const at::Tensor global = arange({8, 2});
  auto steps = plan(mesh, {SS(0, 2)}, {kPsum}, true);
  Locals out = run_plan(mesh, steps, distribute(mesh, {SS(0, 2)}, global, nullptr));
  EXPECT_TRUE(at::equal(out[0] + out[1], global));
  // Rank 0 holds rows 0, 1 and 4, 5 (its sub-chunk of each piece); the rest are zero.
  at::Tensor mask = at::zeros({8, 2}, at::kDouble);
  for (int64_t row : {0, 1, 4, 5}) mask[row].fill_(1);
  EXPECT_TRUE(at::equal(out[0], global * mask));
}

// ---------------------------------------------------------------------------------------------
// Scenarios and the runtime

json scenario(const Mesh& mesh, json inputs, json program) {
  return {{"format", "meshsim.scenario/1"},
          {"name", "strided"},
          {"mesh", {{"axes", mesh.axes()}, {"shape", mesh.shape()}}},
          {"options", {{"seed", 3}}},
          {"inputs", std::move(inputs)},
          {"program", std::move(program)}};
}

json redistribute(const std::string& out, const std::string& arg, std::vector<std::string> placements) {
  return {{"out", out}, {"op", "redistribute"}, {"args", {arg}}, {"placements", placements}};
}

TEST(StridedScenario, InputPlacementsAreNormalized) {
  const Mesh mesh = mesh_of({2, 2});
  json doc = scenario(mesh,
                      {{{"name", "x"}, {"shape", {8, 4}}, {"placements", {"_StridedShard(dim=-2, split_factor=2)", "S(-2)"}}}},
                      {redistribute("y", "x", {"R", "S(0)"})});
  Scenario sc = parse_scenario(doc, "<test>");
  EXPECT_EQ(sc.inputs[0].placements, (Spec{SS(0, 2), S(0)}));
  EXPECT_EQ(spec_str(sc.inputs[0].placements), "[SS(0,2), S(0)]");
}

TEST(StridedScenario, UnevenStridedInputIsAShapeMismatchAtItsPath) {
  const Mesh mesh = mesh_of({2, 2});
  json doc = scenario(mesh, {{{"name", "x"}, {"shape", {6, 4}}, {"placements", {"SS(0,2)", "S(0)"}}}},
                      {redistribute("y", "x", {"R", "R"})});
  try {
    parse_scenario(doc, "<test>");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.json_path(), "/inputs/0/placements");
    EXPECT_EQ(e.kind(), ErrorKind::ShapeMismatch);
    EXPECT_EQ(exit_code_for(e.kind()), 2);
    EXPECT_NE(std::string(e.what()).find("SS(0,2)"), std::string::npos) << e.what();
  }
  doc["inputs"][0]["shape"] = {8, 4};
  doc["inputs"][0]["placements"] = {"S(-3)", "R"};
  try {
    parse_scenario(doc, "<test>");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.json_path(), "/inputs/0/placements");
    EXPECT_NE(std::string(e.what()).find("S(-3)"), std::string::npos) << e.what();
  }
}

// from_local: every rank holds the same [2, 4] local; SS(0,2) over dp=2 makes an [4, 4] global
// (rows: rank 0's piece-0 row, rank 1's piece-0 row, rank 0's piece-1 row, rank 1's piece-1 row).
TEST(StridedScenario, FromLocalStridedInputIsCheckedOnItsGlobal) {
  const Mesh mesh = mesh_of({2});
  json doc = scenario(mesh, {{{"name", "x"}, {"shape", {2, 4}}, {"placements", {"SS(0,2)"}}, {"from_local", true}}},
                      {redistribute("y", "x", {"R"})});
  Scenario sc = parse_scenario(doc, "<test>");
  CheckedRun run = check_scenario(sc, sc.options);
  EXPECT_EQ(run.exit_code, 0) << run.result.dump();
  EXPECT_EQ(run.result["values"]["x"]["shape"], json({4, 4})) << run.result.dump();
  doc["inputs"][0]["shape"] = {3, 4};  // 3 rows do not cut into 2 pieces
  EXPECT_THROW(parse_scenario(doc, "<test>"), InputError);
}

TEST(StridedScenario, RedistributeTargetsWithNegativeAndStridedDims) {
  const Mesh mesh = mesh_of({2, 2});
  // x [8, 4] S(-1) on dp -> FSDP2 layout -> R -> back: the runtime normalizes every target.
  json doc = scenario(mesh, {{{"name", "x"}, {"shape", {8, 4}}, {"placements", {"S(-1)", "R"}}}},
                      {redistribute("y", "x", {"SS(-2,2)", "S(-2)"}), redistribute("z", "y", {"R", "S(0)"}),
                       redistribute("w", "z", {"S(-1)", "R"})});
  Scenario sc = parse_scenario(doc, "<test>");
  CheckedRun run = check_scenario(sc, sc.options);
  EXPECT_EQ(run.exit_code, 0) << run.result.dump();
  EXPECT_EQ(run.result.value("status", ""), "pass") << run.result.dump();
  // y -> z is one all_gather over dp.
  int gathers = 0;
  for (const auto& c : run.result["collectives"])
    if (c.value("value", "") == "z") {
      ++gathers;
      EXPECT_EQ(c.value("op", ""), "all_gather") << c.dump();
    }
  EXPECT_EQ(gathers, 1) << run.result["collectives"].dump();
}

TEST(StridedScenario, RuntimeRefusesAStridedTargetThatDoesNotDivide) {
  const Mesh mesh = mesh_of({2, 2});
  json doc = scenario(mesh, {{{"name", "x"}, {"shape", {6, 4}}, {"placements", {"R", "R"}}}},
                      {redistribute("y", "x", {"SS(0,2)", "R"})});
  Scenario sc = parse_scenario(doc, "<test>");
  CheckedRun run = check_scenario(sc, sc.options);
  EXPECT_EQ(run.exit_code, 2) << run.result.dump();
  EXPECT_NE(run.result.dump().find("shape_mismatch"), std::string::npos) << run.result.dump();
  EXPECT_NE(run.result.dump().find("SS(0,2)"), std::string::npos) << run.result.dump();
}

}  // namespace

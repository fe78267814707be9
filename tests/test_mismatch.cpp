// Tests of oracles/mismatch (failures in numbers, as torch.testing.assert_close reports them), the
// result's "mismatches" field (contract 3) and cli/values (the run's tensors as .npy files).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "cli/values.h"
#include "core/error.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "oracles/mismatch.h"
#include "sim/data.h"

using namespace meshsim;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

at::Tensor f64(std::vector<double> v, std::vector<int64_t> shape) {
  return at::tensor(v, at::TensorOptions().dtype(at::kDouble)).reshape(shape);
}

Spec spec_of(std::vector<std::string> texts) {
  Spec out;
  for (const auto& t : texts) out.push_back(parse_placement(t));
  return out;
}

json input(const std::string& name, const Shape& shape, std::vector<std::string> placements, bool grad = false) {
  json in = {{"name", name}, {"shape", shape}, {"placements", placements}};
  if (grad) in["requires_grad"] = true;
  return in;
}

json op(const std::string& out, const std::string& name, std::vector<std::string> args) {
  return {{"out", out}, {"op", name}, {"args", args}};
}

json doc_of(const std::string& name, std::vector<std::string> axes, std::vector<int64_t> shape, json inputs,
            json program, bool backward) {
  json doc = {{"format", "meshsim.scenario/1"}, {"name", name},         {"mesh", {{"axes", axes}, {"shape", shape}}},
              {"inputs", inputs},               {"program", program}};
  if (backward) doc["backward"] = "loss";
  return doc;
}

CheckedRun check_doc(const json& doc, const std::string& mutant = "", bool keep = false) {
  Scenario sc = parse_scenario(doc, "mem.json");
  RunOptions options = sc.options;
  options.mutant = mutant;
  return check_scenario(sc, options, keep);
}

// The mismatch report of one value ("value" or "grad"); null when there is none.
json report_of(const CheckedRun& run, const std::string& value, const std::string& kind) {
  for (const auto& m : run.result.value("mismatches", json::array()))
    if (m["value"] == value && m["kind"] == kind) return m;
  return nullptr;
}

std::string failure_of(const CheckedRun& run, const std::string& prefix) {
  for (const auto& f : run.result.value("failures", json::array()))
    if (f.get<std::string>().rfind(prefix, 0) == 0) return f.get<std::string>();
  return "";
}

// ---------------------------------------------------------------------------------------------
// describe_mismatch on tensors built by hand

TEST(Mismatch, GreatestDifferenceIndexValuesAndRanks) {
  const Mesh mesh({"tp"}, {4});
  const Spec spec = spec_of({"S(0)"});
  const at::Tensor expected = f64({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  at::Tensor actual = expected.clone();
  actual[2][1] = 9.0;  // off by 3, on rank 2 (one row per rank)
  actual[0][0] = 2.0;  // off by 1, relatively the greatest (1 / 1), on rank 0
  const Mismatch m = describe_mismatch(mesh, spec, distribute(mesh, spec, actual, nullptr), actual, expected, 0.0);
  EXPECT_EQ(m.mismatched, 2);
  EXPECT_EQ(m.total, 8);
  ASSERT_TRUE(m.max_abs.defined);
  EXPECT_EQ(m.max_abs.index, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(m.max_abs.expected, 6.0);
  EXPECT_EQ(m.max_abs.actual, 9.0);
  EXPECT_EQ(m.max_abs.diff, 3.0);
  ASSERT_TRUE(m.max_rel.defined);
  EXPECT_EQ(m.max_rel.index, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(m.max_rel.diff, 1.0);
  EXPECT_EQ(m.ranks, (std::vector<int64_t>{0, 2}));
  EXPECT_FALSE(m.replicas_disagree());
  EXPECT_FALSE(m.factor.has_value());
  EXPECT_EQ(m.message,
            "2 of 8 elements differ; greatest difference 3 at [2, 1]: expected 6, actual 9 (ranks 0, 2); "
            "greatest relative difference 1 at [0, 0]");
  const json j = m.to_json();
  EXPECT_EQ(j["max_abs"], json({{"index", {2, 1}}, {"expected", 6.0}, {"actual", 9.0}, {"diff", 3.0}}));
  EXPECT_EQ(j["ranks"], json({0, 2}));
  EXPECT_TRUE(j["factor"].is_null());
  EXPECT_TRUE(j["nan"].is_null());
}

// Within tolerance is not a mismatch: only the element beyond tol * max(1, max |expected|) counts.
TEST(Mismatch, ToleranceIsRelativeToTheLargestExpectedMagnitude) {
  const Mesh mesh({"dp"}, {2});
  const Spec spec = spec_of({"S(0)"});
  const at::Tensor expected = f64({100, 1}, {2});
  const at::Tensor actual = f64({100.5, 3}, {2});  // 0.5 <= 0.01 * 100, 2 is not
  const Mismatch m = describe_mismatch(mesh, spec, distribute(mesh, spec, actual, nullptr), actual, expected, 0.01);
  EXPECT_EQ(m.mismatched, 1);
  EXPECT_DOUBLE_EQ(m.allowed, 1.0);
  EXPECT_EQ(m.ranks, (std::vector<int64_t>{1}));
  EXPECT_NE(m.message.find("1 of 2 elements differ (up to 1 allowed)"), std::string::npos) << m.message;
}

// Over a Partial axis a rank is named when its group's sum differs: every member of that group.
TEST(Mismatch, PartialGroupsAreComparedByTheirSums) {
  const Mesh mesh({"dp", "tp"}, {2, 2});
  const Spec spec = spec_of({"S(0)", "P(sum)"});
  const at::Tensor expected = f64({1, 2, 3, 4}, {2, 2});
  Locals locals = distribute(mesh, spec, expected, nullptr);  // rank 0 and 2 hold the rows, 1 and 3 zeros
  locals[1] = locals[1] + 1.0;  // wrong parts on rank 1: the group {0, 1} sums to row 0 + 1
  std::string problem;
  const at::Tensor actual = assemble(mesh, spec, locals, &problem);
  const Mismatch m = describe_mismatch(mesh, spec, locals, actual, expected, 0.0);
  EXPECT_EQ(m.mismatched, 2);
  EXPECT_EQ(m.ranks, (std::vector<int64_t>{0, 1}));
}

// Replicas that disagree: the mesh's value is the first holder's (right here), the other replica
// is named, and the disagreement is reported in the text with the ranks.
TEST(Mismatch, ReplicasThatDisagreeAreNamed) {
  const Mesh mesh({"dp"}, {2});
  const Spec spec = spec_of({"R"});
  const at::Tensor expected = f64({1, 2, 3}, {3});
  Locals locals = {expected, expected + 1.0};
  const Mismatch m = describe_mismatch(mesh, spec, locals, expected, expected, 0.0);
  EXPECT_EQ(m.mismatched, 0);
  EXPECT_EQ(m.ranks, (std::vector<int64_t>{1}));
  ASSERT_TRUE(m.replicas_disagree());
  EXPECT_EQ(m.replicas[0].first, 0);
  EXPECT_EQ(m.replicas[0].other, 1);
  EXPECT_EQ(m.replicas[0].axis, "dp");
  EXPECT_EQ(m.message,
            "rank 1 holds a local that differs from the oracle's; ranks 0 and 1 hold different locals across "
            "mesh axis \"dp\" where R says they are equal (first at local [0]: 1 on rank 0, 2 on rank 1)");
  EXPECT_EQ(m.to_json()["replica_pairs"],
            json::parse(R"([{"ranks": [0, 1], "axis": "dp", "first_difference": {"index": [0], "values": [1.0, 2.0]}}])"));
}

TEST(Mismatch, ConstantFactorNamesMeshAxesOrNone) {
  const Mesh mesh({"dp", "tp"}, {2, 3});
  const Spec spec = spec_of({"R", "R"});
  const at::Tensor expected = f64({1, 0, -2, 5}, {4});
  auto factor_of = [&](const at::Tensor& actual) {
    Locals locals(6, actual);
    return describe_mismatch(mesh, spec, locals, actual, expected, 1e-12);
  };
  const Mismatch tp = factor_of(expected * 3.0);
  ASSERT_TRUE(tp.factor.has_value()) << tp.message;
  EXPECT_EQ(tp.factor->ratio, 3.0);
  EXPECT_EQ(tp.factor->axes, (std::vector<std::string>{"tp"}));
  EXPECT_EQ(tp.factor->direction, "actual = 3 x expected");
  EXPECT_NE(tp.message.find("actual = 3 x expected everywhere: the size of mesh axis tp"), std::string::npos)
      << tp.message;
  const Mismatch both = factor_of(expected / 6.0);
  ASSERT_TRUE(both.factor.has_value()) << both.message;
  EXPECT_EQ(both.factor->axes, (std::vector<std::string>{"dp", "tp"}));
  EXPECT_EQ(both.factor->direction, "actual = expected / 6");
  EXPECT_NE(both.message.find("actual = expected / 6 everywhere: the product of the sizes of mesh axes dp, tp"),
            std::string::npos)
      << both.message;
  const Mismatch other = factor_of(expected * 5.0);
  ASSERT_TRUE(other.factor.has_value());
  EXPECT_TRUE(other.factor->axes.empty());
  EXPECT_EQ(other.to_json()["factor"]["ratio"], 5.0);
  EXPECT_NE(other.message.find("actual = 5 x expected everywhere"), std::string::npos) << other.message;
  // A single element is a multiple of anything: a factor only when it is a mesh product.
  const Mesh one({"dp"}, {4});
  const at::Tensor e1 = f64({2}, {}), a4 = f64({8}, {}), a3 = f64({6}, {});
  EXPECT_EQ(describe_mismatch(one, spec_of({"R"}), Locals(4, a4), a4, e1, 0.0).factor->axes,
            (std::vector<std::string>{"dp"}));
  EXPECT_FALSE(describe_mismatch(one, spec_of({"R"}), Locals(4, a3), a3, e1, 0.0).factor.has_value());
  // Forms of a wrong normalization over one axis: sqrt(n), n-1, (n-1)/n (the mesh is dp=2 x tp=3).
  const Mismatch root = factor_of(expected * std::sqrt(3.0));
  ASSERT_TRUE(root.factor.has_value()) << root.message;
  EXPECT_EQ(root.factor->form, "sqrt(n)");
  EXPECT_EQ(root.factor->axes, (std::vector<std::string>{"tp"}));
  EXPECT_NE(root.message.find("sqrt(n) where n is the size of mesh axis tp"), std::string::npos) << root.message;
  EXPECT_EQ(root.to_json()["factor"]["form"], "sqrt(n)");
  const Mismatch bessel = factor_of(expected * (2.0 / 3.0));
  ASSERT_TRUE(bessel.factor.has_value()) << bessel.message;
  EXPECT_EQ(bessel.factor->form, "(n-1)/n");
  EXPECT_EQ(bessel.factor->axes, (std::vector<std::string>{"tp"}));
  EXPECT_EQ(tp.to_json()["factor"]["form"], "n");
  // Not a constant multiple: no factor (and a zero where expected is 0 must stay zero).
  EXPECT_FALSE(factor_of(expected + 1.0).factor.has_value());
  EXPECT_FALSE(factor_of(f64({2, 1, -4, 10}, {4})).factor.has_value());
}

// Two axes of the same size: the first (fewest axes, then mesh order) is named, the other offered.
TEST(Mismatch, AmbiguousFactorListsAlternatives) {
  const Mesh mesh({"dp", "tp"}, {2, 2});
  const at::Tensor expected = f64({1, 2}, {2});
  const at::Tensor actual = expected * 2.0;
  const Mismatch m = describe_mismatch(mesh, spec_of({"R", "R"}), Locals(4, actual), actual, expected, 0.0);
  ASSERT_TRUE(m.factor.has_value());
  EXPECT_EQ(m.factor->axes, (std::vector<std::string>{"dp"}));
  EXPECT_EQ(m.factor->alternatives, (std::vector<std::vector<std::string>>{{"tp"}}));
  EXPECT_NE(m.message.find("the size of mesh axis dp (or of tp)"), std::string::npos) << m.message;
}

// A NaN the oracle does not have: counted, located and, where a rank holds an empty shard (a dim
// shorter than the mesh axis under torch.chunk), explained.
TEST(Mismatch, NaNFromAnEmptyShardIsExplained) {
  const Mesh mesh({"tp"}, {4});
  const Spec shard = spec_of({"S(0)"});
  const at::Tensor expected = f64({1, 2, 3, 4, 5, 6}, {3, 2});
  at::Tensor actual = expected.clone();
  actual[1][0] = std::nan("");
  // The value's own locals: rank 3 of a [3, 2] value sharded 4 ways is empty; rank 1 holds the NaN.
  const Locals locals = distribute(mesh, shard, actual, nullptr);
  ASSERT_EQ(locals[3].sizes().vec(), (std::vector<int64_t>{0, 2}));
  const Mismatch own = describe_mismatch(mesh, shard, locals, actual, expected, 0.0);
  EXPECT_EQ(own.mismatched, 1);
  EXPECT_FALSE(own.max_abs.defined);  // the only difference is not a number
  EXPECT_TRUE(own.to_json()["max_abs"].is_null());
  EXPECT_EQ(own.ranks, (std::vector<int64_t>{1}));
  EXPECT_EQ(own.nan, "NaN at [1, 0]: rank 3 holds an empty shard (shape [0, 2]); a mean or a division over it is 0/0");
  // torch.chunk of 3 rows over 4 ranks: the last rank's shard is empty, and the message says so.
  EXPECT_EQ(own.uneven, "tp=4 shards dim 0 of 3 unevenly: ranks 0, 1, 2, 3 hold [1, 2], [1, 2], [1, 2], [0, 2]");
  EXPECT_EQ(own.message, "1 of 6 elements differ (rank 1); " + own.nan + "; " + own.uneven);
  // Another value of the run holds the empty shard.
  DTensor xv{"x", {3, 2}, shard, locals};
  const Spec rep = spec_of({"R"});
  const Mismatch ctx = describe_mismatch(mesh, rep, Locals(4, actual), actual, expected, 0.0, {&xv});
  EXPECT_EQ(ctx.nan,
            "NaN at [1, 0]: rank 3 holds an empty shard of x (shape [0, 2]); a mean or a division over it is 0/0");
  // Nothing empty anywhere: where, and what was expected.
  EXPECT_EQ(describe_mismatch(mesh, rep, Locals(4, actual), actual, expected, 0.0).nan, "NaN at [1, 0] (expected 3)");
}

TEST(Mismatch, ShapesThatDifferAreNotComparedElementwise) {
  const Mesh mesh({"dp"}, {2});
  const Mismatch m = describe_mismatch(mesh, spec_of({"R"}), {}, f64({1, 2}, {2}), f64({1, 2}, {1, 2}), 0.0);
  EXPECT_EQ(m.mismatched, 2);
  EXPECT_EQ(m.message, "has shape [2] where the oracle's is [1, 2]");
  const Mismatch none = describe_mismatch(mesh, spec_of({"R"}), {}, at::Tensor(), f64({1, 2}, {2}), 0.0);
  EXPECT_EQ(none.message, "its locals do not form a tensor");
}

// ---------------------------------------------------------------------------------------------
// Scenarios with planted bugs: the result's "mismatches" and failure texts

// R -> P(sum) without the divide: every rank keeps the whole value, so the sum over tp is 4 times it.
TEST(MismatchReport, MissingDivideIsTheSizeOfItsAxis) {
  json doc = doc_of("psum", {"dp", "tp"}, {2, 4}, {input("x", {4, 6}, {"S(0)", "R"})},
                    {{{"out", "y"}, {"op", "redistribute"}, {"args", {"x"}}, {"placements", {"S(0)", "P(sum)"}}}},
                    false);
  EXPECT_EQ(check_doc(doc).result["status"], "pass");
  EXPECT_FALSE(check_doc(doc).result.contains("mismatches"));
  CheckedRun run = check_doc(doc, "psum_from_replicate_no_divide");
  ASSERT_EQ(run.result["status"], "fail") << run.result.dump();
  const json m = report_of(run, "y", "value");
  ASSERT_TRUE(m.is_object()) << run.result.dump();
  EXPECT_EQ(m["factor"]["ratio"], 4.0) << m.dump();
  EXPECT_EQ(m["factor"]["axes"], json({"tp"}));
  EXPECT_EQ(m["factor"]["direction"], "actual = 4 x expected");
  EXPECT_EQ(m["total"], 24);
  EXPECT_EQ(m["ranks"], json({0, 1, 2, 3, 4, 5, 6, 7}));  // every group's sum is wrong
  EXPECT_EQ(m["replicas_disagree"], false);
  const std::string text = failure_of(run, "y: ");
  EXPECT_NE(text.find("actual = 4 x expected everywhere: the size of mesh axis tp"), std::string::npos) << text;
  EXPECT_EQ(text, "y: " + m["message"].get<std::string>());
  EXPECT_LT(text.size(), 300u) << text;
  // The existing fields keep their meaning.
  EXPECT_EQ(run.result["checks"]["forward_equivalence"], false);
  EXPECT_TRUE(run.result["max_abs_error"].is_number());
}

// A Partial-cotangent loss seeded with ones on every rank: the gradient is the product of the
// sizes of the axes the seed should have split over.
TEST(MismatchReport, SeedOnEveryRankIsTheProductOfItsAxes) {
  json doc = doc_of("seed", {"dp", "tp"}, {2, 3}, {input("x", {4, 6}, {"Rd", "Rd"}, true)},
                    {op("loss", "sum", {"x"})}, true);
  EXPECT_EQ(check_doc(doc).result["status"], "pass") << check_doc(doc).result.dump();
  CheckedRun run = check_doc(doc, "partial_seed_on_every_rank");
  ASSERT_EQ(run.result["status"], "fail") << run.result.dump();
  const json m = report_of(run, "x", "grad");
  ASSERT_TRUE(m.is_object()) << run.result.dump();
  EXPECT_EQ(m["factor"]["axes"], json({"dp", "tp"})) << m.dump();
  EXPECT_EQ(m["factor"]["ratio"], 6.0);
  const std::string text = failure_of(run, "grad x: ");
  EXPECT_NE(text.find("the product of the sizes of mesh axes dp, tp"), std::string::npos) << text;
}

// The repository's example of a bias gradient off by tp (a bias added on every rank before an
// all_reduce, pre-scaled in the forward only).
TEST(MismatchReport, BiasGradientOffByTp) {
  Scenario sc = load_scenario(std::string(MESHSIM_SOURCE_DIR) + "/examples/bugs/bias_grad_off_by_tp.json");
  CheckedRun run = check_scenario(sc, sc.options);
  const json m = report_of(run, "b", "grad");
  ASSERT_TRUE(m.is_object()) << run.result.dump();
  EXPECT_EQ(m["factor"]["axes"], json({"tp"})) << m.dump();
  const std::string text = failure_of(run, "grad b: ");
  EXPECT_NE(text.find("the size of mesh axis tp"), std::string::npos) << text;
  EXPECT_NE(text.find("6 of 6 elements differ"), std::string::npos) << text;
}

// PyTorch's mean of an uneven shard (the mean of local means): rank 3 of x [3, 4] over 4 ranks is
// empty, its local mean is NaN, and the report says so.
TEST(MismatchReport, UnevenMeanNaNNamesTheEmptyShard) {
  json doc = doc_of("mean", {"dp"}, {4}, {input("x", {3, 4}, {"S(0)"})},
                    {{{"out", "m"}, {"op", "mean"}, {"args", {"x"}}, {"dim", 0}}}, false);
  doc["options"] = {{"semantics", "pytorch"}};
  CheckedRun run = check_doc(doc);
  const json m = report_of(run, "m", "value");
  ASSERT_TRUE(m.is_object()) << run.result.dump();
  ASSERT_TRUE(m["nan"].is_string()) << m.dump();
  EXPECT_NE(m["nan"].get<std::string>().find("rank 3 holds an empty shard of x (shape [0, 4])"), std::string::npos)
      << m.dump();
  EXPECT_EQ(m["mismatched"], 4);
}

// ---------------------------------------------------------------------------------------------
// write_values

struct Npy {
  std::string descr, shape;
  bool fortran = true;
  std::string data;
};

// Reads a version 1.0 .npy file back: the header's fields as written, and the data bytes.
Npy read_npy(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Npy out;
  EXPECT_GE(bytes.size(), 10u);
  if (bytes.size() < 10) return out;
  EXPECT_EQ(bytes.substr(0, 6), "\x93NUMPY");
  EXPECT_EQ(bytes[6], 1);
  EXPECT_EQ(bytes[7], 0);
  const size_t len = static_cast<size_t>(static_cast<unsigned char>(bytes[8])) |
                     static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8;
  EXPECT_EQ((10 + len) % 64, 0u);
  const std::string header = bytes.substr(10, len);
  EXPECT_EQ(header.back(), '\n');
  auto field = [&](const std::string& key, char open, char close) {
    const std::string quoted = "'" + key + "': ";
    const auto at = header.find(quoted);
    if (at == std::string::npos) return std::string();
    const auto from = header.find(open, at + quoted.size()) + 1;
    return header.substr(from, header.find(close, from) - from);
  };
  out.descr = field("descr", '\'', '\'');
  out.shape = field("shape", '(', ')');
  out.fortran = header.find("'fortran_order': False") == std::string::npos;
  out.data = bytes.substr(10 + len);
  return out;
}

std::string bytes_of(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("meshsim_test_mismatch_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

TEST(WriteValues, RoundTripsShapesDtypesAndBytes) {
  json doc = doc_of("vals", {"tp"}, {2}, {input("x", {3, 2}, {"S(0)"}, true), input("w/1", {2}, {"R"}, true)},
                    {op("y", "mul", {"x", "w/1"}), op("loss", "sum", {"y"})}, true);
  CheckedRun run = check_doc(doc, "", true);
  ASSERT_EQ(run.result["status"], "pass") << run.result.dump();
  ASSERT_TRUE(run.tensors);
  const fs::path dir = fresh_dir("roundtrip");
  write_values(run, (dir / "out").string(), true);

  const KeptTensor* y = nullptr;
  for (const auto& k : run.tensors->values)
    if (k.name == "y") y = &k;
  ASSERT_NE(y, nullptr);
  const Npy v = read_npy(dir / "out" / "values" / "y.npy");
  EXPECT_EQ(v.descr, "<f8");
  EXPECT_EQ(v.shape, "3, 2");
  EXPECT_FALSE(v.fortran);
  EXPECT_EQ(v.data, bytes_of(y->global));
  EXPECT_EQ(read_npy(dir / "out" / "oracle" / "y.npy").data, bytes_of(y->oracle));
  // Rank 1's local of a [3, 2] value sharded 2 ways is [1, 2].
  const Npy r1 = read_npy(dir / "out" / "ranks" / "y" / "rank1.npy");
  EXPECT_EQ(r1.shape, "1, 2");
  EXPECT_EQ(r1.data, bytes_of(y->locals[1]));
  // A name with a slash stays in its folder; a 1-d shape keeps its comma.
  const Npy w = read_npy(dir / "out" / "grads" / "w%2F1.npy");
  EXPECT_EQ(w.shape, "2,");
  EXPECT_TRUE(fs::exists(dir / "out" / "oracle_grads" / "w%2F1.npy"));
  EXPECT_TRUE(fs::exists(dir / "out" / "ranks" / "grad_w%2F1" / "rank0.npy"));

  std::ifstream in(dir / "out" / "index.json");
  const json index = json::parse(in);
  EXPECT_EQ(index["format"], "meshsim.values/1");
  bool listed = false;
  for (const auto& f : index["files"]) {
    EXPECT_TRUE(fs::exists(dir / "out" / f["path"].get<std::string>())) << f.dump();
    if (f["path"] == "grads/w%2F1.npy") {
      listed = true;
      EXPECT_EQ(f["value"], "w/1");
      EXPECT_EQ(f["kind"], "grad");
      EXPECT_EQ(f["dtype"], "float64");
      EXPECT_EQ(f["shape"], json({2}));
      EXPECT_EQ(f["placements"], json({"R"}));
    }
  }
  EXPECT_TRUE(listed) << index.dump(2);
  fs::remove_all(dir);
}

TEST(WriteValues, BoolInt64AndScalarHeaders) {
  // A hand-made run: the writer takes whatever the run kept.
  CheckedRun run;
  run.result = {{"name", "hand"}, {"status", "pass"}};
  run.tensors = std::make_shared<RunTensors>();
  const at::Tensor mask = at::tensor(std::vector<int64_t>{1, 0, 1}).to(at::kBool);
  const at::Tensor ids = at::tensor(std::vector<int64_t>{7, -1});
  const at::Tensor scalar = at::scalar_tensor(2.5, at::TensorOptions().dtype(at::kFloat));
  run.tensors->values.push_back({"mask", spec_of({"R"}), {}, 1, mask, at::Tensor()});
  run.tensors->values.push_back({"ids", spec_of({"R"}), {}, 1, ids, ids});
  run.tensors->values.push_back({"s.arg0", spec_of({"R"}), {}, 1, scalar, scalar});
  const fs::path dir = fresh_dir("dtypes");
  write_values(run, dir.string(), false);
  const Npy b = read_npy(dir / "values" / "mask.npy");
  EXPECT_EQ(b.descr, "|b1");
  EXPECT_EQ(b.data, std::string("\x01\x00\x01", 3));
  const Npy i = read_npy(dir / "values" / "ids.npy");
  EXPECT_EQ(i.descr, "<i8");
  EXPECT_EQ(i.data, bytes_of(ids));
  const Npy s = read_npy(dir / "values" / "s.arg0.npy");  // a dot is fine in a file name
  EXPECT_EQ(s.descr, "<f4");
  EXPECT_EQ(s.shape, "");
  EXPECT_EQ(s.data.size(), 4u);
  std::ifstream in(dir / "index.json");
  const json index = json::parse(in);
  ASSERT_EQ(index["missing"].size(), 1u) << index.dump(2);  // the oracle has no mask
  EXPECT_EQ(index["missing"][0]["value"], "mask");
  EXPECT_EQ(index["missing"][0]["kind"], "oracle");
  fs::remove_all(dir);
}

// A run with training steps writes each microbatch's data and every parameter and optimizer state
// after each step, the mesh's (as it kept them) beside the oracle's, listed with step and
// microbatch or state.
TEST(WriteValues, TrainingStepsWriteEachMicrobatchAndEveryStep) {
  json doc = doc_of("steps", {"dp"}, {2}, {input("x", {4, 3}, {"S(0)"}), input("w", {3, 2}, {"R"}, true)},
                    {op("y", "mm", {"x", "w"}), op("loss", "sum", {"y"})}, true);
  doc["train"] = {{"steps", 2}, {"microbatches", 2}, {"lr", 0.1}, {"optimizer", {{"kind", "sgd"}, {"momentum", 0.9}}}};
  CheckedRun run = check_doc(doc, "", true);
  ASSERT_EQ(run.result["status"], "pass") << run.result.dump();
  ASSERT_TRUE(run.tensors);
  // 2 steps x 2 microbatches of x, then per step w and its momentum buffer.
  ASSERT_EQ(run.tensors->train.size(), 8u);
  const fs::path dir = fresh_dir("train");
  write_values(run, dir.string(), true);
  // The first microbatch of the first step is the checked run's own x.
  const KeptTensor *x = nullptr, *w = nullptr;
  for (const auto& k : run.tensors->values) {
    if (k.name == "x") x = &k;
    if (k.name == "w") w = &k;
  }
  ASSERT_NE(x, nullptr);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(read_npy(dir / "train" / "step1" / "mb0" / "values" / "x.npy").data, bytes_of(x->global));
  // Fresh data for the second microbatch.
  EXPECT_NE(read_npy(dir / "train" / "step1" / "mb1" / "values" / "x.npy").data, bytes_of(x->global));
  EXPECT_EQ(read_npy(dir / "train" / "step2" / "mb1" / "ranks" / "x" / "rank1.npy").shape, "2, 3");
  const KeptTrainTensor* w2 = nullptr;
  for (const auto& t : run.tensors->train)
    if (t.kind == "parameter" && t.step == 2) w2 = &t;
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(read_npy(dir / "train" / "step2" / "params" / "w.npy").data, bytes_of(w2->tensor.global));
  EXPECT_EQ(read_npy(dir / "train" / "step2" / "oracle_params" / "w.npy").data, bytes_of(w2->tensor.oracle));
  // The parameter moved from where it started, and the mesh's equals the oracle's.
  EXPECT_GT(max_abs_diff(w2->tensor.global, w->global), 1e-3);
  EXPECT_LT(max_abs_diff(w2->tensor.global, w2->tensor.oracle), 1e-12);
  EXPECT_TRUE(fs::exists(dir / "train" / "step1" / "states" / "w" / "momentum_buffer.npy"));
  EXPECT_TRUE(fs::exists(dir / "train" / "step2" / "oracle_states" / "w" / "momentum_buffer.npy"));
  std::ifstream in(dir / "index.json");
  const json index = json::parse(in);
  int inputs = 0, states = 0;
  for (const auto& f : index["files"]) {
    if (f["kind"] == "train_input") {
      ++inputs;
      EXPECT_TRUE(f.contains("step") && f.contains("microbatch")) << f.dump();
    }
    if (f["kind"] == "train_state") {
      ++states;
      EXPECT_EQ(f["state"], "momentum_buffer");
      EXPECT_EQ(f["value"], "w");
    }
  }
  EXPECT_EQ(inputs, 4);
  EXPECT_EQ(states, 2);
  fs::remove_all(dir);
}

// A value named grad_w and the gradient of w get folders of their own under ranks/.
TEST(WriteValues, AValueNamedLikeAGradientFolderKeepsItsOwn) {
  CheckedRun run;
  run.result = {{"name", "names"}};
  run.tensors = std::make_shared<RunTensors>();
  const at::Tensor one = f64({1}, {1}), two = f64({2}, {1});
  run.tensors->values.push_back({"grad_w", spec_of({"R"}), {one}, 1, one, one});
  run.tensors->grads.push_back({"w", spec_of({"R"}), {two}, 1, two, two});
  const fs::path dir = fresh_dir("names");
  write_values(run, dir.string(), true);
  EXPECT_EQ(read_npy(dir / "ranks" / "%67rad_w" / "rank0.npy").data, bytes_of(one));
  EXPECT_EQ(read_npy(dir / "ranks" / "grad_w" / "rank0.npy").data, bytes_of(two));
  fs::remove_all(dir);
}

TEST(WriteValues, AFailedWriteIsAnInputErrorNamingThePath) {
  const fs::path dir = fresh_dir("blocked");
  fs::create_directories(dir);
  std::ofstream(dir / "values") << "a file where the folder must go (DIR is replaced whole: not what is in it)";
  CheckedRun run;
  run.result = {{"name", "blocked"}};
  run.tensors = std::make_shared<RunTensors>();
  run.tensors->values.push_back({"y", spec_of({"R"}), {}, 1, f64({1}, {1}), at::Tensor()});
  try {
    write_values(run, (dir / "values").string(), false);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "values").string()), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace

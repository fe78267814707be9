// function_backward_matches_reference: every registered Function's backward against central finite
// differences of its reference on one rank. It passes on the built-ins, fails with the planted bug
// function_backward_wrong_factor (naming local_square and the factor 2), and catches a Function of
// the user's, registered through the public API as a plugin registers it, whose backward is wrong.
#include <gtest/gtest.h>

#include <string>

#include <torch/csrc/autograd/custom_function.h>

#include "meshsim/meshsim.h"
#include "properties/properties.h"
#include "properties/runner.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const meshsim::Property& the_property() {
  for (const auto& p : meshsim::property_catalog())
    if (std::string(p.name) == "function_backward_matches_reference") return p;
  throw std::logic_error("function_backward_matches_reference is not in the catalog");
}

meshsim::PropertyOutcome run(uint64_t seed, int cases, const std::string& mutant = "") {
  meshsim::planted_mutant() = mutant;
  meshsim::PropertyOutcome out = meshsim::run_property(the_property(), seed, cases, nullptr);
  meshsim::planted_mutant() = "";
  return out;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// x^3 whose backward forgets the 3: 2 x^2 g instead of 3 x^2 g (2/3 of the true gradient).
struct CubeTwoThirds : public torch::autograd::Function<CubeTwoThirds> {
  static variable_list forward(AutogradContext* ctx, at::TensorList xs) {
    ctx->save_for_backward({xs[0]});
    return {xs[0] * xs[0] * xs[0]};
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    return {2 * x * x * g[0]};
  }
};

// x * y^2 of two args whose backward is right for x and drops the 2 for y.
struct MulSquareHalfY : public torch::autograd::Function<MulSquareHalfY> {
  static variable_list forward(AutogradContext* ctx, at::TensorList xs) {
    ctx->save_for_backward({xs[0], xs[1]});
    return {xs[0] * xs[1] * xs[1]};
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto saved = ctx->get_saved_variables();
    return {g[0] * saved[1] * saved[1], g[0] * saved[0] * saved[1]};
  }
};

meshsim::FunctionDef cube(bool wrong) {
  meshsim::FunctionDef f;
  f.name = "test_cube";
  if (wrong)
    f.rank_local = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) {
      return CubeTwoThirds::apply(at::TensorList(xs))[0];
    };
  else
    f.rank_local = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) { return xs[0] * xs[0] * xs[0]; };
  f.reference = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) { return xs[0] * xs[0] * xs[0]; };
  return f;
}

meshsim::FunctionDef mul_square(bool wrong) {
  meshsim::FunctionDef f;
  f.name = "test_mul_square";
  f.arity = 2;
  if (wrong)
    f.rank_local = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) {
      return MulSquareHalfY::apply(at::TensorList(xs))[0];
    };
  else
    f.rank_local = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) { return xs[0] * xs[1] * xs[1]; };
  f.reference = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) { return xs[0] * xs[1] * xs[1]; };
  return f;
}

// A communicating Function (one output per group member) with a right backward: on one rank its
// collective is the identity, like its reference.
meshsim::FunctionDef group_sum() {
  meshsim::FunctionDef f;
  f.name = "test_group_sum";
  f.group = [](const std::vector<at::Tensor>& group, const nlohmann::json&) {
    at::Tensor sum = group[0];
    for (size_t k = 1; k < group.size(); ++k) sum = sum + group[k];
    return std::vector<at::Tensor>(group.size(), sum);
  };
  f.reference = [](const std::vector<at::Tensor>& xs, const nlohmann::json&) { return xs[0]; };
  return f;
}

// Restores right versions of the test's Functions, whatever a test left registered.
struct RightFunctions {
  RightFunctions() { restore(); }
  ~RightFunctions() { restore(); }
  static void restore() {
    meshsim::register_function(cube(false));
    meshsim::register_function(mul_square(false));
    meshsim::register_function(group_sum());
  }
};

TEST(FunctionBackward, PassesOnRightFunctionsAndSkipsThoseWithoutAReference) {
  RightFunctions right;
  const meshsim::PropertyOutcome out = run(1, 200);
  EXPECT_EQ(out.status, meshsim::PropertyOutcome::Status::Passed) << out.description;
  EXPECT_EQ(out.progress.cases, 200);
  // opaque_all_reduce and opaque_all_reduce_unregistered have no reference: skipped, counted.
  EXPECT_GT(out.progress.discards, 0);
}

TEST(FunctionBackward, PlantedBugNamesLocalSquareAndTheFactor2) {
  RightFunctions right;
  const meshsim::PropertyOutcome out = run(1, 100, "function_backward_wrong_factor");
  ASSERT_EQ(out.status, meshsim::PropertyOutcome::Status::Failed);
  EXPECT_TRUE(has(out.description, "Function local_square")) << out.description;
  EXPECT_TRUE(has(out.description, "input 0")) << out.description;
  EXPECT_TRUE(has(out.description, "the backward is 2 times the finite differences")) << out.description;
  EXPECT_TRUE(has(out.description, "expected ")) << out.description;
  EXPECT_TRUE(has(out.description, "actual ")) << out.description;
  // Another seed finds it too.
  EXPECT_EQ(run(7, 100, "function_backward_wrong_factor").status, meshsim::PropertyOutcome::Status::Failed);
}

TEST(FunctionBackward, AUsersFunctionWithAWrongBackwardIsCaughtByName) {
  RightFunctions right;
  meshsim::register_function(cube(true));
  meshsim::PropertyOutcome out = run(1, 100);
  ASSERT_EQ(out.status, meshsim::PropertyOutcome::Status::Failed);
  EXPECT_TRUE(has(out.description, "Function test_cube")) << out.description;
  EXPECT_TRUE(has(out.description, "the backward is 0.666667 times")) << out.description;
  RightFunctions::restore();

  // Two args, only the second's gradient wrong: the message names input 1 and not input 0.
  meshsim::register_function(mul_square(true));
  out = run(1, 100);
  ASSERT_EQ(out.status, meshsim::PropertyOutcome::Status::Failed);
  EXPECT_TRUE(has(out.description, "Function test_mul_square")) << out.description;
  EXPECT_TRUE(has(out.description, "input 1 (shape")) << out.description;
  EXPECT_FALSE(has(out.description, "input 0 (shape")) << out.description;
  EXPECT_TRUE(has(out.description, "the backward is 0.5 times")) << out.description;
}

TEST(FunctionBackward, TheSameSeedGivesTheSameCounterexample) {
  RightFunctions right;
  const auto a = run(3, 100, "function_backward_wrong_factor");
  const auto b = run(3, 100, "function_backward_wrong_factor");
  ASSERT_EQ(a.status, meshsim::PropertyOutcome::Status::Failed);
  EXPECT_EQ(a.description, b.description);
  EXPECT_EQ(a.progress.cases, b.progress.cases);
}


// The user's case: a hand-written Function whose backward forgets a factor, called in a tracked
// local_map body. The run's first divergence is that call, its factor named (2/3), ahead of the
// leaves' wrong gradients.
TEST(FunctionBackward, AWrongUserFunctionIsTheFirstDivergenceOfARun) {
  meshsim::register_function(cube(true));
  const nlohmann::json doc = nlohmann::json::parse(R"json({
    "format": "meshsim.scenario/1", "name": "user_cube",
    "mesh": {"axes": ["dp"], "shape": [2]},
    "inputs": [{"name": "x", "shape": [4, 3], "placements": ["S(0)"], "requires_grad": true}],
    "program": [
      {"out": "y", "op": "local_map", "args": ["x"], "out_placements": [["S(0)"]],
       "body": [{"out": "c", "op": "call", "function": "test_cube", "args": ["x"]}],
       "reference": [{"out": "c", "op": "call", "function": "test_cube", "args": ["x"]}],
       "returns": ["c"]},
      {"out": "loss", "op": "sum", "args": ["y"]}],
    "backward": "loss"})json");
  const meshsim::RunResult r = meshsim::run_scenario(doc);
  meshsim::register_function(cube(false));
  ASSERT_EQ(r.exit_code, 1) << r.result.dump(1);
  const nlohmann::json& d = r.result["first_divergence"];
  EXPECT_EQ(d.value("phase", ""), "backward") << d.dump(1);
  EXPECT_EQ(d["body"].value("op", ""), "/program/0/body/0") << d.dump(1);
  EXPECT_EQ(d["body"].value("name", ""), "call") << d.dump(1);
  const std::string message = d.value("message", "");
  EXPECT_NE(message.find("call test_cube(x)"), std::string::npos) << message;
  EXPECT_NEAR(d["body"]["adjoint"].value("ratio", 0.0), 2.0 / 3.0, 1e-6) << d.dump(1);
}

}  // namespace

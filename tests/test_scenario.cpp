// The scenario reader (DESIGN.md, contract 2): the example parses; every error is an InputError
// naming the file and the JSON path; no input, however malformed, escapes as anything else.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "core/scenario.h"
#include "tests/json_support.h"

namespace meshsim {
namespace {

using json = nlohmann::json;
using meshsim::testing::with;
using meshsim::testing::without;

const std::string kExample = std::string(MESHSIM_SOURCE_DIR) + "/examples/fsdp_reduced.json";
const std::string kFile = "examples/x.json";

json example() { return read_json_file(kExample); }

struct ErrorCase {
  json doc;
  std::string path;
  std::string message;
  ErrorKind kind = ErrorKind::InvalidScenario;
};

void expect_input_error(const ErrorCase& c) {
  SCOPED_TRACE(c.doc.dump());
  try {
    parse_scenario(c.doc, kFile);
    ADD_FAILURE() << "parsed, expected an error at " << c.path;
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), kFile);
    EXPECT_EQ(e.json_path(), c.path);
    EXPECT_NE(std::string(e.what()).find(kFile + ": " + c.path + ": "), std::string::npos)
        << e.what();
    EXPECT_NE(e.detail().find(c.message), std::string::npos) << e.what();
    EXPECT_EQ(error_kind_name(e.kind()), std::string(error_kind_name(c.kind))) << e.what();
  }
}

// Writes `text` to a fresh temporary file and returns its path.
std::string temp_file(const std::string& name, const std::string& text) {
  auto dir = std::filesystem::temp_directory_path() / "meshsim_test_scenario";
  std::filesystem::create_directories(dir);
  auto path = (dir / name).string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(Scenario, ExampleParses) {
  Scenario s = load_scenario(kExample);
  EXPECT_EQ(s.file, kExample);
  EXPECT_EQ(s.name, "fsdp_reduced_linear");
  EXPECT_EQ(s.mesh, Mesh({"dp"}, {4}));
  EXPECT_EQ(s.options.redistribute, RedistributeMode::AboveAutograd);
  EXPECT_EQ(s.options.reduced_propagation, ReducedPropagation::Intersection);
  EXPECT_EQ(s.options.seed, 0u);
  ASSERT_EQ(s.inputs.size(), 2u);
  EXPECT_EQ(s.inputs[0].name, "x");
  EXPECT_EQ(s.inputs[0].shape, (Shape{8, 16}));
  EXPECT_EQ(s.inputs[0].placements, (Spec{Placement::shard(0)}));
  EXPECT_EQ(s.inputs[0].init, "int");
  EXPECT_FALSE(s.inputs[0].requires_grad);
  EXPECT_FALSE(s.inputs[0].from_local);
  EXPECT_TRUE(s.inputs[1].requires_grad);
  EXPECT_EQ(s.inputs[1].path, "/inputs/1");
  ASSERT_EQ(s.program.size(), 3u);
  EXPECT_EQ(s.program[0].op, "redistribute");
  EXPECT_EQ(s.program[0].out, "wf");
  EXPECT_EQ(s.program[0].args, (std::vector<std::string>{"w"}));
  EXPECT_EQ(s.program[0].attrs["placements"], json::array({"Rd"}));
  EXPECT_EQ(s.program[1].args, (std::vector<std::string>{"x", "wf"}));
  EXPECT_EQ(s.program[2].path, "/program/2");
  EXPECT_EQ(s.backward, "loss");
  EXPECT_EQ(s.source, example());
  ASSERT_NE(s.find_input("w"), nullptr);
  EXPECT_EQ(s.find_input("w")->shape, (Shape{16, 4}));
  EXPECT_EQ(s.find_input("wf"), nullptr);
}

TEST(Scenario, DefaultsAndOptionalFields) {
  json doc = without(without(without(example(), "/name"), "/options"), "/backward");
  doc["inputs"][0]["init"] = "arange";
  doc["inputs"][0]["from_local"] = true;
  doc["program"][2]["dim"] = -1;
  doc["program"][2]["keepdim"] = true;
  Scenario s = parse_scenario(doc, "dir/my_case.json");
  EXPECT_EQ(s.name, "my_case");
  EXPECT_EQ(s.backward, "");
  EXPECT_EQ(s.options.to_json(), RunOptions{}.to_json());
  EXPECT_EQ(s.inputs[0].init, "arange");
  EXPECT_TRUE(s.inputs[0].from_local);
  EXPECT_EQ(s.program[2].attrs["dim"], -1);
}

TEST(Scenario, PyTorchSpellingsAndTwoAxisMesh) {
  json doc = example();
  doc["mesh"] = {{"axes", json::array({"dp", "tp"})}, {"shape", {2, 2}}};
  doc["inputs"][0]["placements"] = json::array({"Shard(dim=0)", "Replicate()"});
  doc["inputs"][1]["placements"] = json::array({"S(0)", "Partial(sum)"});
  doc["program"][0]["placements"] = json::array({"Reduced()", "P(sum)"});
  Scenario s = parse_scenario(doc, kFile);
  EXPECT_EQ(s.inputs[1].placements, (Spec{Placement::shard(0), Placement::partial()}));
}

// A tensor literal: nested arrays of the input's shape, or a flat list of its elements; int64 and
// bool elements whole; each problem named at its JSON path.
TEST(Scenario, TensorLiteralsParseAndTheirErrorsAreNamed) {
  json doc = example();
  doc["inputs"][0] = {{"name", "x"}, {"shape", {2, 3}}, {"placements", {"S(0)"}},
                      {"init", {{"values", {{1, 2.5, 3}, {-4, 5, 6}}}}}};
  Scenario s = parse_scenario(doc, kFile);
  EXPECT_EQ(s.inputs[0].init, "values");
  EXPECT_EQ(s.inputs[0].values, (std::vector<double>{1, 2.5, 3, -4, 5, 6}));
  doc["inputs"][0]["init"]["values"] = {6, 5, 4, 3, 2, 1};  // flat, row-major
  EXPECT_EQ(parse_scenario(doc, kFile).inputs[0].values, (std::vector<double>{6, 5, 4, 3, 2, 1}));
  json ids = doc;
  ids["inputs"][0]["dtype"] = "int64";
  ids["inputs"][0]["init"]["values"] = {{0, 1, 2}, {2, 1, 0}};
  EXPECT_EQ(parse_scenario(ids, kFile).inputs[0].values, (std::vector<double>{0, 1, 2, 2, 1, 0}));
  json mask = doc;
  mask["inputs"][0]["dtype"] = "bool";
  mask["inputs"][0]["init"]["values"] = {{true, false, 1}, {0, true, false}};
  EXPECT_EQ(parse_scenario(mask, kFile).inputs[0].values, (std::vector<double>{1, 0, 1, 0, 1, 0}));
  json scalar = doc;
  scalar["inputs"][0] = {{"name", "x"}, {"shape", json::array()}, {"placements", {"R"}}, {"init", {{"values", 2.5}}}};
  EXPECT_EQ(parse_scenario(scalar, kFile).inputs[0].values, (std::vector<double>{2.5}));
  const std::vector<ErrorCase> cases = {
      {with(doc, "/inputs/0/init/values", {{1, 2, 3}}), "/inputs/0/init/values", "expected 2 items (dim 0 of [2, 3]), got 1",
       ErrorKind::ShapeMismatch},
      {with(doc, "/inputs/0/init/values", {{1, 2, 3}, {4, 5}}), "/inputs/0/init/values/1",
       "expected 3 items (dim 1 of [2, 3]), got 2", ErrorKind::ShapeMismatch},
      {with(doc, "/inputs/0/init/values", {1, 2, 3, 4, 5}), "/inputs/0/init/values",
       "a flat list of values holds every element of [2, 3]: expected 6, got 5", ErrorKind::ShapeMismatch},
      {with(doc, "/inputs/0/init/values", {{1, 2, 3}, {4, "5", 6}}), "/inputs/0/init/values/1/1",
       "expected a number (an element of an input of dtype float), got \"5\""},
      {with(ids, "/inputs/0/init/values", {{0, 1, 2}, {2, 0.5, 0}}), "/inputs/0/init/values/1/1",
       "an element of an input of dtype int64 is a whole number, got 0.5"},
      {with(mask, "/inputs/0/init/values", {{true, false, 2}, {0, true, false}}), "/inputs/0/init/values/0/2",
       "an element of an input of dtype bool is true, false, 0 or 1, got 2"},
      {with(doc, "/inputs/0/init", {{"values", {1, 2, 3, 4, 5, 6}}, {"ids", 3}}), "/inputs/0/init/ids",
       "unknown field \"ids\""},
  };
  for (const auto& c : cases) expect_input_error(c);
}

TEST(Scenario, StructuralErrors) {
  json ex = example();
  std::vector<ErrorCase> cases = {
      {json::array(), "/", "expected an object"},
      {without(ex, "/format"), "/format", "missing required field \"format\""},
      {with(ex, "/format", "meshsim.scenario/2"), "/format",
       "unsupported format \"meshsim.scenario/2\""},
      {with(ex, "/format", 1), "/format", "expected a string"},
      {with(ex, "/extra", 1), "/extra", "unknown field \"extra\""},
      {with(ex, "/a~0b", 1), "/a~0b", "unknown field \"a~b\""},
      {with(ex, "/name", json::object()), "/name", "expected a string"},
      {without(ex, "/mesh"), "/mesh", "missing required field"},
      {with(ex, "/mesh", json::array()), "/mesh", "expected an object"},
      {with(ex, "/mesh/axes", json::array()), "/mesh/axes", "at least one axis"},
      {with(ex, "/mesh/axes", "dp"), "/mesh/axes", "expected an array"},
      {with(ex, "/mesh/axes/0", ""), "/mesh/axes/0", "non-empty"},
      {with(ex, "/mesh/axes/0", 3), "/mesh/axes/0", "expected a string"},
      {with(with(ex, "/mesh/axes", json::array({"dp", "dp"})), "/mesh/shape", {2, 2}),
       "/mesh/axes/1", "duplicate mesh axis \"dp\""},
      {with(ex, "/mesh/shape", {2, 2}), "/mesh/shape", "expected 1 sizes"},
      {with(ex, "/mesh/shape/0", 0), "/mesh/shape/0", "expected an integer >= 1"},
      {with(ex, "/mesh/shape/0", 2.5), "/mesh/shape/0", "expected an integer"},
      {with(ex, "/mesh/shape/0", "4"), "/mesh/shape/0", "expected an integer"},
      {with(ex, "/mesh/tp", 1), "/mesh/tp", "unknown field"},
      {without(ex, "/inputs"), "/inputs", "missing required field"},
      {with(ex, "/inputs", json::object()), "/inputs", "expected an array"},
      {with(ex, "/inputs/0", "x"), "/inputs/0", "expected an object"},
      {without(ex, "/inputs/0/name"), "/inputs/0/name", "missing required field"},
      {with(ex, "/inputs/0/name", ""), "/inputs/0/name", "non-empty"},
      {with(ex, "/inputs/1/name", "x"), "/inputs/1/name",
       "value \"x\" is already defined at /inputs/0/name"},
      {with(ex, "/inputs/0/shape", {8, -1}), "/inputs/0/shape/1", "expected an integer >= 0"},
      {with(ex, "/inputs/0/shape", {1ull << 40, 1ull << 40}), "/inputs/0/shape",
       "too many elements"},
      {with(ex, "/inputs/0/shape/0", 18446744073709551615ull), "/inputs/0/shape/0",
       "expected an integer"},
      {with(ex, "/inputs/0/placements", json::array({"S(0)", "R"})), "/inputs/0/placements",
       "expected 1 placements"},
      {with(ex, "/inputs/0/placements/0", "Q"), "/inputs/0/placements/0", "bad placement \"Q\""},
      {with(ex, "/inputs/0/placements/0", nullptr), "/inputs/0/placements/0", "expected a string"},
      {with(ex, "/inputs/0/placements/0", "S(2)"), "/inputs/0/placements", "shards dim 2",
       ErrorKind::ShapeMismatch},
      {with(ex, "/inputs/0/init", "zeros"), "/inputs/0/init", "unknown init \"zeros\""},
      {with(ex, "/inputs/0/from_local", 1), "/inputs/0/from_local", "expected true or false"},
      {with(ex, "/inputs/0/requires_grad", "yes"), "/inputs/0/requires_grad",
       "expected true or false"},
      {with(ex, "/inputs/0/grad", true), "/inputs/0/grad", "unknown field \"grad\""},
  };
  for (const auto& c : cases) expect_input_error(c);
}

TEST(Scenario, ProgramErrors) {
  json ex = example();
  std::vector<ErrorCase> cases = {
      {without(ex, "/program"), "/program", "missing required field"},
      {with(ex, "/program", "mm"), "/program", "expected an array"},
      {with(ex, "/program/1", json::array()), "/program/1", "expected an object"},
      {with(ex, "/program/1/args/0", "w2"), "/program/1/args/0", "unknown value \"w2\""},
      {with(ex, "/program/1/args/1", "loss"), "/program/1/args/1", "unknown value \"loss\""},
      {with(ex, "/program/1/args/0", 7), "/program/1/args/0", "expected a string"},
      {with(ex, "/program/1/args", "x"), "/program/1/args", "expected an array"},
      {without(ex, "/program/1/args"), "/program/1/args", "missing required field"},
      {with(ex, "/program/1/args", json::array({"x"})), "/program/1/args",
       "mm takes 2 arguments, got 1"},
      {with(ex, "/program/2/args", json::array({"y", "y"})), "/program/2/args",
       "sum takes 1 argument, got 2"},
      {with(ex, "/program/1/out", "x"), "/program/1/out",
       "value \"x\" is already defined at /inputs/0/name"},
      {with(ex, "/program/1/out", "wf"), "/program/1/out", "already defined at /program/0/out"},
      {with(ex, "/program/1/out", ""), "/program/1/out", "non-empty"},
      {without(ex, "/program/1/out"), "/program/1/out", "missing required field"},
      {without(ex, "/program/1/op"), "/program/1/op", "missing required field"},
      {with(ex, "/program/1/op", 3), "/program/1/op", "expected a string"},
      {with(ex, "/program/1/op", "conv2d"), "/program/1/op",
       "unknown op \"conv2d\" (known: abs, add, amax, amin,", ErrorKind::UnsupportedOp},
      {with(ex, "/program/1/op", "call"), "/program/1/op",
       "op \"call\" runs only inside a local_map body", ErrorKind::UnsupportedOp},
      {with(ex, "/program/1/bias", true), "/program/1/bias", "unknown field \"bias\""},
      {with(ex, "/program/1/dim", 0), "/program/1/dim", "unknown field \"dim\""},
      {without(ex, "/program/0/placements"), "/program/0/placements", "missing required field"},
      {with(ex, "/program/0/placements", "Rd"), "/program/0/placements", "expected an array"},
      {with(ex, "/program/0/placements", json::array({"Rd", "R"})), "/program/0/placements",
       "expected 1 placements"},
      {with(ex, "/program/0/placements/0", "X(1)"), "/program/0/placements/0", "bad placement"},
      {with(ex, "/program/0/placements/0", "S(5)"), "/program/0/placements", "shards dim 5",
       ErrorKind::ShapeMismatch},
      {with(ex, "/program/2/dim", "0"), "/program/2/dim", "expected an integer"},
      {with(ex, "/program/2/dim", 0.5), "/program/2/dim", "expected an integer"},
      {with(ex, "/program/2/keepdim", 0), "/program/2/keepdim", "expected true or false"},
      {with(ex, "/backward", "nothing"), "/backward", "unknown value \"nothing\""},
      {with(ex, "/backward", json::array({"loss"})), "/backward", "expected a string"},
  };
  for (const auto& c : cases) expect_input_error(c);
}

// meshsim names the values it makes itself after a user's value with a dotted suffix (the
// operand of y moved by a rule is "y.arg0", a local_map argument moved to its in_placements
// "y.in0", a mark_varying before y "y.in0.dp"): a '.' in a user's name could collide with one of
// them, so every place that defines a value refuses it.
TEST(Scenario, ValueNamesWithADotAreReserved) {
  json ex = example();
  json lm = read_json_file(std::string(MESHSIM_SOURCE_DIR) + "/examples/lm_fsdp_reduced.json");
  const std::string reserved = "contains '.', which is reserved";
  std::vector<ErrorCase> cases = {
      {with(ex, "/inputs/0/name", "x.arg0"), "/inputs/0/name", reserved},
      {with(ex, "/program/1/out", "y.arg1"), "/program/1/out", reserved},
      {with(ex, "/program/0/out", "."), "/program/0/out", reserved},
      {with(lm, "/program/0/out", "loss.in0"), "/program/0/out", reserved},
      {with(lm, "/program/0/out", json::array({"a.b"})), "/program/0/out/0", reserved},
      {with(lm, "/program/0/body/0/out", "wf.varying.dp"), "/program/0/body/0/out", reserved},
      {with(lm, "/program/0/reference/0/out", "y.ref"), "/program/0/reference/0/out", reserved},
  };
  for (const auto& c : cases) expect_input_error(c);
  // Other characters stay allowed.
  EXPECT_NO_THROW(parse_scenario(with(with(ex, "/program/1/out", "y_1-b/c"), "/program/2/args/0", "y_1-b/c"), kFile));
}

TEST(Scenario, RedistributeOfAnOpResultSkipsTheRankCheck) {
  json doc = example();
  doc["program"].push_back({{"out", "y2"},
                            {"op", "redistribute"},
                            {"args", json::array({"y"})},
                            {"placements", json::array({"S(7)"})}});
  EXPECT_EQ(parse_scenario(doc, kFile).program.back().out, "y2");
}

TEST(Scenario, OptionErrors) {
  json ex = example();
  std::vector<ErrorCase> cases = {
      {with(ex, "/options", json::array()), "/options", "expected an object"},
      {with(ex, "/options/speed", 1), "/options/speed", "unknown option \"speed\""},
      {with(ex, "/options/redistribute", "sideways"), "/options/redistribute",
       "expected above_autograd or below_autograd"},
      {with(ex, "/options/reduced_propagation", 1), "/options/reduced_propagation",
       "expected intersection, union or strict"},
      {with(ex, "/options/partial_from_replicate", "rank1"), "/options/partial_from_replicate",
       "expected divide or rank0"},
      {with(ex, "/options/dtype", "float8"), "/options/dtype", "expected float64, float32, bfloat16 or float16"},
      {with(ex, "/options/seed", -1), "/options/seed", "non-negative integer"},
      {with(ex, "/options/seed", 1.5), "/options/seed", "non-negative integer"},
      {with(ex, "/options/mutant", 3), "/options/mutant", "mutant name"},
  };
  for (const auto& c : cases) expect_input_error(c);

  json doc = ex;
  doc["options"] = {{"redistribute", "below_autograd"},
                    {"reduced_propagation", "strict"},
                    {"partial_from_replicate", "rank0"},
                    {"seed", 18446744073709551615ull},
                    {"dtype", "float32"},
                    {"mutant", "uneven_array_split"},
                    {"semantics", "pytorch"}};
  EXPECT_EQ(parse_scenario(doc, kFile).options.to_json(), doc["options"]);
}

TEST(Scenario, KnownAndImplementedOps) {
  const auto& known = known_ops();
  EXPECT_TRUE(std::is_sorted(known.begin(), known.end()));
  EXPECT_GE(known.size(), 59u);  // ops are added, never taken away (DESIGN.md, contract 2)
  EXPECT_EQ(implemented_ops(), known);  // every op of the file format runs in this version
  for (const auto& op : implemented_ops())
    EXPECT_NE(std::find(known.begin(), known.end(), op), known.end()) << op;
  for (const char* op : {"local_map", "softmax", "transpose", "scale", "mean"})
    EXPECT_NE(std::find(known.begin(), known.end(), op), known.end()) << op;
}

TEST(Scenario, SetOption) {
  RunOptions o;
  set_option(o, "redistribute", "below_autograd");
  set_option(o, "reduced_propagation", "union");
  set_option(o, "partial_from_replicate", "rank0");
  set_option(o, "dtype", "float32");
  set_option(o, "seed", 42);
  EXPECT_EQ(o.seed, 42u);
  set_option(o, "seed", "12345678901234567890");
  EXPECT_EQ(o.seed, 12345678901234567890ull);
  set_option(o, "mutant", "cotangent_rd_as_r");
  EXPECT_THROW(set_option(o, "mutant", "no_such_bug"), std::invalid_argument);
  EXPECT_EQ(o.redistribute, RedistributeMode::BelowAutograd);
  EXPECT_EQ(o.reduced_propagation, ReducedPropagation::Union);
  EXPECT_EQ(o.partial_from_replicate, PartialFromReplicate::Rank0);
  EXPECT_EQ(o.dtype, DType::Float32);
  EXPECT_EQ(o.mutant, "cotangent_rd_as_r");
  set_option(o, "mutant", nullptr);
  EXPECT_EQ(o.mutant, "");

  auto expect_bad = [](const std::string& key, const json& value, const std::string& message) {
    RunOptions o;
    try {
      set_option(o, key, value);
      ADD_FAILURE() << key << "=" << value.dump() << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  expect_bad("colour", "red", "unknown option \"colour\" (known: redistribute,");
  expect_bad("redistribute", "above", "expected above_autograd or below_autograd, got \"above\"");
  expect_bad("reduced_propagation", json::array(), "expected intersection, union or strict");
  expect_bad("partial_from_replicate", nullptr, "expected divide or rank0");
  expect_bad("dtype", "float8", "expected float64, float32, bfloat16 or float16");
  expect_bad("seed", "-3", "expected a non-negative integer");
  expect_bad("seed", "12x", "expected a non-negative integer");
  expect_bad("seed", "", "expected a non-negative integer");
  expect_bad("seed", "99999999999999999999", "expected a non-negative integer");
  expect_bad("seed", -3, "expected a non-negative integer");
  expect_bad("mutant", true, "mutant name");
}

TEST(Scenario, OptionsRoundTripThroughToJson) {
  EXPECT_EQ(RunOptions{}.to_json(), json::parse(R"({"redistribute": "above_autograd",
      "reduced_propagation": "intersection", "partial_from_replicate": "divide", "seed": 0,
      "dtype": "float64", "mutant": null, "semantics": "meshsim"})"));
  for (const char* mutant : {"", "pavg_backward_unscaled"}) {
    RunOptions o;
    o.redistribute = RedistributeMode::BelowAutograd;
    o.reduced_propagation = ReducedPropagation::Strict;
    o.partial_from_replicate = PartialFromReplicate::Rank0;
    o.seed = 7;
    o.dtype = DType::Float32;
    o.mutant = mutant;
    RunOptions back;
    json as_json = o.to_json();
    for (const auto& item : as_json.items()) set_option(back, item.key(), item.value());
    EXPECT_EQ(back.to_json(), o.to_json());
    EXPECT_EQ(back.mutant, o.mutant);
  }
  EXPECT_STREQ(redistribute_mode_name(RedistributeMode::AboveAutograd), "above_autograd");
  EXPECT_STREQ(reduced_propagation_name(ReducedPropagation::Union), "union");
  EXPECT_STREQ(dtype_name(DType::Float64), "float64");
}

TEST(Scenario, InvalidJsonNamesLineAndColumn) {
  try {
    parse_json_text("{\n  \"format\": 1,\n  \"mesh\": [1,, 2]\n}", "bad.json");
    FAIL() << "parsed";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "bad.json");
    EXPECT_EQ(e.json_path(), "/mesh/1");  // the element being read
    EXPECT_NE(std::string(e.what()).find("bad.json: /mesh/1: invalid JSON at line 3, column 14"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_json_text("", "empty.json"), InputError);
  EXPECT_THROW(parse_json_text("[1e999]", "big.json"), InputError);
  EXPECT_THROW(parse_json_text("{\"a\": 1} trailing", "t.json"), InputError);
}

TEST(Scenario, UnreadableFiles) {
  for (const std::string& path : {std::string("/nonexistent/dir/none.json"),
                                  std::filesystem::temp_directory_path().string()}) {
    try {
      read_json_file(path);
      ADD_FAILURE() << path << " read";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(path + ": /: cannot read: ", 0), 0u) << e.what();
    }
  }
  std::string bad = temp_file("bad.json", "{\"format\": }");
  EXPECT_THROW(load_scenario(bad), InputError);
  std::string good = temp_file("copy_of_example.json", example().dump(2));
  Scenario s = load_scenario(good);
  EXPECT_EQ(s.file, good);
}

// ---- nothing malformed ever escapes as anything but an InputError ----

json random_value(std::mt19937& rng, int depth) {
  switch (rng() % (depth > 2 ? 8 : 10)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<int64_t>(rng() % 9) - 3;
    case 3: return 18446744073709551615ull;
    case 4: return 0.5;
    case 5: {
      static const char* strings[] = {"",    "x",      "w",        "S(0)", "S(1)",
                                      "Rd",  "P(max)", "mm",       "sum",  "redistribute",
                                      "exp", "dp",     "\xff\xfe", "a/b~c"};
      return strings[rng() % (sizeof(strings) / sizeof(*strings))];
    }
    case 6: return json::array();
    case 7: return json::object();
    case 8: {
      json a = json::array();
      for (unsigned n = rng() % 4; n > 0; --n) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      static const char* keys[] = {"name", "shape", "op",         "args",
                                   "out",  "dim",   "placements", "seed"};
      json o = json::object();
      for (unsigned n = rng() % 4; n > 0; --n) o[keys[rng() % 8]] = random_value(rng, depth + 1);
      return o;
    }
  }
}

// Every JSON pointer inside `doc`.
void collect_pointers(const json& doc, const std::string& at, std::vector<std::string>& out) {
  out.push_back(at);
  if (doc.is_object())
    for (const auto& item : doc.items()) collect_pointers(item.value(), at + "/" + item.key(), out);
  if (doc.is_array())
    for (size_t i = 0; i < doc.size(); ++i)
      collect_pointers(doc[i], at + "/" + std::to_string(i), out);
}

void expect_only_input_errors(const json& doc) {
  try {
    parse_scenario(doc, kFile);
  } catch (const InputError& e) {
    EXPECT_EQ(e.json_path().front(), '/') << e.what();
    EXPECT_EQ(std::string(e.what()).rfind(kFile + ": /", 0), 0u) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "escaped: " << e.what() << " for "
                  << doc.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

TEST(Scenario, MalformedDocumentsOnlyThrowInputError) {
  std::mt19937 rng(1234);
  json ex = example();
  std::vector<std::string> pointers;
  collect_pointers(ex, "", pointers);
  for (int round = 0; round < 3000; ++round) {
    json doc = ex;
    for (unsigned edits = 1 + rng() % 3; edits > 0; --edits) {
      const std::string& at = pointers[rng() % pointers.size()];
      json::json_pointer p(at);
      if (!doc.contains(p)) continue;
      if (rng() % 4 == 0 && !at.empty())
        doc[p.parent_pointer()].is_object()
            ? void(doc[p.parent_pointer()].erase(p.back()))
            : void(doc[p.parent_pointer()].erase(std::stoul(p.back())));
      else
        doc[p] = random_value(rng, 0);
    }
    expect_only_input_errors(doc);
  }
  for (int round = 0; round < 500; ++round) expect_only_input_errors(random_value(rng, 0));
}

TEST(Scenario, GarbageTextOnlyThrowsInputError) {
  std::mt19937 rng(99);
  std::string text = example().dump();
  for (int round = 0; round < 2000; ++round) {
    std::string t = text;
    for (unsigned edits = 1 + rng() % 4; edits > 0; --edits)
      t[rng() % t.size()] = static_cast<char>(rng() % 256);
    try {
      parse_scenario(parse_json_text(t, kFile), kFile);
    } catch (const InputError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "escaped: " << e.what();
    }
  }
}

}  // namespace
}  // namespace meshsim

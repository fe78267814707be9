// traces/: JSON round trips, reading errors, replay comparison, trace hashes, and the diagram
// (golden DOT files under tests/golden/traces/; MESHSIM_UPDATE_GOLDEN=1 rewrites them).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "traces/render.h"
#include "traces/trace.h"

namespace meshsim {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A stand-in for the hash of one rank's local tensor: 16 hex digits.
std::string fake_hash(int64_t seq, int rank) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx",
                static_cast<unsigned long long>(seq * 1000003 + rank * 7919));
  return buf;
}

std::vector<std::vector<int64_t>> on_all_ranks(std::vector<int64_t> shape) { return {4, shape}; }

Event event(int64_t seq, std::string phase, std::string kind, std::string name, std::string value,
            std::vector<std::string> args, std::vector<std::string> in_specs, std::string out_spec,
            std::vector<int64_t> local_shape = {}, std::string axis = "", int64_t bytes = 0,
            std::string note = "") {
  Event e;
  e.seq = seq;
  e.phase = std::move(phase);
  e.kind = std::move(kind);
  e.name = std::move(name);
  e.value = std::move(value);
  e.args = std::move(args);
  e.in_specs = std::move(in_specs);
  e.out_spec = std::move(out_spec);
  e.axis = std::move(axis);
  e.bytes = bytes;
  e.note = std::move(note);
  e.local_shapes = on_all_ranks(local_shape);
  for (int r = 0; r < 4; ++r) e.hashes.push_back(fake_hash(seq, r));
  return e;
}

// FSDP with Reduced on a 4-rank mesh: wf = redistribute(w, [Rd]); y = x @ wf; loss = sum(y).
Trace fsdp_trace() {
  Trace t;
  t.version = "0.1.0";
  t.scenario = json::parse(R"js({
    "format": "meshsim.scenario/1", "name": "fsdp_reduced_linear",
    "mesh": {"axes": ["dp"], "shape": [4]},
    "options": {"redistribute": "above_autograd", "reduced_propagation": "intersection", "seed": 0},
    "inputs": [{"name": "x", "shape": [8, 16], "placements": ["S(0)"]},
               {"name": "w", "shape": [16, 4], "placements": ["S(0)"], "requires_grad": true}],
    "program": [{"out": "wf", "op": "redistribute", "args": ["w"], "placements": ["Rd"]},
                {"out": "y", "op": "mm", "args": ["x", "wf"]},
                {"out": "loss", "op": "sum", "args": ["y"]}],
    "backward": "loss"})js");
  t.options = {{"redistribute", "above_autograd"},
               {"reduced_propagation", "intersection"},
               {"partial_from_replicate", "divide"},
               {"seed", 0},
               {"dtype", "float64"},
               {"mutant", ""}};
  t.events = {
      event(0, "forward", "input", "x", "x", {}, {}, "[S(0)]", {2, 16}),
      event(1, "forward", "input", "w", "w", {}, {}, "[S(0)]", {4, 4}),
      event(2, "forward", "collective", "all_gather", "wf", {"w"}, {"[S(0)]"}, "[R]", {16, 4}, "dp",
            384),
      event(3, "forward", "local", "relabel", "wf", {"w"}, {"[R]"}, "[Rd]", {16, 4}, "dp"),
      event(4, "forward", "op", "redistribute", "wf", {"w"}, {"[S(0)]"}, "[Rd]", {16, 4}),
      event(5, "forward", "op", "mm", "y", {"x", "wf"}, {"[S(0)]", "[Rd]"}, "[S(0)]", {2, 4}),
      event(6, "forward", "op", "sum", "loss", {"y"}, {"[S(0)]"}, "[P(sum)]", {}),
      event(7, "backward", "seed", "", "loss", {}, {}, "[Rd]", {}),
      event(8, "backward", "grad", "sum", "y", {"loss"}, {"[Rd]"}, "[S(0)]", {2, 4}),
      event(9, "backward", "grad", "mm", "wf", {"y"}, {"[S(0)]"}, "[P(sum)]", {16, 4}),
      event(10, "backward", "collective", "reduce_scatter", "wf", {}, {"[P(sum)]"}, "[S(0)]",
            {4, 4}, "dp", 384, "backward of redistribute"),
      event(11, "backward", "grad", "redistribute", "w", {"wf"}, {"[S(0)]"}, "[S(0)]", {4, 4}),
      event(12, "backward", "input_grad", "", "w", {}, {}, "[S(0)]", {4, 4}, "", 0,
            "cotangent [S(0)]"),
  };
  t.result = json::parse(R"js({
    "format": "meshsim.result/1", "name": "fsdp_reduced_linear", "status": "pass",
    "grads": {"w": {"placements": ["S(0)"], "cotangent": ["S(0)"]}},
    "checks": {"forward_equivalence": true, "gradient_equivalence": true, "duality": true,
               "exclusivity": true},
    "max_abs_error": 0.0, "error": null})js");
  return t;
}

Trace failing_trace() {
  Trace t = fsdp_trace();
  t.options["mutant"] = "reduced_grad_all_reduce";
  t.result["status"] = "fail";
  t.result["checks"]["duality"] = false;
  t.result["checks"]["gradient_equivalence"] = false;
  return t;
}

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() / ("meshsim_traces_" + std::string(info->name()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name), std::ios::binary) << text;
    return file(name);
  }

 private:
  fs::path path_;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Compares with tests/golden/traces/NAME, or rewrites it when MESHSIM_UPDATE_GOLDEN=1.
void expect_golden(const std::string& name, const std::string& actual) {
  const std::string path = std::string(MESHSIM_SOURCE_DIR) + "/tests/golden/traces/" + name;
  const char* update = std::getenv("MESHSIM_UPDATE_GOLDEN");
  if (update && std::string(update) == "1") {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << actual;
    return;
  }
  ASSERT_TRUE(fs::exists(path)) << path << " is missing; run with MESHSIM_UPDATE_GOLDEN=1";
  EXPECT_EQ(slurp(path), actual) << "golden " << path
                                 << " differs; MESHSIM_UPDATE_GOLDEN=1 rewrites it";
}

// Reading `doc` as a trace fails with an InputError naming the file and `json_path`.
void expect_input_error(const std::string& text, const std::string& json_path,
                        const std::string& detail) {
  TempDir dir;
  const std::string path = dir.write("bad.json", text);
  try {
    read_trace(path);
    FAIL() << "no error for " << text;
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(e.json_path(), json_path);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(detail), std::string::npos) << e.what();
  }
}

// The example trace's JSON with one event field replaced.
std::string with_event_field(size_t index, const std::string& key, const json& value) {
  json doc = trace_to_json(fsdp_trace());
  doc["events"][index][key] = value;
  return doc.dump();
}

// ---- JSON round trip ----

TEST(TraceJson, EventRoundTripIsExact) {
  for (const Event& e : fsdp_trace().events) {
    EXPECT_EQ(event_from_json(event_to_json(e), "mem", "/e"), e) << event_to_json(e).dump();
  }
  const Event empty;
  EXPECT_EQ(event_from_json(event_to_json(empty), "mem", "/e"), empty);
}

TEST(TraceJson, EventWritesEveryKey) {
  const json doc = event_to_json(Event{});
  for (const char* key : {"seq", "phase", "kind", "name", "value", "args", "in_specs", "out_spec",
                          "axis", "bytes", "local_shapes", "hashes", "note"}) {
    EXPECT_TRUE(doc.contains(key)) << key;
  }
  EXPECT_EQ(doc.size(), 13u);
}

TEST(TraceJson, TraceRoundTripIsExact) {
  const Trace t = fsdp_trace();
  const json doc = trace_to_json(t);
  EXPECT_EQ(doc["format"], "meshsim.trace/1");
  EXPECT_TRUE(is_trace_document(doc));
  EXPECT_EQ(trace_from_json(doc, "mem"), t);
  Trace null_result = t;
  null_result.result = nullptr;
  EXPECT_EQ(trace_from_json(trace_to_json(null_result), "mem"), null_result);
}

TEST(TraceJson, FileRoundTripIsExactAndDeterministic) {
  TempDir dir;
  const Trace t = fsdp_trace();
  write_trace(t, dir.file("a.json"));
  write_trace(read_trace(dir.file("a.json")), dir.file("b.json"));
  EXPECT_EQ(read_trace(dir.file("a.json")), t);
  const std::string text = slurp(dir.file("a.json"));
  EXPECT_EQ(text, slurp(dir.file("b.json")));
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.rfind("{\n  \"events\"", 0), 0u) << text.substr(0, 40);
}

// write_trace builds its text one event at a time: the same bytes as the whole document's dump,
// for events with and without an implicit reason, empty and nested values, no events, a null
// result, and strings that JSON escapes.
TEST(TraceJson, TextIsTheDocumentsDumpByteForByte) {
  Trace t = fsdp_trace();
  ASSERT_FALSE(t.events.empty());
  t.events.front().implicit = "planner: \"quoted\"\nnewline, tab\t, unicode \u00e9";
  t.events.back().note = "";
  t.scenario["program"].push_back(json::object());
  EXPECT_EQ(trace_text(t), trace_to_json(t).dump(2) + "\n");
  Trace bare = t;
  bare.events.clear();
  bare.result = nullptr;
  bare.options = json::object();
  EXPECT_EQ(trace_text(bare), trace_to_json(bare).dump(2) + "\n");
}

TEST(TraceJson, IsTraceDocument) {
  EXPECT_TRUE(is_trace_document(json{{"format", "meshsim.trace/1"}}));
  EXPECT_FALSE(is_trace_document(json{{"format", "meshsim.scenario/1"}}));
  EXPECT_FALSE(is_trace_document(json{{"name", "x"}}));
  EXPECT_FALSE(is_trace_document(json::array()));
}

// ---- reading errors ----

TEST(TraceRead, MissingFile) {
  EXPECT_THROW(read_trace("/nonexistent/dir/trace.json"), InputError);
}

// The element being read when the text ended: /format.
TEST(TraceRead, NotJson) { expect_input_error("{\"format\": ", "/format", "invalid JSON at line 1, column 11"); }

// Traces are read as strictly as scenarios (core/files.h).
TEST(TraceRead, HostileJson) {
  std::string hundred_deep;  // the path of the element that would nest one level too deep
  for (int i = 0; i < 100; ++i) hundred_deep += "/0";
  expect_input_error(std::string(100000, '[') + std::string(100000, ']'), hundred_deep, "nesting deeper than 100 levels");
  std::string dup = trace_to_json(fsdp_trace()).dump();
  dup.insert(1, "\"events\": [], ");
  expect_input_error(dup, "/events", "appears twice");
  expect_input_error(trace_to_json(fsdp_trace()).dump() + std::string(1, '\0') + "{}", "/", "a NUL byte");
}

TEST(TraceRead, NotAnObject) { expect_input_error("[1, 2]", "", "expected an object"); }

TEST(TraceRead, WrongFormat) {
  json doc = trace_to_json(fsdp_trace());
  doc["format"] = "meshsim.scenario/1";
  expect_input_error(doc.dump(), "/format", "meshsim.trace/1");
  doc["format"] = 1;
  expect_input_error(doc.dump(), "/format", "expected a string");
}

TEST(TraceRead, WrongTopLevelFields) {
  json doc = trace_to_json(fsdp_trace());
  doc["events"] = json::object();
  expect_input_error(doc.dump(), "/events", "expected an array");
  doc = trace_to_json(fsdp_trace());
  doc["scenario"] = "fsdp";
  expect_input_error(doc.dump(), "/scenario", "expected an object");
  doc = trace_to_json(fsdp_trace());
  doc.erase("version");
  expect_input_error(doc.dump(), "/version", "missing key");
  doc = trace_to_json(fsdp_trace());
  doc["extra"] = 1;
  expect_input_error(doc.dump(), "/extra", "unknown key");
}

TEST(TraceRead, WrongEventFieldTypes) {
  expect_input_error(with_event_field(1, "bytes", "384"), "/events/1/bytes", "expected an integer");
  expect_input_error(with_event_field(2, "seq", 2.5), "/events/2/seq", "expected an integer");
  expect_input_error(with_event_field(3, "args", "w"), "/events/3/args", "expected an array");
  expect_input_error(with_event_field(0, "hashes", json::array({"a", "b", 3})),
                     "/events/0/hashes/2", "expected a string");
  expect_input_error(with_event_field(4, "local_shapes", json::array({json::array({16, "4"})})),
                     "/events/4/local_shapes/0/1", "expected an integer");
  expect_input_error(with_event_field(5, "speed", 1), "/events/5/speed", "unknown key");
  json doc = trace_to_json(fsdp_trace());
  doc["events"][6].erase("note");
  expect_input_error(doc.dump(), "/events/6/note", "missing key");
}

// ---- replay comparison ----

TEST(TraceCompare, IdenticalListsDoNotDiverge) {
  const auto events = fsdp_trace().events;
  const Divergence d = compare_events(events, events);
  EXPECT_FALSE(d.diverged);
  EXPECT_EQ(d.index, -1);
  EXPECT_TRUE(compare_events({}, {}).message.empty());
}

TEST(TraceCompare, FirstDifferingHash) {
  const auto recorded = fsdp_trace().events;
  auto replayed = recorded;
  replayed[10].hashes[2] = "9a00000000000000";
  replayed[11].hashes.clear();  // a later difference is not the first
  const Divergence d = compare_events(recorded, replayed);
  EXPECT_TRUE(d.diverged);
  EXPECT_EQ(d.index, 10);
  EXPECT_EQ(d.message,
            "event 10 (backward collective reduce_scatter of wf): hashes[2] differs: recorded " +
                recorded[10].hashes[2] + " replayed 9a00000000000000");
}

TEST(TraceCompare, FirstDifferingField) {
  const auto recorded = fsdp_trace().events;
  auto replayed = recorded;
  replayed[4].out_spec = "[R]";
  replayed[4].bytes = 7;  // later in field order
  Divergence d = compare_events(recorded, replayed);
  EXPECT_EQ(d.index, 4);
  EXPECT_EQ(
      d.message,
      "event 4 (forward op redistribute of wf): out_spec differs: recorded [Rd] replayed [R]");
  replayed = recorded;
  replayed[2].bytes = 512;
  d = compare_events(recorded, replayed);
  EXPECT_EQ(
      d.message,
      "event 2 (forward collective all_gather of wf): bytes differs: recorded 384 replayed 512");
  replayed = recorded;
  replayed[0].local_shapes[3] = {3, 16};
  d = compare_events(recorded, replayed);
  EXPECT_EQ(d.message,
            "event 0 (forward input x): local_shapes[3] differs: recorded [2,16] replayed [3,16]");
  replayed = recorded;
  replayed[5].args.pop_back();
  d = compare_events(recorded, replayed);
  EXPECT_EQ(d.message, "event 5 (forward op mm of y): args has 2 entries recorded, 1 replayed");
}

TEST(TraceCompare, LengthDifference) {
  const auto recorded = fsdp_trace().events;
  auto shorter = recorded;
  shorter.pop_back();
  Divergence d = compare_events(recorded, shorter);
  EXPECT_TRUE(d.diverged);
  EXPECT_EQ(d.index, 12);
  EXPECT_EQ(d.message,
            "event 12 (backward input_grad of w): missing from the replay (recorded 13 events, "
            "replayed 12)");
  d = compare_events(shorter, recorded);
  EXPECT_EQ(d.index, 12);
  EXPECT_EQ(
      d.message,
      "event 12 (backward input_grad of w): extra in the replay (recorded 12 events, replayed 13)");
}

// ---- trace hash ----

TEST(TraceHash, StableAndSensitiveToOneByte) {
  const Trace t = fsdp_trace();
  const uint64_t h = trace_hash(t);
  EXPECT_EQ(trace_hash(fsdp_trace()), h);
  EXPECT_EQ(trace_hash(trace_from_json(trace_to_json(t), "mem")), h);
  Trace changed = t;
  changed.events[9].hashes[1].back() ^= 1;
  EXPECT_NE(trace_hash(changed), h);
  Trace other_result = t;  // the hash covers the events only
  other_result.result = nullptr;
  EXPECT_EQ(trace_hash(other_result), h);
}

// ---- diagram ----

// How often `needle` occurs in `hay`.
size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (auto at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + needle.size())) ++n;
  return n;
}

// The DOT statement of one node: its line, or "" when there is none.
std::string node_statement(const std::string& dot, const std::string& id) {
  std::istringstream lines(dot);
  const std::string head = "\"" + id + "\" [";
  for (std::string line; std::getline(lines, line);) {
    const auto start = line.find_first_not_of(' ');
    if (start != std::string::npos && line.compare(start, head.size(), head) == 0) return line.substr(start);
  }
  return "";
}

// The trace with its result's "values" (global shapes) and a 2-axis variant.
Trace with_values(Trace t) {
  t.result["values"] = json::parse(R"js({
    "x": {"placements": ["S(0)"], "shape": [8, 16]}, "w": {"placements": ["S(0)"], "shape": [16, 4]},
    "wf": {"placements": ["Rd"], "shape": [16, 4]}, "y": {"placements": ["S(0)"], "shape": [8, 4]},
    "loss": {"placements": ["P(sum)"], "shape": []}})js");
  return t;
}

// A trace on a mesh of `shape` over axes "dp", "tp", ... with one all_gather over the last axis.
Trace mesh_trace(const std::vector<int64_t>& shape) {
  static const char* kAxes[] = {"dp", "tp", "cp", "ep", "pp"};
  Trace t = fsdp_trace();
  json axes = json::array();
  int64_t ranks = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    axes.push_back(kAxes[i]);
    ranks *= shape[i];
  }
  t.scenario["mesh"] = {{"axes", axes}, {"shape", shape}};
  for (auto& e : t.events) {
    e.local_shapes.assign(static_cast<size_t>(ranks), e.local_shapes.front());
    e.hashes.assign(static_cast<size_t>(ranks), e.hashes.front());
    if (!e.axis.empty()) e.axis = axes.back();
  }
  return t;
}

// The trace with a different local shape of x on every rank: no two ranks alike.
Trace distinct_ranks(Trace t) {
  for (size_t r = 0; r < t.events[0].local_shapes.size(); ++r) t.events[0].local_shapes[r] = {2 + static_cast<int64_t>(r), 16};
  return t;
}

// The label of a cluster ("rank3" for cluster_rank3): its label line, or "".
std::string cluster_label(const std::string& dot, const std::string& name) {
  const auto at = dot.find("subgraph \"cluster_" + name + "\" {");
  if (at == std::string::npos) return "";
  const auto label = dot.find("label=", at);
  return dot.substr(label, dot.find('\n', label) - label);
}

TEST(TraceRender, GoldenFsdp) {
  expect_golden("fsdp_reduced_linear.dot", render_dot(fsdp_trace()));
}

TEST(TraceRender, GoldenFailingRun) {
  const std::string dot = render_dot(failing_trace());
  EXPECT_NE(dot.find("failed: duality"), std::string::npos);
  expect_golden("fsdp_reduced_linear_fail.dot", dot);
}

TEST(TraceRender, GoldenRankView) {
  expect_golden("fsdp_reduced_linear.ranks.dot", render_dot(with_values(fsdp_trace()), RenderView::Ranks));
}

TEST(TraceRender, ParsesTheView) {
  EXPECT_EQ(parse_render_view("logical"), RenderView::Logical);
  EXPECT_EQ(parse_render_view("ranks"), RenderView::Ranks);
  EXPECT_THROW(parse_render_view("rank"), std::invalid_argument);
  EXPECT_STREQ(render_view_name(RenderView::Ranks), "ranks");
  EXPECT_EQ(render_dot(fsdp_trace()), render_dot(fsdp_trace(), RenderView::Logical));
}

TEST(TraceRender, ValueNodesShowNameGlobalShapeAndSpec) {
  const std::string dot = render_dot(with_values(fsdp_trace()));
  const std::string wf = node_statement(dot, "v:wf");
  EXPECT_NE(wf.find("<B>wf</B>"), std::string::npos) << wf;
  EXPECT_NE(wf.find("[16, 4]"), std::string::npos) << wf;
  EXPECT_NE(wf.find(">[Rd]<"), std::string::npos) << wf;
  // Without the result's values, an input's global shape comes from the scenario.
  const std::string x = node_statement(render_dot(fsdp_trace()), "v:x");
  EXPECT_NE(x.find("[8, 16]"), std::string::npos) << x;
  EXPECT_NE(x.find("local [2, 16]"), std::string::npos) << x;
}

TEST(TraceRender, LTensorSetsAreShownAsRecorded) {
  Trace t = fsdp_trace();
  t.events[5].out_spec = "variant=[dp] reduced=[]";
  const std::string y = node_statement(render_dot(with_values(t)), "v:y");
  EXPECT_NE(y.find(">variant=[dp] reduced=[]<"), std::string::npos) << y;
  EXPECT_EQ(y.find("[8, 4]"), std::string::npos) << "an LTensor has no global shape: " << y;
}

TEST(TraceRender, CollectivesHaveOneStyleEachAndBytesOnTheEdge) {
  const std::string dot = render_dot(fsdp_trace());
  const std::string gather = node_statement(dot, "e2");
  const std::string scatter = node_statement(dot, "e10");
  EXPECT_NE(gather.find("distortion=\"-0.18\""), std::string::npos) << gather;
  EXPECT_NE(scatter.find("distortion=\"0.18\""), std::string::npos) << scatter;
  EXPECT_NE(gather.find("#b8e3b0"), std::string::npos);
  EXPECT_NE(scatter.find("#fdd0a2"), std::string::npos);
  EXPECT_NE(dot.find("\"e2\" -> \"e3\" [color=\"#1b7837\", penwidth=\"2.2\", xlabel=\" 384 B/rank \""),
            std::string::npos);
  // Backward edges are dashed; the one leaving the reduce_scatter keeps its color and bytes.
  EXPECT_NE(dot.find("\"e10\" -> \"e11\" [color=\"#d94801\", penwidth=\"2.2\", xlabel=\" 384 B/rank \", "
                     "fontcolor=\"#d94801\", style=\"dashed\"]"),
            std::string::npos);
  EXPECT_NE(dot.find("\"e8\" -> \"e9\" [style=\"dashed\""), std::string::npos);
  EXPECT_NE(dot.find("subgraph \"cluster_forward\""), std::string::npos);
  EXPECT_NE(dot.find("subgraph \"cluster_backward\""), std::string::npos);
  EXPECT_NE(dot.find("subgraph \"cluster_legend\""), std::string::npos);
  for (const char* kind : {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "local step"})
    EXPECT_NE(dot.find("\"legend:" + std::string(kind) + "\""), std::string::npos) << kind;
}

TEST(TraceRender, InputGradientShowsTrackedPlacementAndCotangent) {
  const std::string grad = node_statement(render_dot(fsdp_trace()), "e12");
  EXPECT_NE(grad.find("grad w"), std::string::npos) << grad;
  EXPECT_NE(grad.find("tracked"), std::string::npos) << grad;
  EXPECT_NE(grad.find("cotangent"), std::string::npos) << grad;
  EXPECT_NE(grad.find("\u2713"), std::string::npos) << grad;
  Trace t = fsdp_trace();
  t.result["grads"]["w"]["placements"] = {"R"};
  const std::string wrong = node_statement(render_dot(t), "e12");
  EXPECT_NE(wrong.find("\u2717"), std::string::npos) << wrong;
  EXPECT_NE(wrong.find("penwidth=\"3\""), std::string::npos) << wrong;
}

TEST(TraceRender, FailuresMarkTheirNodes) {
  Trace t = failing_trace();
  t.result["failures"] = {"y: differs from the oracle by 3", "grad w: differs from the oracle by 2",
                          "w: gradient is [R], its cotangent is [S(0)]", "tracking: lost a hook"};
  const std::string dot = render_dot(t);
  const std::string y = node_statement(dot, "v:y");
  EXPECT_NE(y.find("color=\"#d7191c\", penwidth=\"3\""), std::string::npos) << y;
  EXPECT_NE(y.find("differs from the oracle by 3"), std::string::npos) << y;
  const std::string grad = node_statement(dot, "e12");
  EXPECT_NE(grad.find("differs from the oracle by 2"), std::string::npos) << grad;
  EXPECT_NE(grad.find("gradient is [R], its cotangent is [S(0)]"), std::string::npos) << grad;
  EXPECT_NE(grad.find("penwidth=\"3\""), std::string::npos) << grad;
  EXPECT_EQ(node_statement(dot, "v:w").find("penwidth=\"3\""), std::string::npos) << "w itself passes";
  EXPECT_EQ(node_statement(dot, "v:x").find("penwidth=\"3\""), std::string::npos);
  const std::string note = node_statement(dot, "status");
  EXPECT_NE(note.find("tracking: lost a hook"), std::string::npos) << note;
  EXPECT_NE(note.find("3 problems marked in red"), std::string::npos) << note;
}

TEST(TraceRender, RankSpecificFailureMarksThatRank) {
  Trace t = failing_trace();
  t.result["failures"] = {"x: rank 1 holds a local of shape [3, 16], its layout [S(0)] says [2, 16]"};
  const std::string dot = render_dot(t, RenderView::Ranks);
  EXPECT_NE(node_statement(dot, "r1:v:x").find("penwidth=\"3\""), std::string::npos);
  EXPECT_NE(node_statement(dot, "r1:v:x").find("rank 1 holds a local"), std::string::npos);
  // The four ranks are alike but for the failure: rank 1 is drawn apart, the others once.
  EXPECT_EQ(count(dot, "subgraph \"cluster_rank"), 2u);
  EXPECT_NE(cluster_label(dot, "rank0").find("ranks 0, 2, 3"), std::string::npos) << cluster_label(dot, "rank0");
  for (const char* other : {"r0:v:x", "r1:v:w"})
    EXPECT_EQ(node_statement(dot, other).find("penwidth=\"3\""), std::string::npos) << other;
  // The logical view marks the value.
  EXPECT_NE(node_statement(render_dot(t), "v:x").find("penwidth=\"3\""), std::string::npos);
}

TEST(TraceRender, RankSpecificFailureOfACollapsedMeshIsDrawn) {
  Trace t = mesh_trace({4096});
  t.result["status"] = "fail";
  t.result["failures"] = {"x: rank 100 holds a local of shape [3, 16], its layout [S(0)] says [2, 16]"};
  const std::string dot = render_dot(t, RenderView::Ranks);
  const std::string x = node_statement(dot, "r100:v:x");
  EXPECT_NE(x.find("penwidth=\"3\""), std::string::npos) << x;
  EXPECT_NE(x.find("rank 100 holds a local"), std::string::npos) << x;
  EXPECT_EQ(node_statement(dot, "r0:v:x").find("penwidth=\"3\""), std::string::npos);
  EXPECT_NE(dot.find("5 of 4096 ranks shown"), std::string::npos);
}

TEST(TraceRender, ErrorNote) {
  Trace t = fsdp_trace();
  t.result["status"] = "error";
  t.result["error"] = {{"kind", "illegal_redistribute"}, {"message", "S(0) -> P(sum)"}};
  const std::string note = node_statement(render_dot(t), "status");
  EXPECT_NE(note.find("error: illegal_redistribute"), std::string::npos) << note;
  EXPECT_NE(note.find("S(0) -&gt; P(sum)"), std::string::npos) << note;
  EXPECT_NE(note.find("shape=\"note\""), std::string::npos) << note;
  EXPECT_EQ(render_dot(fsdp_trace()).find("shape=\"note\""), std::string::npos);
  EXPECT_EQ(node_statement(render_dot(fsdp_trace()), "status"), "");
}

TEST(TraceRender, ErrorBeforeTheFirstEventDrawsTheProgram) {
  Trace t = fsdp_trace();
  t.events.clear();
  t.result = {{"status", "error"},
              {"error", {{"kind", "shape_mismatch"}, {"message", "mm: [8, 16] @ [4, 4]"}}}};
  for (auto view : {RenderView::Logical, RenderView::Ranks}) {
    const std::string dot = render_dot(t, view);
    EXPECT_NE(dot.find("subgraph \"cluster_program\""), std::string::npos);
    EXPECT_NE(node_statement(dot, "v:w").find("[16, 4]"), std::string::npos);
    // The only mm is the op the error names.
    EXPECT_NE(node_statement(dot, "p1").find("penwidth=\"3\""), std::string::npos) << node_statement(dot, "p1");
    EXPECT_EQ(node_statement(dot, "p0").find("penwidth=\"3\""), std::string::npos);
    EXPECT_NE(node_statement(dot, "status").find("shape_mismatch"), std::string::npos);
  }
}

TEST(TraceRender, OperandMovedBelowAutogradChainsIntoItsOp) {
  Trace t = fsdp_trace();
  // Below autograd: the steps carry the implicit operand "y.arg1"; no redistribute op.
  t.events[2].value = t.events[3].value = "y.arg1";
  t.events[2].args.clear();
  t.events[3].args.clear();
  t.events.erase(t.events.begin() + 4);
  t.events[4].args = {"x", "y.arg1"};
  t.scenario["program"] = json::parse(R"js([{"out": "y", "op": "mm", "args": ["x", "w"]},
                                            {"out": "loss", "op": "sum", "args": ["y"]}])js");
  const std::string dot = render_dot(t);
  EXPECT_NE(dot.find("\"v:w\" -> \"e2\""), std::string::npos) << dot;
  EXPECT_NE(dot.find("\"e3\" -> \"e5\""), std::string::npos) << dot;
  EXPECT_EQ(dot.find("\"v:y.arg1\""), std::string::npos) << dot;
}

TEST(TraceRender, RedefinedNamesGetTheirOwnNodes) {
  Trace t = fsdp_trace();
  // A local_map enters x under its own name.
  Event enter = t.events[0];
  enter.seq = 100;
  enter.kind = "op";
  enter.name = "enter_local_map";
  enter.args = {"x"};
  enter.out_spec = "variant=[dp] reduced=[]";
  t.events.insert(t.events.begin() + 2, enter);
  const std::string dot = render_dot(t);
  EXPECT_NE(dot.find("\"v:x\" -> \"e100\""), std::string::npos);
  EXPECT_NE(dot.find("\"e100\" -> \"v:x@100\""), std::string::npos);
  EXPECT_NE(dot.find("\"v:x@100\" -> \"e5\""), std::string::npos);
  EXPECT_NE(dot.find("subgraph \"cluster_local_map0\""), std::string::npos);
}

TEST(TraceRender, RankViewNestsClustersByMeshAxes) {
  const std::string dot = render_dot(distinct_ranks(mesh_trace({2, 2})), RenderView::Ranks);
  for (const char* c : {"cluster_axes:dp=0", "cluster_axes:dp=1", "cluster_rank0", "cluster_rank3"})
    EXPECT_NE(dot.find(std::string("subgraph \"") + c + "\""), std::string::npos) << c;
  // dp=0 holds ranks 0 and 1 (row-major), dp=1 ranks 2 and 3.
  const auto dp0 = dot.find("cluster_axes:dp=0"), dp1 = dot.find("cluster_axes:dp=1");
  EXPECT_LT(dp0, dot.find("cluster_rank0"));
  EXPECT_LT(dot.find("cluster_rank1"), dp1);
  EXPECT_LT(dp1, dot.find("cluster_rank2"));
  EXPECT_NE(cluster_label(dot, "rank3").find("rank 3  \u00b7  tp=1"), std::string::npos) << cluster_label(dot, "rank3");
  // The all_gather over tp: groups {0, 1} and {2, 3}, each one node joining its ranks.
  EXPECT_NE(dot.find("\"r0:v:w\" -> \"e2:g0\""), std::string::npos);
  EXPECT_NE(dot.find("\"r1:v:w\" -> \"e2:g0\""), std::string::npos);
  EXPECT_NE(dot.find("\"r2:v:w\" -> \"e2:g2\""), std::string::npos);
  EXPECT_NE(dot.find("\"r3:v:w\" -> \"e2:g2\""), std::string::npos);
  EXPECT_EQ(dot.find("\"r2:v:w\" -> \"e2:g0\""), std::string::npos);
  EXPECT_NE(node_statement(dot, "e2:g0").find("ranks 0, 1"), std::string::npos);
  EXPECT_NE(node_statement(dot, "r3:v:wf").find("[16, 4]"), std::string::npos);
  // The backward reduce_scatter joins the same groups and reaches each rank's gradient.
  EXPECT_NE(dot.find("\"e10:g2\" -> \"r3:e11\""), std::string::npos);
  EXPECT_EQ(count(dot, "subgraph \"cluster_rank"), 4u);
}

// One cluster per rank made an 8-rank rank view 8000 px wide. Ranks alike (the same
// local shape at every event, the same collectives) are drawn once, as one cluster naming them.
TEST(TraceRender, RankViewDrawsRanksAlikeOnce) {
  const std::string dot = render_dot(mesh_trace({2, 4}), RenderView::Ranks);
  EXPECT_EQ(count(dot, "subgraph \"cluster_rank"), 1u);
  const std::string label = cluster_label(dot, "rank0");
  for (const char* part : {"ranks 0\u20137", "(8 alike)", "dp=*, tp=*"})
    EXPECT_NE(label.find(part), std::string::npos) << part << " in " << label;
  EXPECT_EQ(count(dot, ":v:w\" [label="), 1u) << "w is drawn once for the 8 ranks";
  // The all_gather over tp is one node for its two groups, joined by the one cluster.
  EXPECT_NE(node_statement(dot, "e2:g0").find("2 groups: {0\u20133} {4\u20137}"), std::string::npos)
      << node_statement(dot, "e2:g0");
  EXPECT_EQ(node_statement(dot, "e2:g4"), "");
  EXPECT_NE(dot.find("\"r0:v:w\" -> \"e2:g0\""), std::string::npos);
  EXPECT_NE(dot.find("8 ranks, drawn as 1 class of ranks alike"), std::string::npos);
  // The same on 16 ranks: the diagram does not grow with the mesh.
  const std::string sixteen = render_dot(mesh_trace({4, 4}), RenderView::Ranks);
  EXPECT_EQ(count(sixteen, "subgraph \"cluster_rank"), 1u);
  EXPECT_EQ(count(sixteen, " [label="), count(dot, " [label="));
}

TEST(TraceRender, RankViewDrawsRanksThatDifferApart) {
  // w is [4, 4] on every rank but those of tp=3, which hold [3, 4].
  Trace t = mesh_trace({2, 4});
  for (int64_t r : {3, 7}) t.events[1].local_shapes[r] = {3, 4};
  const std::string dot = render_dot(t, RenderView::Ranks);
  EXPECT_EQ(count(dot, "subgraph \"cluster_rank"), 2u);
  EXPECT_NE(cluster_label(dot, "rank0").find("ranks 0\u20132, 4\u20136"), std::string::npos) << cluster_label(dot, "rank0");
  EXPECT_NE(cluster_label(dot, "rank0").find("dp=*, tp=0,1,2"), std::string::npos) << cluster_label(dot, "rank0");
  EXPECT_NE(cluster_label(dot, "rank3").find("ranks 3, 7"), std::string::npos) << cluster_label(dot, "rank3");
  EXPECT_NE(cluster_label(dot, "rank3").find("dp=*, tp=3"), std::string::npos) << cluster_label(dot, "rank3");
  EXPECT_NE(node_statement(dot, "r3:v:w").find("[3, 4]"), std::string::npos);
  EXPECT_NE(node_statement(dot, "r0:v:w").find("[4, 4]"), std::string::npos);
  // Each all_gather group over tp holds ranks of both classes: one node joins the two clusters.
  EXPECT_NE(dot.find("\"r0:v:w\" -> \"e2:g0\""), std::string::npos);
  EXPECT_NE(dot.find("\"r3:v:w\" -> \"e2:g0\""), std::string::npos);
}

TEST(TraceRender, RankViewSeparatesRanksThatMeetDifferentCollectives) {
  // On dp=2 x tp=2, rank 0 alone holds another x. Ranks 1, 2 and 3 hold the same shapes, but
  // rank 1 meets rank 0 in the all_gather over tp, and ranks 2 and 3 meet each other: three classes.
  Trace t = mesh_trace({2, 2});
  t.events[0].local_shapes[0] = {3, 16};
  const std::string dot = render_dot(t, RenderView::Ranks);
  EXPECT_EQ(count(dot, "subgraph \"cluster_rank"), 3u);
  EXPECT_NE(cluster_label(dot, "rank2").find("ranks 2, 3"), std::string::npos) << cluster_label(dot, "rank2");
  EXPECT_NE(node_statement(dot, "e2:g0").find("ranks 0, 1"), std::string::npos);
  EXPECT_NE(node_statement(dot, "e2:g2").find("ranks 2, 3"), std::string::npos);
  EXPECT_NE(dot.find("\"r1:v:w\" -> \"e2:g0\""), std::string::npos);
  EXPECT_NE(dot.find("\"r2:v:w\" -> \"e2:g2\""), std::string::npos);
  EXPECT_EQ(dot.find("\"r1:v:w\" -> \"e2:g2\""), std::string::npos);
  EXPECT_EQ(dot.find("\"r2:v:w\" -> \"e2:g0\""), std::string::npos);
}

TEST(TraceRender, RankViewDrawsUpToSixteenRanks) {
  const std::string dot = render_dot(distinct_ranks(mesh_trace({4, 4})), RenderView::Ranks);
  EXPECT_EQ(count(dot, "subgraph \"cluster_rank"), 16u);
  EXPECT_EQ(dot.find("more ranks like these"), std::string::npos);
}

TEST(TraceRender, RankViewCollapsesLargeMeshes) {
  const std::string one_axis = render_dot(mesh_trace({4096}), RenderView::Ranks);
  EXPECT_EQ(count(one_axis, "subgraph \"cluster_rank"), 1u);
  EXPECT_NE(cluster_label(one_axis, "rank0").find("ranks 0\u20133"), std::string::npos);
  EXPECT_NE(one_axis.find("and 4092 more ranks like these"), std::string::npos);
  const std::string gather = node_statement(one_axis, "e2:g0");
  EXPECT_NE(gather.find("ranks 0\u20133<"), std::string::npos) << gather;
  EXPECT_NE(gather.find(">\u2026 (4096 in the group)<"), std::string::npos) << gather;
  EXPECT_LT(one_axis.size(), 100000u);
  const std::string two_axes = render_dot(distinct_ranks(mesh_trace({2, 9})), RenderView::Ranks);
  EXPECT_EQ(count(two_axes, "subgraph \"cluster_rank"), 4u);
  for (const char* c : {"cluster_rank0\"", "cluster_rank1\"", "cluster_rank9\"", "cluster_rank10\""})
    EXPECT_NE(two_axes.find(c), std::string::npos) << c;
  EXPECT_NE(two_axes.find("and 14 more ranks like these"), std::string::npos);
  // Alike, the four shown ranks are one cluster: every coordinate of dp, the shown ones of tp.
  const std::string folded = render_dot(mesh_trace({2, 9}), RenderView::Ranks);
  EXPECT_NE(cluster_label(folded, "rank0").find("dp=*, tp=0,1<"), std::string::npos) << cluster_label(folded, "rank0");
}

TEST(TraceRender, EscapesLabels) {
  Trace t;
  t.events = {event(0, "forward", "input", "a\"b\\c", "a\"b\\c", {}, {}, "[R]", {2}),
              event(1, "forward", "input", "<x&y>", "<x&y>", {}, {}, "[R]", {2})};
  const std::string dot = render_dot(t);
  EXPECT_NE(dot.find(R"dot("v:a\"b\\c" [label=<<B>a&quot;b\c</B>)dot"), std::string::npos) << dot;
  EXPECT_NE(dot.find(R"dot("v:<x&y>" [label=<<B>&lt;x&amp;y&gt;</B>)dot"), std::string::npos) << dot;
}

TEST(TraceRender, IsAPureFunction) {
  EXPECT_EQ(render_dot(fsdp_trace()), render_dot(fsdp_trace()));
  EXPECT_EQ(render_dot(fsdp_trace(), RenderView::Ranks), render_dot(fsdp_trace(), RenderView::Ranks));
}

TEST(TraceRender, WritesDotSvgAndPng) {
  TempDir dir;
  const Trace t = fsdp_trace();
  render_to_file(t, dir.file("g.dot"));
  render_to_file(t, dir.file("g.svg"));
  render_to_file(t, dir.file("g.png"));
  render_to_file(t, dir.file("r.dot"), RenderView::Ranks);
  render_to_file(t, dir.file("r.svg"), RenderView::Ranks);
  EXPECT_EQ(slurp(dir.file("g.dot")), render_dot(t));
  EXPECT_EQ(slurp(dir.file("r.dot")), render_dot(t, RenderView::Ranks));
  for (const char* svg_file : {"g.svg", "r.svg"}) {
    const std::string svg = slurp(dir.file(svg_file));
    EXPECT_TRUE(svg.rfind("<?xml", 0) == 0 || svg.find("<svg") != std::string::npos) << svg.substr(0, 80);
  }
  const std::string png = slurp(dir.file("g.png"));
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST(TraceRender, LaysOutEveryGoldenDiagram) {
  // Every label is valid graphviz HTML: each view of each hand-made trace lays out.
  Trace failing = failing_trace();
  failing.result["failures"] = {"y: differs <by> 3 & more"};
  for (const Trace& t : {fsdp_trace(), failing, mesh_trace({2, 2}), distinct_ranks(mesh_trace({2, 2})),
                         mesh_trace({2, 4}), mesh_trace({4096})})
    for (auto view : {RenderView::Logical, RenderView::Ranks})
      EXPECT_NO_THROW(layout_dot(render_dot(t, view), "svg"));
}

TEST(TraceRender, UnknownExtensionThrows) {
  TempDir dir;
  for (const char* name : {"g.pdf", "g", "dir.svg/g"}) {
    try {
      render_to_file(fsdp_trace(), dir.file(name));
      FAIL() << name;
    } catch (const InputError& e) {
      EXPECT_EQ(e.file(), dir.file(name));
      EXPECT_NE(std::string(e.what()).find("use .svg, .png or .dot"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(dir.file("g.pdf")));
}

}  // namespace
}  // namespace meshsim

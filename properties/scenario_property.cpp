// What a case of a scenario property draws, and why (docs/testing.md, "Property-test your own
// scenario"):
// - kind 0 (the first case of every run, where RapidCheck's size is 0, and where shrinking ends):
//   the scenario as written; it must pass, or the property fails on it at once.
// - otherwise: each mesh axis a size from 1 to 8 (at most 32 ranks); each dimension size of the
//   inputs a symbol drawn anew (so dims that must agree still agree), often uneven over the axes,
//   except sizes that the program's attributes spell out (a view's shape); each input's placements
//   redrawn from R, S(d), P(sum) and Rd, except for inputs whose locals the program reads as they
//   are (they reach a local_map without in_placements, or to_local: its local code is written for
//   its layout), and for training steps the parameters when the user's code reduces the norm or
//   the optimizer states have placements of their own (written for the parameters' layout); the run options redistribute, reduced_propagation, partial_from_replicate and the
//   data seed. `semantics` is the user's: under another the same program means something else.
// - a variant over the limits of the run (--max-memory, --max-ranks: the estimate meshsim run
//   refuses with) is a discard ("the variant is refused: resource_limit"); the scenario as written
//   over them is refused before any case, as meshsim run refuses it (exit 2).
// - memory that runs out in a case ends the property as out of memory (exit 6), not as a failure.
// - a variant the semantics refuse or that is invalid input (an error, exit 2 or 3) is a discard,
//   counted by its error kind ("the variant is refused: illegal_redistribute"): a mesh too small for
//   a view, an Rd where the reduced policy refuses it. Only the scenario as written must not be
//   refused.
// - the verdict: status pass; "unchecked" where the scenario as written is unchecked too (its
//   local_map has no reference: the oracle has no value to compare).
#include "properties/scenario_property.h"

#include <deque>
#include <functional>
#include <map>
#include <set>

#include <rapidcheck.h>

#include "core/error.h"
#include "core/resources.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "properties/runner.h"

namespace meshsim {

namespace {

using nlohmann::json;

// Every integer in the program's attributes (a view's shape, a split's sizes): dimension sizes
// equal to one of them stay as written.
void integers_in(const json& v, std::set<int64_t>& out) {
  if (v.is_number_integer()) out.insert(v.get<int64_t>());
  if (v.is_array() || v.is_object())
    for (const auto& item : v) integers_in(item, out);
}

std::set<int64_t> pinned_sizes(const json& program) {
  std::set<int64_t> out;
  for (const auto& op : program) {
    json attrs = op;
    for (const char* k : {"out", "outs", "op", "args", "body", "reference", "returns", "in_placements",
                          "out_placements", "dim", "dims", "axis", "split_dim", "concat_dim", "value"})
      attrs.erase(k);
    integers_in(attrs, out);
    for (const char* k : {"body", "reference"})
      if (op.contains(k)) {
        const auto inner = pinned_sizes(op[k]);
        out.insert(inner.begin(), inner.end());
      }
  }
  return out;
}

// The inputs whose locals the program reads as laid out: those upstream of a local_map argument
// without in_placements or of a to_local.
std::set<std::string> layout_bound_inputs(const json& doc) {
  std::set<std::string> bound;
  const json& program = doc.at("program");
  for (auto it = program.rbegin(); it != program.rend(); ++it) {
    const json& op = *it;
    const std::string name = op.value("op", "");
    bool reads_locals = name == "to_local" || (name == "local_map" && !op.contains("in_placements"));
    bool feeds_bound = false;
    if (op.contains("out") && op["out"].is_string()) feeds_bound = bound.count(op["out"].get<std::string>()) > 0;
    for (const auto& o : op.value("outs", json::array())) feeds_bound |= o.is_string() && bound.count(o.get<std::string>());
    if (reads_locals || feeds_bound)
      for (const auto& a : op.value("args", json::array()))
        if (a.is_string()) bound.insert(a.get<std::string>());
  }
  // Training steps whose own code is written for the parameters' layout: the user's all_reduce of
  // clip_grad_norm's total (right for these placements, wrong for others), and optimizer states
  // with placements of their own.
  const json train = doc.value("train", json::object());
  if (train.is_object()) {
    const json clip = train.value("clip_grad_norm", json::object());
    const bool users_norm = clip.is_object() && clip.contains("reduce") && clip["reduce"].is_object();
    const json states = train.value("optimizer", json::object()).value("states", json::object());
    for (const auto& in : doc.value("inputs", json::array()))
      if (in.is_object() && in.value("requires_grad", false) && in.contains("name") && in["name"].is_string())
        if (users_norm || (states.is_object() && states.contains(in["name"].get<std::string>())))
          bound.insert(in["name"].get<std::string>());
  }
  return bound;
}

json draw_variant(const json& original) {
  json doc = original;
  doc.erase("expect");  // a variant must pass, whatever the file expects of itself
  // Mesh: each axis 1..8, at most 32 ranks (the largest halved until it fits).
  std::vector<int64_t> sizes;
  for (size_t a = 0; a < original["mesh"]["shape"].size(); ++a) sizes.push_back(*rc::gen::inRange<int64_t>(1, 9));
  auto product = [&] {
    int64_t p = 1;
    for (auto s : sizes) p *= s;
    return p;
  };
  while (product() > 32) *std::max_element(sizes.begin(), sizes.end()) /= 2;
  doc["mesh"]["shape"] = sizes;
  // Shapes: one new size per distinct input dimension size, unless the program spells it out.
  const std::set<int64_t> pinned = pinned_sizes(original["program"]);
  std::map<int64_t, int64_t> sized;
  if (*rc::gen::arbitrary<bool>()) {
    for (const auto& in : original["inputs"])
      for (const auto& d : in["shape"]) {
        const int64_t v = d.get<int64_t>();
        if (!sized.count(v)) sized[v] = pinned.count(v) ? v : *rc::gen::inRange<int64_t>(1, std::max<int64_t>(v, 8) + 1);
      }
    for (auto& in : doc["inputs"])
      for (auto& d : in["shape"]) d = sized.at(d.get<int64_t>());
  }
  // Placements of the inputs whose layout the program does not read. In half precision no P(sum):
  // an input's parts are random uneven splits, several times the value, whose rounding on each rank
  // is relative to the part, not to the value the tolerance is relative to (docs/semantics.md,
  // "Dtypes and mixed precision").
  const std::set<std::string> bound = layout_bound_inputs(original);
  std::function<bool(const json&)> names_half = [&](const json& j) {
    if (j.is_string()) return j == "bfloat16" || j == "float16";
    if (j.is_structured())
      for (const auto& v : j)
        if (names_half(v)) return true;
    return false;
  };
  const bool half = names_half(original["inputs"]) || names_half(original["program"]) ||
                    names_half(original.value("options", json::object()));
  for (auto& in : doc["inputs"]) {
    if (bound.count(in.value("name", "")) || !*rc::gen::arbitrary<bool>()) continue;
    const size_t rank = in["shape"].size();
    std::vector<std::string> choices = half ? std::vector<std::string>{"R", "Rd"} : std::vector<std::string>{"R", "P(sum)", "Rd"};
    for (size_t d = 0; d < rank; ++d) choices.push_back("S(" + std::to_string(d) + ")");
    json placements = json::array();
    for (size_t a = 0; a < sizes.size(); ++a) placements.push_back(*rc::gen::elementOf(choices));
    in["placements"] = placements;
  }
  // Options that must not change the verdict of a right program.
  json& options = doc["options"];
  if (!options.is_object()) options = json::object();
  options["redistribute"] = *rc::gen::element<std::string>("above_autograd", "below_autograd");
  options["reduced_propagation"] = *rc::gen::element<std::string>("intersection", "union");
  options["partial_from_replicate"] = *rc::gen::element<std::string>("divide", "rank0");
  options["seed"] = *rc::gen::inRange<uint64_t>(0, 1000);
  return doc;
}

std::string failures_of(const json& result) {
  if (result.contains("failures") && result["failures"].is_array() && !result["failures"].empty()) {
    std::string out;
    for (const auto& f : result["failures"]) out += (out.empty() ? "" : "; ") + (f.is_string() ? f.get<std::string>() : f.dump());
    return out;
  }
  if (result.contains("error") && result["error"].is_object())
    return "error " + result["error"].value("kind", "") + ": " + result["error"].value("message", "");
  return result.value("status", "?");
}

// What a run that ran out of memory says (its error's message).
std::string out_of_memory_message(const CheckedRun& run) {
  const json error = run.result.value("error", json::object());
  return error.is_object() ? error.value("message", std::string("out of memory")) : "out of memory";
}

void check_case(const std::string& path, const json& original, bool original_unchecked, const ResourceLimits& limits) {
  const bool as_written = *rc::gen::inRange(0, 5) == 0;
  const json doc = as_written ? original : draw_variant(original);
  Scenario sc;
  try {
    sc = parse_scenario(doc, path);
  } catch (const InputError&) {
    discard_case("the variant is not a valid scenario");
  }
  note_case_scenario(doc);
  RunOptions options = sc.options;
  options.mutant = planted_mutant();
  try {
    check_resources(sc, options, limits);
  } catch (const SemanticError& e) {
    discard_case(std::string("the variant is refused: ") + error_kind_name(e.kind()));
  }
  CheckedRun run;
  {
    CoverageScope covered(case_coverage());
    run = check_scenario(sc, options);
  }
  if (run.exit_code == kExitResource) out_of_memory_in_case(out_of_memory_message(run));
  note_case_implicit(run.result.value("implicit", nlohmann::json::array()));
  const std::string status = run.result.value("status", "");
  if (status == "pass" || (status == "unchecked" && original_unchecked)) return;
  if (status == "error" && !as_written)
    discard_case("the variant is refused: " + run.result["error"].value("kind", std::string("error")));
  latest_failure() = {doc, options.to_json()};
  RC_FAIL(std::string(as_written ? "the scenario as written: " : "a variant: ") + status + ": " + failures_of(run.result));
}

}  // namespace

Property scenario_property(const std::string& path, const ResourceLimits& limits) {
  const json original = read_json_file(path);
  const Scenario sc = parse_scenario(original, path);  // InputError names the file and path
  // Whether the scenario as written is unchecked (a local_map without reference): run it once,
  // within the limits meshsim run holds it to.
  RunOptions options = sc.options;
  options.mutant.clear();
  check_resources(sc, options, limits);
  const CheckedRun first = check_scenario(sc, options);
  if (first.exit_code == kExitResource)
    throw SemanticError(ErrorKind::OutOfMemory, out_of_memory_message(first));
  const bool unchecked = first.result.value("status", "") == "unchecked";
  // Property holds C strings: their storage lives as long as the process.
  static std::deque<std::string> names;
  names.push_back("scenario:" + path);
  const char* name = names.back().c_str();
  names.push_back("the scenario " + path +
                  " over random mesh sizes, input shapes, input placements and run options: values and gradients "
                  "equal the oracle's");
  const char* checks = names.back().c_str();
  return Property{name, checks,
                  [path, original, unchecked, limits] { check_case(path, original, unchecked, limits); }};
}

}  // namespace meshsim

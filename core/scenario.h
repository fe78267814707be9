// The scenario file (DESIGN.md, contract 2), read and checked. Every error names the file and the
// JSON path (InputError, exit 2). Shapes of op results are checked when the scenario runs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/files.h"  // parse_json_text, read_json_file: every scenario reader uses them

#include "core/dtype.h"
#include "core/layout.h"
#include "core/mesh.h"
#include "core/placement.h"
#include "core/redistribute.h"
#include "core/semantics.h"
#include "core/train.h"

namespace meshsim {

enum class RedistributeMode { AboveAutograd, BelowAutograd };
enum class ReducedPropagation { Intersection, Union, Strict };
// What a run does with a redistribution the planner inserts (an operand that fits no rule row):
// allow it (marked implicit in the result), or fail the run listing every one (JAX's shard_map
// refuses what it cannot type alike).
enum class ImplicitPolicy { Allow, Error };
// When a failing run looks for the op where values or gradients first go wrong (result
// "first_divergence"): on failure (a second, instrumented run), always (in the run itself: every
// intermediate gradient kept), or never.
enum class Localize { OnFailure, Always, Never };
// What a Partial placement is when it enters a tracked local_map (seed 002's open point, JAX
// 0.10's `unreduced`; docs/semantics.md, "Partial placements entering a local_map"): a variant
// value (the default, seed 002's rule), or unreduced, a state of its own whose ops are checked.
enum class PartialEntry { Variant, Unreduced };
// The element type of an input or a created value: float (the run's dtype, or one a value names:
// float64, float32, bfloat16, float16), bool (masks and conditions) or int64 (ids and targets).
// Only float values carry gradients or Partial placements.
enum class ElementType { Float, Bool, Int64 };

const char* redistribute_mode_name(RedistributeMode m);
const char* reduced_propagation_name(ReducedPropagation r);
const char* element_type_name(ElementType t);  // "float" | "bool" | "int64"
// "float" | "bool" | "int64", or a float dtype's name (Float); throws std::invalid_argument otherwise.
ElementType parse_element_type(const std::string& text);

// FSDP2's MixedPrecisionPolicy for one parameter (an input's `mixed_precision`): a redistribution
// of the input itself (FSDP's all_gather of its shards) casts the shards to `param_dtype` first,
// so that its collectives move param_dtype and the gathered value is param_dtype; its backward
// casts the incoming gradient to `reduce_dtype` before the collectives (reduce_scatter) and the
// result to the input's own dtype after.
struct MixedPrecision {
  bool present = false;
  std::optional<DType> param_dtype, reduce_dtype;  // nothing: the input's own dtype
};

// The options of a run (contract 2, "options"). Planted bugs are switched on by name.
struct RunOptions {
  RedistributeMode redistribute = RedistributeMode::AboveAutograd;
  ReducedPropagation reduced_propagation = ReducedPropagation::Intersection;
  PartialFromReplicate partial_from_replicate = PartialFromReplicate::Divide;
  uint64_t seed = 0;
  DType dtype = DType::Float64;
  std::string mutant;  // empty: none
  Semantics semantics = Semantics::Meshsim;  // whose rules: meshsim's, or PyTorch DTensor's as released
  ImplicitPolicy implicit = ImplicitPolicy::Allow;
  Localize localize = Localize::OnFailure;
  PartialEntry partial_entry = PartialEntry::Variant;

  nlohmann::json to_json() const;
};

// Applies one "key=value" (from --option or the options object); throws std::invalid_argument.
void set_option(RunOptions& options, const std::string& key, const nlohmann::json& value);
// `options` with "key=value" overrides (`--option`, RunSettings::options) applied; InputError naming
// --option and the key when one is malformed.
RunOptions with_overrides(RunOptions options, const std::vector<std::string>& overrides);

// Where the user's code made a value, for imported programs (docs/import.md): the module path and
// the file and line of the user's source, with the line's text. Empty when the scenario has none.
struct SourceRef {
  std::string module, file, code;
  int64_t line = 0;

  bool empty() const { return module.empty() && file.empty(); }
  std::string where() const;  // "llama.py:57 (layers.0.attention.wq)", "" when empty
  nlohmann::json to_json() const;
};

// What the system a program was imported from chose for one op (`recorded`), which `meshsim run`
// compares with its own choices (oracles/recorded.h).
struct RecordedMove {
  size_t arg = 0;  // the operand PyTorch redistributed before running the op
  Spec from, to;
  std::string path;  // "/program/4/recorded/collectives/0"
};
struct RecordedChoice {
  bool present = false;
  // Per result, per mesh axis: the placement the system gave it; nullopt where it did not record
  // one (an axis its value does not live on, such as a data-parallel axis meshsim adds).
  std::vector<std::vector<std::optional<Placement>>> placements;
  std::vector<RecordedMove> moves;
};
// The scenario's `imported`: where it came from, and the collectives the system's backward ran.
struct ImportedFrom {
  bool present = false;
  std::string system, version, file, function, mesh;
  struct Count {
    std::string op, axis;
    int64_t count = 0;
  };
  std::vector<Count> backward_collectives;
  bool backward_recorded = false;  // the field was there (an empty list says: none ran)

  // "PyTorch", "JAX", the system as written, or "the recorded system" when not imported.
  static std::string label_of(const std::string& system);
  std::string label() const { return present ? label_of(system) : "the recorded system"; }
};

struct InputDecl {
  std::string name;
  Shape shape;  // global shape, or each rank's local shape when from_local
  Spec placements;
  // int | ones | arange | randn | ids ({"ids": high}: uniform in [0, high)) | values ({"values":
  // [...]}: the value written out)
  std::string init = "int";
  int64_t ids_high = 0;          // init ids
  std::vector<double> values;    // init values: every element, row-major (int64 and bool ones exact)
  ElementType dtype = ElementType::Float;
  std::optional<DType> float_dtype;  // a float input's own dtype; nothing: the run's
  MixedPrecision mixed_precision;
  bool from_local = false;
  bool requires_grad = false;
  std::string path;  // JSON path, for messages: "/inputs/1"
  SourceRef source;
};

struct OpDecl {
  std::string out;                // the first (usually only) result
  std::vector<std::string> outs;  // every result: one per `returns` entry of a local_map
  std::string op;
  std::vector<std::string> args;
  nlohmann::json attrs;  // the whole op object, for op-specific fields
  std::string path;      // "/program/2"
  SourceRef source;         // where the user's code made it (imported programs)
  RecordedChoice recorded;  // what the system it was imported from chose (program ops)

  // local_map only.
  std::vector<Spec> in_placements;  // empty: the args as they are
  // PyTorch's spellings of the layout of local code's gradients: local_map's in_grad_placements
  // (one per arg) and to_local's grad_placements (one); empty: the value's own placements.
  std::vector<Spec> in_grad_placements;
  std::vector<Spec> out_placements;
  std::vector<OpDecl> body;         // LTensor ops
  std::vector<OpDecl> reference;    // the same computation on global tensors, for the oracle
  std::vector<std::string> returns;
};

// An op's result names: `outs`, or `out` alone where an op was made without them (the parser sets
// both).
inline std::vector<std::string> result_names(const OpDecl& op) {
  return op.outs.empty() ? std::vector<std::string>{op.out} : op.outs;
}

struct Scenario {
  std::string file;  // where it was read from, for messages
  std::string name;
  Mesh mesh;
  RunOptions options;
  std::vector<InputDecl> inputs;
  std::vector<OpDecl> program;
  std::string backward;  // empty: forward only
  // What `meshsim run` must find (an object; null when the file has none). Its fields are checked
  // by the command line (cli/expect.h), which names the JSON path of a malformed one.
  nlohmann::json expect;
  // requires.functions: Functions of the user's own that the scenario calls (loaded with --plugin
  // or built into a meshsim of one's own). `meshsim run DIR` skips the scenario without them.
  std::vector<std::string> required_functions;
  nlohmann::json source;  // the document as read
  ImportedFrom imported;  // `imported`: the program this scenario was imported from
  TrainSpec train;        // `train`: whole training steps (core/train.h); absent: one forward and backward

  const InputDecl* find_input(const std::string& name) const;
};

// The DTensor-level ops of contract 2 (the file format), in alphabetical order.
const std::vector<std::string>& known_ops();
// The subset of known_ops() this version's runtime implements, in alphabetical order; a scenario
// using any other known op is rejected with ErrorKind::UnsupportedOp.
const std::vector<std::string>& implemented_ops();

// zeros, ones, full, arange, rand, randn: ops without operands that make a value of a shape and placements.
bool is_creation_op(const std::string& op);

// Checks the document and builds the scenario; throws InputError naming `file` and the JSON path.
Scenario parse_scenario(const nlohmann::json& doc, const std::string& file);
// The same, keeping the document itself as the scenario's `source` (no copy: a long program's
// document is as large as the scenario).
Scenario parse_scenario(nlohmann::json&& doc, const std::string& file);
// Reads and parses a file; unreadable files and invalid JSON throw InputError too.
Scenario load_scenario(const std::string& path);

}  // namespace meshsim

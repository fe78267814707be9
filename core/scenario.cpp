#include "core/scenario.h"

#include "core/mutants.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "core/error.h"
#include "core/ops.h"
#include "core/scenario_imported.h"
#include "core/scenario_reader.h"

namespace meshsim {

using json = nlohmann::json;
using namespace scenario_detail;

namespace {

constexpr const char* kFormat = "meshsim.scenario/1";

}  // namespace

bool is_creation_op(const std::string& op) {
  const OpSchema* s = find_op(op);
  return s && (s->gen == GenClass::Creation || s->gen == GenClass::RandomCreation);
}

namespace {

// Where an op stands decides which ops it may be.
enum class Region { Program, Body, Reference };

// The catalog's row of an op a scenario may use where it stands (core/ops.h, OpSchema::scopes).
const OpSchema* find_op_rule(const std::string& name, Region region = Region::Program) {
  const OpSchema* s = find_op(name);
  if (!s) return nullptr;
  const unsigned scope = region == Region::Program ? kProgram : region == Region::Body ? kBody : kReference;
  return (s->scopes & scope) ? s : nullptr;
}

// ---- the parts of a scenario ----

class ScenarioParser {
 public:
  ScenarioParser(const json& doc, const std::string& file) : doc_(doc), r_(file) { s_.file = file; }

  Scenario parse() {
    r_.object(doc_, "");
    r_.only_keys(doc_, "", {"format", "name", "mesh", "options", "inputs", "program", "backward", "expect", "requires",
                               "imported", "train"});
    parse_format();
    s_.name = doc_.contains("name") ? r_.string(doc_["name"], "/name")
                                    : std::filesystem::path(s_.file).stem().string();
    parse_mesh(r_.field(doc_, "", "mesh"));
    if (doc_.contains("options")) parse_options(doc_["options"]);
    const json& inputs = r_.array(r_.field(doc_, "", "inputs"), "/inputs");
    for (size_t i = 0; i < inputs.size(); ++i) parse_input(inputs[i], child("/inputs", i));
    const json& program = r_.array(r_.field(doc_, "", "program"), "/program");
    s_.program.reserve(program.size());
    for (size_t i = 0; i < program.size(); ++i) parse_op(program[i], child("/program", i));
    if (doc_.contains("backward")) s_.backward = value_name(doc_["backward"], "/backward");
    if (doc_.contains("expect")) s_.expect = r_.object(doc_["expect"], "/expect");
    if (doc_.contains("requires")) parse_requires(doc_["requires"]);
    if (doc_.contains("imported")) s_.imported = parse_imported(doc_["imported"], "/imported", s_.file);
    if (doc_.contains("train")) {
      s_.train = parse_train(doc_["train"], s_.file, s_.mesh, s_.inputs, !s_.backward.empty());
      if (s_.train.data == TrainData::Fixed) refuse_random_ops(s_.program);
    }
    return std::move(s_);
  }

 private:
  // Training steps draw each microbatch's random values from its own seed, as its data; with fixed
  // data (train.data "fixed") every step would draw the same mask where PyTorch's generator moves on
  // (semantics.md, "Randomness"), so a random op there is refused, named.
  void refuse_random_ops(const std::vector<OpDecl>& ops) const {
    for (const auto& op : ops) {
      const OpSchema* s = find_op(op.op);
      if (s && (std::string_view(s->family) == "random" || s->gen == GenClass::RandomCreation))
        r_.fail(op.path, op.op + " in training steps with fixed data: every step would draw the same values, where "
                                 "PyTorch's generator draws a fresh mask each step (leave train.data per_microbatch: "
                                 "each microbatch draws from its own seed)");
      refuse_random_ops(op.body);
      refuse_random_ops(op.reference);
    }
  }

  // requires {functions: [name, ...]}: the Functions of the user's own the scenario calls.
  void parse_requires(const json& req) {
    r_.object(req, "/requires");
    r_.only_keys(req, "/requires", {"functions"});
    if (!req.contains("functions")) return;
    const json& fns = r_.array(req["functions"], "/requires/functions");
    for (size_t i = 0; i < fns.size(); ++i)
      s_.required_functions.push_back(r_.string(fns[i], child("/requires/functions", i)));
  }

  void parse_format() {
    std::string format = r_.string(r_.field(doc_, "", "format"), "/format");
    if (format != kFormat)
      r_.fail("/format",
              "unsupported format " + in_quotes(format) + " (expected " + in_quotes(kFormat) + ")");
  }

  void parse_mesh(const json& mesh) {
    r_.only_keys(r_.object(mesh, "/mesh"), "/mesh", {"axes", "shape"});
    const json& axes_json = r_.array(r_.field(mesh, "/mesh", "axes"), "/mesh/axes");
    if (axes_json.empty()) r_.fail("/mesh/axes", "a mesh needs at least one axis");
    std::vector<std::string> axes;
    for (size_t k = 0; k < axes_json.size(); ++k) {
      std::string axis = r_.name(axes_json[k], child("/mesh/axes", k));
      if (std::find(axes.begin(), axes.end(), axis) != axes.end())
        r_.fail(child("/mesh/axes", k), "duplicate mesh axis " + in_quotes(axis));
      axes.push_back(axis);
    }
    Shape shape = r_.shape(r_.field(mesh, "/mesh", "shape"), "/mesh/shape", 1);
    if (shape.size() != axes.size())
      r_.fail("/mesh/shape", "expected " + std::to_string(axes.size()) +
                                 " sizes (one per axis), got " + std::to_string(shape.size()));
    s_.mesh = Mesh(std::move(axes), std::move(shape));
  }

  void parse_options(const json& options) {
    for (const auto& item : r_.object(options, "/options").items()) {
      try {
        set_option(s_.options, item.key(), item.value());
      } catch (const std::invalid_argument& e) {
        r_.fail(child("/options", item.key()), e.what());
      }
    }
  }

  // `group` (an op's or an input's layer, docs/scenario-format.md): a name, read by render and explore.
  void check_group(const json& item, const std::string& path) {
    if (!item.contains("group")) return;
    const std::string where = child(path, "group");
    if (r_.string(item["group"], where).empty()) r_.fail(where, "group: expected a layer's name, got \"\"");
  }

  void parse_input(const json& in, const std::string& path) {
    r_.only_keys(r_.object(in, path), path,
                 {"name", "shape", "placements", "init", "from_local", "requires_grad", "dtype", "mixed_precision", "source",
                  "group"});
    check_group(in, path);
    InputDecl decl;
    decl.path = path;
    decl.name = new_value(r_.field(in, path, "name"), child(path, "name"));
    decl.shape = r_.shape(r_.field(in, path, "shape"), child(path, "shape"), 0);
    std::string placements = child(path, "placements");
    decl.placements = r_.spec(r_.field(in, path, "placements"), placements, s_.mesh);
    r_.check_shape(s_.mesh, decl.placements, decl.shape.size(), placements);
    // Negative shard dims are wrapped by the input's rank (check_shape checked the range).
    decl.placements = normalize_spec(decl.placements, static_cast<int64_t>(decl.shape.size()));
    if (in.contains("dtype")) {
      try {
        const std::string text = r_.string(in["dtype"], child(path, "dtype"));
        decl.dtype = parse_element_type(text);
        decl.float_dtype = find_dtype(text);
      } catch (const std::invalid_argument& e) {
        r_.fail(child(path, "dtype"), e.what());
      }
    }
    if (in.contains("init")) parse_init(in["init"], child(path, "init"), decl);
    if (decl.dtype != ElementType::Float) {
      for (size_t k = 0; k < decl.placements.size(); ++k)
        if (decl.placements[k].is_partial())
          r_.fail(child(placements, k), std::string("a ") + element_type_name(decl.dtype) +
                                            " input is S, R or Rd on each axis, not " + decl.placements[k].str());
      if (decl.init == "randn")
        r_.fail(child(path, "init"), std::string("init randn makes float values, not ") + element_type_name(decl.dtype));
    }
    if (decl.init == "ids" && decl.dtype != ElementType::Int64)
      r_.fail(child(path, "init"), "init {\"ids\": high} makes int64 values: add \"dtype\": \"int64\"");
    if (in.contains("from_local"))
      decl.from_local = r_.boolean(in["from_local"], child(path, "from_local"));
    // A strided shard must divide the global value evenly (from_local: every rank's equal local
    // times the sizes of the axes that shard its dim).
    Shape global = decl.shape;
    if (decl.from_local)
      for (int a = 0; a < s_.mesh.ndim(); ++a)
        if (decl.placements[static_cast<size_t>(a)].is_shard())
          global[static_cast<size_t>(decl.placements[static_cast<size_t>(a)].dim)] *= s_.mesh.axis_size(a);
    if (std::string why = check_strided(s_.mesh, decl.placements, global); !why.empty())
      r_.fail(placements, why, ErrorKind::ShapeMismatch);
    if (in.contains("requires_grad"))
      decl.requires_grad = r_.boolean(in["requires_grad"], child(path, "requires_grad"));
    if (decl.requires_grad && decl.dtype != ElementType::Float)
      r_.fail(child(path, "requires_grad"), std::string("a ") + element_type_name(decl.dtype) + " input has no gradient");
    if (in.contains("mixed_precision")) parse_mixed_precision(in["mixed_precision"], child(path, "mixed_precision"), decl);
    if (in.contains("source")) decl.source = parse_source(in["source"], child(path, "source"), s_.file);
    s_.inputs.push_back(std::move(decl));
  }

  // {"param_dtype"?, "reduce_dtype"?}: float dtypes, on a float input.
  void parse_mixed_precision(const json& v, const std::string& path, InputDecl& decl) const {
    r_.only_keys(r_.object(v, path), path, {"param_dtype", "reduce_dtype"});
    if (decl.dtype != ElementType::Float)
      r_.fail(path, std::string("mixed precision casts float parameters, not a ") + element_type_name(decl.dtype) + " input");
    decl.mixed_precision.present = true;
    for (const char* key : {"param_dtype", "reduce_dtype"}) {
      if (!v.contains(key)) continue;
      const std::string where = child(path, key);
      const std::string text = r_.string(v[key], where);
      const auto d = find_dtype(text);
      if (!d) r_.fail(where, "unknown dtype " + in_quotes(text) + " (expected " + dtype_choices() + ")");
      (std::string(key) == "param_dtype" ? decl.mixed_precision.param_dtype : decl.mixed_precision.reduce_dtype) = d;
    }
  }

  // A name, {"ids": high} (int64 ids uniform in [0, high)) or {"values": [...]} (the value itself:
  // nested arrays of the input's shape, or one flat array of its elements in row-major order).
  void parse_init(const json& v, const std::string& path, InputDecl& decl) const {
    if (v.is_object()) {
      if (v.contains("values")) {
        r_.only_keys(v, path, {"values"});
        parse_values(v["values"], child(path, "values"), decl);
        return;
      }
      r_.only_keys(v, path, {"ids", "values"});
      decl.init = "ids";
      decl.ids_high = r_.integer(r_.field(v, path, "ids"), child(path, "ids"), 1);
      return;
    }
    std::string init = r_.string(v, path);
    for (const char* known : {"int", "ones", "arange", "randn"})
      if (init == known) {
        decl.init = init;
        return;
      }
    r_.fail(path, "unknown init " + in_quotes(init) +
                      " (expected int, ones, arange, randn, {\"ids\": high} or {\"values\": [...]})");
  }

  // A tensor literal: nested arrays whose lengths are the shape's extents (a 0-d input: one
  // number), or a flat array of every element; numbers for a float input, integers for int64,
  // true/false (or 0/1) for bool. Each problem is named at its JSON path.
  void parse_values(const json& v, const std::string& path, InputDecl& decl) const {
    decl.init = "values";
    int64_t count = 1;
    for (auto d : decl.shape) count *= d;
    const char* type = element_type_name(decl.dtype);
    auto element = [&](const json& e, const std::string& where) {
      if (decl.dtype == ElementType::Bool && e.is_boolean()) return decl.values.push_back(e.get<bool>() ? 1.0 : 0.0);
      if (!e.is_number())
        r_.fail(where, std::string("expected ") + (decl.dtype == ElementType::Bool ? "true or false" : "a number") +
                           " (an element of an input of dtype " + type + "), got " + brief(e));
      const double x = e.get<double>();
      if (decl.dtype != ElementType::Float && (x != std::trunc(x) || !std::isfinite(x)))
        r_.fail(where, std::string("an element of an input of dtype ") + type + " is a whole number, got " + e.dump());
      if (decl.dtype == ElementType::Bool && x != 0 && x != 1)
        r_.fail(where, "an element of an input of dtype bool is true, false, 0 or 1, got " + e.dump());
      if (decl.dtype == ElementType::Int64 && std::abs(x) > 9007199254740992.0)
        r_.fail(where, "an int64 element beyond 2^53 is not held exactly, got " + e.dump());
      decl.values.push_back(x);
    };
    if (decl.shape.empty() && !v.is_array()) return element(v, path);
    r_.array(v, path);
    const bool flat = !decl.shape.empty() && (decl.shape.size() == 1 || (!v.empty() && !v[0].is_array()));
    if (flat) {
      if (static_cast<int64_t>(v.size()) != count)
        r_.fail(path, "a flat list of values holds every element of " + shape_str(decl.shape) + ": expected " +
                          std::to_string(count) + ", got " + std::to_string(v.size()), ErrorKind::ShapeMismatch);
      for (size_t k = 0; k < v.size(); ++k) element(v[k], child(path, k));
      return;
    }
    // Nested: the array at depth d holds shape[d] items.
    std::function<void(const json&, const std::string&, size_t)> walk = [&](const json& a, const std::string& where,
                                                                         size_t d) {
      if (d == decl.shape.size()) return element(a, where);
      if (!a.is_array())
        r_.fail(where, "expected an array of " + std::to_string(decl.shape[d]) + " (dim " + std::to_string(d) + " of " +
                           shape_str(decl.shape) + "), got " + brief(a), ErrorKind::ShapeMismatch);
      if (static_cast<int64_t>(a.size()) != decl.shape[d])
        r_.fail(where, "expected " + std::to_string(decl.shape[d]) + " items (dim " + std::to_string(d) + " of " +
                           shape_str(decl.shape) + "), got " + std::to_string(a.size()), ErrorKind::ShapeMismatch);
      for (size_t k = 0; k < a.size(); ++k) walk(a[k], child(where, k), d + 1);
    };
    walk(v, path, 0);
  }

  // arange's 1-D form {start?, end, step?}: its shape [ceil((end - start) / step)] written in, so
  // that every reader after this one finds a shape as the other creation ops give it (a shape given
  // beside end must be that one); int64 takes whole start, end and step.
  json arange_filled(const json& op, const std::string& path) const {
    if (!op.is_object() || op.value("op", json()) != "arange") return op;
    for (const char* key : {"start", "end", "step"})
      if (op.contains(key)) r_.number(op[key], child(path, key));
    const double start = op.value("start", 0.0), step = op.value("step", 1.0);
    if (op.value("dtype", json()) == "int64")
      for (const char* key : {"start", "end", "step"})
        if (op.contains(key) && op[key].get<double>() != std::trunc(op[key].get<double>()))
          r_.fail(child(path, key), std::string("arange of int64 takes a whole ") + key + ", got " + op[key].dump());
    if (step == 0) r_.fail(child(path, "step"), "arange: step must not be 0");
    if (!op.contains("end")) {
      if (!op.contains("shape"))
        r_.fail(child(path, "shape"), "arange takes a shape, or end (torch.arange's 1-D form, with start and step)");
      return op;
    }
    const double end = op["end"].get<double>();
    if ((end - start) * step < 0)
      r_.fail(child(path, "step"), "arange: from start " + json(start).dump() + " to end " + json(end).dump() +
                                       " a step of the other sign is needed, got " + json(step).dump());
    const double count = std::ceil((end - start) / step);
    if (!(count <= 0x1p40))  // NaN too; a larger count is no tensor this machine holds
      r_.fail(child(path, "end"), "arange: from start " + json(start).dump() + " to end " + json(end).dump() + " by step " +
                                      json(step).dump() + " is more than 2^40 elements");
    const auto n = static_cast<int64_t>(count);
    const json shape = json::array({n});
    if (op.contains("shape") && op["shape"] != shape)
      r_.fail(child(path, "shape"), "arange: shape " + op["shape"].dump() + " disagrees with start, end and step, which give " +
                                        shape.dump());
    json filled = op;
    filled["shape"] = shape;
    return filled;
  }

  void parse_op(const json& given, const std::string& path, Region region = Region::Program,
                std::vector<OpDecl>* into = nullptr) {
    const json op = arange_filled(given, path);
    r_.object(op, path);
    OpDecl decl;
    decl.path = path;
    decl.op = r_.string(r_.field(op, path, "op"), child(path, "op"));
    const OpSchema& rule = op_rule(decl.op, child(path, "op"), region);
    // split and chunk give several results: `outs` names them (one per piece) instead of `out`.
    const bool multi = rule.gen == GenClass::Split;
    std::vector<std::string> allowed = {multi ? "outs" : "out", "op", "args"};
    for (const auto& a : rule.attrs) allowed.push_back(a.key);
    allowed.push_back("source");  // imported programs: where the user's code made it
    if (region == Region::Program) allowed.push_back("group");  // the explorer's and render's layer
    if (region == Region::Program) allowed.push_back("recorded");
    // Seed 003's per-op opt-out: the planner's moves of this op's operands above or below autograd.
    if (region == Region::Program && decl.op != "redistribute" && decl.op != "local_map" && decl.op != "to_local" &&
        decl.op != "from_local" && !is_creation_op(decl.op))
      allowed.push_back("redistribute_mode");
    // A call passes its other fields to the Function as its attributes.
    if (decl.op != "call") r_.only_keys(op, path, allowed);
    static const json kNoArgs = json::array();
    const json& args = is_creation_op(decl.op) && !op.contains("args")
                           ? kNoArgs
                           : r_.array(r_.field(op, path, "args"), child(path, "args"));
    for (size_t k = 0; k < args.size(); ++k)
      decl.args.push_back(value_name(args[k], child(child(path, "args"), k)));
    int min_args = rule.min_args(), max_args = rule.max_args();
    // A binary op with a scalar `value` takes one tensor operand.
    if (rule.scalar_second() && op.contains("value")) min_args = max_args = 1;
    if (max_args >= 0 && (args.size() < static_cast<size_t>(min_args) || args.size() > static_cast<size_t>(max_args)))
      r_.fail(child(path, "args"), decl.op + " takes " +
                                       (min_args == max_args ? std::to_string(min_args)
                                                             : std::to_string(min_args) + " or " + std::to_string(max_args)) +
                                       " argument" + (max_args == 1 ? "" : "s") +
                                       (min_args == 1 && rule.scalar_second() ? " (with a scalar \"value\")" : "") + ", got " +
                                       std::to_string(args.size()));
    if (min_args > 0 && max_args < 0 && args.empty())  // cat and stack take one or more
      r_.fail(child(path, "args"), decl.op + " takes one or more arguments, got none");
    // A creation op in a local_map body makes a local tensor, alike on every rank (invariant), of its
    // shape; in a reference, a global tensor of its shape: neither has placements. In a program, one
    // without placements is local code's (after to_local: the interpreter refuses it before).
    const bool placed = !is_creation_op(decl.op) || (region == Region::Program && op.contains("placements")) ||
                        (region == Region::Program && find_op(decl.op)->gen == GenClass::RandomCreation);
    if (!placed && op.contains("placements"))
      r_.fail(child(path, "placements"),
              decl.op + (region == Region::Body ? " in a local_map body makes a local tensor of its shape, the same on "
                                                  "every rank (invariant over every mesh axis): it takes no placements"
                                                : " in a local_map reference makes a global tensor of its shape: it "
                                                  "takes no placements"));
    for (const auto& attr : rule.attrs)
      if (placed || std::string_view(attr.key) != "placements") check_attr(op, path, attr, decl);
    check_choices(op, path, decl.op);
    decl.attrs = op;
    if (decl.op == "local_map") {
      parse_local_map(op, path, decl);
    } else if (multi) {
      if (decl.op == "split" && op.contains("sizes") == op.contains("size"))
        r_.fail(child(path, "sizes"), "split takes either sizes (a list) or size (an integer)");
      const std::string op_path = child(path, "outs");
      const json& outs = r_.array(r_.field(op, path, "outs"), op_path);
      if (outs.empty()) r_.fail(op_path, decl.op + " needs one name per piece in outs");
      for (size_t k = 0; k < outs.size(); ++k) decl.outs.push_back(new_value(outs[k], child(op_path, k)));
      decl.out = decl.outs.front();
    } else if (decl.op == "call" && op.contains("out") && op["out"].is_array()) {
      // A Function with several outputs (seed 001's "single or tuple result"): one name per output.
      const std::string op_path = child(path, "out");
      const json& outs = op["out"];
      if (outs.empty()) r_.fail(op_path, "call needs one name per output of the Function in out");
      for (size_t k = 0; k < outs.size(); ++k) decl.outs.push_back(new_value(outs[k], child(op_path, k)));
      decl.out = decl.outs.front();
    } else {
      decl.out = new_value(r_.field(op, path, "out"), child(path, "out"));
      decl.outs = {decl.out};
    }
    if (decl.op == "to_local" && op.contains("grad_placements"))
      decl.in_grad_placements.push_back(r_.spec(op["grad_placements"], child(path, "grad_placements"), s_.mesh));
    if (op.contains("source")) decl.source = parse_source(op["source"], child(path, "source"), s_.file);
    check_group(op, path);
    if (op.contains("redistribute_mode")) {
      const std::string mode = r_.string(op["redistribute_mode"], child(path, "redistribute_mode"));
      if (mode != "above_autograd" && mode != "below_autograd")
        r_.fail(child(path, "redistribute_mode"), "expected \"above_autograd\" or \"below_autograd\", got " + in_quotes(mode));
    }
    if (op.contains("recorded") && decl.op != "call")
      decl.recorded = parse_recorded(op["recorded"], child(path, "recorded"), s_.file, s_.mesh, decl.args.size(),
                                     decl.outs.size(), decl.op);
    (into ? *into : s_.program).push_back(std::move(decl));
  }

  // local_map {args, in_placements?, out_placements, body, returns, reference?}: the body sees
  // only the args and its own values; `out` is one name per return (a string for one).
  void parse_local_map(const json& op, const std::string& path, OpDecl& decl) {
    if (decl.args.empty()) r_.fail(child(path, "args"), "local_map takes at least one argument");
    if (op.contains("in_placements")) {
      const std::string ip = child(path, "in_placements");
      if (r_.array(op["in_placements"], ip).size() != decl.args.size())
        r_.fail(ip, "expected one spec per argument (" + std::to_string(decl.args.size()) + ")");
      for (size_t k = 0; k < decl.args.size(); ++k) decl.in_placements.push_back(r_.spec(op["in_placements"][k], child(ip, k), s_.mesh));
    }
    if (op.contains("in_grad_placements")) {
      const std::string ip = child(path, "in_grad_placements");
      if (r_.array(op["in_grad_placements"], ip).size() != decl.args.size())
        r_.fail(ip, "expected one spec per argument (" + std::to_string(decl.args.size()) + ")");
      for (size_t k = 0; k < decl.args.size(); ++k)
        decl.in_grad_placements.push_back(r_.spec(op["in_grad_placements"][k], child(ip, k), s_.mesh));
    }
    const std::string op_path = child(path, "out_placements");
    const json& outs = r_.array(op["out_placements"], op_path);
    if (outs.empty()) r_.fail(op_path, "a local_map returns at least one value");
    for (size_t k = 0; k < outs.size(); ++k) decl.out_placements.push_back(r_.spec(outs[k], child(op_path, k), s_.mesh));

    auto outer = visible_;
    const auto defined_before_body = defined_;
    visible_ = std::set<std::string>(decl.args.begin(), decl.args.end());
    const std::string bp = child(path, "body");
    const json& body = r_.array(op["body"], bp);
    for (size_t i = 0; i < body.size(); ++i) parse_op(body[i], child(bp, i), Region::Body, &decl.body);
    decl.returns = returns(op, path, decl.out_placements.size());
    if (op.contains("reference")) {
      // The reference is a scope of its own: it may reuse the body's names, not the program's.
      auto defined = defined_;
      defined_ = defined_before_body;
      visible_ = std::set<std::string>(decl.args.begin(), decl.args.end());
      const std::string rp = child(path, "reference");
      const json& ref = r_.array(op["reference"], rp);
      in_reference_ = true;
      for (size_t i = 0; i < ref.size(); ++i) parse_op(ref[i], child(rp, i), Region::Reference, &decl.reference);
      returns(op, path, decl.out_placements.size());
      in_reference_ = false;
      defined_ = std::move(defined);
    }
    visible_ = std::move(outer);

    const std::string out_path = child(path, "out");
    const json& out = r_.field(op, path, "out");
    if (out.is_string() && decl.returns.size() == 1) {
      decl.outs = {new_value(out, out_path)};
    } else {
      if (r_.array(out, out_path).size() != decl.returns.size())
        r_.fail(out_path, "expected one name per returned value (" + std::to_string(decl.returns.size()) + ")");
      for (size_t k = 0; k < out.size(); ++k) decl.outs.push_back(new_value(out[k], child(out_path, k)));
    }
    decl.out = decl.outs.front();
  }

  std::vector<std::string> returns(const json& op, const std::string& path, size_t count) const {
    const std::string rp = child(path, "returns");
    const json& rets = r_.array(op["returns"], rp);
    if (rets.size() != count)
      r_.fail(rp, "expected one returned value per out placement (" + std::to_string(count) + ")");
    std::vector<std::string> out;
    for (size_t k = 0; k < rets.size(); ++k) out.push_back(value_name(rets[k], child(rp, k)));
    return out;
  }

  const OpSchema& op_rule(const std::string& name, const std::string& path, Region region) const {
    const OpSchema* rule = find_op_rule(name, region);
    if (!rule && find_op_rule(name, Region::Body))
      r_.fail(path, "op " + in_quotes(name) + " runs only inside a local_map body", ErrorKind::UnsupportedOp);
    if (!rule && region == Region::Body && find_op_rule(name))
      r_.fail(path, "op " + in_quotes(name) + " cannot run inside a local_map body", ErrorKind::UnsupportedOp);
    if (!rule)
      r_.fail(path, "unknown op " + in_quotes(name) + " (known: " + join(known_ops()) + ")",
              ErrorKind::UnsupportedOp);
    return *rule;
  }

  void check_attr(const json& op, const std::string& op_path, const AttrSchema& attr,
                  const OpDecl& decl) const {
    std::string path = child(op_path, attr.key);
    if (!op.contains(attr.key)) {
      if (attr.required) r_.fail(path, "missing required field " + in_quotes(attr.key));
      return;
    }
    const json& v = op[attr.key];
    switch (attr.type) {
      case AttrType::Int: r_.integer(v, path); break;
      case AttrType::IntOrInts:
        if (!v.is_array()) {
          r_.integer(v, path);
          break;
        }
        [[fallthrough]];
      case AttrType::Ints: {
        const json& items = r_.array(v, path);
        for (size_t k = 0; k < items.size(); ++k) r_.integer(items[k], child(path, k));
        break;
      }
      case AttrType::Number: r_.number(v, path); break;
      case AttrType::NumberOrInf:
        if (!(v.is_string() && (v == "inf" || v == "-inf"))) {
          if (!v.is_number()) r_.fail(path, "expected a number, \"inf\" or \"-inf\", got " + brief(v));
        }
        break;
      case AttrType::Bool: r_.boolean(v, path); break;
      case AttrType::Any: break;
      case AttrType::String: {
        const std::string text = r_.string(v, path);
        if (attr.choices.empty() || std::find(attr.choices.begin(), attr.choices.end(), text) != attr.choices.end()) break;
        std::string list;
        for (const char* c : attr.choices) list += (list.empty() ? "" : ", ") + std::string(c);
        r_.fail(path, "expected one of " + list + ", got " + in_quotes(text));
      }
      case AttrType::Axis: {
        std::string axis = r_.string(v, path);
        if (s_.mesh.axis_index(axis) < 0)
          r_.fail(path, "unknown mesh axis " + in_quotes(axis) + " (axes: " + join(s_.mesh.axes()) + ")");
        break;
      }
      case AttrType::Spec: {
        Spec spec = r_.spec(v, path, s_.mesh);
        // Only inputs have a rank known before the run; op results are checked when it runs.
        if (const InputDecl* in = decl.args.empty() ? nullptr : s_.find_input(decl.args[0]))
          r_.check_shape(s_.mesh, spec, in->shape.size(), path);
        if (is_creation_op(decl.op) && op.contains("shape") && op["shape"].is_array()) {
          r_.check_shape(s_.mesh, spec, op["shape"].size(), path);
          for (size_t k = 0; k < spec.size(); ++k)
            if (spec[k].is_partial())
              r_.fail(child(path, k), decl.op + " makes S, R or Rd values, not " + spec[k].str());
        }
        break;
      }
    }
  }

  // Attributes that go together, and the shapes of creation ops (a String attribute's spellings are
  // the catalog's, checked by check_attr).
  void check_choices(const json& op, const std::string& path, const std::string& name) const {
    if (name == "cross_entropy" || name == "nll_loss") {
      if (op.contains("axis") != op.contains("classes"))
        r_.fail(child(path, op.contains("axis") ? "classes" : "axis"),
                name + ": a class-parallel pick in a local_map body names both axis and classes");
      if (op.contains("axis") && op.contains("args") && op["args"].is_array() && op["args"].size() > 2)
        r_.fail(child(path, "args"), name + ": a class-parallel pick in a local_map body takes no class weight "
                                            "(weight the rank's classes in the body's own code)");
      if (op.contains("label_smoothing") && op["label_smoothing"].is_number() &&
          !(op["label_smoothing"].get<double>() >= 0.0 && op["label_smoothing"].get<double>() <= 1.0))
        r_.fail(child(path, "label_smoothing"),
                name + ": label_smoothing is in [0, 1], got " + op["label_smoothing"].dump());
    }
    if (name == "embedding" && op.contains("axis") != op.contains("vocab"))
      r_.fail(child(path, op.contains("axis") ? "vocab" : "axis"),
              "embedding: a vocab-parallel lookup in a local_map body names both axis and vocab");
    if (is_creation_op(name)) {
      r_.shape(op["shape"], child(path, "shape"), 0);
    }
    if (name == "clamp" && !op.contains("min") && !op.contains("max"))
      r_.fail(child(path, "min"), "clamp takes min, max or both (torch.clamp refuses neither)");
    if (name == "one_hot" && op.contains("num_classes") && op["num_classes"].is_number_integer() &&
        op["num_classes"].get<int64_t>() < 1)
      r_.fail(child(path, "num_classes"),
              op["num_classes"] == -1
                  ? "one_hot: num_classes -1 (torch: the data's max + 1) is refused: on a shard, or in local code, "
                    "each rank would count its own values' max and the ranks' results would differ in shape; give "
                    "num_classes"
                  : "one_hot: num_classes must be at least 1, got " + op["num_classes"].dump());
    if (name == "bincount" && !(op.contains("minlength") && op["minlength"].is_number_integer() &&
                                op["minlength"].get<int64_t>() >= 1))
      r_.fail(child(path, "minlength"),
              "bincount: minlength " + op.value("minlength", json(0)).dump() +
                  " leaves the result's length to the data (torch: max(minlength, max + 1)): on a shard each rank "
                  "would count up to its own max and the ranks' counts would differ in length; give a minlength "
                  "above every value");
    if (name == "dropout" && op.contains("p") && op["p"].is_number() &&
        !(op["p"].get<double>() >= 0.0 && op["p"].get<double>() <= 1.0))
      r_.fail(child(path, "p"), "dropout: p is a probability in [0, 1], got " + op["p"].dump());
    if ((name == "layer_norm" || name == "rms_norm") && op.contains("normalized_shape"))
      r_.shape(op["normalized_shape"], child(path, "normalized_shape"), 1);
  }

  // A name that refers to a value visible here (an input or an earlier op's out; inside a
  // local_map body or reference, its args and the body's or reference's own values).
  std::string value_name(const json& v, const std::string& path) const {
    std::string name = r_.string(v, path);
    if (!visible_.count(name) && in_reference_) {
      // A local_map's reference: a scope of its own, on global tensors.
      if (path.find("/returns/") != std::string::npos)
        r_.fail(path, "the local_map returns " + in_quotes(name) +
                          ", which its reference does not define (the reference computes every returned value, under "
                          "the same name, from the args on global tensors)");
      r_.fail(path, "the local_map's reference reads " + in_quotes(name) +
                        ", which neither the local_map's args nor an earlier op of its reference define");
    }
    if (!visible_.count(name)) {
      if (defined_.count(name)) r_.fail(path, "value " + in_quotes(name) + " is not visible here (a local_map body sees only its args and its own values)");
      r_.fail(path, "unknown value " + in_quotes(name));
    }
    return name;
  }

  // A name that defines a new value; names are unique across the scenario, local_map bodies
  // included (a reference's names are its own). A '.' is reserved: the values meshsim makes
  // itself are named after a user's value with a dotted suffix (y.arg0, y.in0.dp, ...), so no user
  // name can be one of them.
  std::string new_value(const json& v, const std::string& path) {
    std::string name = r_.name(v, path);
    if (name.find('.') != std::string::npos)
      r_.fail(path, "value name " + in_quotes(name) +
                        " contains '.', which is reserved for the values meshsim makes itself (y.arg0, y.in0.dp, ...)");
    auto [it, inserted] = defined_.emplace(name, path);
    if (!inserted)
      r_.fail(path, "value " + in_quotes(name) + " is already defined at " + it->second);
    visible_.insert(name);
    return name;
  }

  const json& doc_;
  Reader r_;
  Scenario s_;
  std::map<std::string, std::string> defined_;  // value name -> JSON path of its definition
  std::set<std::string> visible_;                // the names an op here may use
  bool in_reference_ = false;                    // parsing a local_map's reference (its own scope)
};

}  // namespace

const InputDecl* Scenario::find_input(const std::string& input_name) const {
  for (const auto& in : inputs)
    if (in.name == input_name) return &in;
  return nullptr;
}

// The DTensor-level ops: the catalog's, less local code's collectives and calls, and the ops only
// the runtime writes.
const std::vector<std::string>& known_ops() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& s : op_catalog())
      if ((s.scopes & kProgram) && !s.local_code) out.push_back(s.name);
    return out;
  }();
  return names;
}

// Every op of the catalog runs in this version.
const std::vector<std::string>& implemented_ops() { return known_ops(); }

Scenario parse_scenario(const json& doc, const std::string& file) {
  Scenario s = ScenarioParser(doc, file).parse();
  s.source = doc;
  return s;
}

Scenario parse_scenario(json&& doc, const std::string& file) {
  Scenario s = ScenarioParser(doc, file).parse();
  s.source = std::move(doc);
  return s;
}

Scenario load_scenario(const std::string& path) {
  return parse_scenario(read_json_file(path), path);
}

}  // namespace meshsim

#include "properties/program_parts.h"

#include <cmath>

#include <rapidcheck.h>

#include "core/scenario.h"
#include "oracles/check.h"
#include "properties/generators.h"
#include "sim/data.h"

namespace meshsim::gen::parts {

json op(const std::string& out, const std::string& name, std::vector<std::string> args, json extra) {
  json d = {{"out", out}, {"op", name}, {"args", args}};
  if (extra.is_object()) d.update(extra);  // `{}` makes a null
  return d;
}

json input(const std::string& name, const Shape& shape, const Spec& spec, bool grad, bool randn) {
  json d = {{"name", name}, {"shape", shape}, {"placements", spec_json(spec)}};
  if (grad) d["requires_grad"] = true;
  if (randn) d["init"] = "randn";
  return d;
}

json typed_input(const std::string& name, const Shape& shape, const Spec& spec, const std::string& dtype, int64_t high) {
  json d = {{"name", name}, {"shape", shape}, {"placements", spec_json(without_partial(spec))}, {"dtype", dtype}};
  if (high > 0) d["init"] = {{"ids", high}};
  return d;
}

Spec without_partial(Spec spec) {
  for (auto& p : spec)
    if (p.is_partial()) p = Placement::replicate();
  return spec;
}

std::vector<int64_t> drawn_ids(uint64_t seed, size_t index, const Shape& shape, int64_t high) {
  InputDecl in;
  in.shape = shape;
  in.init = "ids";
  in.ids_high = high;
  in.dtype = ElementType::Int64;
  Rng rng(seed, index);
  const at::Tensor t = make_input(in, DType::Float64, rng).contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

std::optional<int64_t> ignore_index_for(const std::vector<int64_t>& targets, int64_t pick) {
  std::set<int64_t> values(targets.begin(), targets.end());
  if (values.size() < 2) return std::nullopt;
  auto it = values.begin();
  std::advance(it, static_cast<std::ptrdiff_t>(pick % static_cast<int64_t>(values.size())));
  return *it;
}

Mesh small_mesh() {
  const int ndim = *rc::gen::weightedElement<int>({{8, 1}, {8, 2}, {1, 3}});
  std::vector<std::string> axes;
  std::vector<int64_t> sizes;
  for (int a = 0; a < ndim; ++a) {
    axes.push_back(std::string(1, static_cast<char>('a' + a)));
    sizes.push_back(*rc::gen::inRange<int64_t>(1, ndim == 3 ? 3 : 5));
  }
  return Mesh(axes, sizes);
}

json draw_options(json base) {
  base["redistribute"] = *rc::gen::element<std::string>("above_autograd", "below_autograd");
  base["reduced_propagation"] = *rc::gen::element<std::string>("intersection", "union");
  base["partial_from_replicate"] = *rc::gen::element<std::string>("divide", "rank0");
  base["seed"] = *rc::gen::inRange<int>(0, 1000);
  return base;
}

json live_ops(const json& ops, std::set<std::string> live) {
  std::vector<json> kept;
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    // split and chunk name their results in `outs`, a call of several outputs in an `out` list; a
    // live one keeps the op.
    bool used = false;
    const json& names = it->contains("outs") ? (*it)["outs"] : (*it)["out"];
    for (const auto& o : names.is_array() ? names : json::array({names})) used |= live.count(o.get<std::string>()) > 0;
    if (!used) continue;
    for (const auto& a : (*it)["args"]) live.insert(a.get<std::string>());
    kept.push_back(*it);
  }
  return json(std::vector<json>(kept.rbegin(), kept.rend()));
}


bool mesh_rounds(const Mesh& mesh) {
  for (auto n : mesh.shape())
    if ((n & (n - 1)) != 0) return true;
  return false;
}

double operand_limit(const std::string& name) {
  const OpSchema* s = find_op(name);
  return s && s->values.operand_limit > 0 ? s->values.operand_limit : kMaxBound;
}

bool has_kink(const std::string& name) {
  const OpSchema* s = find_op(name);
  return s && s->values.kink;
}

bool needs_positive(const std::string& name) {
  const OpSchema* s = find_op(name);
  return s && s->values.needs_positive;
}

ValueRange result_range(const std::string& name, const json& attrs, ValueRange x) {
  const OpSchema* s = find_op(name);
  if (!s || !s->values.range) return {INFINITY, 0};
  return s->values.range(x, attrs);
}

std::string op_of(GenClass c) { return *rc::gen::elementOf(ops_of_class(c)); }

json drawn_attrs(const std::string& name) {
  const OpSchema& s = op_schema(name);
  json attrs = json::object();
  for (const auto& [key, values] : s.values.draws) {
    const AttrSchema* a = s.attr(key);
    if (a && !a->required && !*rc::gen::arbitrary<bool>()) continue;
    attrs[key] = *rc::gen::elementOf(json::parse(values).get<std::vector<json>>());
  }
  if (name == "clamp" && attrs.empty()) attrs["min"] = -1;  // clamp takes at least one bound
  return attrs;
}

int optional_operands(const std::string& name) {
  int n = 0;
  for (const auto& o : op_schema(name).operands) n += o.optional ? 1 : 0;
  return n;
}

bool within_bounds(const std::string& name, const json& extra, const std::vector<Operand>& xs, double bound,
                   bool& rounded) {
  OpDecl decl;
  decl.op = name;
  decl.attrs = extra;
  rounded = !exact_op(decl);  // the oracle's own list of ops exact on integers
  for (const auto& x : xs) {
    rounded |= x.rounded;
    if (x.bound > operand_limit(name)) return false;
    // relu has a kink at 0: a rounded value the oracle has at exactly 0 may be 1e-17 on the mesh.
    if (has_kink(name) && x.rounded) return false;
  }
  return std::isfinite(bound) && bound <= (rounded ? kMaxRoundedBound : kMaxBound);
}

}  // namespace meshsim::gen::parts

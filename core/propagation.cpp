#include "core/propagation.h"

#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/coverage.h"
#include "core/error.h"
#include "core/rules/common.h"

// The rules themselves, by op family, are in core/rules/ (rules/common.h lists the files).

namespace meshsim {

using namespace rules;

// ---------------------------------------------------------------------------------------------
// Row text form

std::string RuleRow::str() const {
  std::string out;
  for (size_t i = 0; i < ins.size(); ++i) out += (i ? ", " : "") + ins[i].str();
  return out + " -> " + this->out.str();
}

RuleRow RuleRow::parse(const std::string& text) {
  auto arrow = text.find("->");
  if (arrow == std::string::npos) throw std::invalid_argument("rule row without ->: " + text);
  RuleRow row;
  std::stringstream lhs(text.substr(0, arrow));
  std::string item;
  while (std::getline(lhs, item, ',')) row.ins.push_back(parse_placement(item));
  row.out = parse_placement(text.substr(arrow + 2));
  row.rule = intern_rule(row.str());
  return row;
}

// ---------------------------------------------------------------------------------------------
// The registry, by op (the families are in rules/registry.cpp)

const std::vector<RuleFamily>& rule_families() {
  static const std::vector<RuleFamily> names = [] {
    std::vector<RuleFamily> out;
    for (const auto& f : registry()) {
      out.push_back(f.names);
      out.back().arity = f.arity;
    }
    return out;
  }();
  return names;
}

std::vector<RuleRow> rule_rows_for(const std::string& op, const std::vector<Shape>& shapes, const OpAttrs& attrs) {
  const Family& family = family_of(op);
  const Shape out = infer_shape(op, shapes, attrs);
  const OpAttrs a = resolved(op, attrs, static_cast<int64_t>(shapes.at(0).size()), shape_str(shapes.at(0)));
  return family.rows({shapes, out, a, op});
}

std::vector<RuleRow> rule_rows(const std::string& op, const std::vector<int64_t>& ranks, const OpAttrs& attrs) {
  // Operands of the given ranks, every extent 2 (no broadcasting); view ops keep their shape.
  const size_t arity = family_of(op).arity;
  std::vector<Shape> shapes;
  for (int64_t r : ranks)
    if (arity == 0 || shapes.size() < arity) shapes.push_back(Shape(static_cast<size_t>(r), 2));
  while (shapes.size() < arity) shapes.push_back(shapes.back());
  return rule_rows_for(op, shapes, attrs);
}

// ---------------------------------------------------------------------------------------------
// Forward propagation

namespace {

// The row of one mesh axis for operands `given`, by the order stated in propagation.h.
const RuleRow* choose_row(const std::vector<RuleRow>& rows, const std::vector<Placement>& given, int64_t n,
                          const std::vector<int64_t>& bytes, bool replicate_first = false) {
  for (const auto& row : rows)
    if (row_cost(given, row.ins, n, bytes, false) == std::pair<int64_t, int64_t>{0, 0}) return &row;
  if (given.size() == 1)
    for (const auto& row : rows)
      if (row.ins[0] == Placement::replicate()) return &row;
  // The norms replace the input's placement by R, the others staying as they are (PyTorch's
  // native_layer_norm strategy), rather than moving a shard to another dim.
  if (replicate_first)
    for (const auto& row : rows) {
      if (row.ins[0] != Placement::replicate()) continue;
      std::vector<Placement> rest(given.begin() + 1, given.end()), want(row.ins.begin() + 1, row.ins.end());
      if (row_cost(rest, want, n, std::vector<int64_t>(bytes.begin() + 1, bytes.end()), false).first == 0) return &row;
    }
  // A row giving P(max) or P(min) is taken only by operands already there: making a replica
  // P(max) to fit it would cut the gradient path (P(max) has no cotangent).
  const RuleRow* best = nullptr;
  std::pair<int64_t, int64_t> best_cost{std::numeric_limits<int64_t>::max(), 0};
  for (const auto& row : rows) {
    if (row.out.is_partial() && !is_linear(row.out.op)) continue;
    auto cost = row_cost(given, row.ins, n, bytes, false);
    if (cost.first >= 0 && cost < best_cost) {
      best = &row;
      best_cost = cost;
    }
  }
  return best;
}

int64_t bytes_of(const Shape& s) { return numel(s) * 8; }

}  // namespace

ShardingDecision propagate(const std::string& op, const Mesh& mesh, const std::vector<Spec>& specs,
                           const std::vector<Shape>& shapes, const OpAttrs& attrs) {
  ShardingDecision d;
  d.out_shape = infer_shape(op, shapes, attrs);
  std::vector<int64_t> bytes;
  for (const auto& s : shapes) bytes.push_back(bytes_of(s));
  const OpAttrs a_res = resolved(op, attrs, static_cast<int64_t>(shapes.at(0).size()), shape_str(shapes.at(0)));
  const auto rows = family_of(op).rows({shapes, d.out_shape, a_res, op});
  d.in_specs = specs;
  d.out_spec.assign(mesh.ndim(), Placement::replicate());
  std::vector<const RuleRow*> chosen;
  for (int a = 0; a < mesh.ndim(); ++a) {
    std::vector<Placement> given;
    for (const auto& s : specs) given.push_back(s[a]);
    const RuleRow* best = choose_row(rows, given, mesh.axis_size(a), bytes, family_of(op).names.name == "norm");
    if (!best)
      throw SemanticError(ErrorKind::IllegalRedistribute,
                          op + ": no legal placement for mesh axis " + mesh.axes()[a]);
    for (size_t i = 0; i < specs.size(); ++i)
      if (!same_for_rule(specs[i][a], best->ins[i])) d.in_specs[i][a] = best->ins[i];
    d.out_spec[a] = best->out;
    chosen.push_back(best);
  }
  // A view keeps a shard only where each rank's chunk is the same elements before and after;
  // elsewhere (uneven chunks that do not line up) the operand is gathered on that axis first.
  if (family_of(op).names.name == "view") {
    const RuleRow* replicate = nullptr;
    for (const auto& row : rows)
      if (row.ins[0] == Placement::replicate()) replicate = &row;
    for (bool changed = true; changed;) {
      changed = false;
      const auto bad = view_layout_mismatches(mesh, d.in_specs[0], d.out_spec, shapes[0], d.out_shape, op, a_res);
      for (int a = 0; a < mesh.ndim(); ++a)
        if (d.in_specs[0][a].is_shard() && bad.count(d.in_specs[0][a].dim)) {
          d.in_specs[0][a] = Placement::replicate();
          d.out_spec[a] = Placement::replicate();
          chosen[a] = replicate;
          changed = true;
        }
    }
  }
  for (int a = 0; a < mesh.ndim(); ++a) {
    d.rows.push_back(op + ": " + chosen[a]->str());
    if (coverage_sink()) cover("forward " + op + ": " + std::string(chosen[a]->rule));
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// Backward (the per-family functions are in core/rules/, by family)

BackwardDecision backward_rule(const std::string& op, const Mesh& mesh,
                               const std::vector<Spec>& in_specs, const Spec& out_spec,
                               const std::vector<Shape>& shapes, const OpAttrs& attrs,
                               const Spec& grad_in, size_t input) {
  const Family& family = family_of(op);
  AxisGrad x;
  x.input = input;
  x.rank = static_cast<int64_t>(shapes.at(0).size());
  x.attrs = resolved(op, attrs, x.rank, shape_str(shapes[0]));
  x.shapes = shapes;
  x.out_shape = infer_shape(op, shapes, attrs);
  x.op = op;
  x.bytes = bytes_of(x.out_shape);
  BackwardDecision d{grad_in, grad_in};
  for (int a = 0; a < mesh.ndim(); ++a) {
    x.ins.clear();
    for (const auto& s : in_specs) x.ins.push_back(s.at(a));
    x.out = out_spec[a];
    x.g = grad_in[a];
    x.n = mesh.axis_size(a);
    Grad g = family.backward(x);
    d.grad_in[a] = g.in;
    d.grad_out[a] = g.out;
    if (coverage_sink()) cover("backward " + op + " d" + std::to_string(input) + ": " + g.rule());
  }
  return d;
}

}  // namespace meshsim

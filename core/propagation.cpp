#include "core/propagation.h"

#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/coverage.h"
#include "core/explain.h"
#include "core/error.h"
#include "core/mutants.h"
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

int64_t bytes_of(const Shape& s) { return numel(s) * 8; }

// The row of one mesh axis for operands `given`, by the order stated in propagation.h, and how it
// was reached (a kHow* text of core/explain.h); index -1 when no row is legal.
struct Choice {
  int index = -1;
  const char* how = kHowNoneLegal;
};

bool excluded_partial(const RuleRow& row) { return row.out.is_partial() && !is_linear(row.out.op); }

Choice choose_row(const std::vector<RuleRow>& rows, const std::vector<Placement>& given, int64_t n,
                  const std::vector<int64_t>& bytes, bool replicate_first) {
  const int count = static_cast<int>(rows.size());
  for (int i = 0; i < count; ++i)
    if (row_cost(given, rows[i].ins, n, bytes, false) == std::pair<int64_t, int64_t>{0, 0}) return {i, kHowExactFit};
  if (given.size() == 1)
    for (int i = 0; i < count; ++i)
      if (rows[i].ins[0] == Placement::replicate()) return {i, kHowOneOperand};
  // The norms replace the input's placement by R, the others staying as they are (PyTorch's
  // native_layer_norm strategy), rather than moving a shard to another dim.
  if (replicate_first)
    for (int i = 0; i < count; ++i) {
      const RuleRow& row = rows[i];
      if (row.ins[0] != Placement::replicate()) continue;
      std::vector<Placement> rest(given.begin() + 1, given.end()), want(row.ins.begin() + 1, row.ins.end());
      if (row_cost(rest, want, n, std::vector<int64_t>(bytes.begin() + 1, bytes.end()), false).first == 0)
        return {i, kHowReplicateFirst};
    }
  // A row giving P(max) or P(min) is taken only by operands already there: making a replica
  // P(max) to fit it would cut the gradient path (P(max) has no cotangent).
  Choice best;
  std::pair<int64_t, int64_t> best_cost{std::numeric_limits<int64_t>::max(), 0};
  for (int i = 0; i < count; ++i) {
    if (excluded_partial(rows[i])) continue;
    auto cost = row_cost(given, rows[i].ins, n, bytes, false);
    if (cost.first >= 0 && cost < best_cost) {
      best = {i, kHowCheapest};
      best_cost = cost;
    }
  }
  return best;
}

std::string bytes_str(int64_t b) { return std::to_string(b) + " B"; }

// Every candidate of one axis with its cost, its moves and its verdict, once the choice is made.
std::vector<RowCandidate> candidates_of(const std::vector<RuleRow>& rows, const std::vector<Placement>& given, int64_t n,
                                        const std::vector<int64_t>& bytes, const Choice& choice) {
  std::vector<RowCandidate> out;
  for (const auto& row : rows) {
    RowCandidate c;
    c.row = row.str();
    c.rule = std::string(row.rule);
    c.ins = row.ins;
    c.out = row.out;
    std::tie(c.bytes, c.changed) = row_cost(given, row.ins, n, bytes, false);
    c.legal = c.bytes >= 0;
    for (size_t i = 0; i < given.size(); ++i)
      if (!same_for_rule(given[i], row.ins[i]))
        c.moves.push_back("operand " + std::to_string(i) + " " + describe_move(given[i], row.ins[i], n, bytes[i]));
    out.push_back(std::move(c));
  }
  auto needs = [](const RowCandidate& c) {
    std::string s;
    for (const auto& m : c.moves) s += (s.empty() ? "" : "; ") + m;
    return s.empty() ? std::string("nothing moves") : "needs " + s;
  };
  auto first_illegal = [](const RowCandidate& c) {
    for (const auto& m : c.moves)
      if (const auto at = m.find(": illegal ("); at != std::string::npos)
        return "illegal: " + m.substr(0, at) + " " + m.substr(at + 10);
    return std::string("illegal");
  };
  const RowCandidate* best = choice.index >= 0 ? &out[choice.index] : nullptr;
  const std::string how = choice.how;
  for (size_t i = 0; i < out.size(); ++i) {
    RowCandidate& c = out[i];
    const RuleRow& row = rows[i];
    const bool earlier = choice.index >= 0 && static_cast<int>(i) > choice.index;
    if (static_cast<int>(i) == choice.index) {
      c.chosen = true;
      if (how == kHowExactFit) c.verdict = "fits the operands as they are";
      else if (how == kHowOneOperand) c.verdict = "the one operand fits no row: the row taking R, " + needs(c);
      else if (how == kHowReplicateFirst) c.verdict = "a norm replicates its input, the others as they are: " + needs(c);
      else c.verdict = "cheapest: " + needs(c);
      continue;
    }
    if (!c.legal) {
      c.verdict = first_illegal(c);
    } else if (how == kHowExactFit) {
      c.verdict = c.bytes == 0 && c.changed == 0 ? "fits too, an earlier row won"
                                                 : needs(c) + "; a row the operands fit as they are won";
    } else if (how == kHowOneOperand) {
      c.verdict = row.ins[0] == Placement::replicate()
                      ? "takes R too, an earlier row won"
                      : "takes " + row.ins[0].str() + ": an operand alone that fits no row is replicated";
    } else if (how == kHowReplicateFirst) {
      c.verdict = row.ins[0] != Placement::replicate()
                      ? "does not take the input as R: a norm replicates its input first"
                      : earlier ? "takes R too, an earlier row won" : "would move the other operands: " + needs(c);
    } else if (excluded_partial(row)) {
      c.verdict = "gives " + row.out.str() + ", which has no cotangent (taken only by operands already there)";
    } else if (!best) {
      c.verdict = needs(c);
    } else if (c.bytes > best->bytes) {
      c.verdict = "costs more (" + bytes_str(c.bytes) + " vs " + bytes_str(best->bytes) + ")";
    } else if (c.bytes == best->bytes && c.changed > best->changed) {
      c.verdict = "changes more operands (" + std::to_string(c.changed) + " vs " + std::to_string(best->changed) +
                  ") at equal bytes (" + bytes_str(c.bytes) + ")";
    } else {
      c.verdict = "tie at equal cost, an earlier row won";
    }
  }
  return out;
}

// propagate(), explained when `ex` is given (the same code either way).
ShardingDecision decide(const std::string& op, const Mesh& mesh, const std::vector<Spec>& specs,
                        const std::vector<Shape>& shapes, const OpAttrs& attrs, PropagationExplanation* ex) {
  ShardingDecision d;
  d.out_shape = infer_shape(op, shapes, attrs);
  std::vector<int64_t> bytes;
  for (const auto& s : shapes) bytes.push_back(bytes_of(s));
  const OpAttrs a_res = resolved(op, attrs, static_cast<int64_t>(shapes.at(0).size()), shape_str(shapes.at(0)));
  const Family& family = family_of(op);
  const auto rows = family.rows({shapes, d.out_shape, a_res, op});
  d.in_specs = specs;
  d.out_spec.assign(mesh.ndim(), Placement::replicate());
  std::vector<int> chosen;
  for (int a = 0; a < mesh.ndim(); ++a) {
    std::vector<Placement> given;
    for (const auto& s : specs) given.push_back(s[a]);
    const Choice choice = choose_row(rows, given, mesh.axis_size(a), bytes, family.names.name == "norm");
    if (ex) {
      AxisExplanation ax;
      ax.axis = a;
      ax.axis_name = mesh.axes()[a];
      ax.axis_size = mesh.axis_size(a);
      ax.given = given;
      ax.how = choice.how;
      ax.chosen = choice.index;
      ax.candidates = candidates_of(rows, given, mesh.axis_size(a), bytes, choice);
      ex->axes.push_back(std::move(ax));
    }
    if (choice.index < 0) {
      const std::string why = op + ": no legal placement for mesh axis " + mesh.axes()[a];
      if (ex) {
        ex->error = why;
        ex->decision = d;
        return d;
      }
      throw SemanticError(ErrorKind::IllegalRedistribute, why);
    }
    const RuleRow& best = rows[choice.index];
    for (size_t i = 0; i < specs.size(); ++i)
      if (!same_for_rule(specs[i][a], best.ins[i])) d.in_specs[i][a] = best.ins[i];
    d.out_spec[a] = best.out;
    chosen.push_back(choice.index);
  }
  // A view keeps a shard only where each rank's chunk is the same elements before and after;
  // elsewhere (uneven chunks that do not line up) the operand is gathered on that axis first.
  if (family.names.name == "view") {
    int replicate = -1;
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i].ins[0] == Placement::replicate()) replicate = static_cast<int>(i);
    for (bool changed = true; changed;) {
      changed = false;
      const auto bad = view_layout_mismatches(mesh, d.in_specs[0], d.out_spec, shapes[0], d.out_shape, op, a_res);
      for (int a = 0; a < mesh.ndim(); ++a)
        if (d.in_specs[0][a].is_shard() && bad.count(d.in_specs[0][a].dim)) {
          d.in_specs[0][a] = Placement::replicate();
          d.out_spec[a] = Placement::replicate();
          if (ex) {
            AxisExplanation& ax = ex->axes[a];
            RowCandidate& was = ax.candidates[chosen[a]];
            was.chosen = false;
            was.verdict = "the view's layout does not line up (" + was.verdict + "): replaced by R";
            RowCandidate& now = ax.candidates[replicate];
            now.chosen = true;
            now.verdict = "the view's layout does not line up with " + was.row + ": replaced by R" +
                          (now.moves.empty() ? std::string() : ", " + now.moves.front());
            ax.how = kHowViewFixUp;
            ax.chosen = replicate;
          }
          chosen[a] = replicate;
          changed = true;
        }
    }
  }
  // repeat_interleave's shard of its dim and attention's grouped heads stay only where each rank's
  // chunks line up (rules/attention.cpp); elsewhere the axis takes the family's all-R row.
  for (int a : layout_misaligned_axes(family.names.name, mesh, d.in_specs, d.out_spec, shapes, d.out_shape, a_res)) {
    int replicate = -1;
    for (size_t i = 0; i < rows.size() && replicate < 0; ++i) {
      bool all = rows[i].out == Placement::replicate();
      for (const auto& p : rows[i].ins) all = all && p == Placement::replicate();
      if (all) replicate = static_cast<int>(i);
    }
    for (size_t i = 0; i < specs.size(); ++i)
      d.in_specs[i][a] = same_for_rule(specs[i][a], Placement::replicate()) ? specs[i][a] : Placement::replicate();
    d.out_spec[a] = Placement::replicate();
    if (ex) {
      AxisExplanation& ax = ex->axes[a];
      RowCandidate& was = ax.candidates[chosen[a]];
      was.chosen = false;
      was.verdict = "the chunks do not line up (" + was.verdict + "): replaced by R";
      RowCandidate& now = ax.candidates[replicate];
      now.chosen = true;
      now.verdict = "the chunks of " + was.row + " do not line up: replaced by R" +
                    (now.moves.empty() ? std::string() : ", " + now.moves.front());
      ax.how = kHowLayoutFixUp;
      ax.chosen = replicate;
    }
    chosen[a] = replicate;
  }
  for (int a = 0; a < mesh.ndim(); ++a) {
    d.rows.push_back(op + ": " + rows[chosen[a]].str());
    if (!ex && coverage_sink()) cover("forward " + op + ": " + std::string(rows[chosen[a]].rule));
  }
  if (ex) ex->decision = d;
  return d;
}

}  // namespace

std::string describe_move(const Placement& from, const Placement& to, int64_t axis_size, int64_t full_bytes) {
  const std::string head = from.str() + " -> " + to.str() + ": ";
  const AxisMove m = axis_move(from, to, axis_size, full_bytes, false);
  if (m.bytes < 0) {
    const std::string why = redistribute_illegal_reason({as_rule_input(from)}, {to});
    const auto at = why.find("is illegal: ");
    return head + "illegal (" + (at == std::string::npos ? why : why.substr(at + 12)) + ")";
  }
  if (m.kind == StepKind::Relabel) return head + "relabel, no communication";
  if (m.bytes == 0) return head + step_kind_name(m.kind) + ", no communication";
  return head + step_kind_name(m.kind) + ", " + bytes_str(m.bytes);
}

void append_key_word(std::string& key, int64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); }

void append_key_spec(std::string& key, const Spec& spec) {
  append_key_word(key, static_cast<int64_t>(spec.size()));
  for (const Placement& p : spec) {
    append_key_word(key, static_cast<int64_t>(p.kind));
    append_key_word(key, p.dim);
    append_key_word(key, static_cast<int64_t>(p.op));
    append_key_word(key, p.split);
    key.append(reinterpret_cast<const char*>(&p.norm), sizeof p.norm);
  }
}

std::string decision_key(const std::string& op, const OpAttrs& attrs, const std::vector<Spec>& specs,
                         const std::vector<Shape>& shapes) {
  std::string key = attrs.key();
  append_key_word(key, static_cast<int64_t>(op.size()));
  key += op;
  for (size_t i = 0; i < specs.size(); ++i) {
    append_key_spec(key, specs[i]);
    append_key_word(key, static_cast<int64_t>(shapes[i].size()));
    for (int64_t e : shapes[i]) append_key_word(key, e);
  }
  return key;
}

namespace {

// The rules' results remembered per thread (decision_key, above), with the coverage keys each
// recorded, which a later call records again. A table past kMemoEntries starts over.
constexpr size_t kMemoEntries = size_t{1} << 14;

template <class V>
class Memo {
 public:
  template <class F>
  const V& get(std::string key, F&& compute) {
    auto it = map_.find(key);
    if (it == map_.end()) {
      Entry e;
      {
        CoverageSink seen;
        CoverageScope capture(&seen);
        e.value = compute();
        e.covered.assign(seen.begin(), seen.end());
      }
      if (map_.size() >= kMemoEntries) map_.clear();
      it = map_.emplace(std::move(key), std::move(e)).first;
    }
    if (CoverageSink* sink = coverage_sink()) sink->insert(it->second.covered.begin(), it->second.covered.end());
    return it->second.value;
  }

 private:
  struct Entry {
    V value;
    std::vector<std::string> covered;
  };
  std::unordered_map<std::string, Entry> map_;
};

// The key of a call: its arguments, the mesh (axis names and sizes) and the planted bug.
std::string memo_key(const std::string& op, const Mesh& mesh, const std::vector<Spec>& specs,
                     const std::vector<Shape>& shapes, const OpAttrs& attrs) {
  std::string key = decision_key(op, attrs, specs, shapes);
  append_key_word(key, static_cast<int64_t>(active_mutant()));
  for (int a = 0; a < mesh.ndim(); ++a) {
    append_key_word(key, mesh.axis_size(a));
    append_key_word(key, static_cast<int64_t>(mesh.axes()[a].size()));
    key += mesh.axes()[a];
  }
  return key;
}

}  // namespace

ShardingDecision propagate(const std::string& op, const Mesh& mesh, const std::vector<Spec>& specs,
                           const std::vector<Shape>& shapes, const OpAttrs& attrs) {
  thread_local Memo<ShardingDecision> memo;
  return memo.get(memo_key(op, mesh, specs, shapes, attrs),
                  [&] { return decide(op, mesh, specs, shapes, attrs, nullptr); });
}

PropagationExplanation explain_propagation(const std::string& op, const Mesh& mesh, const std::vector<Spec>& specs,
                                           const std::vector<Shape>& shapes, const OpAttrs& attrs) {
  thread_local Memo<PropagationExplanation> memo;
  return memo.get(memo_key(op, mesh, specs, shapes, attrs), [&] {
    PropagationExplanation ex;
    ex.op = op;
    decide(op, mesh, specs, shapes, attrs, &ex);
    return ex;
  });
}

// ---------------------------------------------------------------------------------------------
// Backward (the per-family functions are in core/rules/, by family)

namespace {

BackwardDecision backward_of(const std::string& op, const Mesh& mesh, const std::vector<Spec>& in_specs,
                             const Spec& out_spec, const std::vector<Shape>& shapes, const OpAttrs& attrs,
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

}  // namespace

BackwardDecision backward_rule(const std::string& op, const Mesh& mesh,
                               const std::vector<Spec>& in_specs, const Spec& out_spec,
                               const std::vector<Shape>& shapes, const OpAttrs& attrs,
                               const Spec& grad_in, size_t input) {
  thread_local Memo<BackwardDecision> memo;
  std::string key = memo_key(op, mesh, in_specs, shapes, attrs);
  append_key_spec(key, out_spec);
  append_key_spec(key, grad_in);
  append_key_word(key, static_cast<int64_t>(input));
  return memo.get(std::move(key),
                  [&] { return backward_of(op, mesh, in_specs, out_spec, shapes, attrs, grad_in, input); });
}

}  // namespace meshsim

#include "core/rules/common.h"

#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cost_model.h"
#include "core/error.h"

namespace meshsim::rules {

// ---------------------------------------------------------------------------------------------
// Row text form

std::string_view intern_rule(const std::string& text) {
  static std::mutex mutex;
  static std::set<std::string> texts;
  std::lock_guard<std::mutex> lock(mutex);
  return *texts.insert(text).first;
}

// ---------------------------------------------------------------------------------------------
// The tables' text

std::vector<RuleRow> parse_rows(const std::vector<RowText>& texts) {
  thread_local std::unordered_map<std::string, RuleRow> parsed;
  std::vector<RuleRow> rows;
  rows.reserve(texts.size());
  for (const auto& t : texts) {
    const std::string key = t.text + "|" + t.rule;
    auto it = parsed.find(key);
    if (it == parsed.end()) {
      RuleRow row = RuleRow::parse(t.text);
      if (!t.rule.empty()) row.rule = intern_rule(t.rule);
      it = parsed.emplace(key, std::move(row)).first;
    }
    rows.push_back(it->second);
  }
  return rows;
}

std::string S(int64_t d) { return "S(" + std::to_string(d) + ")"; }

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out;
}

int64_t aligned(const Shape& s, const Shape& out, int64_t d) {
  const int64_t k = d - static_cast<int64_t>(out.size() - s.size());
  if (k < 0 || s[k] != out[d]) return -1;
  return k;
}

void moved_elements_rows(std::vector<RowText>& t, size_t arity) {
  for (const char* p : {"R", "P(sum)", "P(avg)", "P(max)", "P(min)"})
    t.emplace_back(joined(std::vector<std::string>(arity, p)) + " -> " + p);
}

// ---------------------------------------------------------------------------------------------
// Row cost

Placement as_rule_input(const Placement& p) { return p.is_reduced() ? Placement::replicate() : p; }

bool same_for_rule(const Placement& given, const Placement& wanted) {
  return as_rule_input(given) == wanted;
}

AxisMove axis_move(const Placement& from, const Placement& to, int64_t n, int64_t bytes, bool gradient) {
  Placement f = as_rule_input(from);
  if (f == to) return {StepKind::Relabel, 0};
  if (!redistribute_illegal_reason({f}, {to}, gradient).empty()) return {StepKind::Relabel, -1};
  if (f.is_shard()) {
    const StepKind k = to.is_shard() ? StepKind::AllToAll : StepKind::AllGather;
    return {k, collective_bytes(k, bytes, n)};
  }
  if (f.is_partial()) {
    const StepKind k = to.is_shard() ? StepKind::ReduceScatter : StepKind::AllReduce;
    return {k, collective_bytes(k, bytes, n)};
  }
  return {to.is_shard() ? StepKind::LocalChunk : StepKind::PartialFromReplicate, 0};  // R -> S, R -> P: local
}

std::pair<int64_t, int64_t> row_cost(const std::vector<Placement>& given, const std::vector<Placement>& want,
                                     int64_t n, const std::vector<int64_t>& bytes, bool gradient) {
  std::pair<int64_t, int64_t> cost{0, 0};
  for (size_t i = 0; i < given.size() && cost.first >= 0; ++i) {
    int64_t c = axis_move(given[i], want[i], n, bytes[i], gradient).bytes;
    cost.first = c < 0 ? -1 : cost.first + c;
    cost.second += same_for_rule(given[i], want[i]) ? 0 : 1;
  }
  return cost;
}

// ---------------------------------------------------------------------------------------------
// Backward helpers

Grad gradient_row(const char* table, const std::vector<RuleRow>& rows, size_t g_pos, const Placement* fixed,
                  const AxisGrad& x) {
  const RuleRow* best = nullptr;
  std::pair<int64_t, int64_t> best_cost{std::numeric_limits<int64_t>::max(), 0};
  for (const auto& row : rows) {
    if (fixed && row.ins.at(1 - g_pos) != *fixed) continue;
    auto cost = row_cost({x.g}, {row.ins[g_pos]}, x.n, {x.bytes}, true);
    if (cost.first >= 0 && cost < best_cost) {
      best = &row;
      best_cost = cost;
    }
  }
  if (!best) throw SemanticError(ErrorKind::IllegalRedistribute, "backward: no rule row for the gradient");
  const Placement& want = best->ins[g_pos];
  return {same_for_rule(x.g, want) ? x.g : want, best->out, table, best->rule};
}

Grad own_table(const char* table, const std::vector<RuleRow>& rows, const AxisGrad& x) {
  return gradient_row(table, rows, 0, nullptr, x);
}

[[noreturn]] void no_gradient(const AxisGrad& x, const char* what) {
  throw SemanticError(ErrorKind::NotDifferentiable, x.op + ": " + what + " has no gradient");
}

}  // namespace meshsim::rules

// The registry: one entry per op family (its name, its arity, its table and its backward function),
// in the order of rule_families(): the tables' order, which rule coverage and the docs follow. An
// op's family is named by its row in the op catalog (core/ops.cpp). Each family's functions are in
// the file of its group (rules/common.h lists them).
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "core/rules/common.h"

namespace meshsim::rules {

namespace {

// One entry per family: its name, arity, table and backward. Its ops are the catalog's rows that
// name the family (core/ops.cpp), in the catalog's (alphabetical) order.
struct Entry {
  const char* name;
  size_t arity;  // 0: any number
  std::vector<RuleRow> (*rows)(const RowCtx&);
  Grad (*backward)(const AxisGrad&);
};

const Entry kEntries[] = {
    {"linear_binary", 2, linear_binary_rows, add_gradient},
    {"linear_unary", 1, linear_unary_rows, linear_unary_gradient},
    {"nonlinear_unary", 1, nonlinear_unary_rows, times_operand},
    {"random", 1, random_rows, times_operand},
    {"mul", 2, mul_rows, mul_gradient},
    {"div", 2, div_rows, div_gradient},
    {"integer_binary", 2, integer_binary_rows, integer_gradient},
    {"mm", 2, mm_rows, mm_gradient},
    {"matmul", 2, matmul_rows, matmul_gradient},
    {"transpose", 1, transpose_rows, transpose_gradient},
    {"permute", 1, permute_rows, permute_gradient},
    {"view", 1, view_rows, view_gradient},
    {"expand", 1, expand_rows, expand_gradient},
    {"cat", 0, cat_rows, cat_gradient},
    {"stack", 0, stack_rows, stack_gradient},
    {"narrow", 1, narrow_rows, narrow_gradient},
    {"repeat", 1, repeat_rows, repeat_gradient},
    {"repeat_interleave", 1, repeat_interleave_rows, repeat_interleave_gradient},
    {"reduction", 1, reduction_rows, reduction_gradient},
    {"amax", 1, amax_rows, reduction_gradient},
    {"amin", 1, amin_rows, reduction_gradient},
    {"softmax", 1, softmax_rows, times_operand},
    {"scan", 1, scan_rows, scan_gradient},
    {"item", 1, item_rows, no_gradient_result},
    {"select", 1, select_rows, select_gradient},
    {"select_index", 1, select_rows, select_index_gradient},
    {"cast", 1, cast_rows, cast_gradient},
    {"detach", 1, detach_rows, no_gradient_result},
    {"where", 3, where_rows, where_gradient},
    {"masked_fill", 2, masked_fill_rows, masked_fill_gradient},
    {"triangle", 1, triangle_rows, triangle_gradient},
    {"norm", 0, norm_rows, norm_gradient},
    {"vector_norm", 1, vector_norm_rows, vector_norm_gradient},
    {"attention", 0, attention_rows, attention_gradient},
    {"embedding", 2, embedding_rows, embedding_gradient},
    {"index", 2, index_rows, index_gradient},
    {"scatter", 3, scatter_rows, scatter_gradient},
    {"one_hot", 1, one_hot_rows, counts_gradient},
    {"bincount", 1, bincount_rows, counts_gradient},
    {"pick_target", 2, pick_target_rows, pick_target_gradient},
    {"count_targets", 1, count_targets_rows, count_targets_gradient},
    {"compare", 0, compare_rows, compare_gradient},
};

}  // namespace

const std::vector<Family>& registry() {
  static const std::vector<Family> families = [] {
    std::vector<Family> out;
    for (const Entry& e : kEntries) {
      Family f{{e.name, {}}, e.arity, e.rows, e.backward};
      for (const OpSchema& s : op_catalog())
        if (f.names.name == s.family) f.names.ops.push_back(s.name);
      if (f.names.ops.empty())
        throw std::logic_error(std::string("rule family \"") + e.name + "\" (core/rules/registry.cpp) has no op in the op catalog");
      out.push_back(std::move(f));
    }
    for (const OpSchema& s : op_catalog()) {
      bool found = !*s.family;
      for (const Entry& e : kEntries) found |= std::string(e.name) == s.family;
      if (!found)
        throw std::logic_error(std::string("op \"") + s.name + "\" names rule family \"" + s.family +
                               "\", which core/rules/registry.cpp does not have");
    }
    return out;
  }();
  return families;
}

const Family& family_of(const std::string& op) {
  // Each op's family, by OpId (null: the runtime handles the op itself).
  static const std::vector<const Family*> by_op = [] {
    std::vector<const Family*> out(op_count(), nullptr);
    for (const Family& f : registry())
      for (const auto& o : f.names.ops) out[op_id(o)] = &f;
    return out;
  }();
  const OpSchema* s = find_op(op);
  if (!s || !by_op[s->id]) throw SemanticError(ErrorKind::UnsupportedOp, "no sharding rule for op \"" + op + "\"");
  return *by_op[s->id];
}

}  // namespace meshsim::rules

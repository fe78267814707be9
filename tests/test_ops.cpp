// The DTensor ops of contract 2 (DESIGN.md) against the single-device oracle. Every op, for a set
// of operand placements on meshes [3], [4] and [2, 2] with uneven shapes, gives the oracle's value
// and input gradients, with loss = sum(op(...) * c), c a replicated random-int input. Also: the
// rule tables print and parse back; shape errors; the redistributions DTensor inserts (softmax
// gathers its dim, exp reduces a Partial, neg keeps it); mean over uneven shards; and every row of
// every table is chosen by some case. Cases are listed by op family, in rule_families() order.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>

#include "core/error.h"
#include "core/ops.h"
#include "core/propagation.h"
#include "core/reduced_policy.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "sim/data.h"
#include "sim/interpreter.h"
#include "sim/local_ops.h"

#include <torch/csrc/autograd/autograd.h>

namespace meshsim {
namespace {

using json = nlohmann::json;
using Names = std::vector<std::string>;  // one placement per mesh axis, as text

// ---------------------------------------------------------------------------------------------
// Cases

// One op with its attributes and operand shapes.
struct OpConfig {
  std::string op;
  json attrs = json::object();  // the op's fields besides out, op and args
  std::vector<Shape> shapes;
};

struct OpCase {
  OpConfig config;
  Shape mesh;
  std::vector<Names> specs;  // per operand

  std::string name() const {
    std::string s = config.op + config.attrs.dump();
    for (const auto& sh : config.shapes) s += " " + shape_str(sh);
    s += " mesh" + shape_str(mesh);
    for (const auto& sp : specs) s += " " + json(sp).dump();
    return s;
  }
};

// Inputs are integers everywhere, so every op but div, exp, mean, sin, softmax and tanh is exact on
// meshes of power-of-two axes; the oracle compares those bit for bit and the others within a
// relative 1e-12 (comparison_tolerance): every case must pass, no allowance here.
bool passes(const json& r, const std::string&) { return r["status"] == "pass"; }

bool differentiable(const std::vector<Names>& specs) {
  for (const auto& s : specs)
    for (const auto& p : s)
      if (p == "P(max)" || p == "P(min)") return false;
  return true;
}

int arity(const std::string& op) {
  static const std::set<std::string> binary = {"add", "bmm", "cat", "div", "matmul", "mm", "mul", "stack", "sub",
                                               "masked_fill", "embedding", "nll_loss", "cross_entropy",
                                               "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
                                               "floor_divide", "remainder", "gather", "index_select"};
  if (op == "where" || op == "scatter" || op == "scatter_add" || op == "index_add") return 3;
  return binary.count(op) ? 2 : 1;
}

// The element type of operand i: ids and targets are int64, conditions and masks bool.
std::string operand_dtype(const std::string& op, size_t i) {
  if ((op == "embedding" && i == 0) || ((op == "nll_loss" || op == "cross_entropy") && i == 1)) return "int64";
  if ((op == "gather" || op == "index_select" || op == "scatter" || op == "scatter_add" || op == "index_add") && i == 1)
    return "int64";  // the index
  if ((op == "where" && i == 0) || (op == "masked_fill" && i == 1)) return "bool";
  if (op == "logical_and" || op == "logical_or" || op == "logical_not") return "bool";
  if (op == "floor_divide" || op == "remainder" || op == "one_hot" || op == "bincount") return "int64";
  return "float";
}

// Ops whose operand must be positive (it is exp(x) in the scenario), as div's denominator.
bool positive_operand(const std::string& op, size_t i) {
  return (op == "div" && i == 1) || op == "sqrt" || op == "rsqrt" || op == "log" || op == "pow";
}

// The placements one axis takes, for an operand of `rank` dims (differentiable ones); an int64 or
// bool operand is never Partial.
Names axis_placements(size_t rank, bool partial = true) {
  Names out;
  for (size_t d = 0; d < rank; ++d) out.push_back("S(" + std::to_string(d) + ")");
  for (const char* p : {"R", "Rd", "P(sum)", "P(avg)"})
    if (partial || p[0] == 'R') out.push_back(p);
  return out;
}

std::vector<OpConfig> configs(const std::string& op) {
  const Shape tall{5, 3}, wide{3, 5}, cube{3, 5, 2};
  std::vector<OpConfig> out;
  const json none = json::object();
  if (op == "mm") return {{op, none, {tall, {3, 4}}}, {op, none, {wide, {5, 2}}}};
  if (op == "bmm") return {{op, none, {{2, 5, 3}, {2, 3, 4}}}, {op, none, {{3, 2, 5}, {3, 5, 2}}}};
  if (op == "matmul")
    return {{op, none, {tall, {3}}},         {op, none, {{3}, {3, 4}}},          {op, none, {{3}, {3}}},
            {op, none, {{2, 5, 3}, {3, 4}}}, {op, none, {{1, 5, 3}, {2, 3, 4}}}, {op, none, {{5, 3}, {2, 3, 4}}}};
  // to: a cast of the float64 run's values (the oracle's float64 reference, the dtypes' tolerance).
  if (op == "to") return {{op, {{"dtype", "bfloat16"}}, {tall}}, {op, {{"dtype", "float32"}}, {cube}}};
  // item: a value of one element, [1] (a shard: rank 0's) and [1, 1] (0-d: tests/test_ops_item.cpp).
  if (op == "item") return {{op, none, {{1}}}, {op, none, {{1, 1}}}};
  if (op == "cat") return {{op, {{"dim", 0}}, {tall, {2, 3}}}, {op, {{"dim", -1}}, {tall, {5, 2}}}};
  if (op == "stack") return {{op, {{"dim", 0}}, {tall, tall}}, {op, {{"dim", 2}}, {wide, wide}}};
  if (op == "log_softmax") {
    for (int dim : {0, 1, -1}) out.push_back({op, {{"dim", dim}}, {tall}});
    out.push_back({op, {{"dim", 1}}, {cube}});
    return out;
  }
  if (op == "where") return {{op, none, {tall, tall, tall}}, {op, none, {{3}, tall, {5, 1}}}, {op, none, {{5, 1}, {3}, {3}}}};
  if (op == "masked_fill")
    return {{op, {{"value", -2.5}}, {tall, tall}}, {op, {{"value", 0}}, {tall, {3}}}, {op, {{"value", 7}}, {cube, {5, 1}}}};
  if (op == "tril" || op == "triu")
    return {{op, none, {tall}}, {op, {{"diagonal", 1}}, {wide}}, {op, {{"diagonal", -1}}, {cube}}};
  if (op == "layer_norm")
    return {{op, {{"normalized_shape", {3}}}, {tall}},
            {op, {{"normalized_shape", {3}}, {"eps", 0.5}}, {tall, {3}}},
            {op, {{"normalized_shape", {5, 2}}}, {cube, {5, 2}, {5, 2}}}};
  if (op == "rms_norm")
    return {{op, {{"normalized_shape", {3}}}, {tall}}, {op, {{"normalized_shape", {2}}, {"eps", 0.25}}, {cube, {2}}}};
  if (op == "embedding") return {{op, none, {{5}, {7, 3}}}, {op, none, {{2, 3}, {5, 4}}}};
  if (op == "nll_loss" || op == "cross_entropy")
    return {{op, none, {tall, {5}}}, {op, {{"reduction", "sum"}}, {{4, 5}, {4}}}, {op, {{"ignore_index", 2}}, {{6, 3}, {6}}}};
  // gather and index_select along each dim: an index as long as x on the other dims (gather's S(d),
  // S(d) rows) or shorter, longer or shorter than x on the dim; uneven on [3], [4] and [2, 2].
  if (op == "gather")
    return {{op, {{"dim", 0}}, {tall, {7, 3}}}, {op, {{"dim", -1}}, {tall, {5, 2}}}, {op, {{"dim", 1}}, {cube, {2, 4, 2}}}};
  if (op == "index_select")
    return {{op, {{"dim", 0}}, {tall, {4}}}, {op, {{"dim", -1}}, {tall, {7}}}, {op, {{"dim", 1}}, {cube, {3}}}};
  // repeat (a dim repeated is gathered, one repeated once keeps its shard), repeat_interleave (its
  // dim's shard kept where the chunks line up), scaled_dot_product_attention (causal, grouped heads;
  // the mask: tests/test_ops_attention.cpp).
  if (op == "repeat") return {{op, {{"sizes", {2, 1}}}, {tall}}, {op, {{"sizes", {2, 1, 2}}}, {cube}}};
  if (op == "repeat_interleave") return {{op, {{"repeats", 2}, {"dim", 0}}, {tall}}, {op, {{"repeats", 3}, {"dim", -1}}, {cube}}};
  if (op == "scaled_dot_product_attention")
    return {{op, {{"is_causal", true}}, {{3, 5, 5, 2}, {3, 5, 5, 2}, {3, 5, 5, 3}}},
            {op, {{"enable_gqa", true}}, {{3, 4, 5, 2}, {3, 2, 7, 2}, {3, 2, 7, 2}}}};
  // cumsum along each dim (the dim gathered where sharded; [5, 3] uneven on [3] and [4]).
  if (op == "cumsum") return {{op, {{"dim", 0}}, {tall}}, {op, {{"dim", -1}}, {tall}}, {op, {{"dim", 1}}, {cube}}};
  // clamp: min, max or both, min above max too (on the bounds often: small integers); one_hot of ids
  // into 3 or 4 classes; bincount of 1-D ids into minlength bins (tests/test_ops_counts.cpp: more).
  if (op == "clamp")
    return {{op, {{"min", -1}}, {tall}}, {op, {{"min", -1}, {"max", 1}}, {cube}}, {op, {{"min", 1}, {"max", 0}}, {tall}}};
  if (op == "one_hot") return {{op, {{"num_classes", 3}}, {tall}}, {op, {{"num_classes", 4}}, {{7}}}};
  if (op == "bincount") return {{op, {{"minlength", 3}}, {{7}}}, {op, {{"minlength", 5}}, {{5}}}};
  // floor_divide, remainder of int64 data: alike or broadcast either way (the scalar value:
  // test_ops_int.cpp).
  if (op == "floor_divide" || op == "remainder")
    return {{op, none, {tall, tall}}, {op, none, {tall, {3}}}, {op, none, {{5, 1}, {3}}}, {op, none, {cube, {5, 1}}}};
  // scatter and scatter_add along each dim: an index (and src) as long as x on the other dims (the
  // S(d), S(d), S(d) rows) or shorter, longer or shorter than x on the dim; index_add's 1-D index
  // with source x's shape but at the dim.
  if (op == "scatter" || op == "scatter_add")
    return {{op, {{"dim", 0}}, {tall, {7, 3}, {7, 3}}},
            {op, {{"dim", -1}}, {tall, {5, 2}, {5, 2}}},
            {op, {{"dim", 1}}, {cube, {3, 4, 2}, {3, 4, 2}}},
            {op, {{"dim", 0}}, {tall, {2, 2}, {2, 2}}}};
  if (op == "index_add")
    return {{op, {{"dim", 0}}, {tall, {4}, {4, 3}}}, {op, {{"dim", -1}}, {tall, {7}, {5, 7}}}, {op, {{"dim", 1}}, {cube, {3}, {3, 3, 2}}}};
  // max, min, argmax, argmin: along each dim, keepdim or not; sort, argsort, topk along each dim
  // (k from 0 to the whole extent). The dim gathered where sharded; [5, 3] is uneven on [3] and [4].
  if (op == "max" || op == "min" || op == "argmax" || op == "argmin") {
    for (bool keepdim : {false, true})
      for (int dim : {0, -1}) out.push_back({op, {{"dim", dim}, {"keepdim", keepdim}}, {tall}});
    out.push_back({op, {{"dim", 1}}, {cube}});
    return out;
  }
  if (op == "sort" || op == "argsort")
    return {{op, {{"dim", 0}}, {tall}}, {op, {{"dim", -1}, {"descending", true}}, {tall}}, {op, {{"dim", 1}}, {cube}}};
  if (op == "topk")
    return {{op, {{"k", 2}, {"dim", 0}}, {tall}},
            {op, {{"k", 3}, {"dim", -1}, {"largest", false}}, {tall}},
            {op, {{"k", 5}, {"dim", 1}}, {cube}},
            {op, {{"k", 0}, {"dim", 0}}, {wide}}};
  // Comparisons: as the binary ops, and against a scalar value (small integers: equal often).
  if (op == "eq" || op == "ne" || op == "lt" || op == "le" || op == "gt" || op == "ge")
    return {{op, none, {tall, tall}},
            {op, none, {wide, wide}},
            {op, none, {tall, {3}}},
            {op, none, {{5, 1}, tall}},
            {op, {{"value", 1}}, {tall}},
            {op, {{"value", 0.5}}, {cube}}};
  // Binary pointwise ops: same shapes, and a broadcast operand (missing dims and size-1 dims).
  if (arity(op) == 2)
    return {{op, none, {tall, tall}}, {op, none, {wide, wide}}, {op, none, {tall, {3}}}, {op, none, {{5, 1}, tall}}};
  if (op == "permute") return {{op, {{"dims", {2, 0, 1}}}, {cube}}, {op, {{"dims", {-1, 0}}}, {tall}}};
  if (op == "view" || op == "reshape")
    return {{op, {{"shape", {15}}}, {tall}}, {op, {{"shape", {2, 3, -1}}}, {{6, 5}}}, {op, {{"shape", {3, 10}}}, {cube}},
            {op, {{"shape", {5, 3, 2}}}, {{5, 6}}}, {op, {{"shape", {4, 6}}}, {{6, 4}}}};
  if (op == "flatten")
    return {{op, {{"start_dim", 0}, {"end_dim", 1}}, {cube}}, {op, {{"start_dim", 1}}, {cube}}, {op, none, {tall}}};
  if (op == "unflatten")
    return {{op, {{"dim", 0}, {"sizes", {2, 3}}}, {{6, 5}}}, {op, {{"dim", -1}, {"sizes", {3, -1}}}, {{5, 6}}}};
  if (op == "squeeze") return {{op, none, {{1, 5, 3}}}, {op, {{"dim", 1}}, {{5, 1, 3}}}};
  if (op == "unsqueeze") return {{op, {{"dim", 0}}, {tall}}, {op, {{"dim", -1}}, {tall}}};
  if (op == "expand")
    return {{op, {{"shape", {5, 3}}}, {{1, 3}}}, {op, {{"shape", {4, 3}}}, {{3}}}, {op, {{"shape", {-1, 3}}}, {{5, 1}}}};
  if (op == "narrow")
    return {{op, {{"dim", 0}, {"start", 1}, {"length", 3}}, {tall}}, {op, {{"dim", 2}, {"start", -1}, {"length", 1}}, {cube}}};
  if (op == "transpose") {
    return {{op, {{"dim0", 0}, {"dim1", 1}}, {tall}},
            {op, {{"dim0", 1}, {"dim1", -2}}, {wide}},
            {op, {{"dim0", 0}, {"dim1", 2}}, {cube}},
            {op, {{"dim0", 2}, {"dim1", 2}}, {cube}}};
  }
  if (op == "sum" || op == "mean" || op == "amax" || op == "amin") {
    for (bool keepdim : {false, true}) {
      out.push_back({op, {{"keepdim", keepdim}}, {tall}});
      for (int dim : {0, 1, -1}) out.push_back({op, {{"dim", dim}, {"keepdim", keepdim}}, {tall}});
      out.push_back({op, {{"dim", {0, 2}}, {"keepdim", keepdim}}, {cube}});
    }
    out.push_back({op, {{"dim", 1}}, {cube}});
    out.push_back({op, json::object(), {cube}});
    out.push_back({op, {{"dim", json::array()}}, {tall}});
    return out;
  }
  if (op == "linalg_vector_norm") {  // each kind of norm partial, over one dim, a list or every dim
    for (const json& ord : {json(2), json(3), json(1.5), json(1), json(0), json("inf"), json("-inf")}) {
      out.push_back({op, {{"ord", ord}, {"dim", 0}}, {tall}});
      out.push_back({op, {{"ord", ord}, {"dim", -1}, {"keepdim", true}}, {tall}});
    }
    out.push_back({op, none, {tall}});
    out.push_back({op, {{"dim", {0, 2}}, {"ord", 3}}, {cube}});
    return out;
  }
  if (op == "softmax") {
    for (int dim : {0, 1, -1}) out.push_back({op, {{"dim", dim}}, {tall}});
    out.push_back({op, {{"dim", 1}}, {cube}});
    return out;
  }
  json attrs = op == "scale" ? json{{"value", 1.5}} : op == "pow" ? json{{"exponent", 1.5}} : json::object();
  if (op == "gelu") return {{op, none, {tall}}, {op, {{"approximate", "tanh"}}, {wide}}, {op, none, {cube}}};
  return {{op, attrs, {tall}}, {op, attrs, {wide}}, {op, attrs, {cube}}};
}

// gather's, index_select's, scatter's and index_add's index: positions along x's dim.
int64_t indexed_extent_dim(const OpConfig& cfg) {
  const auto rank = static_cast<int64_t>(cfg.shapes[0].size());
  const int64_t dim = cfg.attrs.at("dim").get<int64_t>();
  return dim < 0 ? dim + rank : dim;
}
int64_t indexed_extent(const OpConfig& cfg) { return cfg.shapes[0].at(static_cast<size_t>(indexed_extent_dim(cfg))); }

// Per config: every placement on meshes [3] and [4]; on [2, 2] every pair for one operand, and
// for two each spec against itself and against one other. P(max) and P(min) (not differentiable:
// forward only) for one-operand ops.
std::vector<OpCase> cases(const std::string& op) {
  std::vector<OpCase> out;
  for (const auto& c : configs(op)) {
    if (c.shapes.size() > 2 || (c.shapes.size() == 2 && arity(op) == 1)) {
      // Three operands, or a norm's weight (and bias): every placement of the first operand against
      // a cycle through the others' (the norms' parameters take R, Rd and their shards).
      std::vector<Names> each;
      for (size_t i = 0; i < c.shapes.size(); ++i) each.push_back(axis_placements(c.shapes[i].size(), operand_dtype(op, i) == "float"));
      size_t k = 0;
      for (Shape mesh : {Shape{3}, Shape{4}})
        for (const auto& p : each[0])
          for (size_t rep = 0; rep < 3; ++rep, ++k) {
            std::vector<Names> specs{{p}};
            for (size_t i = 1; i < each.size(); ++i) specs.push_back({each[i][(k * (2 * i + 1) + i) % each[i].size()]});
            out.push_back({c, mesh, specs});
          }
      for (const auto& p : each[0])
        for (const auto& q : each[0]) {
          std::vector<Names> specs{{p, q}};
          for (size_t i = 1; i < each.size(); ++i, ++k)
            specs.push_back({each[i][k % each[i].size()], each[i][(3 * k + 1) % each[i].size()]});
          out.push_back({c, {2, 2}, specs});
        }
      // The index and src sharded alike (index_add: S(0) and S(dim)) against x R (moved to P(sum)),
      // P(sum) or sharded alike.
      if (op == "scatter" || op == "scatter_add" || op == "index_add")
        for (const auto& q : each[1]) {
          Names src{q};
          if (op == "index_add" && q == "S(0)") src = {"S(" + std::to_string(indexed_extent_dim(c)) + ")"};
          for (const char* x : {"R", "P(sum)"}) out.push_back({c, {3}, {{x}, {q}, src}});
          out.push_back({c, {4}, {{q}, {q}, src}});
        }
      if (op == "where")  // x and y alike against a replicated condition (the Partial rows)
        for (const auto& p : each[1])
          if (c.shapes[1] == c.shapes[2]) out.push_back({c, {3}, {{"R"}, {p}, {p}}});
      continue;
    }
    const Names one = axis_placements(c.shapes[0].size(), operand_dtype(op, 0) == "float");
    std::vector<Names> two;
    for (const auto& p : one)
      for (const auto& q : one) two.push_back({p, q});
    // One operand: a unary op, or a binary one against its scalar `value`.
    const bool unary = arity(op) == 1 || c.shapes.size() == 1;
    for (Shape mesh : {Shape{3}, Shape{4}}) {
      if (unary) {
        for (const auto& p : one) out.push_back({c, mesh, {{p}}});
        if (operand_dtype(op, 0) == "float")  // a bool operand is never Partial
          for (const char* p : {"P(max)", "P(min)"}) out.push_back({c, mesh, {{p}}});
      } else {
        for (const auto& p : one)
          for (const auto& q : axis_placements(c.shapes[1].size(), operand_dtype(op, 1) == "float"))
            out.push_back({c, mesh, {{p}, {q}}});
        if (op == "cat" || op == "stack")  // elements only move: P(max) and P(min) pass (forward only)
          for (const char* p : {"P(max)", "P(min)"}) out.push_back({c, mesh, {{p}, {p}}});
      }
    }
    if (unary) {
      for (const auto& s : two) out.push_back({c, {2, 2}, {s}});
      if (operand_dtype(op, 0) == "float") {
        out.push_back({c, {2, 2}, {{"P(max)", "S(0)"}}});
        out.push_back({c, {2, 2}, {{"R", "P(min)"}}});
      }
    } else {
      std::vector<Names> other;
      const bool partial = operand_dtype(op, 1) == "float";
      for (const auto& p : axis_placements(c.shapes[1].size(), partial))
        for (const auto& q : axis_placements(c.shapes[1].size(), partial)) other.push_back({p, q});
      for (size_t i = 0; i < two.size(); ++i) {
        if (c.shapes[0] == c.shapes[1] && operand_dtype(op, 1) == "float") out.push_back({c, {2, 2}, {two[i], two[i]}});
        out.push_back({c, {2, 2}, {two[i], other[(7 * i + 3) % other.size()]}});
      }
    }
  }
  return out;
}

// The ops of the contract that run as a decomposition into ops with tables (the loss ops: log_softmax,
// pick_target, count_targets, sum, mean, div), tested as the user writes them.
const Names kDecomposed = {"cross_entropy", "nll_loss"};
// Ops with a table that no scenario names (the parts of the loss ops).
const Names kInternal = {"count_targets", "pick_target"};

// Every op with a rule table, in the order of rule_families(), the internal ones replaced by the
// contract ops that run them.
Names tested_ops() {
  Names out;
  for (const auto& f : rule_families())
    for (const auto& op : f.ops)
      if (std::find(kInternal.begin(), kInternal.end(), op) == kInternal.end()) out.push_back(op);
  out.insert(out.end(), kDecomposed.begin(), kDecomposed.end());
  return out;
}

OpAttrs attrs_of(const std::string& op, const json& fields) {
  OpDecl decl;
  decl.op = op;
  decl.attrs = fields;
  return op_attrs(decl);
}

json spec_json(const Names& s) { return json(s); }

// The scenario of a case: y = op(x0, x1); m = mul(y, c); loss = sum(m); backward when every
// operand is differentiable. div divides by d = exp(x1), which is never 0.
json scenario_json(const OpCase& c) {
  const auto& cfg = c.config;
  bool grad = differentiable(c.specs);
  json mesh_axes = c.mesh.size() == 1 ? json::array({"a"}) : json::array({"a", "b"});
  json inputs = json::array();
  json program = json::array();
  Names args;
  for (size_t i = 0; i < cfg.shapes.size(); ++i) {
    const std::string name = "x" + std::to_string(i);
    const std::string dtype = operand_dtype(cfg.op, i);
    json in = {{"name", name}, {"shape", cfg.shapes[i]}, {"placements", spec_json(c.specs[i])},
               {"requires_grad", grad && dtype == "float"}};
    if (dtype != "float") in["dtype"] = dtype;
    if (dtype == "int64")  // ids of the weight's vocab, targets of the classes
      in["init"] = {{"ids", cfg.op == "embedding" ? cfg.shapes[1][0]
                            : cfg.op == "gather" || cfg.op == "index_select" || cfg.op == "scatter" ||
                                    cfg.op == "scatter_add" || cfg.op == "index_add"
                                ? indexed_extent(cfg)
                            : cfg.op == "one_hot"  ? cfg.attrs["num_classes"].get<int64_t>()
                            : cfg.op == "bincount" ? cfg.attrs["minlength"].get<int64_t>()
                                                   : cfg.shapes[0][1]}};
    if ((cfg.op == "floor_divide" || cfg.op == "remainder") && i == 0) in.erase("init");  // in [-4, 4]
    inputs.push_back(in);
    if ((cfg.op == "floor_divide" || cfg.op == "remainder") && i == 1) {  // a divisor in [1, 3]
      inputs.back()["init"] = {{"ids", 3}};
      program.push_back({{"out", "d"}, {"op", "add"}, {"args", {name}}, {"value", 1}});
      args.push_back("d");
    } else if (positive_operand(cfg.op, i)) {
      program.push_back({{"out", "d"}, {"op", "exp"}, {"args", {name}}});
      args.push_back("d");
    } else {
      args.push_back(name);
    }
  }
  const bool loss_op = std::find(kDecomposed.begin(), kDecomposed.end(), cfg.op) != kDecomposed.end();
  const Shape out_shape = loss_op ? Shape{} : infer_shape(cfg.op, cfg.shapes, attrs_of(cfg.op, cfg.attrs));
  // A P(max), P(min) or P(normP) result has no gradient.
  if (grad && (cfg.op == "amax" || cfg.op == "amin" || cfg.op == "linalg_vector_norm")) {
    std::vector<Spec> given;
    for (const auto& sp : c.specs) {
      Spec spec;
      for (const auto& p : sp) spec.push_back(parse_placement(p));
      given.push_back(spec);
    }
    Mesh mesh(c.mesh.size() == 1 ? std::vector<std::string>{"a"} : std::vector<std::string>{"a", "b"}, c.mesh);
    for (const auto& p : propagate(cfg.op, mesh, given, cfg.shapes, attrs_of(cfg.op, cfg.attrs)).out_spec)
      grad = grad && !p.is_partial();
  }
  // A bool or int64 result (comparisons, indices): its value alone, no gradient.
  const bool integral = op_schema(cfg.op).result != OperandType::Any;
  if (integral) {
    grad = false;
    for (auto& in : inputs) in["requires_grad"] = false;
  }
  if (!integral) inputs.push_back({{"name", "c"}, {"shape", out_shape}, {"placements", Names(c.mesh.size(), "R")}});
  json op = cfg.attrs;
  op["out"] = "y";
  op["op"] = cfg.op;
  op["args"] = args;
  program.push_back(op);
  if (!integral) {
    program.push_back({{"out", "m"}, {"op", "mul"}, {"args", {"y", "c"}}});
    program.push_back({{"out", "loss"}, {"op", "sum"}, {"args", {"m"}}});
  }
  json doc = {{"format", "meshsim.scenario/1"},
              {"name", "ops"},
              {"mesh", {{"axes", mesh_axes}, {"shape", c.mesh}}},
              {"options", {{"seed", 0}}},
              {"inputs", inputs},
              {"program", program}};
  if (grad) doc["backward"] = "loss";
  return doc;
}

Scenario scenario_of(const OpCase& c) { return parse_scenario(scenario_json(c), c.name()); }

json run(const Scenario& sc) { return check_scenario(sc, sc.options).result; }

// The rows propagate() chooses for every op of the scenario's program, walked as the runtime
// walks it (propagation, then the Rd label restored by the run's policy).
std::vector<std::string> chosen_rows(const Scenario& sc) {
  bool decomposed = false;
  for (const auto& op : sc.program)
    decomposed |= std::find(kDecomposed.begin(), kDecomposed.end(), op.op) != kDecomposed.end() || op.op == "log_softmax";
  if (decomposed) {  // the rows the runtime chose for the parts, from its events' notes
    std::vector<std::string> rows;
    for (const auto& e : run_distributed(sc, sc.options).runtime->events()) {
      if (e.kind != "op") continue;
      for (size_t at = 0; at < e.note.size();) {
        size_t end = e.note.find("; ", at);
        rows.push_back(e.note.substr(at, end == std::string::npos ? std::string::npos : end - at));
        at = end == std::string::npos ? e.note.size() : end + 2;
      }
    }
    return rows;
  }
  std::map<std::string, Spec> specs;
  std::map<std::string, Shape> shapes;
  for (const auto& in : sc.inputs) {
    specs[in.name] = in.placements;
    shapes[in.name] = in.shape;
  }
  std::vector<std::string> rows;
  for (const auto& op : sc.program) {
    std::vector<Spec> given;
    std::vector<Shape> in_shapes;
    for (const auto& a : op.args) {
      given.push_back(specs.at(a));
      in_shapes.push_back(shapes.at(a));
    }
    OpAttrs attrs = op_attrs(op);
    // An arithmetic op's `value` (the divisor of floor_divide's cases: add(d0, 1)): a 0-d operand, R on
    // every axis, as the run gives it; the comparisons' tables have rows of their one-operand form.
    if (attrs.scalar && given.size() == 1 && std::string_view(op_schema(op.op).family) != "compare") {
      given.push_back(Spec(static_cast<size_t>(sc.mesh.ndim()), Placement::replicate()));
      in_shapes.push_back({});
      attrs.scalar = false;
    }
    ShardingDecision d = propagate(op.op, sc.mesh, given, in_shapes, attrs);
    rows.insert(rows.end(), d.rows.begin(), d.rows.end());
    specs[op.out] = restore_reduced(op.op, sc.mesh, given, d.out_spec, sc.options.reduced_propagation);
    shapes[op.out] = d.out_shape;
  }
  return rows;
}

// Every row of the tables the cases use, as "op: row".
std::set<std::string> table_rows(const OpConfig& c) {
  std::set<std::string> out;
  if (std::find(kDecomposed.begin(), kDecomposed.end(), c.op) != kDecomposed.end()) {  // the pick's rows
    for (const auto& row : rule_rows_for("pick_target", c.shapes, {})) out.insert("pick_target: " + row.str());
    return out;
  }
  for (const auto& row : rule_rows_for(c.op, c.shapes, attrs_of(c.op, c.attrs))) out.insert(c.op + ": " + row.str());
  return out;
}

// ---------------------------------------------------------------------------------------------
// Equivalence with the oracle, one test per op

// Operands Rd and P(avg) on one axis (mul, mm, div): the gradient contribution to the Rd operand
// is P(avg) where its cotangent asks for P(sum); the gradient-only RescalePartial step moves it.
bool rd_against_pavg(const std::vector<Names>& specs) {
  if (specs.size() != 2) return false;
  for (size_t a = 0; a < specs[0].size(); ++a) {
    std::set<std::string> pair{specs[0][a], specs[1][a]};
    if (pair == std::set<std::string>{"Rd", "P(avg)"}) return true;
  }
  return false;
}

// Runs every case under both redistribution modes; reports up to `max_failures`.
void expect_cases_pass(const std::vector<OpCase>& cases, int max_failures = 10) {
  int failures = 0;
  for (const auto& c : cases) {
    for (const char* mode : {"above_autograd", "below_autograd"}) {
      Scenario sc = scenario_of(c);
      set_option(sc.options, "redistribute", mode);
      json r = run(sc);
      if (passes(r, c.config.op)) continue;
      ADD_FAILURE() << c.name() << " " << mode << "\n"
                    << (r["status"] == "error" ? r["error"] : r["failures"]).dump() << "\n"
                    << r["collectives"].dump();
      if (++failures == max_failures) {
        ADD_FAILURE() << "more failures not shown";
        return;
      }
    }
  }
}

class OpEquivalence : public ::testing::TestWithParam<std::string> {};

TEST_P(OpEquivalence, ValueAndGradientMatchTheOracle) {
  const std::vector<OpCase> run_here = cases(GetParam());
  ASSERT_FALSE(run_here.empty());
  expect_cases_pass(run_here);
}

// The cases above include an Rd operand against a P(avg) one (the rescaled gradient).
TEST(OpCases, IncludeRdAgainstPAvg) {
  std::vector<OpCase> mixed;
  for (const char* op : {"div", "mm", "mul"})
    for (const auto& c : cases(op))
      if (rd_against_pavg(c.specs)) mixed.push_back(c);
  EXPECT_EQ(mixed.size(), 64u);
}

INSTANTIATE_TEST_SUITE_P(Ops, OpEquivalence, ::testing::ValuesIn(tested_ops()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// ---------------------------------------------------------------------------------------------
// The tables

TEST(OpTables, EveryOpOfTheContractHasAFamilyAndIsImplemented) {
  Names in_families = tested_ops();
  std::sort(in_families.begin(), in_families.end());
  Names expected;
  for (const auto& op : known_ops())
    // linear, split and chunk run as other ops (transpose, matmul, add; narrow per piece); creation
    // ops have no operand to place; to_local and from_local end local code, whose placements are
    // asserted, not propagated.
    if (op != "local_map" && op != "redistribute" && op != "linear" && op != "split" && op != "chunk" &&
        !is_creation_op(op) && op != "to_local" && op != "from_local")
      expected.push_back(op);
  EXPECT_EQ(in_families, expected);
  for (const auto& op : in_families)
    EXPECT_NE(std::find(implemented_ops().begin(), implemented_ops().end(), op), implemented_ops().end()) << op;
  for (const auto& f : rule_families()) EXPECT_TRUE(std::is_sorted(f.ops.begin(), f.ops.end())) << f.name;
}

TEST(OpTables, RowsPrintAndParseBackInBothSpellings) {
  size_t checked = 0;
  for (const auto& op : tested_ops()) {
    if (std::find(kDecomposed.begin(), kDecomposed.end(), op) != kDecomposed.end()) continue;
    for (const auto& c : configs(op)) {
      for (const auto& row : rule_rows_for(op, c.shapes, attrs_of(op, c.attrs))) {
        RuleRow back = RuleRow::parse(row.str());
        EXPECT_EQ(back.str(), row.str());
        EXPECT_EQ(back.ins, row.ins) << row.str();
        EXPECT_EQ(back.out, row.out) << row.str();
        std::string pytorch;
        for (size_t i = 0; i < row.ins.size(); ++i) pytorch += (i ? ", " : "") + row.ins[i].pytorch_str();
        pytorch += " -> " + row.out.pytorch_str();
        EXPECT_EQ(RuleRow::parse(pytorch).str(), row.str()) << pytorch;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100u);
  EXPECT_THROW(RuleRow::parse("S(0), R"), std::invalid_argument);
  EXPECT_THROW(RuleRow::parse("S(0), X -> R"), std::invalid_argument);
}

TEST(OpTables, TablesAreTheStatedRows) {
  auto texts = [](const std::string& op, std::vector<int64_t> ranks, const json& attrs) {
    Names out;
    for (const auto& r : rule_rows(op, ranks, attrs_of(op, attrs))) out.push_back(r.str());
    return out;
  };
  EXPECT_EQ(texts("neg", {2}, {}), (Names{"S(0) -> S(0)", "S(1) -> S(1)", "R -> R", "P(sum) -> P(sum)", "P(avg) -> P(avg)"}));
  EXPECT_EQ(texts("exp", {2}, {}), (Names{"S(0) -> S(0)", "S(1) -> S(1)", "R -> R"}));
  EXPECT_EQ(texts("div", {1, 1}, {}),
            (Names{"S(0), S(0) -> S(0)", "R, R -> R", "P(sum), R -> P(sum)", "P(avg), R -> P(avg)"}));
  EXPECT_EQ(texts("transpose", {3}, {{"dim0", 0}, {"dim1", -1}}),
            (Names{"S(0) -> S(2)", "S(1) -> S(1)", "S(2) -> S(0)", "R -> R", "P(sum) -> P(sum)",
                   "P(avg) -> P(avg)", "P(max) -> P(max)", "P(min) -> P(min)"}));
  EXPECT_EQ(texts("mean", {2}, {{"dim", 0}}),
            (Names{"S(0) -> P(sum)", "S(1) -> S(0)", "R -> R", "P(sum) -> P(sum)", "P(avg) -> P(avg)"}));
  EXPECT_EQ(texts("sum", {2}, {{"dim", -1}, {"keepdim", true}}), texts("sum", {2}, {{"dim", 1}, {"keepdim", true}}));
  EXPECT_EQ(texts("softmax", {2}, {{"dim", 1}}), (Names{"S(0) -> S(0)", "R -> R"}));
}

TEST(OpTables, EveryRowIsChosenBySomeCase) {
  std::set<std::string> all, hit;
  size_t n = 0;
  for (const auto& op : tested_ops()) {
    for (const auto& c : cases(op)) {
      auto rows = table_rows(c.config);
      all.insert(rows.begin(), rows.end());
      for (const auto& r : chosen_rows(scenario_of(c))) hit.insert(r);
      ++n;
    }
  }
  Names missing;
  for (const auto& r : all)
    if (!hit.count(r)) missing.push_back(r);
  EXPECT_TRUE(missing.empty()) << "rows no case chooses:\n" << json(missing).dump(1);
  EXPECT_GT(all.size(), 60u);
  std::cout << n << " cases choose all " << all.size() << " rows\n";
}

// ---------------------------------------------------------------------------------------------
// Shapes

void expect_shape_error(const std::string& op, std::vector<Shape> shapes, const json& attrs,
                        const std::string& message) {
  try {
    infer_shape(op, shapes, attrs_of(op, attrs));
    ADD_FAILURE() << op << attrs.dump() << ": no error, expected " << message;
  } catch (const SemanticError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::ShapeMismatch) << e.what();
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

TEST(OpShapes, Results) {
  auto shape = [](const std::string& op, std::vector<Shape> s, const json& attrs) {
    return infer_shape(op, s, attrs_of(op, attrs));
  };
  EXPECT_EQ(shape("div", {{5, 3}, {5, 3}}, {}), (Shape{5, 3}));
  EXPECT_EQ(shape("scale", {{5, 3}}, {{"value", 2}}), (Shape{5, 3}));
  EXPECT_EQ(shape("transpose", {{3, 5, 2}}, {{"dim0", -1}, {"dim1", 0}}), (Shape{2, 5, 3}));
  EXPECT_EQ(shape("mean", {{5, 3}}, {{"dim", -2}}), (Shape{3}));
  EXPECT_EQ(shape("mean", {{5, 3}}, {{"keepdim", true}}), (Shape{1, 1}));
  EXPECT_EQ(shape("sum", {{5, 3}}, {}), (Shape{}));
  EXPECT_EQ(shape("softmax", {{5, 3}}, {{"dim", 1}}), (Shape{5, 3}));
}

TEST(OpShapes, ErrorsNameTheOpAndTheShapes) {
  expect_shape_error("add", {{5, 3}, {3, 5}}, {}, "add: operand shapes [5, 3] and [3, 5] do not broadcast");
  expect_shape_error("div", {{5, 3}, {5}}, {}, "div: operand shapes [5, 3] and [5] do not broadcast");
  expect_shape_error("bmm", {{2, 5, 3}, {3, 3, 4}}, {}, "bmm: batch dims differ: [2, 5, 3] @ [3, 3, 4]");
  expect_shape_error("matmul", {{5, 3}, {4}}, {}, "matmul: inner dims differ: [5, 3] @ [4]");
  expect_shape_error("matmul", {{2, 5, 3}, {3, 3, 4}}, {}, "matmul: operand shapes [2] and [3] do not broadcast");
  expect_shape_error("view", {{5, 3}}, {{"shape", {4, -1}}}, "view: [4, -1] cannot hold the 15 elements of [5, 3]");
  expect_shape_error("reshape", {{5, 3}}, {{"shape", {4, 4}}}, "reshape: [4, 4] holds 16 elements, [5, 3] holds 15");
  expect_shape_error("expand", {{5, 3}}, {{"shape", {5, 4}}}, "expand: cannot expand [5, 3] to [5, 4] (dim 1)");
  expect_shape_error("permute", {{5, 3}}, {{"dims", {0, 0}}}, "permute: dims [0,0] name a dim twice");
  expect_shape_error("narrow", {{5, 3}}, {{"dim", 0}, {"start", 3}, {"length", 3}}, "narrow: start 3 and length 3 out of range");
  expect_shape_error("cat", {{5, 3}, {5, 2}}, {{"dim", 0}}, "cat: operand shapes differ: [5, 3] and [5, 2]");
  expect_shape_error("sum", {{5, 3}}, {{"dim", {0, -2}}}, "sum: dim -2 appears twice");
  expect_shape_error("mm", {{5, 3}, {5, 3}}, {}, "mm: inner dims differ: [5, 3] @ [5, 3]");
  expect_shape_error("mm", {{5, 3, 1}, {3, 5}}, {}, "mm: needs 2-D operands");
  expect_shape_error("transpose", {{5, 3}}, {{"dim0", 0}, {"dim1", 2}}, "transpose: dim1 2 out of range for [5, 3]");
  expect_shape_error("transpose", {{5, 3}}, {{"dim0", -3}, {"dim1", 0}}, "transpose: dim0 -3 out of range");
  expect_shape_error("sum", {{5, 3}}, {{"dim", 2}}, "sum: dim 2 out of range for [5, 3]");
  expect_shape_error("mean", {{5, 3}}, {{"dim", -3}}, "mean: dim -3 out of range for [5, 3]");
  expect_shape_error("softmax", {{5}}, {{"dim", 1}}, "softmax: dim 1 out of range for [5]");
  expect_shape_error("softmax", {{5}}, json::object(), "softmax: needs a dim");
  expect_shape_error("neg", {{5}, {5}}, {}, "neg: takes 1 operand(s), got 2");
  try {
    infer_shape("conv", {{5}}, {});
    ADD_FAILURE() << "no error for an unknown op";
  } catch (const SemanticError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::UnsupportedOp);
  }
}

TEST(OpShapes, AScenarioWithABadDimIsAShapeMismatch) {
  OpCase c{{"transpose", {{"dim0", 0}, {"dim1", 1}}, {{5, 3}}}, {4}, {{"S(0)"}}};
  json doc = scenario_json(c);
  doc["program"][0]["dim1"] = 5;
  json r = run(parse_scenario(doc, "bad_dim"));
  EXPECT_EQ(r["status"], "error");
  EXPECT_EQ(r["error"]["kind"], "shape_mismatch") << r.dump();
}

// ---------------------------------------------------------------------------------------------
// Redistributions the rules ask for

// The forward collectives of a forward-only run of y = op(x).
json forward_only(const std::string& op, const json& attrs, const Shape& shape, const Names& spec, json* result = nullptr) {
  OpCase c{{op, attrs, {shape}}, Shape(spec.size(), 4), {spec}};
  json doc = scenario_json(c);
  doc.erase("backward");
  doc["program"] = json::array({doc["program"][0]});
  doc["inputs"] = json::array({doc["inputs"][0]});
  doc["inputs"][0]["requires_grad"] = false;
  json r = run(parse_scenario(doc, c.name()));
  EXPECT_TRUE(passes(r, op)) << r.dump(1);
  if (result) *result = r;
  json out = json::array();
  for (const auto& e : r["collectives"]) out.push_back(e["op"]);
  return out;
}

TEST(OpRedistribution, SoftmaxGathersItsShardedDim) {
  json r;
  EXPECT_EQ(forward_only("softmax", {{"dim", 1}}, {5, 3}, {"S(1)"}, &r), json::array({"all_gather"}));
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"R"}));
  EXPECT_EQ(forward_only("softmax", {{"dim", -1}}, {5, 3}, {"S(0)"}, &r), json::array());
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"S(0)"}));
  EXPECT_EQ(forward_only("softmax", {{"dim", 0}}, {5, 3}, {"P(sum)"}, &r), json::array({"all_reduce"}));
}

TEST(OpRedistribution, NonLinearOpsReduceAPartialFirst) {
  json r;
  for (const char* op : {"exp", "relu", "sin", "tanh"}) {
    EXPECT_EQ(forward_only(op, json::object(), {5, 3}, {"P(sum)"}, &r), json::array({"all_reduce"})) << op;
    EXPECT_EQ(r["values"]["y"]["placements"], json::array({"R"})) << op;
  }
  EXPECT_EQ(forward_only("exp", json::object(), {5, 3}, {"S(1)", "P(avg)"}, &r), json::array({"all_reduce"}));
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"S(1)", "R"}));
}

TEST(OpRedistribution, LinearOpsKeepAPartial) {
  json r;
  EXPECT_EQ(forward_only("neg", json::object(), {5, 3}, {"P(sum)"}, &r), json::array());
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"P(sum)"}));
  EXPECT_EQ(forward_only("scale", {{"value", -2}}, {5, 3}, {"P(avg)"}, &r), json::array());
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"P(avg)"}));
  EXPECT_EQ(forward_only("transpose", {{"dim0", 0}, {"dim1", 1}}, {5, 3}, {"P(max)", "S(0)"}, &r), json::array());
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"P(max)", "S(1)"}));
  // neg would turn P(max) into P(min): reduced first.
  EXPECT_EQ(forward_only("neg", json::object(), {5, 3}, {"P(max)"}, &r), json::array({"all_reduce"}));
}

TEST(OpRedistribution, DivTakesAPartialOnlyInTheNumerator) {
  Mesh mesh({"a"}, {4});
  auto d = propagate("div", mesh, {{parse_placement("P(sum)")}, {parse_placement("P(sum)")}}, {{5, 3}, {5, 3}}, {});
  EXPECT_EQ(spec_str(d.in_specs[0]), "[P(sum)]");
  EXPECT_EQ(spec_str(d.in_specs[1]), "[R]");
  EXPECT_EQ(spec_str(d.out_spec), "[P(sum)]");
  // A Partial denominator is reduced: to S(0) (a reduce_scatter, the numerator chunked locally)
  // is cheaper than to R.
  d = propagate("div", mesh, {{parse_placement("R")}, {parse_placement("P(avg)")}}, {{5, 3}, {5, 3}}, {});
  EXPECT_EQ(spec_str(d.in_specs[0]), "[S(0)]");
  EXPECT_EQ(spec_str(d.in_specs[1]), "[S(0)]");
  EXPECT_EQ(spec_str(d.out_spec), "[S(0)]");
}

// ---------------------------------------------------------------------------------------------
// mean over uneven shards

TEST(OpMean, LocalSumsOverTheGlobalCountAddUpToTheMean) {
  // 5 rows over 4 ranks: 2, 2, 1, 0 rows.
  at::Tensor x = at::arange(15, at::kDouble).reshape({5, 3});
  OpAttrs a = attrs_of("mean", {{"dim", 0}});
  OpAttrs local = with_global_shape("mean", a, {5, 3});
  ASSERT_TRUE(local.mean_divisor.has_value());
  EXPECT_EQ(*local.mean_divisor, 5);
  EXPECT_EQ(*with_global_shape("mean", attrs_of("mean", json::object()), {5, 3}).mean_divisor, 15);
  EXPECT_EQ(*with_global_shape("mean", attrs_of("mean", {{"dim", -1}}), {5, 3}).mean_divisor, 3);
  EXPECT_EQ(*with_global_shape("mean", attrs_of("mean", {{"dim", {0, 1}}}), {5, 3}).mean_divisor, 15);
  EXPECT_FALSE(with_global_shape("sum", attrs_of("sum", {{"dim", 0}}), {5, 3}).mean_divisor.has_value());
  at::Tensor total = at::zeros({3}, at::kDouble);
  for (const auto& chunk : x.chunk(4, 0)) total = total + local_op("mean", local, {chunk});
  for (const auto& chunk : at::split(x, {2, 2, 1, 0}, 0)) EXPECT_FALSE(local_op("mean", local, {chunk}).isnan().any().item<bool>());
  EXPECT_TRUE(at::allclose(total, local_op("mean", a, {x}))) << total;
  EXPECT_TRUE(at::allclose(local_op("mean", a, {x}), at::mean(x, {0})));
}

TEST(OpMean, UnevenShardsOfTheReducedDimAreAPartialSum) {
  // forward_only() expects the oracle's value (within 1e-9: mean is inexact).
  for (const char* spec : {"S(0)", "P(avg)"}) {
    json r;
    forward_only("mean", {{"dim", 0}}, {5, 3}, {spec}, &r);
    EXPECT_EQ(r["values"]["y"]["placements"], json::array({spec == std::string("S(0)") ? "P(sum)" : "P(avg)"}));
    EXPECT_EQ(r["collectives"], json::array());
  }
  // One row over four ranks: three of them hold nothing (a mean of nothing would be NaN).
  json r;
  forward_only("mean", json::object(), {1, 3}, {"S(0)"}, &r);
  EXPECT_EQ(r["values"]["y"]["placements"], json::array({"P(sum)"}));
}

// The mean of an empty tensor is NaN (PyTorch's torch.mean); on the mesh each rank's local sum
// (0) over the global count (0) is NaN too, and the two agree: replicated NaN locals are equal
// replicas, and NaN against NaN is no difference.
TEST(OpMean, MeanOfAnEmptyTensorIsNaNOnTheMeshAndInTheOracle) {
  for (const Names& spec : {Names{"R"}, Names{"S(0)"}, Names{"S(1)"}, Names{"P(sum)"}})
    for (const json& attrs : {json::object(), json({{"dim", 0}})}) {
      SCOPED_TRACE(json(spec).dump() + " " + attrs.dump());
      OpCase c{{"mean", attrs, {{0, 3}}}, Shape(spec.size(), 2), {spec}};
      json doc = scenario_json(c);
      Scenario sc = parse_scenario(doc, c.name());
      CheckedRun run = check_scenario(sc, sc.options);
      EXPECT_EQ(run.result["status"], "pass") << run.result.dump(1);
      // Both sides are NaN (not 0): the mesh's y assembled from its locals, and torch.mean.
      SimRun sim = run_distributed(sc, sc.options);
      const DTensor& y = sim.values.at("y");
      EXPECT_TRUE(assemble(sc.mesh, y.spec, y.locals).isnan().all().item<bool>());
      EXPECT_TRUE(local_op("mean", attrs_of("mean", attrs), {at::zeros({0, 3}, at::kDouble)}).isnan().all().item<bool>());
    }
}

// A program of exact ops compares bit for bit; one inexact op anywhere (a local_map body or
// reference included) allows a relative 1e-12; float32 1e-4.
TEST(OpTolerance, ExactOnlyWithoutInexactOps) {
  const std::string root = MESHSIM_SOURCE_DIR;
  auto tol = [](const json& doc) {
    Scenario sc = parse_scenario(doc, "<test>");
    return comparison_tolerance(sc, sc.options);
  };
  json fsdp = read_json_file(root + "/examples/fsdp_reduced.json");  // redistribute, mm, sum
  EXPECT_EQ(tol(fsdp), 0.0);
  for (const char* op : {"exp", "tanh", "sin"}) {
    json d = fsdp;
    d["program"][1] = {{"out", "y"}, {"op", op}, {"args", {"x"}}};
    EXPECT_EQ(tol(d), 1e-12) << op;
  }
  json d = fsdp;
  d["program"][2] = {{"out", "loss"}, {"op", "mean"}, {"args", {"y"}}};
  EXPECT_EQ(tol(d), 1e-12);
  d["program"][2] = {{"out", "loss"}, {"op", "softmax"}, {"args", {"y"}}, {"dim", 1}};
  EXPECT_EQ(tol(d), 1e-12);
  for (double v : {2.0, -3.0, 0.5, -0.25, 0.0}) {
    d["program"][2] = {{"out", "loss"}, {"op", "scale"}, {"args", {"y"}}, {"value", v}};
    EXPECT_EQ(tol(d), 0.0) << v;
  }
  for (double v : {0.1, 1.5, -2.0 / 3}) {
    d["program"][2] = {{"out", "loss"}, {"op", "scale"}, {"args", {"y"}}, {"value", v}};
    EXPECT_EQ(tol(d), 1e-12) << v;
  }
  json lm = read_json_file(root + "/examples/lm_fsdp_reduced.json");  // all_gather, mm, sum
  EXPECT_EQ(tol(lm), 0.0);
  json body = lm, ref = lm;
  body["program"][0]["body"][2] = {{"out", "s"}, {"op", "mean"}, {"args", {"y"}}};
  EXPECT_EQ(tol(body), 1e-12);
  ref["program"][0]["reference"][1] = {{"out", "s"}, {"op", "div"}, {"args", {"y", "y"}}};
  EXPECT_EQ(tol(ref), 1e-12);
  json f32 = fsdp;
  f32["options"] = {{"dtype", "float32"}};
  EXPECT_EQ(tol(f32), 1e-4);
  json odd = fsdp;
  odd["mesh"]["shape"] = {3};
  EXPECT_EQ(tol(odd), 1e-12);
}

// mean of 5 rows over 4 ranks: the local sums over 5 add up to the oracle's mean up to rounding
// (mean is inexact), which passes; it used to fail its bit-for-bit comparison on this
// power-of-two mesh.
TEST(OpTolerance, MeanOverUnevenShardsPassesWithinRounding) {
  json r;
  forward_only("mean", {{"dim", 0}}, {5, 3}, {"S(0)"}, &r);
  EXPECT_EQ(r["status"], "pass") << r.dump(1);
}

TEST(OpAttrsText, EveryFieldIsInTheKey) {
  OpAttrs a = attrs_of("transpose", {{"dim0", 0}, {"dim1", 2}});
  OpAttrs b = attrs_of("transpose", {{"dim0", 1}, {"dim1", 2}});
  EXPECT_NE(a.str(), b.str());
  EXPECT_NE(attrs_of("scale", {{"value", 2}}).str(), attrs_of("scale", {{"value", 3}}).str());
  EXPECT_NE(attrs_of("scale", {{"value", 1.0000001}}).str(), attrs_of("scale", {{"value", 1.0000002}}).str());
  EXPECT_EQ(attrs_of("sum", {{"dim", 1}, {"keepdim", true}}).str(),
            "dim=1 dims=[] dims_given=0 keepdim=1 value=1 scalar=0 dim0=0 dim1=0 shape=[] sizes=[] start_dim=0 end_dim=-1 "
            "start=0 length=0 split_size=0 chunks=0 tanh=0 exponent=1 diagonal=0 normalized_shape=[] eps=- sum_reduction=0 "
            "no_reduction=0 label_smoothing=0 ignore_index=- fill=0 k=1 largest=1 descending=0 float32=0 ord=2 dtype=- "
            "range=- divisor=- local_mean=0 local_shape=- p=0.5 training=1 repeats=1 is_causal=0 attn_scale=nan "
            "enable_gqa=0 stream= seed=0 step=-1 microbatch=-1 global=[] "
            "clamp_min=- clamp_max=- num_classes=0 minlength=0");
  EXPECT_NE(attrs_of("topk", {{"k", 2}}).str(), attrs_of("topk", {{"k", 3}}).str());
  EXPECT_NE(attrs_of("topk", {{"k", 2}, {"largest", false}}).str(), attrs_of("topk", {{"k", 2}}).str());
  EXPECT_NE(attrs_of("sort", {{"descending", true}}).str(), attrs_of("sort", json::object()).str());
  EXPECT_NE(attrs_of("linalg_vector_norm", {{"ord", 3}}).str(), attrs_of("linalg_vector_norm", json::object()).str());
  OpAttrs pytorch_mean = attrs_of("mean", {{"dim", 0}});
  pytorch_mean.local_mean = true;  // semantics pytorch: P(avg) of local means, another decision
  EXPECT_NE(pytorch_mean.str(), attrs_of("mean", {{"dim", 0}}).str());
  EXPECT_NE(attrs_of("gelu", {{"approximate", "tanh"}}).str(), attrs_of("gelu", json::object()).str());
  EXPECT_NE(attrs_of("masked_fill", {{"value", "-inf"}}).str(), attrs_of("masked_fill", {{"value", 0}}).str());
  EXPECT_NE(attrs_of("nll_loss", {{"ignore_index", 0}}).str(), attrs_of("nll_loss", json::object()).str());
  EXPECT_NE(attrs_of("nll_loss", {{"reduction", "none"}}).str(), attrs_of("nll_loss", json::object()).str());
  EXPECT_NE(attrs_of("cross_entropy", {{"label_smoothing", 0.1}}).str(), attrs_of("cross_entropy", json::object()).str());
  EXPECT_NE(attrs_of("to", {{"dtype", "bfloat16"}}).str(), attrs_of("to", {{"dtype", "float16"}}).str());
  EXPECT_NE(attrs_of("dropout", {{"p", 0.1}}).str(), attrs_of("dropout", json::object()).str());
  OpAttrs ranged = attrs_of("embedding", json::object());
  ranged.range = Chunk{2, 3};
  EXPECT_NE(ranged.str(), attrs_of("embedding", json::object()).str());
  EXPECT_NE(attrs_of("permute", {{"dims", {0, 1}}}).str(), attrs_of("permute", {{"dims", {1, 0}}}).str());
  EXPECT_NE(attrs_of("view", {{"shape", {2, 3}}}).str(), attrs_of("view", {{"shape", {3, 2}}}).str());
  EXPECT_NE(attrs_of("clamp", {{"min", 0}}).str(), attrs_of("clamp", {{"max", 0}}).str());
  EXPECT_NE(attrs_of("clamp", {{"min", 0}, {"max", 1}}).str(), attrs_of("clamp", {{"min", 0}, {"max", 2}}).str());
  EXPECT_NE(attrs_of("one_hot", {{"num_classes", 3}}).str(), attrs_of("one_hot", {{"num_classes", 4}}).str());
  EXPECT_NE(attrs_of("bincount", {{"minlength", 3}}).str(), attrs_of("bincount", {{"minlength", 4}}).str());
  EXPECT_NE(attrs_of("repeat_interleave", {{"repeats", 2}}).str(), attrs_of("repeat_interleave", {{"repeats", 3}}).str());
  EXPECT_NE(attrs_of("scaled_dot_product_attention", {{"is_causal", true}}).str(),
            attrs_of("scaled_dot_product_attention", json::object()).str());
  EXPECT_NE(attrs_of("scaled_dot_product_attention", {{"scale", 0.5}}).str(),
            attrs_of("scaled_dot_product_attention", {{"scale", 0.50000001}}).str());
  EXPECT_NE(attrs_of("scaled_dot_product_attention", {{"enable_gqa", true}}).str(),
            attrs_of("scaled_dot_product_attention", json::object()).str());
}

}  // namespace
}  // namespace meshsim

namespace meshsim {
namespace {

// split and chunk (one narrow per piece): every piece and the operand's gradient match the oracle
// for a shard of the cut dim, of another dim, and Partial operands; a wrong number of outs is a
// shape_mismatch naming the op.
TEST(OpSplit, PiecesMatchTheOracleAndCountTheOuts) {
  // The scenario around a split: x [5, 6] laid out by `spec`; the program is set per case.
  auto doc = [](const json& split, const Names& spec, const Shape& mesh) {
    json axes = mesh.size() == 1 ? json::array({"a"}) : json::array({"a", "b"});
    return json{{"format", "meshsim.scenario/1"},
                {"name", "split"},
                {"mesh", {{"axes", axes}, {"shape", mesh}}},
                {"inputs", {{{"name", "x"}, {"shape", {5, 6}}, {"placements", spec}, {"requires_grad", true}}}},
                {"program", json::array({split})},
                {"backward", "acc" + std::to_string(split["outs"].size() - 1)}};
  };
  const std::vector<json> splits = {
      {{"outs", {"a", "b", "c"}}, {"op", "split"}, {"args", {"x"}}, {"size", 2}, {"dim", -1}},
      {{"outs", {"a", "b"}}, {"op", "split"}, {"args", {"x"}}, {"sizes", {4, 1}}},
      {{"outs", {"a", "b", "c"}}, {"op", "chunk"}, {"args", {"x"}}, {"chunks", 3}, {"dim", 0}},
      {{"outs", {"a", "b", "c"}}, {"op", "chunk"}, {"args", {"x"}}, {"chunks", 4}, {"dim", 1}}};
  int runs = 0;
  for (const auto& sp : splits)
    for (const auto& mesh : {Shape{3}, Shape{2, 2}})
      for (const Names& spec : {Names{"S(0)"}, Names{"S(1)"}, Names{"P(sum)"}, Names{"Rd"}, Names{"S(0)", "S(1)"},
                                Names{"P(avg)", "S(0)"}}) {
        if (spec.size() != mesh.size()) continue;
        json d = doc(sp, spec, mesh);
        // The program: the split, then acc0 = sum(piece 0), acc_k = acc_{k-1} + sum(piece_k^2).
        json program = json::array({sp, {{"out", "acc0"}, {"op", "sum"}, {"args", {sp["outs"][0]}}}});
        for (size_t k = 1; k < sp["outs"].size(); ++k) {
          const std::string r = "r" + std::to_string(k), q = "q" + std::to_string(k);
          program.push_back({{"out", r}, {"op", "mul"}, {"args", {sp["outs"][k], sp["outs"][k]}}});
          program.push_back({{"out", q}, {"op", "sum"}, {"args", {r}}});
          program.push_back({{"out", "acc" + std::to_string(k)}, {"op", "add"}, {"args", {q, "acc" + std::to_string(k - 1)}}});
        }
        d["program"] = program;
        for (const char* mode : {"above_autograd", "below_autograd"}) {
          Scenario sc = parse_scenario(d, "split");
          set_option(sc.options, "redistribute", mode);
          const json r = run(sc);
          EXPECT_EQ(r["status"], "pass") << sp.dump() << " " << json(spec).dump() << " " << mode << "\n" << r.dump(1);
          ++runs;
        }
      }
  EXPECT_EQ(runs, 48);
  // Two names for three pieces.
  json d = doc(splits[0], {"S(0)"}, {3});
  d["program"] = json::array({{{"outs", {"a", "b"}}, {"op", "split"}, {"args", {"x"}}, {"size", 2}, {"dim", -1}},
                              {{"out", "l"}, {"op", "sum"}, {"args", {"a"}}}});
  d["backward"] = "l";
  const json r = run(parse_scenario(d, "split"));
  EXPECT_EQ(r["status"], "error") << r.dump(1);
  EXPECT_EQ(r["error"]["kind"], "shape_mismatch") << r.dump(1);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("/program/0: split of dim 1 of [5, 6] gives 3 pieces, outs names 2"),
            std::string::npos)
      << r.dump(1);
}

// gelu's gradient does not depend on the layout of the incoming gradient, in float32 too:
// libtorch's gelu_backward (approximate none) leaves its float32 result unwritten for a gradient
// strided otherwise than the input (pytorch/pytorch#112006), which the kernel works around.
TEST(OpKernels, GeluGradientIgnoresTheIncomingGradientsLayout) {
  for (auto dtype : {at::kFloat, at::kDouble})
    for (const char* approximate : {"none", "tanh"}) {
      SCOPED_TRACE(std::string(approximate) + (dtype == at::kFloat ? " float32" : " float64"));
      OpAttrs attrs;
      attrs.tanh = std::string(approximate) == "tanh";
      const at::Tensor x = at::arange(-8, 9, at::kDouble).div(3).reshape({17, 1}).expand({17, 17}).contiguous();
      const at::Tensor g = (at::arange(17 * 17, at::kDouble).reshape({17, 17}).remainder(7) - 3).to(dtype);
      auto grad_with = [&](const at::Tensor& incoming) {
        const at::Tensor xi = x.to(dtype).requires_grad_(true);
        const at::Tensor y = local_op("gelu", attrs, {xi});
        return torch::autograd::grad({y}, {xi}, {incoming})[0];
      };
      const at::Tensor strided = g.t().contiguous().t();  // the same values, column-major
      ASSERT_FALSE(strided.is_contiguous());
      const at::Tensor want = grad_with(g), got = grad_with(strided);
      EXPECT_TRUE(at::isfinite(got).all().item<bool>());
      EXPECT_LE((got - want).abs().max().item<double>(), dtype == at::kFloat ? 1e-6 : 1e-15);
      EXPECT_GT(want.abs().max().item<double>(), 1.0);  // not the zeros of an unwritten result
    }
}

// amax / amin split the gradient among the elements equal to the extremum. Where the mesh's
// operand and the oracle's differ by rounding, the two may break a tie otherwise; the oracle then
// takes the mesh's tie set (oracles/oracle.h) and the run passes. A kernel that sends the whole
// gradient to one of the ties still fails.
TEST(OpExtrema, TiesBrokenByRoundingAreNotAFailure) {
  const std::string file = std::string(MESHSIM_SOURCE_DIR) + "/examples/regressions/amin_ties_reduced_weight.json";
  const json r = run(load_scenario(file));
  EXPECT_EQ(r["status"], "pass") << r.dump(1);
  // Exact ties: every element of a row of ones is the maximum.
  const json ties = {{"format", "meshsim.scenario/1"},
                     {"mesh", {{"axes", {"dp"}}, {"shape", {2}}}},
                     {"inputs", {{{"name", "x"}, {"shape", {4, 3}}, {"placements", {"S(0)"}}, {"init", "ones"},
                                  {"requires_grad", true}}}},
                     {"program", {{{"out", "m"}, {"op", "amax"}, {"args", {"x"}}, {"dim", 1}},
                                  {{"out", "loss"}, {"op", "sum"}, {"args", {"m"}}}}},
                     {"backward", "loss"}};
  Scenario tied = parse_scenario(ties, "ties");
  EXPECT_EQ(run(tied)["status"], "pass");
  set_option(tied.options, "mutant", "extremum_grad_first_tie");
  const json bug = run(tied);
  EXPECT_EQ(bug["status"], "fail") << bug.dump(1);
  EXPECT_EQ(bug["checks"]["gradient_equivalence"], false) << bug.dump(1);
}

}  // namespace
}  // namespace meshsim

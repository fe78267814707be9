// DTensor-mode local code (to_local ... from_local) drawn with the generator's own verdict: whether
// the local code is a correct SPMD program for the placements from_local asserts. The model is
// small and sound: each family below is a program shape whose verdict holds for every draw of it.
// The failing ones fail on every draw: their axis has two ranks or more, and their data make the
// failure show. x is ones where a wrong value or gradient is a count (a rank's share of the
// elements) times a constant the chain keeps nonzero (no relu of a negative constant; after the
// point where the data differ, only ops with a derivative nowhere zero and distinct values kept
// distinct), so no sum can cancel; a w added to every part of a P(sum) is ones; exp of a P(sum)'s
// integer parts never sums to the exp of their sum (sum_r e^(p_r) = e^(sum_r p_r) has no solution in
// integers over two ranks or more, and the parts, |p_r| <= 13, keep the difference far above the
// comparison's tolerance).
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "core/mesh.h"
#include "core/placement.h"
#include "properties/generators.h"
#include "properties/program_parts.h"
#include "properties/programs.h"

namespace meshsim::gen {

namespace {

using json = nlohmann::json;
using parts::op;
using parts::op_of;

// The local value a chain of local ops has reached, with what the model knows of it.
struct Chain {
  json program = json::array();
  std::string cur;            // the current local value
  int64_t rank = 2;           // its tensor rank
  std::vector<int64_t> dims;  // per mesh axis: the dim the value's layout shards there, -1 none
  double bound = 4.0;         // a bound on its magnitude (exp takes small operands only)
  bool rounded = false;       // an op that rounds made it (relu then never meets it: a kink at 0)
  bool exp_done = false;      // one exp a chain (no exp of exp)
  bool ones = false;          // every element is the same constant `kappa` (x initialized to ones)
  double kappa = 1.0;
  int next = 0;

  // Appends `name` on the current value (and `other`), naming the result.
  void push(const std::string& name, const std::vector<std::string>& others = {}, json extra = json::object()) {
    std::vector<std::string> args{cur};
    for (const auto& o : others) args.push_back(o);
    const std::string out = "t" + std::to_string(++next);
    program.push_back(op(out, name, args, std::move(extra)));
    cur = out;
  }
};

// The unary local ops: neg, scale (by a power of two or -1: exact), exp (once, of a small value),
// relu (of a value no rounding made, and under ones of a positive constant: its derivative is 1).
// `injective`: only ops that keep distinct values distinct and have a derivative nowhere zero.
void unary(Chain& c, bool injective) {
  std::vector<std::string> names = {"neg", "scale"};
  if (!c.exp_done && c.bound <= 13.0) names.push_back("exp");
  if (!injective && !c.rounded && (!c.ones || c.kappa > 0)) names.push_back("relu");
  const std::string name = *rc::gen::elementOf(names);
  if (name == "neg") {
    c.push("neg");
    c.kappa = -c.kappa;
  } else if (name == "scale") {
    const double v = *rc::gen::element(2.0, -1.0, 0.5, -2.0);
    c.push("scale", {}, {{"value", v}});
    c.kappa *= v;
    c.bound *= std::abs(v);
  } else if (name == "exp") {
    c.push("exp");
    c.kappa = std::exp(c.kappa);
    c.bound = std::exp(c.bound);
    c.rounded = c.exp_done = true;
  } else {
    c.push("relu");
    c.kappa = std::max(c.kappa, 0.0);
  }
}

// A binary op of the current value with w (its local, or its local marked varying), in either order
// (mul: a bound 4 times the value's; the others, add and sub, 4 more).
void with_w(Chain& c, const std::string& name, const std::string& w) {
  if (*rc::gen::arbitrary<bool>()) {
    c.push(name, {w});
  } else {
    const std::string out = "t" + std::to_string(++c.next);
    c.program.push_back(op(out, name, {w, c.cur}));
    c.cur = out;
  }
  c.bound = name == "mul" ? c.bound * 4.0 : c.bound + 4.0;
  c.rank = std::max<int64_t>(c.rank, 1);  // w is [1]
}

// Local sum over `dim` (keepdim false): the shards of later dims move down one.
void local_sum(Chain& c, int64_t dim, int64_t extent) {
  c.push("sum", {}, {{"dim", dim}});
  for (auto& d : c.dims)
    if (d > dim) --d;
  --c.rank;
  c.bound *= static_cast<double>(extent);
}

// The same local code as a local_map with check_variance false: to_local's results are the
// region's args (under the inputs' names), from_local's placements its out placements, and the
// reference is the code with each collective as the identity (`scale` by 1: the value as it is,
// which is what the oracle reads in DTensor mode too), so the verdict is the same.
json local_map_form(const json& program, const std::string& last, const std::vector<std::string>& yp, bool w_in) {
  static const std::set<std::string> collectives = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                                    "mark_varying"};
  const std::map<std::string, std::string> args_of = {{"xl", "x"}, {"wl", "w"}};
  auto renamed = [&](const std::string& v) { return args_of.count(v) ? args_of.at(v) : v; };
  json body = json::array(), reference = json::array();
  for (json o : program) {
    if (o["op"] == "to_local") continue;
    for (auto& a : o["args"]) a = renamed(a.get<std::string>());
    body.push_back(o);
    reference.push_back(collectives.count(o["op"].get<std::string>())
                            ? op(o["out"].get<std::string>(), "scale", {o["args"][0].get<std::string>()}, {{"value", 1}})
                            : o);
  }
  return {{"out", "y"},
          {"op", "local_map"},
          {"args", w_in ? json::array({"x", "w"}) : json::array({"x"})},
          {"check_variance", false},
          {"out_placements", json::array({json(yp)})},
          {"body", body},
          {"returns", json::array({renamed(last)})},
          {"reference", reference}};
}

enum class Family {
  ShardElementwise,      // pass: elementwise (and sums over unsharded dims) on shards and replicas
  MissingPvary,          // fail: a replicated w meets a shard without mark_varying; pass with it
  SumAllReduce,          // pass: a local sum over the sharded dim, all_reduce over that axis, from_local R
  SumNoAllReduce,        // fail: the same without the all_reduce
  PartialLinear,         // pass: P(sum) through linear ops only (w marked varying before a mul)
  PartialExp,            // fail: P(sum) through exp
  PartialPlusReplicate,  // fail: a replicated w added to every rank's part of a P(sum)
  AllGather,             // all_gather of a shard: pass to from_local Rd, fail to from_local R
};
constexpr int kFamilies = 8;

}  // namespace

LocalCodeCase local_code_program() {
  // Drawn at full size: every family from the first cases on (shrinks toward the first).
  const Family family = static_cast<Family>(*rc::gen::resize(100, rc::gen::inRange(0, kFamilies)));
  // Every family may fail but the pass-only ones: their axis has two ranks at least.
  const bool needs_group = family != Family::ShardElementwise && family != Family::SumAllReduce &&
                           family != Family::PartialLinear;
  const int ndim = *rc::gen::inRange(1, 3);
  const int key = *rc::gen::inRange(0, ndim);  // the mesh axis the family is about
  std::vector<std::string> axes;
  std::vector<int64_t> sizes;
  for (int a = 0; a < ndim; ++a) {
    axes.push_back(a == 0 ? "dp" : "tp");
    sizes.push_back(*rc::gen::inRange<int64_t>(a == key && needs_group ? 2 : 1, 5));
  }
  const Mesh mesh(axes, sizes);
  const Shape shape = {*rc::gen::inRange<int64_t>(1, 6), *rc::gen::inRange<int64_t>(1, 6)};
  const std::string& key_axis = axes[static_cast<size_t>(key)];
  const int64_t d = *rc::gen::inRange<int64_t>(0, 2);  // the dim the key axis shards

  json options = parts::draw_options({});
  if (*rc::gen::arbitrary<bool>()) {  // local code means the same under both profiles
    options["semantics"] = "pytorch";
    options["partial_from_replicate"] = "divide";  // rank0 is refused there
  }

  LocalCodeCase out;
  Chain c;
  c.cur = "xl";
  c.dims.assign(static_cast<size_t>(ndim), -1);
  std::vector<std::string> xp(static_cast<size_t>(ndim), "R");  // x's placements
  std::vector<std::string> yp;                                   // from_local's
  bool x_ones = false, w_in = false, w_used = false;
  std::string w_init = "int";
  std::vector<std::string> marked;  // the axes w is marked varying over, in order (its local is then wv)
  auto w_local = [&] { return marked.empty() ? std::string("wl") : std::string("wv"); };
  auto use_w = [&](const std::string& name) {
    with_w(c, name, w_local());
    w_used = true;
  };

  auto shard_x = [&](int a, int64_t dim) {
    xp[static_cast<size_t>(a)] = "S(" + std::to_string(dim) + ")";
    c.dims[static_cast<size_t>(a)] = dim;
  };
  auto dims_placements = [&] {
    std::vector<std::string> ps;
    for (int64_t s : c.dims) ps.push_back(s >= 0 ? "S(" + std::to_string(s) + ")" : "R");
    return ps;
  };
  auto linear = [&] {  // neg or scale
    if (*rc::gen::arbitrary<bool>()) {
      c.push("neg");
      c.kappa = -c.kappa;
    } else {
      const double v = *rc::gen::element(2.0, -1.0, 0.5, -2.0);
      c.push("scale", {}, {{"value", v}});
      c.bound *= std::abs(v);
      c.kappa *= v;
    }
  };

  switch (family) {
    case Family::ShardElementwise: {
      for (int a = 0; a < ndim; ++a) {
        const int choice = *rc::gen::inRange(0, 3);  // S(0), S(1), R
        if (choice < 2) shard_x(a, choice);
      }
      w_in = *rc::gen::arbitrary<bool>();
      if (w_in)  // w meets the shards: marked varying over every axis of two ranks or more that shards x
        for (int a = 0; a < ndim; ++a)
          if (c.dims[static_cast<size_t>(a)] >= 0 && (sizes[static_cast<size_t>(a)] > 1 || *rc::gen::arbitrary<bool>()))
            marked.push_back(axes[static_cast<size_t>(a)]);
      const int n = *rc::gen::inRange(1, 4);
      for (int i = 0; i < n; ++i) {
        const int kind = *rc::gen::inRange(0, 3);  // unary, binary with w, sum over a dim no axis shards
        std::vector<int64_t> free_dims;
        for (int64_t k = 0; k < c.rank; ++k)
          if (std::find(c.dims.begin(), c.dims.end(), k) == c.dims.end()) free_dims.push_back(k);
        if (kind == 1 && w_in) {
          use_w(op_of(GenClass::Binary));  // any pointwise op of w and x is right SPMD code here
        } else if (kind == 2 && !free_dims.empty()) {
          const int64_t k = *rc::gen::elementOf(free_dims);
          // The extent: a value of rank 2 has x's shape; of rank 1 after a sum of dim 0, x's dim 1,
          // and after a sum of dim 1, x's dim 0 (bounded by 5 either way).
          local_sum(c, k, 5);
        } else {
          unary(c, false);
        }
      }
      yp = dims_placements();
      out.correct = true;
      out.why = "elementwise local code on shards and replicas (and sums over unsharded dims), w marked varying "
                "over every axis where it meets a shard";
      break;
    }
    case Family::MissingPvary: {
      shard_x(key, d);
      x_ones = c.ones = true;
      w_in = true;
      const bool pvary = *rc::gen::arbitrary<bool>();
      if (pvary) marked.push_back(key_axis);
      const int before = *rc::gen::inRange(0, 3);
      for (int i = 0; i < before; ++i) unary(c, false);
      use_w(*rc::gen::element<std::string>("mul", "add"));  // the ops whose wrong gradient of w shows
      c.ones = false;  // w's data are not ones
      if (*rc::gen::arbitrary<bool>()) unary(c, true);
      yp = dims_placements();
      out.correct = pvary;
      out.why = pvary ? "w is marked varying over " + key_axis + " before it meets the shard"
                      : "w meets a shard over " + key_axis +
                            " without mark_varying: its gradient is each rank's partial sum (the missing pvary)";
      break;
    }
    case Family::SumAllReduce:
    case Family::SumNoAllReduce: {
      const bool reduce = family == Family::SumAllReduce;
      shard_x(key, d);
      x_ones = c.ones = !reduce;
      w_in = *rc::gen::arbitrary<bool>();
      const int before = *rc::gen::inRange(0, 3);
      for (int i = 0; i < before; ++i) unary(c, !reduce);
      local_sum(c, d, shape[static_cast<size_t>(d)]);
      c.ones = false;  // the local extents differ
      if (reduce) {
        c.push("all_reduce", {}, {{"axis", key_axis}, {"reduce", "sum"}});
        c.dims[static_cast<size_t>(key)] = -1;
      }
      // After the sum, w (replicated) meets the reduced sum (replicated too) without mark_varying;
      // without the all_reduce, only adds and injective ops follow (the wrong sum stays visible).
      const int after = *rc::gen::inRange(0, 3);
      for (int i = 0; i < after; ++i) {
        if (w_in && *rc::gen::arbitrary<bool>()) use_w(reduce ? op_of(GenClass::Binary) : "add");
        else unary(c, !reduce);
      }
      if (w_in && !w_used) use_w("add");
      yp.assign(static_cast<size_t>(ndim), "R");
      out.correct = reduce;
      out.why = reduce ? "a local sum over the dim " + key_axis + " shards, all_reduced over " + key_axis + ", returned as R"
                       : "a local sum over the dim " + key_axis +
                             " shards returned as R without the all_reduce: each rank holds its own part";
      break;
    }
    case Family::PartialLinear:
    case Family::PartialExp:
    case Family::PartialPlusReplicate: {
      xp[static_cast<size_t>(key)] = "P(sum)";
      c.bound = 4.0 + 3.0 * static_cast<double>(sizes[static_cast<size_t>(key)] - 1);  // a rank's part
      if (family == Family::PartialLinear) {
        w_in = *rc::gen::arbitrary<bool>();
        if (w_in && (sizes[static_cast<size_t>(key)] > 1 || *rc::gen::arbitrary<bool>())) marked.push_back(key_axis);
        const int n = *rc::gen::inRange(1, 4);
        for (int i = 0; i < n; ++i) {
          const int kind = *rc::gen::inRange(0, 4);  // neg or scale, add of two P(sum) values, sum, mul by w
          if (kind == 1) {
            // xl only while the value has x's shape (no broadcast of xl's parts against a sum).
            c.push("add", {c.rank == 2 && *rc::gen::arbitrary<bool>() ? std::string("xl") : c.cur});
            c.bound *= 2.0;
          } else if (kind == 2 && c.rank > 0) {
            local_sum(c, *rc::gen::inRange<int64_t>(0, c.rank), 5);
          } else if (kind == 3 && w_in) {
            use_w("mul");
          } else {
            linear();
          }
        }
        if (w_in && !w_used) use_w("mul");
        out.correct = true;
        out.why = "P(sum) through linear ops only (w marked varying before it multiplies)";
      } else if (family == Family::PartialExp) {
        if (*rc::gen::arbitrary<bool>()) c.push("neg");
        c.push("exp");
        if (*rc::gen::arbitrary<bool>()) linear();
        out.correct = false;
        out.why = "P(sum) through exp: the sum of the exps of the parts is not the exp of their sum";
      } else {
        w_in = true;
        w_init = "ones";
        if (*rc::gen::arbitrary<bool>()) marked.push_back(key_axis);
        if (*rc::gen::arbitrary<bool>()) linear();
        use_w("add");
        if (*rc::gen::arbitrary<bool>()) linear();
        out.correct = false;
        out.why = "a replicated w added to every rank's part of a P(sum): the sum counts it once a rank";
      }
      yp.assign(static_cast<size_t>(ndim), "R");
      yp[static_cast<size_t>(key)] = "P(sum)";
      break;
    }
    case Family::AllGather: {
      shard_x(key, d);
      const bool to_reduced = *rc::gen::arbitrary<bool>();
      x_ones = c.ones = !to_reduced;
      if (*rc::gen::arbitrary<bool>()) unary(c, !to_reduced);
      c.push("all_gather", {}, {{"axis", key_axis}, {"dim", d}});
      c.dims[static_cast<size_t>(key)] = -1;
      if (*rc::gen::arbitrary<bool>()) unary(c, !to_reduced);
      yp = dims_placements();
      yp[static_cast<size_t>(key)] = to_reduced ? "Rd" : "R";
      out.correct = to_reduced;
      out.why = to_reduced ? "a shard all_gathered over " + key_axis +
                                 " and returned as Rd: the backward reduce_scatters its P(sum) cotangent"
                           : "a shard all_gathered over " + key_axis +
                                 " and returned as R: the backward reduce_scatter sums every rank's copy of the "
                                 "replicated gradient (n times the gradient)";
      break;
    }
  }

  // The program: to_local of each input, w marked varying where the family says, the chain (its
  // last value named m, the value the loss weighs), from_local and loss = sum.
  json program = json::array();
  program.push_back(op("xl", "to_local", {"x"}));
  if (w_in) {
    program.push_back(op("wl", "to_local", {"w"}));
    std::string prev = "wl";
    for (size_t i = 0; i < marked.size(); ++i) {
      const std::string o = i + 1 == marked.size() ? "wv" : "wv" + std::to_string(i);
      program.push_back(op(o, "mark_varying", {prev}, {{"axis", marked[i]}}));
      prev = o;
    }
  }
  std::string last = "xl";
  for (size_t i = 0; i < c.program.size(); ++i) {
    json o = c.program[i];
    if (i + 1 == c.program.size()) o["out"] = "m";
    program.push_back(o);
    last = o["out"].get<std::string>();
  }
  if (*rc::gen::arbitrary<bool>()) {
    json from = op("y", "from_local", {last}, {{"placements", yp}});
    if (*rc::gen::arbitrary<bool>()) from["run_check"] = *rc::gen::arbitrary<bool>();
    program.push_back(from);
  } else {
    program = json::array({local_map_form(program, last, yp, w_in)});
  }
  program.push_back(op("loss", "sum", {"y"}));

  json x = {{"name", "x"}, {"shape", shape}, {"placements", xp}, {"requires_grad", true}};
  if (x_ones) x["init"] = "ones";
  json inputs = json::array({x});
  if (w_in) {
    json w = {{"name", "w"},
              {"shape", {1}},
              {"placements", std::vector<std::string>(static_cast<size_t>(ndim), "R")},
              {"requires_grad", true}};
    if (w_init != "int") w["init"] = w_init;
    inputs.push_back(w);
  }
  out.doc = {{"format", "meshsim.scenario/1"}, {"name", "local_code"}, {"mesh", mesh_json(mesh)},
             {"options", options},             {"inputs", inputs},     {"program", program},
             {"backward", "loss"}};
  return out;
}

}  // namespace meshsim::gen

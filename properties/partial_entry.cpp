// local_map_partial_entry: a Partial placement entering a local_map, in both of meshsim's readings
// (docs/semantics.md, "Partial placements entering a local_map"; docs/findings.md section 17).
//
// One case: a mesh of 1-2 axes (sizes 1-4); a Partial axis `a` and its op (sum, avg, max, min);
// an input p [m, k] that is P(op) over `a` (R or S(0) over the other axis), with a gradient where
// the op is linear; beside it q (laid out as p), r [k, n] (Rd over `a`, R elsewhere) and c [m, k]
// (R). The body takes p through 0-2 steps linear in it (scale, neg, add q, mm r: the last only for
// sum and avg, with the mm at most once) and then reduces it (all_reduce with its op; for sum,
// reduce_scatter along dim 0 half the time) or returns it as P(op). A third of the cases (over an
// axis of 2 or more ranks) plant one misuse a user writes: exp of the unreduced locals (not
// linear; sum and avg), c added on every rank (n times, not once; sum), or the all_reduce with
// another op than the Partial's (every op).
//
// The program runs twice, with `partial_in_local_map` variant and unreduced:
// - without a misuse, both pass (values and gradients equal the oracle's): the unreduced rules
//   refuse nothing right, and the variant reading computes it right;
// - with one, the unreduced run is refused at the op (unreduced_misuse) and the variant run fails
//   the comparison with the oracle: each reading catches the bug, one by its types, one by values.
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "core/scenario.h"
#include "core/scoped.h"
#include "oracles/check.h"
#include "properties/generators.h"
#include "properties/program_parts.h"
#include "properties/properties.h"
#include "properties/runner.h"

namespace meshsim {

namespace {

using gen::parts::json;
using gen::parts::op;

enum class Misuse { None, Exp, Bias, WrongOp };

const char* misuse_name(Misuse m) {
  switch (m) {
    case Misuse::Exp: return "exp of the unreduced locals";
    case Misuse::Bias: return "a replicated value added on every rank";
    case Misuse::WrongOp: return "an all_reduce with another op than the Partial's";
    default: return "none";
  }
}

struct Drawn {
  json doc;
  Misuse misuse = Misuse::None;
};

Drawn draw_program() {
  const Mesh mesh = gen::parts::small_mesh();
  const auto n_axes = static_cast<size_t>(mesh.ndim());
  const size_t a = static_cast<size_t>(*rc::gen::inRange<int>(0, static_cast<int>(n_axes)));
  const std::string axis = mesh.axes()[a];
  const ReduceOp rop = *rc::gen::element(ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min);
  const bool linear = is_linear(rop);
  const std::string rname = reduce_op_name(rop);
  const int64_t m = *rc::gen::inRange<int64_t>(1, 5), k = *rc::gen::inRange<int64_t>(1, 4),
                n = *rc::gen::inRange<int64_t>(1, 4);

  // Placements: the Partial over `a`, R or S(0) over the other axis.
  Spec sp, sr, sc;
  bool other_shards = false;  // another axis shards dim 0 (then no reduce_scatter along it)
  for (size_t b = 0; b < n_axes; ++b) {
    if (b == a) {
      sp.push_back(Placement::partial(rop));
      sr.push_back(Placement::reduced());
    } else {
      sp.push_back(*rc::gen::arbitrary<bool>() ? Placement::shard(0) : Placement::replicate());
      sr.push_back(Placement::replicate());
      other_shards |= sp.back().is_shard();
    }
    sc.push_back(sp.back().is_shard() ? sp.back() : Placement::replicate());
  }
  // randn data: no element is 0, so that every misuse changes the values.
  json inputs = {gen::parts::input("p", {m, k}, sp, linear, true), gen::parts::input("q", {m, k}, sp, linear, true),
                 gen::parts::input("r", {k, n}, sr, linear, true), gen::parts::input("c", {m, k}, sc, false, true)};
  std::vector<std::string> args = {"p", "q", "r", "c"};

  // The linear steps, in the body and in the reference alike.
  json body = json::array(), reference = json::array();
  std::string x = "p";
  int64_t cols = k;
  bool mm_done = false;
  const int steps = linear ? *rc::gen::inRange(0, 3) : 0;
  for (int s = 0; s < steps; ++s) {
    const std::string y = "s" + std::to_string(s);
    const int kind = *rc::gen::inRange(0, 4);
    json step;
    if (kind == 0) step = op(y, "scale", {x}, {{"value", *rc::gen::element(0.5, 2.0, -1.0)}});
    else if (kind == 1) step = op(y, "neg", {x});
    else if (kind == 2 && cols == k) step = op(y, "add", {x, "q"});
    else if (!mm_done && cols == k) {
      step = op(y, "mm", {x, "r"});
      mm_done = true;
      cols = n;
    } else {
      step = op(y, "scale", {x}, {{"value", 2.0}});
    }
    body.push_back(step);
    reference.push_back(step);
    x = y;
  }

  Drawn d;
  const bool can_misuse = mesh.axis_size(static_cast<int>(a)) >= 2;
  // exp and a bias commute with max and min (max(x_r + c) = max(x_r) + c), and a bias with avg
  // (mean(x_r + c) = mean(x_r) + c: no bug, though the unreduced reading refuses it): those are not
  // drawn there.
  if (can_misuse && *rc::gen::inRange(0, 3) == 0) {
    if (rop == ReduceOp::Sum) d.misuse = *rc::gen::element(Misuse::Exp, Misuse::Bias, Misuse::WrongOp);
    else if (rop == ReduceOp::Avg) d.misuse = *rc::gen::element(Misuse::Exp, Misuse::WrongOp);
    else d.misuse = Misuse::WrongOp;
  }
  if (d.misuse == Misuse::Exp) {  // bounded: the locals are small integers
    body.push_back(op("e", "exp", {x}));
    reference.push_back(op("e", "exp", {x}));
    x = "e";
  } else if (d.misuse == Misuse::Bias) {
    if (cols != k) {  // c has p's shape: add it before the mm
      d.misuse = Misuse::WrongOp;
    } else {
      body.push_back(op("b", "add", {x, "c"}));
      reference.push_back(op("b", "add", {x, "c"}));
      x = "b";
    }
  }

  // The reduction (or none: returned as the Partial).
  const int how = *rc::gen::inRange(0, 3);
  Spec out = sp;
  std::string ret = x;
  if (how > 0 || d.misuse != Misuse::None) {
    const bool scatter = rop == ReduceOp::Sum && how == 2 && d.misuse != Misuse::WrongOp && !other_shards;
    if (scatter) {
      body.push_back(op("red", "reduce_scatter", {x}, {{"axis", axis}, {"dim", 0}}));
      out[a] = Placement::shard(0);
    } else {
      ReduceOp use = rop;
      if (d.misuse == Misuse::WrongOp) use = rop == ReduceOp::Sum ? ReduceOp::Avg : ReduceOp::Sum;
      if (d.misuse == Misuse::WrongOp && !linear) use = rop == ReduceOp::Max ? ReduceOp::Min : ReduceOp::Max;
      body.push_back(op("red", "all_reduce", {x}, {{"axis", axis}, {"reduce", reduce_op_name(use)}}));
      out[a] = Placement::replicate();
    }
    ret = "red";
    reference.push_back(op("red", "scale", {x}, {{"value", 1}}));
  }
  json region = op("y", "local_map", args,
                   {{"out_placements", json::array({gen::spec_json(out)})}, {"body", body},
                    {"returns", json::array({ret})}, {"reference", reference}});
  Spec replicated(n_axes, Placement::replicate());
  json program = {region, op("yr", "redistribute", {"y"}, {{"placements", gen::spec_json(replicated)}}),
                  op("loss", "sum", {"yr"})};
  d.doc = {{"format", "meshsim.scenario/1"},
           {"name", "local_map_partial_entry"},
           {"mesh", {{"axes", mesh.axes()}, {"shape", mesh.shape()}}},
           {"inputs", inputs},
           {"program", program},
           {"options", {{"seed", *rc::gen::inRange<int>(0, 1000)}}}};
  if (linear) d.doc["backward"] = "loss";
  return d;
}

json with_reading(json doc, const char* reading) {
  doc["options"]["partial_in_local_map"] = reading;
  return doc;
}

// The case's failure: the run of that reading is the counterexample (with the check's planted bug).
void fail(const json& doc, const std::string& why) {
  RunOptions options = parse_scenario(doc, "<generated>").options;
  options.mutant = planted_mutant();
  latest_failure() = {doc, options.to_json()};
  RC_FAIL(why);
}

std::string verdict(const json& r) {
  if (r.value("status", "") == "error") return "error " + r["error"].value("kind", "") + ": " + r["error"].value("message", "");
  std::string out = r.value("status", "?");
  for (const auto& f : r.value("failures", json::array())) out += "; " + (f.is_string() ? f.get<std::string>() : f.dump());
  return out;
}

}  // namespace

void local_map_partial_entry() {
  const Drawn d = draw_program();
  const json as_variant = with_reading(d.doc, "variant"), as_unreduced = with_reading(d.doc, "unreduced");
  json variant;
  {
    // A misuse's variant run must fail: its status is all this reads.
    ScopedOverride<bool> described(mismatch_numbers_enabled(), d.misuse == Misuse::None);
    variant = run_generated(as_variant).result;
  }
  const json unreduced = run_generated(as_unreduced).result;
  if (d.misuse == Misuse::None) {
    if (variant.value("status", "") != "pass")
      fail(as_variant, "a right program, partial_in_local_map variant: " + verdict(variant));
    if (unreduced.value("status", "") != "pass")
      fail(as_unreduced, "a right program, partial_in_local_map unreduced: " + verdict(unreduced));
    return;
  }
  const std::string what = std::string("the misuse \"") + misuse_name(d.misuse) + "\"";
  if (unreduced.value("status", "") != "error" || unreduced["error"].value("kind", "") != "unreduced_misuse")
    fail(as_unreduced, what + ", partial_in_local_map unreduced: not refused (" + verdict(unreduced) + ")");
  if (variant.value("status", "") != "fail")
    fail(as_variant, what + ", partial_in_local_map variant: the oracle does not see it (" + verdict(variant) + ")");
}

}  // namespace meshsim

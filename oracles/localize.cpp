#include "oracles/localize.h"

#include <map>
#include <set>
#include <tuple>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include "core/cotangent.h"
#include "core/ops.h"
#include "core/scoped.h"
#include "sim/local_map.h"
#include "sim/local_ops.h"
#include "sim/mesh_node.h"
#include "core/mutants.h"
#include "oracles/mismatch.h"
#include "sim/data.h"

namespace meshsim {

namespace {

using nlohmann::json;

std::vector<std::string> results_of(const OpDecl& op) {
  return op.outs.empty() ? std::vector<std::string>{op.out} : op.outs;
}

// "l0_q = linear(l0_n1_g, l0_wq_g)"
std::string op_text(const OpDecl& op) {
  std::string outs;
  for (const auto& o : results_of(op)) outs += (outs.empty() ? "" : ", ") + o;
  std::string args;
  for (const auto& a : op.args) args += (args.empty() ? "" : ", ") + a;
  const std::string name =
      op.op == "call" && op.attrs.is_object() ? "call " + op.attrs.value("function", std::string("?")) : op.op;
  return outs + " = " + name + "(" + args + ")";
}

json op_json(const OpDecl& op) {
  return {{"op", op.path}, {"name", op.op}, {"out", op.out}, {"text", op_text(op)}};
}

// Which op made each value, and which ops read it, in program order.
struct Dataflow {
  std::map<std::string, int> producer;            // absent: an input
  std::map<std::string, std::vector<int>> consumers;
  explicit Dataflow(const Scenario& sc) {
    for (size_t k = 0; k < sc.program.size(); ++k) {
      const OpDecl& op = sc.program[k];
      for (const auto& a : op.args) {
        auto& c = consumers[a];
        if (c.empty() || c.back() != static_cast<int>(k)) c.push_back(static_cast<int>(k));
      }
      for (const auto& o : results_of(op)) producer[o] = static_cast<int>(k);
    }
  }
};

// One gradient compared: the mesh's (assembled, times its divisor) against the oracle's.
struct GradCompare {
  bool known = false;  // both sides have it
  bool agree = true;
  Mismatch mismatch;
};

GradCompare compare_grad(const Mesh& mesh, const GradSpec& layout, Locals locals, const DTensor& primal,
                         at::Tensor ref, double tol) {
  GradCompare out;
  if (!ref.defined()) return out;
  for (size_t r = 0; r < locals.size(); ++r)
    if (!locals[r].defined()) locals[r] = at::zeros_like(primal.locals.at(r)).detach();
  Locals scaled;
  for (const auto& t : locals) scaled.push_back(t.detach() * static_cast<double>(layout.divisor));
  std::string problem;
  at::Tensor global;
  try {
    global = assemble(mesh, layout.spec, scaled, &problem);
  } catch (const std::exception& e) {
    problem = first_line(e.what());
  }
  out.known = true;
  ref = ref.detach();
  const double err = global.defined() && global.sizes() == ref.sizes() ? max_abs_diff(global, ref)
                                                                        : std::numeric_limits<double>::infinity();
  out.agree = problem.empty() && within(err, tol, ref);
  if (!out.agree) {
    out.mismatch = describe_mismatch(mesh, layout.spec, scaled, global, ref, tol);
    if (!problem.empty()) out.mismatch.message = problem + "; " + out.mismatch.message;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Inside a local_map body: the adjoint test of each op's backward

// The weight of one rank's term in the inner product of an LTensor's values: an axis where the
// value is invariant (neither variant nor reduced) holds one value on every member of its group, so
// each member counts 1/n of it; variant and reduced axes count each member whole (a reduced value's
// cotangent is unreduced: its members add up). Plain local code keeps no sets: every rank whole.
double weight(const Mesh& mesh, const LTensor& t) {
  if (t.unchecked) return 1.0;
  double w = 1.0;
  for (int a = 0; a < mesh.ndim(); ++a)
    if (!t.variant.count(a) && !t.reduced.count(a)) w /= static_cast<double>(mesh.axis_size(a));
  return w;
}

// Per rank, random values shaped as `like`'s locals, equal across the groups of every axis in
// `same` (so that they are a possible value, or cotangent, of an LTensor with those sets).
Locals random_like(const Mesh& mesh, const Locals& like, const AxisSet& same, at::Generator& gen) {
  Locals out;
  for (const auto& t : like)
    out.push_back(at::randn(t.sizes(), gen, at::TensorOptions().dtype(at::kDouble)).to(t.scalar_type()));
  for (int a : same)
    for (const auto& group : mesh.groups(a))
      for (size_t k = 1; k < group.size(); ++k)
        if (out[group[k]].sizes() == out[group[0]].sizes()) out[group[k]] = out[group[0]].clone();
  return out;
}

// The axes where a value is invariant (primal perturbations equal across the group: also reduced),
// and where its cotangent is (invariant only).
AxisSet not_variant(const Mesh& mesh, const LTensor& t) {
  AxisSet out;
  if (t.unchecked) return out;
  for (int a = 0; a < mesh.ndim(); ++a)
    if (!t.variant.count(a)) out.insert(a);
  return out;
}
AxisSet invariant(const Mesh& mesh, const LTensor& t) {
  AxisSet out;
  if (t.unchecked) return out;
  for (int a = 0; a < mesh.ndim(); ++a)
    if (!t.variant.count(a) && !t.reduced.count(a)) out.insert(a);
  return out;
}

double dot(const Locals& a, const Locals& b, double w) {
  double s = 0.0;
  for (size_t r = 0; r < a.size(); ++r)
    if (a[r].defined() && b[r].defined() && a[r].numel())
      s += (a[r].to(at::kDouble) * b[r].to(at::kDouble)).sum().item<double>();
  return s * w;
}

// "4 (the size of tp x dp)" where a ratio is a product of axis sizes.
std::string ratio_text(const Mesh& mesh, double ratio) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", ratio);
  std::string out = buf;
  const bool inverse = std::abs(ratio) < 1 && ratio != 0;
  const double r = inverse ? 1.0 / std::abs(ratio) : std::abs(ratio);
  for (int mask = 1; mask < (1 << mesh.ndim()); ++mask) {
    double p = 1.0;
    std::string axes;
    for (int a = 0; a < mesh.ndim(); ++a)
      if (mask & (1 << a)) {
        p *= static_cast<double>(mesh.axis_size(a));
        axes += (axes.empty() ? "" : " x ") + mesh.axes()[a];
      }
    if (p > 1 && std::abs(r - p) < 1e-6 * p)
      return out + (inverse ? " (1 / the size of " : " (the size of ") + axes + ")";
  }
  return out;
}

}  // namespace

json body_divergence(const Scenario& sc, const OpDecl& lm, SimRun& run, const std::string& mutant, DType dtype) {
  auto found = run.bodies.find(lm.path);
  if (found == run.bodies.end()) return nullptr;
  const Mesh& mesh = sc.mesh;
  std::map<std::string, LTensor>& env = found->second;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(20261126);
  // Central differences: exact up to rounding on the ops that are linear in the operand moved
  // (collectives, casts, products), to eps^2 on the others.
  const double eps = dtype == DType::Float32 ? 1e-2 : 1e-5;
  const double tol = dtype == DType::Float32 ? 2e-2 : 1e-6;
  // Every result of every body op, the last first (a call of a Function with several outputs
  // is tested output by output: each one's cotangent alone).
  std::vector<std::tuple<const OpDecl*, size_t, std::string>> results;
  for (auto op = lm.body.rbegin(); op != lm.body.rend(); ++op) {
    const std::vector<std::string> names = result_names(*op);
    for (size_t k = names.size(); k-- > 0;) results.emplace_back(&*op, k, names[k]);
  }
  for (const auto& [b, out_k, y_name] : results) {
    if (is_split_op(b->op) || !env.count(y_name)) continue;
    const LTensor& y = env.at(y_name);
    // Plain local code keeps no sets: which inner product its values pair in (whether a result is
    // one value held n times) is unknown, so its ops get no verdict.
    if (y.unchecked || y.untracked) continue;
    bool y_grad = false;
    for (const auto& t : y.locals) y_grad |= t.defined() && t.requires_grad();
    if (!y_grad) continue;
    for (size_t i = 0; i < b->args.size(); ++i) {
      if (!env.count(b->args[i])) continue;
      const LTensor& x = env.at(b->args[i]);
      bool x_grad = true;
      for (const auto& t : x.locals) x_grad &= t.defined() && t.requires_grad() && at::isFloatingType(t.scalar_type());
      if (!x_grad) continue;
      const Locals ybar = random_like(mesh, y.locals, invariant(mesh, y), gen);
      const Locals xdir = random_like(mesh, x.locals, not_variant(mesh, x), gen);
      // The op's backward alone: the op run again on fresh leaves of x (the other operands without
      // gradient), its casts included, with the planted bug as the run had it, nothing recorded.
      Locals xbar, base;
      try {
        MutantScope planted(parse_mutant(mutant));
        ScopedOverride<bool> mute(run.runtime->recorder().muted, true);
        at::AutoGradMode grad(true);
        std::map<std::string, LTensor> fresh = env;
        for (const auto& a : b->args)
          if (fresh.count(a)) fresh.at(a).locals = detached(env.at(a).locals);
        Locals leaves;
        for (const auto& t : x.locals) leaves.push_back(t.detach().clone().requires_grad_(true));
        fresh.at(b->args[i]).locals = leaves;
        BodyContext ctx(*run.runtime, !y.unchecked);
        const LTensor yf = ctx.run_all(*b, fresh).at(out_k);
        std::vector<at::Tensor> ys, gs;
        for (size_t r = 0; r < yf.locals.size(); ++r) {
          base.push_back(yf.locals[r].detach());
          if (yf.locals[r].requires_grad()) {
            ys.push_back(yf.locals[r]);
            gs.push_back(ybar[r]);
          }
        }
        if (ys.empty()) continue;
        xbar = torch::autograd::grad(ys, leaves, gs, /*retain_graph=*/false, false, /*allow_unused=*/true);
        if (run.runtime->pending_error_) return nullptr;
      } catch (const std::exception&) {
        continue;  // the op cannot run again alone: no verdict on it
      }
      // The forward's derivative along xdir: the op run again on x +- eps * xdir.
      auto shifted = [&](double sign) {
        std::map<std::string, LTensor> moved = env;
        LTensor& xm = moved.at(b->args[i]);
        for (size_t r = 0; r < xm.locals.size(); ++r) xm.locals[r] = x.locals[r].detach() + sign * eps * xdir[r];
        MutantScope planted(parse_mutant(mutant));
        ScopedOverride<bool> mute(run.runtime->recorder().muted, true);
        at::NoGradGuard no_grad;
        BodyContext ctx(*run.runtime, !y.unchecked);
        return ctx.run_all(*b, moved).at(out_k).locals;
      };
      Locals plus, minus;
      try {
        plus = shifted(1.0);
        minus = shifted(-1.0);
      } catch (const std::exception&) {
        continue;  // the op cannot run again alone (it raised): no verdict on it
      }
      // A kink (relu or abs at 0, a tie of amax): the one-sided differences disagree, and so does
      // the backward with either; no verdict there.
      {
        Locals fwd, bwd;
        for (size_t r = 0; r < plus.size(); ++r) {
          fwd.push_back((plus[r].to(at::kDouble) - base[r].to(at::kDouble)) / eps);
          bwd.push_back((base[r].to(at::kDouble) - minus[r].to(at::kDouble)) / eps);
        }
        const double a = dot(ybar, fwd, weight(mesh, y)), c = dot(ybar, bwd, weight(mesh, y));
        if (std::abs(a - c) > 1e-3 * std::max({std::abs(a), std::abs(c), 1e-12})) continue;
      }
      Locals jdir;
      for (size_t r = 0; r < plus.size(); ++r) jdir.push_back((plus[r].to(at::kDouble) - minus[r].to(at::kDouble)) / (2 * eps));
      const double lhs = dot(xbar, xdir, weight(mesh, x));
      const double rhs = dot(ybar, jdir, weight(mesh, y));
      // Relative, with a floor for the rounding of results that cancel (a saturated softmax).
      double floor = 0.0;
      for (size_t r = 0; r < ybar.size(); ++r)
        if (base[r].numel())
          floor += (ybar[r].to(at::kDouble).abs() * (base[r].to(at::kDouble).abs() + 1)).sum().item<double>();
      floor *= weight(mesh, y) * (dtype == DType::Float32 ? 1e-5 : 1e-13) / eps;
      const double scale = std::max({std::abs(lhs), std::abs(rhs), 1e-300});
      if (std::abs(lhs - rhs) <= tol * scale + floor) continue;
      char nums[160];
      std::snprintf(nums, sizeof nums, "<grad x, dx> = %.6g where <grad y, J dx> = %.6g", lhs, rhs);
      std::string factor;
      if (rhs != 0 && std::isfinite(lhs / rhs)) factor = ": the gradient is " + ratio_text(mesh, lhs / rhs) + " times what the forward implies";
      json out = {{"op", b->path},
                  {"name", b->op},
                  {"out", y_name},
                  {"text", op_text(*b)},
                  {"operand", b->args[i]},
                  {"operand_index", i},
                  {"adjoint", {{"grad_dot_direction", lhs}, {"cotangent_dot_derivative", rhs}}}};
      if (rhs != 0 && std::isfinite(lhs / rhs)) out["adjoint"]["ratio"] = lhs / rhs;
      out["message"] = "backward of " + b->path + " " + op_text(*b) + " (in the local_map " + lm.path + "): its gradient for \"" +
                       b->args[i] + "\" (" + meta_str(mesh, x) + ") fails the adjoint test against its forward (" + meta_str(mesh, y) +
                       "), " + nums + factor;
      return out;
    }
  }
  return nullptr;
}

namespace {

// The result's mismatch entry of value `v` into `out` ("mismatch"); its message, "" when none.
std::string attach_mismatch(const json& mismatches, const std::string& v, json& out) {
  for (const auto& m : mismatches)
    if (m.value("value", "") == v && m.value("kind", "") == "value") {
      out["mismatch"] = m;
      return m.value("message", "");
    }
  return "";
}

}  // namespace

json forward_divergence(const Scenario& sc, const std::vector<std::string>& failed, const json& mismatches) {
  if (failed.empty()) return nullptr;
  const Dataflow flow(sc);
  for (const auto& v : failed) {
    auto p = flow.producer.find(v);
    if (p == flow.producer.end()) {
      // An input: its locals are not the layout of its global value (the layout itself is wrong).
      const InputDecl* in = sc.find_input(v);
      if (!in) continue;
      json out = {{"phase", "forward"}, {"op", in->path}, {"name", "input"}, {"out", v}, {"value", v}};
      const std::string why = attach_mismatch(mismatches, v, out);
      out["message"] = in->path + " input \"" + v + "\" " + spec_str(in->placements) +
                       ": its locals do not hold its global value laid out as its placements say" +
                       (why.empty() ? "" : " (" + why + ")");
      return out;
    }
    const OpDecl& op = sc.program[static_cast<size_t>(p->second)];
    json out = op_json(op);
    out["phase"] = "forward";
    out["value"] = v;
    const std::string why = attach_mismatch(mismatches, v, out);
    std::string operands;
    for (const auto& a : op.args) operands += (operands.empty() ? "" : ", ") + a;
    out["message"] = op.path + " " + op_text(op) + ": its result \"" + v + "\" differs from the oracle's" +
                     (why.empty() ? "" : " (" + why + ")") +
                     (operands.empty() ? "" : ", while its operands " + operands + " agree");
    return out;
  }
  return nullptr;
}

json backward_divergence(const Scenario& sc, SimRun& run, const OracleRun& oracle, double tol,
                         const std::string& mutant, DType dtype) {
  const Mesh& mesh = sc.mesh;
  const Runtime& rt = *run.runtime;
  const Dataflow flow(sc);
  std::set<std::string> inputs;
  for (const auto& in : sc.inputs) inputs.insert(in.name);

  // The mesh's gradient of a value and its layout; the oracle's.
  auto mesh_grad = [&](const std::string& v) -> std::pair<GradSpec, Locals> {
    const DTensor& x = run.values.at(v);
    if (inputs.count(v)) {
      auto gs = run.grad_specs.find(v);
      auto g = run.grads.find(v);
      return {gs != run.grad_specs.end() ? gs->second : rt.grad_spec(v, x.spec),
              g != run.grads.end() ? g->second : Locals(x.locals.size())};
    }
    auto g = run.value_grads.find(v);
    return {rt.grad_spec(v, x.spec), g != run.value_grads.end() ? g->second : Locals(x.locals.size())};
  };
  auto oracle_grad = [&](const std::string& v) -> at::Tensor {
    const auto& m = inputs.count(v) ? oracle.grads : oracle.value_grads;
    auto it = m.find(v);
    if (it != m.end() && it->second.defined()) return it->second;
    auto val = oracle.values.find(v);
    if (val == oracle.values.end() || !val->second.defined()) return {};
    // A value the oracle knows that no gradient reaches: zeros (a value it does not track: unknown).
    return inputs.count(v) && !oracle.grads.count(v) ? at::Tensor() : at::zeros_like(val->second);
  };
  auto differs = [&](const std::string& v, GradCompare* detail) {
    auto x = run.values.find(v);
    if (x == run.values.end() || !has_cotangent(x->second.spec)) return false;
    if (inputs.count(v) && !sc.find_input(v)->requires_grad) return false;
    const auto [layout, locals] = mesh_grad(v);
    GradCompare c = compare_grad(mesh, layout, locals, x->second, oracle_grad(v), tol);
    if (detail) *detail = c;
    return c.known && !c.agree;
  };

  // The latest value, in scenario order, whose gradient differs.
  std::string bad;
  GradCompare bad_detail;
  for (auto it = run.named.rbegin(); it != run.named.rend() && bad.empty(); ++it)
    if (differs(*it, &bad_detail)) bad = *it;
  if (bad.empty()) return nullptr;

  json out;
  out["phase"] = "backward";
  out["gradient_of"] = bad;
  const int made_by = flow.producer.count(bad) ? flow.producer.at(bad) : -1;
  std::vector<int> consumers;
  if (auto c = flow.consumers.find(bad); c != flow.consumers.end())
    for (int k : c->second)
      if (k > made_by) consumers.push_back(k);
  auto describe = [&](const GradCompare& c, const std::string& what) {
    out["mismatch"] = c.mismatch.to_json();
    out["mismatch"]["value"] = bad;
    out["mismatch"]["kind"] = "grad";
    return what + ": " + c.mismatch.message;
  };

  // The loss's own gradient is wrong: the backward's seed.
  auto seed = [&](const std::string& why) {
    out["op"] = "/backward";
    out["name"] = "seed";
    out["out"] = bad;
    out["text"] = "the backward's seed of " + bad;
    out["message"] = "the backward's seed of \"" + bad + "\": " + why + ": " + describe(bad_detail, "grad " + bad);
    return out;
  };
  if (bad == sc.backward && consumers.empty()) return seed("the loss's own gradient differs from ones");

  // The consumer whose contribution differs (the one consumer, when there is one).
  int culprit = consumers.size() == 1 && bad != sc.backward ? consumers.front() : -1;
  GradCompare culprit_detail = bad_detail;
  int local_code = -1;  // a consumer that is local code (to_local): its values are not compared
  if (culprit < 0) {
    const DTensor& x = run.values.at(bad);
    for (auto k = consumers.rbegin(); k != consumers.rend() && culprit < 0; ++k) {
      const OpDecl& op = sc.program[static_cast<size_t>(*k)];
      std::vector<DTensor> outs;
      std::vector<Locals> mesh_grads;
      std::vector<std::string> names;
      std::vector<at::Tensor> oracle_grads;
      for (const auto& o : results_of(op)) {
        if (!run.values.count(o)) continue;  // local code: its values are not the program's
        outs.push_back(run.values.at(o));
        mesh_grads.push_back(mesh_grad(o).second);
        names.push_back(o);
        oracle_grads.push_back(oracle_grad(o));
      }
      if (outs.empty()) {
        local_code = *k;
        continue;
      }
      // The op's own contribution: the gradient at its own use of the value (operand_uses), which
      // no other path to the value reaches. An operand read twice adds up.
      Locals mine(x.locals.size());
      at::Tensor theirs;
      for (size_t i = 0; i < op.args.size(); ++i) {
        if (op.args[i] != bad) continue;
        const std::pair<int, int> use{*k, static_cast<int>(i)};
        auto m = run.operand_uses.find(use);
        if (m != run.operand_uses.end()) {
          Locals part;
          {
            MutantScope planted(parse_mutant(mutant));  // the mesh's backward nodes run again, as they ran
            part = run.runtime->contribution(outs, mesh_grads, m->second);
          }
          for (size_t r = 0; r < mine.size(); ++r)
            if (part[r].defined()) mine[r] = mine[r].defined() ? mine[r] + part[r] : part[r];
        }
        auto o = oracle.operand_uses.find(use);
        if (o != oracle.operand_uses.end()) {
          const at::Tensor part = oracle_contribution(oracle, names, oracle_grads, o->second);
          if (part.defined()) theirs = theirs.defined() ? theirs + part : part;
        }
      }
      if (!theirs.defined() && oracle.values.count(bad) && oracle.values.at(bad).defined())
        theirs = at::zeros_like(oracle.values.at(bad));
      GradCompare c = compare_grad(mesh, mesh_grad(bad).first, mine, x, theirs, tol);
      if (c.known && !c.agree) {
        culprit = *k;
        culprit_detail = c;
      }
    }
  }
  // Every program consumer agrees, but local code read the value too: its region is the culprit
  // (its values are rank-local tensors, not compared one by one).
  if (culprit < 0 && local_code >= 0) {
    const OpDecl& op = sc.program[static_cast<size_t>(local_code)];
    const json about = op_json(op);
    for (const auto& [k, v] : about.items()) out[k] = v;
    out["message"] = "the local code from " + op.path + " " + op_text(op) + " on gives \"" + bad +
                     "\" a gradient that differs from the oracle's, while every DTensor op that reads it agrees (" +
                     describe(bad_detail, "grad " + bad) + "); its rank-local values are not compared one by one";
    return out;
  }
  if (culprit < 0) {
    if (bad == sc.backward) return seed("its consumers' contributions agree, the total differs");
    // Every consumer's contribution agrees on its own: their sum (the layouts they were added in).
    out["op"] = made_by >= 0 ? sc.program[static_cast<size_t>(made_by)].path : "/inputs";
    out["name"] = "accumulation";
    out["out"] = bad;
    out["text"] = "the sum of the gradients of " + bad;
    out["message"] = "the gradient of \"" + bad + "\" differs although each consumer's contribution agrees: "
                     "the contributions were added wrongly (" + describe(bad_detail, "grad " + bad) + ")";
    return out;
  }
  const OpDecl& op = sc.program[static_cast<size_t>(culprit)];
  const json about = op_json(op);
  for (const auto& [k, v] : about.items()) out[k] = v;
  std::vector<std::string> outs_agree;
  for (const auto& o : results_of(op))
    if (run.values.count(o)) outs_agree.push_back(o);
  out["results_agree"] = outs_agree;
  std::string agree_text;
  for (const auto& o : outs_agree) agree_text += (agree_text.empty() ? "" : ", ") + ("grad " + o);
  if (op.op == "local_map") {
    json body = body_divergence(sc, op, run, mutant, dtype);
    if (!body.is_null()) {
      out["body"] = body;
      out["message"] = body["message"].get<std::string>() + "; so the local_map gives \"" + bad +
                       "\" a gradient that differs from the oracle's (" + describe(culprit_detail, "grad " + bad) + ")";
      return out;
    }
  }
  out["message"] = "backward of " + op.path + " " + op_text(op) + ": the gradient it gives \"" + bad +
                   "\" differs from the oracle's (" + describe(culprit_detail, "grad " + bad) + ")" +
                   (agree_text.empty() ? "" : ", while " + agree_text + " agree" + (outs_agree.size() > 1 ? "" : "s"));
  return out;
}

std::string divergence_line(const json& d) {
  if (!d.is_object()) return "";
  return "first divergence (" + d.value("phase", "?") + "): " + d.value("message", "");
}

}  // namespace meshsim

#include "core/train.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/cotangent.h"
#include "core/layout.h"
#include "core/scenario.h"
#include "core/scenario_reader.h"

namespace meshsim {

using namespace scenario_detail;

const char* optimizer_name(OptimizerKind k) { return k == OptimizerKind::Sgd ? "sgd" : "adamw"; }

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double number_of(const Reader& r, const json& v, const std::string& path) {
  r.number(v, path);
  const double x = v.get<double>();
  if (!std::isfinite(x)) r.fail(path, "expected a finite number, got " + brief(v));
  return x;
}

double in_range(const Reader& r, const json& v, const std::string& path, double lo, double hi, bool lo_open,
                bool hi_open, const std::string& range) {
  const double x = number_of(r, v, path);
  if ((lo_open ? x <= lo : x < lo) || (hi_open ? x >= hi : x > hi))
    r.fail(path, "expected a number in " + range + ", got " + brief(v));
  return x;
}

void parse_optimizer(const Reader& r, const json& o, const std::string& path, const Mesh& mesh,
                     const std::vector<InputDecl>& inputs, const std::vector<std::string>& params,
                     OptimizerSpec& out) {
  r.object(o, path);
  const std::string kind = r.string(r.field(o, path, "kind"), child(path, "kind"));
  if (kind == "sgd") {
    out.kind = OptimizerKind::Sgd;
    r.only_keys(o, path, {"kind", "momentum", "dampening", "nesterov", "weight_decay", "states"});
  } else if (kind == "adamw") {
    out.kind = OptimizerKind::AdamW;
    out.weight_decay = 0.01;  // torch.optim.AdamW's default
    r.only_keys(o, path, {"kind", "betas", "eps", "weight_decay", "states"});
  } else {
    r.fail(child(path, "kind"), "unknown optimizer " + in_quotes(kind) + " (expected sgd, adamw)");
  }
  if (o.contains("momentum")) out.momentum = in_range(r, o["momentum"], child(path, "momentum"), 0, 1, false, true, "[0, 1)");
  if (o.contains("dampening"))
    out.dampening = in_range(r, o["dampening"], child(path, "dampening"), 0, 1, false, false, "[0, 1]");
  if (o.contains("nesterov")) out.nesterov = r.boolean(o["nesterov"], child(path, "nesterov"));
  if (out.nesterov && (out.momentum <= 0 || out.dampening != 0))
    r.fail(child(path, "nesterov"), "nesterov momentum requires a momentum > 0 and zero dampening (torch.optim.SGD)");
  if (o.contains("weight_decay"))
    out.weight_decay = in_range(r, o["weight_decay"], child(path, "weight_decay"), 0, 1, false, true, "[0, 1)");
  if (o.contains("eps")) out.eps = in_range(r, o["eps"], child(path, "eps"), 0, 1, true, true, "(0, 1)");
  if (o.contains("betas")) {
    const std::string bp = child(path, "betas");
    if (r.array(o["betas"], bp).size() != 2) r.fail(bp, "expected two numbers [beta1, beta2], got " + brief(o["betas"]));
    out.beta1 = in_range(r, o["betas"][0], child(bp, 0), 0, 1, false, true, "[0, 1)");
    out.beta2 = in_range(r, o["betas"][1], child(bp, 1), 0, 1, false, true, "[0, 1)");
  }
  if (o.contains("states")) {
    const std::string sp = child(path, "states");
    for (const auto& item : r.object(o["states"], sp).items()) {
      const std::string at = child(sp, item.key());
      if (std::find(params.begin(), params.end(), item.key()) == params.end())
        r.fail(at, in_quotes(item.key()) + " is not a parameter (an input with \"requires_grad\": true)");
      const InputDecl& in = *std::find_if(inputs.begin(), inputs.end(), [&](const InputDecl& d) { return d.name == item.key(); });
      Spec spec = r.spec(item.value(), at, mesh);
      for (size_t k = 0; k < spec.size(); ++k)
        if (spec[k].is_partial())
          r.fail(child(at, k), "an optimizer state is a value of its own: Shard or Replicate, not " + spec[k].str());
      r.check_shape(mesh, spec, in.shape.size(), at);
      out.states[item.key()] = normalize_spec(spec, static_cast<int64_t>(in.shape.size()));
    }
  }
}

void parse_clip(const Reader& r, const json& c, const std::string& path, const Mesh& mesh,
                const std::vector<std::string>& params, ClipSpec& out) {
  r.object(c, path);
  r.only_keys(c, path, {"max_norm", "norm_type", "params", "reduce", "eps"});
  out.present = true;
  out.max_norm = in_range(r, r.field(c, path, "max_norm"), child(path, "max_norm"), 0, kInf, true, true, "(0, inf)");
  if (c.contains("norm_type")) {
    const std::string np = child(path, "norm_type");
    if (c["norm_type"].is_string()) {
      if (c["norm_type"] != "inf") r.fail(np, "expected a number >= 1 or \"inf\", got " + brief(c["norm_type"]));
      out.norm_type = std::numeric_limits<double>::infinity();
    } else {
      out.norm_type = number_of(r, c["norm_type"], np);
      if (out.norm_type < 1) r.fail(np, "expected a number >= 1 or \"inf\", got " + brief(c["norm_type"]));
    }
  }
  if (c.contains("eps")) out.eps = in_range(r, c["eps"], child(path, "eps"), 0, 1, false, true, "[0, 1)");
  if (c.contains("params")) {
    const std::string pp = child(path, "params");
    const json& list = r.array(c["params"], pp);
    if (list.empty()) r.fail(pp, "expected at least one parameter");
    for (size_t k = 0; k < list.size(); ++k) {
      std::string name = r.name(list[k], child(pp, k));
      if (std::find(params.begin(), params.end(), name) == params.end())
        r.fail(child(pp, k), in_quotes(name) + " is not a parameter (an input with \"requires_grad\": true)");
      if (std::find(out.params.begin(), out.params.end(), name) != out.params.end())
        r.fail(child(pp, k), "parameter " + in_quotes(name) + " named twice");
      out.params.push_back(name);
    }
  }
  if (!c.contains("reduce")) return;
  const std::string rp = child(path, "reduce");
  const json& red = c["reduce"];
  if (red.is_string()) {
    if (red != "dtensor") r.fail(rp, "expected \"dtensor\" or {\"all_reduce\": [axis, ...]}, got " + brief(red));
    return;
  }
  r.object(red, rp);
  r.only_keys(red, rp, {"all_reduce"});
  out.dtensor = false;
  const std::string ap = child(rp, "all_reduce");
  const json& axes = r.array(r.field(red, rp, "all_reduce"), ap);
  for (size_t k = 0; k < axes.size(); ++k) {
    std::string axis = r.name(axes[k], child(ap, k));
    if (std::find(mesh.axes().begin(), mesh.axes().end(), axis) == mesh.axes().end())
      r.fail(child(ap, k), "unknown mesh axis " + in_quotes(axis) + " (the mesh's: " + join(mesh.axes()) + ")");
    out.all_reduce_axes.push_back(axis);
  }
}

}  // namespace

TrainSpec parse_train(const json& t, const std::string& file, const Mesh& mesh, const std::vector<InputDecl>& inputs,
                      bool has_backward) {
  Reader r(file);
  const std::string path = "/train";
  r.object(t, path);
  r.only_keys(t, path, {"steps", "microbatches", "data", "batch", "lr", "optimizer", "clip_grad_norm"});
  TrainSpec out;
  out.present = true;
  if (!has_backward) r.fail(path, "training steps need a \"backward\" (the loss whose gradients the optimizer takes)");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const InputDecl& in = inputs[i];
    if (!in.requires_grad) continue;
    const std::string at = child("/inputs", i);
    if (in.from_local) r.fail(child(at, "from_local"), "a parameter of training steps is a global value: not from_local");
    if (!has_cotangent(in.placements))
      r.fail(child(at, "placements"), "a parameter of training steps has a gradient: not P(max) or P(min)");
    out.params.push_back(in.name);
  }
  if (out.params.empty()) r.fail(path, "training steps need a parameter (an input with \"requires_grad\": true)");
  out.steps = r.integer(r.field(t, path, "steps"), child(path, "steps"), 1);
  if (out.steps > 1000) r.fail(child(path, "steps"), "at most 1000 steps, got " + std::to_string(out.steps));
  if (t.contains("microbatches")) {
    out.microbatches = r.integer(t["microbatches"], child(path, "microbatches"), 1);
    if (out.microbatches > 1000)
      r.fail(child(path, "microbatches"), "at most 1000 microbatches, got " + std::to_string(out.microbatches));
  }
  if (t.contains("data")) {
    const std::string d = r.string(t["data"], child(path, "data"));
    if (d == "per_microbatch") out.data = TrainData::PerMicrobatch;
    else if (d == "fixed") out.data = TrainData::Fixed;
    else r.fail(child(path, "data"), "expected \"per_microbatch\" or \"fixed\", got " + in_quotes(d));
  }
  if (t.contains("batch")) {
    const std::string bp = child(path, "batch");
    const json& list = r.array(t["batch"], bp);
    for (size_t k = 0; k < list.size(); ++k) {
      const std::string at = child(bp, k);
      const std::string name = r.name(list[k], at);
      auto in = std::find_if(inputs.begin(), inputs.end(), [&](const InputDecl& d) { return d.name == name; });
      if (in == inputs.end()) r.fail(at, "no input named " + in_quotes(name));
      if (in->requires_grad) r.fail(at, in_quotes(name) + " is a parameter: the batch is data");
      if (in->from_local) r.fail(at, in_quotes(name) + " is from_local: a batch is cut from a global value");
      if (in->shape.empty()) r.fail(at, in_quotes(name) + " is a scalar: a batch is cut along dim 0");
      if (std::find(out.batch.begin(), out.batch.end(), name) != out.batch.end()) r.fail(at, in_quotes(name) + " named twice");
      out.batch.push_back(name);
    }
  }
  const std::string lp = child(path, "lr");
  const json& lr = r.field(t, path, "lr");
  if (lr.is_array()) {
    if (lr.size() != static_cast<size_t>(out.steps))
      r.fail(lp, "expected one learning rate per step (" + std::to_string(out.steps) + "), got " +
                     std::to_string(lr.size()));
    for (size_t k = 0; k < lr.size(); ++k) out.lr.push_back(in_range(r, lr[k], child(lp, k), 0, kInf, false, true, "[0, inf)"));
  } else {
    out.lr.assign(static_cast<size_t>(out.steps), in_range(r, lr, lp, 0, kInf, false, true, "[0, inf)"));
  }
  for (double& x : out.lr)
    if (x > 1e6) r.fail(lp, "a learning rate of at most 1e6 expected");
  parse_optimizer(r, r.field(t, path, "optimizer"), child(path, "optimizer"), mesh, inputs, out.params, out.optimizer);
  if (t.contains("clip_grad_norm")) parse_clip(r, t["clip_grad_norm"], child(path, "clip_grad_norm"), mesh, out.params, out.clip);
  return out;
}

}  // namespace meshsim

#include "sim/train.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/mutants.h"
#include "core/redistribute.h"
#include "sim/data.h"

namespace meshsim {

std::vector<std::string> optimizer_state_names(const OptimizerSpec& opt) {
  if (opt.kind == OptimizerKind::AdamW) return {"exp_avg", "exp_avg_sq"};
  if (opt.momentum != 0.0) return {"momentum_buffer"};
  return {};
}

Spec optimizer_state_spec(const OptimizerSpec& opt, const std::string& param, const Spec& param_spec) {
  auto it = opt.states.find(param);
  if (it != opt.states.end()) return it->second;
  Spec out = param_spec;
  for (auto& p : out)
    if (p.is_partial() || p.is_reduced()) p = Placement::replicate();
  return out;
}

void optimizer_update(const OptimizerSpec& opt, double lr, int64_t step, at::Tensor& param, const at::Tensor& grad,
                      std::map<std::string, at::Tensor>& states) {
  // Out of place throughout: replicated locals may share storage across ranks.
  if (opt.kind == OptimizerKind::Sgd) {
    at::Tensor d = opt.weight_decay != 0.0 ? grad + param * opt.weight_decay : grad;
    if (opt.momentum != 0.0) {
      auto it = states.find("momentum_buffer");
      at::Tensor buf = it == states.end() ? d.clone() : it->second * opt.momentum + d * (1.0 - opt.dampening);
      states["momentum_buffer"] = buf;
      d = opt.nesterov ? d + buf * opt.momentum : buf;
    }
    param = param - d * lr;
    return;
  }
  // AdamW (torch.optim.adamw's single-tensor path, amsgrad off).
  param = param * (1.0 - lr * opt.weight_decay);
  auto m = states.find("exp_avg");
  auto v = states.find("exp_avg_sq");
  at::Tensor exp_avg = m == states.end() ? at::zeros_like(param) : m->second;
  at::Tensor exp_avg_sq = v == states.end() ? at::zeros_like(param) : v->second;
  exp_avg = exp_avg + (grad - exp_avg) * (1.0 - opt.beta1);  // lerp_(grad, 1 - beta1)
  exp_avg_sq = exp_avg_sq * opt.beta2 + grad * grad * (1.0 - opt.beta2);
  const double bias_correction1 = 1.0 - std::pow(opt.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(opt.beta2, static_cast<double>(step));
  const double step_size = lr / bias_correction1;
  // float16 states: libtorch's CPU has no float16 sqrt; a GPU computes it in float32 and rounds.
  const at::Tensor root = exp_avg_sq.scalar_type() == at::kHalf ? exp_avg_sq.to(at::kFloat).sqrt().to(at::kHalf)
                                                                 : exp_avg_sq.sqrt();
  const at::Tensor denom = root / std::sqrt(bias_correction2) + opt.eps;
  param = param - exp_avg / denom * step_size;
  states["exp_avg"] = exp_avg;
  states["exp_avg_sq"] = exp_avg_sq;
}

at::Tensor norm_power(const at::Tensor& g, double p) {
  const at::Tensor a = g.abs();
  if (std::isinf(p)) return g.numel() == 0 ? at::zeros({}, g.options()) : a.max();
  if (p == 1.0) return a.sum();
  if (p == 2.0) return (a * a).sum();
  return a.pow(p).sum();
}

double norm_root(double total, double p) {
  if (std::isinf(p) || p == 1.0) return total;
  if (p == 2.0) return std::sqrt(total);
  return std::pow(total, 1.0 / p);
}

MeshTrainer::MeshTrainer(const Scenario& sc, const RunOptions& options, std::map<std::string, Locals> params)
    : sc_(sc), options_(options), params_(std::move(params)) {
  for (const auto& p : sc.train.params) state_specs_[p] = optimizer_state_spec(sc.train.optimizer, p, param_spec(p));
}

const Spec& MeshTrainer::param_spec(const std::string& p) const { return sc_.find_input(p)->placements; }

Locals MeshTrainer::move(const Locals& x, const Spec& from, const Spec& to, bool gradient, const std::string& value,
                         const std::string& phase) {
  if (from == to) return x;
  Locals out = x;
  for (const RedistStep& s : plan_redistribute(sc_.mesh, from, to, {options_.partial_from_replicate, gradient})) {
    if (s.communicates())
      collectives_.push_back({step_, phase, step_kind_name(s.kind), sc_.mesh.axes()[static_cast<size_t>(s.axis)], value,
                              step_bytes(sc_.mesh, s, out)});
    out = apply_step(sc_.mesh, s, out);
  }
  return out;
}

Locals MeshTrainer::all_reduce_axis(const Locals& x, int axis, ReduceOp op, const std::string& value,
                                    const std::string& phase) {
  RedistStep s;
  s.kind = StepKind::AllReduce;
  s.axis = axis;
  s.from = Placement::partial(op);
  s.to = Placement::replicate();
  s.op = op;
  if (s.communicates())
    collectives_.push_back({step_, phase, "all_reduce", sc_.mesh.axes()[static_cast<size_t>(axis)], value,
                            step_bytes(sc_.mesh, s, x)});
  return apply_step(sc_.mesh, s, x);
}

void MeshTrainer::accumulate(const std::string& param, const GradSpec& grad, const Locals& locals) {
  Locals g = locals;
  if (grad.divisor != 1)
    for (auto& t : g) t = t * static_cast<double>(grad.divisor);
  for (auto& t : g) t = t.detach();
  auto acc = acc_.find(param);
  // Planted bug accumulation_lost_gradient: the gradient is reset at every microbatch (zero_grad
  // inside the accumulation loop): only the last microbatch's reaches the optimizer.
  if (acc == acc_.end() || mutant_on(Mutant::AccumulationLostGradient)) {
    acc_[param] = std::move(g);
    acc_spec_[param] = grad.spec;
  } else {
    if (grad.spec != acc_spec_.at(param)) g = move(g, grad.spec, acc_spec_.at(param), true, param + ".grad", "accumulate");
    for (size_t r = 0; r < g.size(); ++r) acc->second[r] = acc->second[r] + g[r];
  }
  microbatches_seen_[param] += 1;
}

std::vector<double> MeshTrainer::clip() {
  const ClipSpec& c = sc_.train.clip;
  const double p = c.norm_type;
  const bool inf = std::isinf(p);
  const ReduceOp op = inf ? ReduceOp::Max : ReduceOp::Sum;
  const std::vector<std::string>& names = c.params.empty() ? sc_.train.params : c.params;
  const size_t n = static_cast<size_t>(sc_.mesh.size());
  Locals total(n);
  auto combine = [&](Locals& into, const Locals& part) {
    for (size_t r = 0; r < n; ++r)
      into[r] = !into[r].defined() ? part[r] : inf ? at::maximum(into[r], part[r]) : into[r] + part[r];
  };
  for (const auto& name : names) {
    auto acc = acc_.find(name);
    if (acc == acc_.end()) continue;  // no gradient this step: none to clip (torch skips a None grad)
    Spec spec = acc_spec_.at(name);
    Locals g = acc->second;
    Locals powers(n);
    if (c.dtensor) {
      // DTensor: a Partial gradient is reduced first (the norm is not linear); then the local norms'
      // p-th powers are P(sum) (P(max) for inf) over the sharded axes, and reduced there.
      Spec reduced = spec;
      for (auto& pl : reduced)
        if (pl.is_partial()) pl = Placement::replicate();
      g = move(g, spec, reduced, false, name + ".grad", "clip");
      for (size_t r = 0; r < n; ++r) powers[r] = norm_power(g[r], p);
      for (size_t a = 0; a < reduced.size(); ++a)
        if (reduced[a].is_shard()) powers = all_reduce_axis(powers, static_cast<int>(a), op, name + ".grad_norm", "clip");
    } else {
      for (size_t r = 0; r < n; ++r) powers[r] = norm_power(g[r], p);
    }
    combine(total, powers);
  }
  for (size_t r = 0; r < n; ++r)
    if (!total[r].defined()) total[r] = at::zeros({}, at::TensorOptions().dtype(scalar_type(options_.dtype)));
  // The user's code: the summed local powers all_reduced over the axes it names, in its order.
  if (!c.dtensor)
    for (const auto& axis : c.all_reduce_axes) total = all_reduce_axis(total, sc_.mesh.axis_index(axis), op, "grad_norm", "clip");
  std::vector<double> norms(n);
  for (size_t r = 0; r < n; ++r) {
    norms[r] = norm_root(total[r].item<double>(), p);
    const double coef = std::min(1.0, c.max_norm / (norms[r] + c.eps));
    for (const auto& name : names) {
      auto acc = acc_.find(name);
      if (acc != acc_.end()) acc->second[r] = acc->second[r] * coef;
    }
  }
  return norms;
}

std::vector<double> MeshTrainer::finish_step(int64_t step) {
  step_ = step;
  // Planted bug accumulation_double_reduce: the gradient of each microbatch, already reduced by the
  // backward, is all_reduced once more when an accumulation of several microbatches ends (no_sync
  // missing, and the user's own all_reduce after the loop): a factor of the replicated axes' sizes.
  if (mutant_on(Mutant::AccumulationDoubleReduce))
    for (auto& [name, g] : acc_) {
      if (microbatches_seen_[name] < 2) continue;
      const Spec& spec = acc_spec_.at(name);
      for (size_t a = 0; a < spec.size(); ++a)
        if (spec[a].is_plain_replicate() && sc_.mesh.axis_size(static_cast<int>(a)) > 1)
          g = all_reduce_axis(g, static_cast<int>(a), ReduceOp::Sum, name + ".grad", "accumulate");
    }
  std::vector<double> norms;
  if (sc_.train.clip.present) norms = clip();
  const OptimizerSpec& opt = sc_.train.optimizer;
  const double lr = sc_.train.lr_at(step - 1);
  const std::vector<std::string> state_names = optimizer_state_names(opt);
  for (const auto& name : sc_.train.params) {
    auto acc = acc_.find(name);
    if (acc == acc_.end()) continue;  // torch's optimizers skip a parameter whose grad is None
    const Spec& pspec = param_spec(name);
    const Spec& sspec = state_specs_.at(name);
    const Locals g = move(acc->second, acc_spec_.at(name), sspec, false, name + ".grad", "optimizer");
    Locals w = move(params_.at(name), pspec, sspec, false, name, "optimizer");
    auto& states = states_[name];
    for (size_t r = 0; r < w.size(); ++r) {
      std::map<std::string, at::Tensor> st;
      for (const auto& s : state_names)
        if (states.count(s) && states[s][r].defined()) st[s] = states[s][r];
      optimizer_update(opt, lr, step, w[r], g[r], st);
      for (const auto& s : state_names) {
        Locals& l = states[s];
        if (l.empty()) l.resize(w.size());
        l[r] = st.at(s);
      }
    }
    params_[name] = move(w, sspec, pspec, false, name, "optimizer");
  }
  acc_.clear();
  acc_spec_.clear();
  microbatches_seen_.clear();
  return norms;
}

uint64_t train_data_seed(const TrainSpec& train, uint64_t seed, int64_t step, int64_t microbatch) {
  if (train.data == TrainData::Fixed || (step == 0 && microbatch == 0)) return seed;
  // One stream per (step, microbatch), split from the run's seed as every other component's.
  Rng rng(seed, 0x747261696e000000ULL + static_cast<uint64_t>(step) * 1000003ULL + static_cast<uint64_t>(microbatch));
  return rng.next();
}

void run_train_steps(const Scenario& sc, const RunOptions& options, const SimRun& first, const OnMicrobatch& on_microbatch,
                     const OnStep& on_step) {
  const TrainSpec& t = sc.train;
  const Mutant planted = parse_mutant(options.mutant);
  std::map<std::string, Locals> initial;
  for (const auto& p : t.params) {
    Locals l;
    for (const auto& x : first.values.at(p).locals) l.push_back(x.detach());
    initial[p] = std::move(l);
  }
  MeshTrainer trainer(sc, options, std::move(initial));
  for (int64_t step = 1; step <= t.steps; ++step) {
    // The batch inputs' whole batch of the step, drawn as make_inputs draws an input (its own
    // stream of the step's first seed), so that its first rows are that draw's.
    std::map<std::string, at::Tensor> batches;
    for (const auto& name : t.batch) {
      const auto index = static_cast<uint64_t>(sc.find_input(name) - sc.inputs.data());
      InputDecl whole = *sc.find_input(name);
      whole.shape[0] *= t.microbatches;
      Rng rng(train_data_seed(t, options.seed, step - 1, 0), index);
      batches[name] = make_input(whole, options.dtype, rng);
    }
    for (int64_t mb = 0; mb < t.microbatches; ++mb) {
      SimRun later;
      const SimRun* run = &first;
      if (step > 1 || mb > 0) {
        RunOptions o = options;
        o.seed = train_data_seed(t, options.seed, step - 1, mb);
        o.localize = Localize::Never;
        std::map<std::string, Locals> given = trainer.params();
        for (const auto& [name, whole] : batches) {
          const InputDecl& in = *sc.find_input(name);
          const at::Tensor slice = whole.narrow(0, mb * in.shape[0], in.shape[0]).contiguous();
          Rng rng(o.seed, static_cast<uint64_t>(&in - sc.inputs.data()));
          given[name] = distribute(sc.mesh, in.placements, slice, &rng);
        }
        MutantScope scope(planted);
        later = run_distributed(sc, o, {}, &given);
        run = &later;
      }
      if (on_microbatch) on_microbatch(step, mb, *run);
      MutantScope scope(planted);
      for (const auto& p : t.params) {
        auto spec = run->grad_specs.find(p);
        if (spec != run->grad_specs.end()) trainer.accumulate(p, spec->second, run->grads.at(p));
      }
    }
    std::vector<double> norms;
    {
      MutantScope scope(planted);
      norms = trainer.finish_step(step);
    }
    if (on_step && !on_step(step, trainer, norms)) return;
  }
}

}  // namespace meshsim

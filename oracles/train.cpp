#include "oracles/train.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <tuple>

#include "core/error.h"
#include "core/mutants.h"
#include "oracles/mismatch.h"
#include "oracles/recorded.h"
#include "sim/data.h"
#include "sim/mesh_node.h"
#include "sim/train.h"

namespace meshsim {

double train_tolerance(const RunOptions& options) { return options.dtype == DType::Float32 ? 1e-3 : 1e-9; }

namespace {

// The oracle's side of the steps: global parameters and states, in the run's dtype.
struct OracleTrainer {
  std::map<std::string, at::Tensor> params, acc;
  std::map<std::string, std::map<std::string, at::Tensor>> states;
  double norm = 0.0;

  void accumulate(const std::string& name, const at::Tensor& g, bool first) {
    auto it = acc.find(name);
    if (first || it == acc.end()) acc[name] = g.detach();
    else it->second = it->second + g.detach();
  }

  void finish_step(const TrainSpec& t, int64_t step) {
    if (t.clip.present) {
      const double p = t.clip.norm_type;
      const std::vector<std::string>& names = t.clip.params.empty() ? t.params : t.clip.params;
      double total = 0.0;
      for (const auto& n : names) {
        auto it = acc.find(n);
        if (it == acc.end()) continue;
        const double part = norm_power(it->second, p).item<double>();
        total = std::isinf(p) ? std::max(total, part) : total + part;
      }
      norm = norm_root(total, p);
      const double coef = std::min(1.0, t.clip.max_norm / (norm + t.clip.eps));
      for (const auto& n : names)
        if (acc.count(n)) acc[n] = acc[n] * coef;
    }
    for (const auto& n : t.params) {
      auto it = acc.find(n);
      if (it == acc.end()) continue;
      optimizer_update(t.optimizer, t.lr_at(step - 1), step, params.at(n), it->second, states[n]);
    }
    acc.clear();
  }
};

struct StepReport {
  bool ok = true;
  double max_error = 0.0;
  nlohmann::json entry;
};

void add_failure(nlohmann::json& failures, nlohmann::json& mismatches, int64_t step, const std::string& what,
                 const char* kind, const Mismatch& m) {
  nlohmann::json j = m.to_json();
  j["value"] = what;
  j["kind"] = kind;
  j["step"] = step;
  mismatches.push_back(j);
  failures.push_back("step " + std::to_string(step) + ", " + what + ": " + m.message);
}

// One DTensor of the mesh (param or state) against the oracle's global tensor.
bool compare_one(const Mesh& mesh, const Spec& spec, const Locals& locals, const at::Tensor& ref, double tol,
                 int64_t step, const std::string& what, const char* kind, nlohmann::json& failures,
                 nlohmann::json& mismatches, double& max_error) {
  std::string problem;
  at::Tensor global;
  try {
    global = assemble(mesh, spec, locals, &problem);
  } catch (const std::exception& e) {
    problem = std::string("its locals do not form a tensor laid out as ") + spec_str(spec) + ": " + first_line(e.what());
  }
  const double err = global.defined() ? max_abs_diff(global, ref) : std::numeric_limits<double>::infinity();
  max_error = std::isnan(err) || std::isnan(max_error) ? std::numeric_limits<double>::quiet_NaN() : std::max(max_error, err);
  if (problem.empty() && within(err, tol, ref)) return true;
  Mismatch m = describe_mismatch(mesh, spec, locals, global, ref, tol);
  if (!problem.empty() && !m.replicas_disagree()) m.message = problem + (m.message.empty() ? "" : "; " + m.message);
  add_failure(failures, mismatches, step, what, kind, m);
  return false;
}

// A total norm off by a factor that the sizes of mesh axes explain: the p-th powers summed over
// ranks that hold the same gradient (n^(1/p): an axis the gradient is replicated on, reduced
// anyway) or not summed over the ranks of a shard (n^(-1/p)). "" when no set of axes fits.
std::string norm_factor_text(const Mesh& mesh, double actual, double expected, double p) {
  if (!(expected > 0) || !(actual > 0) || std::isinf(p)) return "";
  const double powered = std::pow(actual / expected, p);  // n or 1/n
  const bool over = powered > 1;
  const double n = over ? powered : 1 / powered;
  const int k = mesh.ndim();
  for (int mask = 1; mask < (1 << k); ++mask) {
    double size = 1;
    std::string axes;
    for (int a = 0; a < k; ++a)
      if (mask & (1 << a)) {
        size *= static_cast<double>(mesh.axis_size(a));
        axes += (axes.empty() ? "" : " x ") + mesh.axes()[static_cast<size_t>(a)];
      }
    if (size < 2 || std::abs(n - size) > 1e-6 * size) continue;
    char num[32];
    std::snprintf(num, sizeof num, "%g", size);
    const std::string form = p == 2 ? "sqrt(" + std::string(num) + ")"
                             : p == 1 ? std::string(num)
                                      : std::string(num) + "^(1/" + std::to_string(p).substr(0, 4) + ")";
    char buf[64];
    std::snprintf(buf, sizeof buf, "actual = %g x expected = ", actual / expected);
    const std::string head = std::string(buf) + (over ? "" : "1/") + form;
    return head + ", " + (axes.find(" x ") == std::string::npos ? "the size of mesh axis " : "the sizes of mesh axes ") +
           axes + (over ? ": the local norms were reduced over ranks that hold the same gradient (an axis it is replicated on)"
                        : ": the local norms were not reduced over the ranks that shard the gradient");
  }
  return "";
}

// With keep_values (meshsim run --values): a microbatch's data inputs as the mesh drew and laid
// them out (the oracle ran on the same globals).
void keep_train_inputs(const Scenario& sc, const TrainSpec& t, int64_t step, int64_t mb, const SimRun& run,
                       std::vector<KeptTrainTensor>& kept) {
  for (const auto& in : sc.inputs) {
    if (std::find(t.params.begin(), t.params.end(), in.name) != t.params.end()) continue;
    auto v = run.values.find(in.name);
    if (v == run.values.end()) continue;
    KeptTrainTensor k{step, mb, "input", "", {}};
    k.tensor.name = in.name;
    k.tensor.spec = v->second.spec;
    for (const auto& l : v->second.locals) k.tensor.locals.push_back(l.detach());
    auto g = run.input_globals.find(in.name);
    if (g != run.input_globals.end()) k.tensor.global = k.tensor.oracle = g->second.detach();
    kept.push_back(std::move(k));
  }
}

// ... and every parameter and optimizer state after a step, the mesh's (assembled) and the oracle's.
void keep_train_step(const Scenario& sc, const TrainSpec& t, int64_t step, const MeshTrainer& mesh,
                     const std::map<std::string, at::Tensor>& oracle_params,
                     const std::map<std::string, std::map<std::string, at::Tensor>>& oracle_states,
                     std::vector<KeptTrainTensor>& kept) {
  auto one = [&](const std::string& kind, const std::string& param, const std::string& state, const Spec& spec,
                 const Locals& locals, const at::Tensor& ref) {
    KeptTrainTensor k{step, -1, kind, state, {}};
    k.tensor.name = param;
    k.tensor.spec = spec;
    for (const auto& l : locals) k.tensor.locals.push_back(l.detach().clone());  // the optimizer updates in place
    try {
      k.tensor.global = assemble(sc.mesh, spec, locals, nullptr);
    } catch (const std::exception&) {  // written as missing, with why
    }
    if (ref.defined()) k.tensor.oracle = ref.detach().clone();
    kept.push_back(std::move(k));
  };
  for (const auto& p : t.params) {
    one("parameter", p, "", mesh.param_spec(p), mesh.params().at(p), oracle_params.at(p));
    auto ms = mesh.states().find(p);
    auto os = oracle_states.find(p);
    for (const auto& s : optimizer_state_names(t.optimizer)) {
      if (ms == mesh.states().end() || !ms->second.count(s)) continue;
      at::Tensor ref;
      if (os != oracle_states.end() && os->second.count(s)) ref = os->second.at(s);
      one("state", p, s, mesh.state_spec(p), ms->second.at(s), ref);
    }
  }
}

nlohmann::json finite_or_null(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

// A parameter of a scenario with mixed dtypes (float64_reference_run): its update since the start
// against the oracle's, within `tol` relative to the largest element of the oracle's update (not of
// the parameter: an update rounded away where the parameter is stored is a failure, however small
// against the parameter, unless float32 storage would lose it too).
bool compare_update(const Mesh& mesh, const Spec& spec, const Locals& locals, const at::Tensor& start,
                    const at::Tensor& ref, double tol, int64_t step, const std::string& what,
                    nlohmann::json& failures, nlohmann::json& mismatches, double& max_error) {
  std::string problem;
  at::Tensor stored, change;
  try {
    stored = assemble(mesh, spec, locals, &problem);
    change = stored.to(at::kDouble) - start;
  } catch (const std::exception& e) {
    problem = std::string("its locals do not form a tensor laid out as ") + spec_str(spec) + ": " + first_line(e.what());
  }
  const at::Tensor expected = ref - start;
  const double err = change.defined() ? max_abs_diff(change, expected) : std::numeric_limits<double>::infinity();
  max_error = std::isnan(err) || std::isnan(max_error) ? std::numeric_limits<double>::quiet_NaN() : std::max(max_error, err);
  const double largest = expected.numel() ? expected.abs().max().item<double>() : 0.0;
  // Plus what float32 master weights lose: an update below float32's resolution of the parameter
  // rounds away in any mixed-precision training (half an ulp, 2^-24 relative, each step); a coarser
  // storage's losses are the failure this comparison exists for.
  const double stored_max = start.numel() ? start.abs().max().item<double>() : 0.0;
  const double allowed = tol * largest + static_cast<double>(step) * 0x1p-24 * stored_max;
  if (problem.empty() && !std::isnan(err) && err <= allowed) return true;
  Mismatch m = describe_mismatch(mesh, spec, locals, stored.defined() ? stored.to(at::kDouble) : stored, ref, tol);
  char buf[160];
  std::string text = "its update since the start differs from the oracle's";
  if (change.defined() && change.sizes() == expected.sizes() && change.numel()) {
    const at::Tensor diff = (change - expected).abs();
    const int64_t beyond = (diff > allowed).sum().item<int64_t>();
    const int64_t at = diff.flatten().argmax().item<int64_t>();
    std::snprintf(buf, sizeof buf, ": %lld of %lld elements beyond %g x the largest update (%g); greatest difference %g",
                  static_cast<long long>(beyond), static_cast<long long>(diff.numel()), tol, largest,
                  diff.flatten()[at].item<double>());
    text += buf;
    std::snprintf(buf, sizeof buf, ", expected update %g, actual %g", expected.flatten()[at].item<double>(),
                  change.flatten()[at].item<double>());
    std::string index;
    int64_t rest = at;
    for (int64_t d = diff.dim() - 1; d >= 0; --d) {
      index = std::to_string(rest % diff.size(d)) + (index.empty() ? "" : ", ") + index;
      rest /= diff.size(d);
    }
    text += " at [" + index + "]" + buf;
    // Updates lost where the parameter is stored: no change where the oracle's is not zero.
    const int64_t lost = ((change == 0).logical_and(expected != 0)).sum().item<int64_t>();
    if (lost > 0)
      text += "; " + std::to_string(lost) + " elements did not change at all (their update rounded away in the " +
              std::string(dtype_of(stored.scalar_type()) ? dtype_name(*dtype_of(stored.scalar_type())) : "stored") +
              " parameter)";
  }
  m.message = problem.empty() ? text : problem + "; " + text;
  add_failure(failures, mismatches, step, what, "parameter", m);
  return false;
}

}  // namespace

void check_train(const Scenario& sc, const RunOptions& options, const SimRun& first, const OracleRun& first_oracle,
                 CheckedRun& out) {
  nlohmann::json& r = out.result;
  const TrainSpec& t = sc.train;
  nlohmann::json train = {{"steps", t.steps},
                          {"microbatches", t.microbatches},
                          {"data", t.data == TrainData::Fixed ? "fixed" : "per_microbatch"},
                          {"optimizer", optimizer_name(t.optimizer.kind)},
                          {"lr", t.lr}};
  if (r.value("status", "") != "pass" && r.value("status", "") != "unchecked") {
    train["ran"] = false;
    train["reason"] = "the first forward and backward did not pass: the steps after it are not run";
    r["train"] = train;
    return;
  }
  // Mixed dtypes: every comparison within the dtypes' tolerance, a parameter's by its change.
  const bool reference = float64_reference_run(sc, options.dtype);
  const double tol = reference ? dtype_tolerance(sc, options) : train_tolerance(options);
  train["ran"] = true;
  train["tolerance"] = tol;
  nlohmann::json layouts = nlohmann::json::object();
  for (const auto& p : t.params) {
    const Spec& ps = sc.find_input(p)->placements;
    nlohmann::json states = nlohmann::json::object();
    for (const auto& s : optimizer_state_names(t.optimizer))
      states[s] = placements_json(optimizer_state_spec(t.optimizer, p, ps));
    layouts[p] = {{"placements", placements_json(ps)}, {"states", states}};
  }
  train["parameters"] = layouts;

  OracleTrainer oracle;
  std::map<std::string, at::Tensor> start;  // the parameters before the first step (float64 in the reference)
  for (const auto& p : t.params) {
    const at::Tensor& g = first.input_globals.at(p);
    start[p] = oracle.params[p] = reference ? g.detach().to(at::kDouble) : g.detach();
  }
  nlohmann::json per_step = nlohmann::json::array(), failures = nlohmann::json::array(),
                 mismatches = nlohmann::json::array();
  std::vector<TrainCollective> collectives;
  bool ok = true;
  int64_t at_step = 1;
  // The oracle runs each microbatch on its own parameters and the mesh's data (the same draws).
  auto on_microbatch = [&](int64_t step, int64_t mb, const SimRun& run) {
    at_step = step;
    if (out.tensors) keep_train_inputs(sc, t, step, mb, run, out.tensors->train);
    OracleRun later;
    const OracleRun* orun = &first_oracle;
    if (step > 1 || mb > 0) {
      std::map<std::string, at::Tensor> globals = run.input_globals;
      for (const auto& p : t.params) globals[p] = oracle.params.at(p);
      // The microbatch's seed, the mesh's (sim/train.cpp): its random ops draw that step's values.
      later = run_oracle(sc, globals, options.dtype, nullptr, 0.0, false, train_data_seed(t, options.seed, step - 1, mb));
      orun = &later;
    }
    for (const auto& p : t.params) {
      auto g = orun->grads.find(p);
      if (g != orun->grads.end() && g->second.defined()) oracle.accumulate(p, g->second, mb == 0);
    }
  };
  auto on_step = [&](int64_t step, const MeshTrainer& mesh, const std::vector<double>& norms) {
    oracle.finish_step(t, step);
    collectives = mesh.collectives();
    StepReport rep;
    rep.entry = {{"step", step}};
    if (t.clip.present) {
      rep.entry["grad_norm"] = {{"oracle", finite_or_null(oracle.norm)}, {"ranks", nlohmann::json::array()}};
      Locals ranks;
      for (double n : norms) {
        rep.entry["grad_norm"]["ranks"].push_back(finite_or_null(n));
        ranks.push_back(at::full({}, n, at::kDouble));
      }
      Spec replicated(sc.mesh.axes().size(), Placement::replicate());
      // Every rank's total norm must be the oracle's: a norm reduced over too many axes is off by
      // n^(1/p) (sqrt(n) for L2), one reduced over too few differs between ranks.
      const size_t before = failures.size();
      rep.ok &= compare_one(sc.mesh, replicated, ranks, at::full({}, oracle.norm, at::kDouble), tol, step,
                            "clip_grad_norm's total norm", "grad_norm", failures, mismatches, rep.max_error);
      if (failures.size() > before && !norms.empty()) {
        const std::string factor = norm_factor_text(sc.mesh, norms[0], oracle.norm, t.clip.norm_type);
        if (!factor.empty()) {
          failures.back() = failures.back().get<std::string>() + "; " + factor;
          mismatches.back()["norm_factor"] = factor;
        }
      }
    }
    for (const auto& p : t.params) {
      if (reference)
        rep.ok &= compare_update(sc.mesh, mesh.param_spec(p), mesh.params().at(p), start.at(p), oracle.params.at(p), tol,
                                 step, "parameter " + p, failures, mismatches, rep.max_error);
      else
        rep.ok &= compare_one(sc.mesh, mesh.param_spec(p), mesh.params().at(p), oracle.params.at(p), tol, step,
                              "parameter " + p, "parameter", failures, mismatches, rep.max_error);
      auto ms = mesh.states().find(p);
      for (const auto& s : optimizer_state_names(t.optimizer)) {
        auto os = oracle.states[p].find(s);
        if (os == oracle.states[p].end()) continue;  // no gradient reached it yet
        if (ms == mesh.states().end() || !ms->second.count(s)) {
          failures.push_back("step " + std::to_string(step) + ", optimizer state " + p + "." + s +
                             ": the mesh has none, the oracle has one (a gradient reached " + p + " in the oracle only)");
          rep.ok = false;
          continue;
        }
        rep.ok &= compare_one(sc.mesh, mesh.state_spec(p), ms->second.at(s), os->second, tol, step,
                              "optimizer state " + p + "." + s, "optimizer_state", failures, mismatches, rep.max_error);
      }
    }
    if (out.tensors) keep_train_step(sc, t, step, mesh, oracle.params, oracle.states, out.tensors->train);
    rep.entry["status"] = rep.ok ? "pass" : "fail";
    rep.entry["max_abs_error"] = finite_or_null(rep.max_error);
    per_step.push_back(rep.entry);
    if (rep.ok) return true;
    ok = false;
    train["first_failing_step"] = step;
    return false;  // the later steps start from values already wrong
  };
  try {
    run_train_steps(sc, options, first, on_microbatch, on_step);
  } catch (const std::exception& e) {
    ok = false;
    failures.push_back("step " + std::to_string(at_step) + " raised: " + first_line(e.what()));
    train["first_failing_step"] = at_step;
  }
  train["per_step"] = per_step;
  // Communication of the steps beyond the forward and backward, by phase, collective and axis.
  std::map<std::tuple<std::string, std::string, std::string>, std::pair<int64_t, int64_t>> comm;
  for (const auto& c : collectives) {
    auto& row = comm[{c.phase, c.op, c.axis}];
    row.first += 1;
    row.second += c.bytes;
  }
  nlohmann::json comm_json = nlohmann::json::array();
  for (const auto& [k, v] : comm)
    comm_json.push_back({{"phase", std::get<0>(k)}, {"op", std::get<1>(k)}, {"axis", std::get<2>(k)},
                         {"count", v.first}, {"bytes", v.second}});
  train["communication"] = comm_json;
  r["train"] = train;
  r["checks"]["train_equivalence"] = ok;
  if (ok) return;
  r["status"] = "fail";
  nlohmann::json all = r.value("failures", nlohmann::json::array());
  for (const auto& f : failures) all.push_back(f);
  r["failures"] = all;
  if (!mismatches.empty()) {
    nlohmann::json m = r.value("mismatches", nlohmann::json::array());
    for (const auto& x : mismatches) m.push_back(x);
    r["mismatches"] = m;
  }
  out.exit_code = 1;
}

}  // namespace meshsim

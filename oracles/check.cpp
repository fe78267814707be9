#include "oracles/check.h"

#include <algorithm>

#include "core/cotangent.h"
#include "core/error.h"
#include "core/mutants.h"
#include "oracles/oracle.h"
#include "sim/data.h"
#include "sim/interpreter.h"

namespace meshsim {

namespace {

nlohmann::json placements_json(const Spec& spec) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : spec) out.push_back(p.str());
  return out;
}

// Exact for integer-valued float64 data on meshes whose axis sizes are powers of two (a division
// by 3 in R -> P(sum) or P(avg) is not exact in binary); a relative tolerance otherwise.
double tolerance(const Scenario& sc, const RunOptions& options) {
  bool exact = options.dtype == DType::Float64;
  for (const auto& in : sc.inputs) exact &= in.init != "randn";
  for (auto n : sc.mesh.shape()) exact &= (n & (n - 1)) == 0;
  if (exact) return 0.0;
  return options.dtype == DType::Float32 ? 1e-4 : 1e-12;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return std::numeric_limits<double>::infinity();
  if (a.numel() == 0) return 0.0;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

bool within(double err, double tol, const at::Tensor& reference) {
  if (tol == 0.0) return err == 0.0;
  double scale = reference.numel() ? std::max(1.0, reference.abs().max().item<double>()) : 1.0;
  return err <= tol * scale;
}

std::string format_error(double err) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", err);
  return buf;
}

struct Comparison {
  bool ok = true;
  double max_error = 0.0;
  std::vector<std::string> problems;

  void add(const std::string& what, double err, bool pass, const std::string& problem) {
    max_error = std::max(max_error, err);
    if (!pass) {
      ok = false;
      problems.push_back(what + ": " + problem);
    }
  }
};

// Every rank's local shape must be the one its spec's torch.chunk layout gives.
std::string layout_problem(const Mesh& mesh, const DTensor& v) {
  for (int64_t r = 0; r < mesh.size(); ++r) {
    Shape want = local_layout(mesh, v.spec, v.shape, r).shape;
    if (v.locals[r].sizes().vec() != want)
      return "rank " + std::to_string(r) + " holds a local of shape " + shape_str(v.locals[r].sizes().vec()) +
             ", its layout " + spec_str(v.spec) + " says " + shape_str(want);
  }
  return {};
}

nlohmann::json collectives_json(const std::vector<Event>& events) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : events)
    if (e.kind == "collective")
      out.push_back({{"phase", e.phase}, {"op", e.name}, {"axis", e.axis}, {"bytes", e.bytes}, {"value", e.value}});
  return out;
}

}  // namespace

CheckedRun check_scenario(const Scenario& sc, const RunOptions& options) {
  CheckedRun out;
  nlohmann::json& r = out.result;
  r["format"] = "meshsim.result/1";
  r["name"] = sc.name;
  SimRun run;
  try {
    // A planted bug lives in the system under test only; the checks below use the true rules.
    MutantScope planted(parse_mutant(options.mutant));
    run = run_distributed(sc, options);
  } catch (const SemanticError& e) {
    r["status"] = "error";
    r["error"] = {{"kind", error_kind_name(e.kind())}, {"message", e.what()}};
    out.exit_code = exit_code_for(e.kind());
    return out;
  } catch (const std::exception& e) {
    // libtorch refused what the runtime asked of it (shapes that do not fit, say): the
    // simulation is inconsistent, which is a failed check, not unusable input.
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    r["status"] = "fail";
    r["error"] = nullptr;
    r["checks"] = {{"runs", false}};
    r["failures"] = {"the run raised: " + what};
    r["options"] = options.to_json();
    out.exit_code = 1;
    return out;
  }
  out.events = run.runtime->events();
  const OracleRun oracle = run_oracle(sc, run.input_globals);
  const double tol = tolerance(sc, options);

  Comparison forward, gradient, duality, tracking;
  std::vector<std::string> unchecked;  // values the oracle cannot know (a local_map without reference)
  r["values"] = nlohmann::json::object();
  for (const auto& name : run.named) {
    const DTensor& v = run.values.at(name);
    nlohmann::json local_shapes = nlohmann::json::array();
    for (const auto& t : v.locals) local_shapes.push_back(t.sizes().vec());
    r["values"][name] = {{"placements", placements_json(v.spec)}, {"shape", v.shape}, {"local_shapes", local_shapes}};
    std::string problem = layout_problem(sc.mesh, v);
    at::Tensor global = assemble(sc.mesh, v.spec, v.locals, problem.empty() ? &problem : nullptr);
    const at::Tensor& ref = oracle.values.at(name);
    if (!ref.defined()) {
      unchecked.push_back(name);
      continue;
    }
    double err = max_abs_diff(global, ref);
    bool pass = problem.empty() && within(err, tol, ref);
    forward.add(name, err, pass, problem.empty() ? "differs from the oracle by " + format_error(err) : problem);
  }
  r["grads"] = nlohmann::json::object();
  for (const auto& name : run.grad_inputs) {
    const DTensor& v = run.values.at(name);
    if (!run.ran_backward) {  // P(max) and P(min) have no cotangent: null
      nlohmann::json cot = nullptr;
      try {
        cot = placements_json(cotangent_spec(v.spec));
      } catch (const SemanticError&) {
      }
      r["grads"][name] = {{"placements", nullptr}, {"cotangent", cot}};
      continue;
    }
    const Spec want = cotangent_spec(v.spec);
    const int64_t want_divisor = cotangent_scale_divisor(sc.mesh, v.spec);
    const GradSpec& got = run.grad_specs.at(name);
    r["grads"][name] = {{"placements", placements_json(got.spec)}, {"cotangent", placements_json(want)}};
    duality.add(name, 0.0, got.spec == want && got.divisor == want_divisor,
                "gradient is " + spec_str(got.spec) + ", its cotangent is " + spec_str(want));
    std::string problem;
    at::Tensor global = assemble(sc.mesh, got.spec, run.grads.at(name), &problem) * static_cast<double>(got.divisor);
    if (!oracle.grads.count(name)) {
      unchecked.push_back("grad " + name);
      continue;
    }
    const at::Tensor& ref = oracle.grads.at(name);
    double err = max_abs_diff(global, ref);
    gradient.add("grad " + name, err, problem.empty() && within(err, tol, ref),
                 problem.empty() ? "differs from the oracle by " + format_error(err) : problem);
  }
  for (const auto& p : run.runtime->tracking_problems()) duality.add("tracking", 0.0, false, p);
  for (const auto& name : run.runtime->body_order()) {
    const auto& b = run.runtime->body_values().at(name);
    r["values"][name] = {{"variant", b.variant}, {"reduced", b.reduced}, {"local_shapes", b.local_shapes}};
    if (b.untracked) r["values"][name]["untracked"] = true;
  }
  for (const auto& u : run.runtime->untracked()) tracking.add("untracked", 0.0, false, u);
  if (!unchecked.empty()) r["unchecked"] = unchecked;

  r["collectives"] = collectives_json(out.events);
  r["checks"] = {{"forward_equivalence", forward.ok}, {"duality", duality.ok}};
  if (run.ran_backward) r["checks"]["gradient_equivalence"] = gradient.ok;
  if (run.has_local_map) {
    // Every LTensor passed the exclusivity check after every op and strategy (a violation is an
    // exclusivity_violation error); every value that left a region had tracked sets.
    r["checks"]["exclusivity"] = true;
    r["checks"]["variance_tracking"] = tracking.ok;
  }
  r["max_abs_error"] = std::max(forward.max_error, gradient.max_error);
  const bool pass = forward.ok && gradient.ok && duality.ok && tracking.ok;
  r["status"] = pass ? "pass" : "fail";
  r["error"] = nullptr;
  if (!pass) {
    nlohmann::json failures = nlohmann::json::array();
    for (const auto* c : {&forward, &gradient, &duality, &tracking})
      for (const auto& p : c->problems) failures.push_back(p);
    r["failures"] = failures;
  }
  r["options"] = options.to_json();
  const auto& st = run.runtime->stats();
  r["stats"] = {{"propagation_requests", st.propagation_requests},
                {"propagations", st.propagations},
                {"cache_hits", st.cache_hits}};
  out.exit_code = pass ? 0 : 1;
  return out;
}

}  // namespace meshsim

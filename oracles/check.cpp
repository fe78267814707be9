#include "oracles/check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

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

// The larger of two errors, NaN winning (std::max would drop it).
double worse(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b);
}

std::string format_error(double err) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", err);
  return buf;
}

// NaN and infinity have no JSON spelling: null.
nlohmann::json error_json(double err) {
  return std::isfinite(err) ? nlohmann::json(err) : nlohmann::json(nullptr);
}

struct Comparison {
  bool ok = true;
  int not_run = 0;  // comparisons the oracle could not make (a local_map without reference)
  double max_error = 0.0;
  std::vector<std::string> problems;

  void add(const std::string& what, double err, bool pass, const std::string& problem) {
    max_error = worse(max_error, err);
    if (!pass) {
      ok = false;
      problems.push_back(what + ": " + problem);
    }
  }
  void skip() { ++not_run; }
  // true: every comparison ran and passed; false: one failed; null: none failed, some did not run.
  nlohmann::json verdict() const {
    if (!ok) return false;
    if (not_run) return nullptr;
    return true;
  }
};

// The global value of locals laid out by `spec`; locals that libtorch cannot put together (shapes
// that do not concatenate) give an undefined tensor and a problem.
at::Tensor assemble_checked(const Mesh& mesh, const Spec& spec, const Locals& locals, std::string& problem) {
  try {
    return assemble(mesh, spec, locals, problem.empty() ? &problem : nullptr);
  } catch (const std::exception& e) {
    if (problem.empty())
      problem = "its locals do not form a tensor laid out as " + spec_str(spec) + ": " + first_line(e.what());
    return at::Tensor();
  }
}

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

// The run raised (libtorch refused what it was asked, the oracle could not run a program op the
// mesh ran): the simulation is inconsistent, which is a failed check, not unusable input.
void raised(CheckedRun& out, const RunOptions& options, const std::string& stage, const std::exception& e) {
  nlohmann::json& r = out.result;
  r["status"] = "fail";
  r["error"] = nullptr;
  r["checks"] = {{"runs", false}};
  r["failures"] = {stage + " raised: " + first_line(e.what())};
  r["options"] = options.to_json();
  out.exit_code = 1;
}

void semantic_error(CheckedRun& out, const SemanticError& e) {
  nlohmann::json& r = out.result;
  r["status"] = "error";
  r["error"] = {{"kind", error_kind_name(e.kind())}, {"message", e.what()}};
  out.exit_code = exit_code_for(e.kind());
}

// The comparisons of a run with its oracle, into the result.
void compare(const Scenario& sc, const RunOptions& options, const SimRun& run, const OracleRun& oracle,
             CheckedRun& out) {
  nlohmann::json& r = out.result;
  const double tol = comparison_tolerance(sc, options);

  Comparison forward, gradient, duality, tracking;
  std::vector<std::string> unchecked;  // values the oracle cannot know (a local_map without reference)
  r["values"] = nlohmann::json::object();
  for (const auto& name : run.named) {
    const DTensor& v = run.values.at(name);
    nlohmann::json local_shapes = nlohmann::json::array();
    for (const auto& t : v.locals) local_shapes.push_back(t.sizes().vec());
    r["values"][name] = {{"placements", placements_json(v.spec)}, {"shape", v.shape}, {"local_shapes", local_shapes}};
    std::string problem = layout_problem(sc.mesh, v);
    at::Tensor global = assemble_checked(sc.mesh, v.spec, v.locals, problem);
    const at::Tensor& ref = oracle.values.at(name);
    if (!ref.defined()) {
      unchecked.push_back(name);
      forward.skip();
      continue;
    }
    double err = global.defined() ? max_abs_diff(global, ref) : std::numeric_limits<double>::infinity();
    bool pass = problem.empty() && within(err, tol, ref);
    forward.add(name, err, pass, problem.empty() ? "differs from the oracle by " + format_error(err) : problem);
  }
  r["grads"] = nlohmann::json::object();
  for (const auto& name : run.grad_inputs) {
    const DTensor& v = run.values.at(name);
    auto got = run.grad_specs.find(name);
    if (!run.ran_backward || got == run.grad_specs.end()) {
      // Forward only, or no gradient reached a P(max) or P(min) input (it has no cotangent): no
      // placements; the cotangent where there is one.
      nlohmann::json cot = nullptr;
      if (has_cotangent(v.spec)) cot = placements_json(cotangent_spec(v.spec));
      r["grads"][name] = {{"placements", nullptr}, {"cotangent", cot}};
      if (!run.ran_backward) continue;
      // The oracle must agree that nothing flows to it.
      if (!oracle.grads.count(name)) {
        unchecked.push_back("grad " + name);
        gradient.skip();
        continue;
      }
      const at::Tensor& ref = oracle.grads.at(name);
      const double err = max_abs_diff(ref, at::zeros_like(ref));
      gradient.add("grad " + name, err, within(err, tol, ref),
                   "no gradient reaches it on the mesh, the oracle's differs from zero by " + format_error(err));
      continue;
    }
    const Spec want = cotangent_spec(v.spec);
    const int64_t want_divisor = cotangent_scale_divisor(sc.mesh, v.spec);
    r["grads"][name] = {{"placements", placements_json(got->second.spec)}, {"cotangent", placements_json(want)}};
    duality.add(name, 0.0, got->second.spec == want && got->second.divisor == want_divisor,
                "gradient is " + spec_str(got->second.spec) + ", its cotangent is " + spec_str(want));
    if (!oracle.grads.count(name)) {
      unchecked.push_back("grad " + name);
      gradient.skip();
      continue;
    }
    std::string problem;
    at::Tensor global = assemble_checked(sc.mesh, got->second.spec, run.grads.at(name), problem);
    const at::Tensor& ref = oracle.grads.at(name);
    double err = global.defined() ? max_abs_diff(global * static_cast<double>(got->second.divisor), ref)
                                  : std::numeric_limits<double>::infinity();
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
  r["checks"] = {{"forward_equivalence", forward.verdict()}, {"duality", duality.verdict()}};
  if (run.ran_backward) r["checks"]["gradient_equivalence"] = gradient.verdict();
  if (run.has_local_map) {
    // Every LTensor passed the exclusivity check after every op and strategy (a violation is an
    // exclusivity_violation error); every value that left a region had tracked sets.
    r["checks"]["exclusivity"] = true;
    r["checks"]["variance_tracking"] = tracking.verdict();
  }
  r["max_abs_error"] = error_json(worse(forward.max_error, gradient.max_error));
  const bool failed = !(forward.ok && gradient.ok && duality.ok && tracking.ok);
  // Nothing failed, but a comparison did not run: not a pass (exit 0 all the same: nothing failed).
  const bool partial = forward.not_run || gradient.not_run;
  r["status"] = failed ? "fail" : partial ? "unchecked" : "pass";
  r["error"] = nullptr;
  if (failed) {
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
  out.exit_code = failed ? 1 : 0;
}

}  // namespace

// Ops whose results on integer data are integers (sums, products, maxima and moves of data), so
// that the mesh and the oracle agree bit for bit whatever the order of the sums. Every other op
// rounds: exp, tanh, sin and softmax are transcendental, div and mean divide (mean by the global
// count, each rank its own part), and a new op is inexact until it is listed here.
bool exact_op(const OpDecl& op) {
  static const std::set<std::string> exact = {
      "redistribute", "add", "sub", "mul", "neg", "relu", "mm", "transpose", "sum",
      // products and moves of data (amax and amin are not: their gradient splits g among ties)
      "bmm", "matmul", "linear", "permute", "view", "reshape", "flatten", "unflatten", "squeeze",
      "unsqueeze", "expand", "cat", "stack", "narrow",
      // local_map body ops; all_reduce(avg) divides by its group size, checked with the mesh.
      "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "mark_varying"};
  // Built-in Functions: x * x, and a sum over the group.
  static const std::set<std::string> exact_functions = {"local_square", "opaque_all_reduce",
                                                        "opaque_all_reduce_unregistered"};
  // scale, and a binary op with a scalar `value` (add, sub, mul; div rounds anyway).
  if (op.op == "scale" || (op.attrs.is_object() && op.attrs.contains("value") && exact.count(op.op))) {
    // An integer, or a power of two (0.5, 0.25): the product of an integer by it is exact.
    const double v = op.attrs.value("value", 0.0);
    int exponent = 0;
    return std::isfinite(v) && (v == std::trunc(v) || std::abs(std::frexp(v, &exponent)) == 0.5);
  }
  if (op.op == "call") return exact_functions.count(op.attrs.value("function", "")) > 0;
  if (op.op == "local_map") {
    for (const auto* ops : {&op.body, &op.reference})
      for (const auto& b : *ops)
        if (!exact_op(b)) return false;
    return true;
  }
  return exact.count(op.op) > 0;
}

double comparison_tolerance(const Scenario& sc, const RunOptions& options) {
  if (options.dtype == DType::Float32) return 1e-4;
  bool exact = true;
  for (const auto& in : sc.inputs) exact &= in.init != "randn";
  // A division by a group size that is not a power of two (R -> P(sum) divided by 3, P(avg)) rounds.
  for (auto n : sc.mesh.shape()) exact &= (n & (n - 1)) == 0;
  for (const auto& op : sc.program) exact &= exact_op(op);
  return exact ? 0.0 : 1e-12;
}

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
    semantic_error(out, e);
    return out;
  } catch (const std::exception& e) {
    raised(out, options, "the run", e);
    return out;
  }
  out.events = run.runtime->events();
  OracleRun oracle;
  try {
    oracle = run_oracle(sc, run.input_globals, options.dtype);
  } catch (const SemanticError& e) {  // a local_map reference libtorch refuses
    semantic_error(out, e);
    return out;
  } catch (const std::exception& e) {
    raised(out, options, "the single-device oracle", e);
    return out;
  }
  try {
    compare(sc, options, run, oracle, out);
  } catch (const std::exception& e) {
    nlohmann::json keep = {{"format", r["format"]}, {"name", r["name"]}};
    r = keep;
    raised(out, options, "the comparison with the oracle", e);
  }
  return out;
}

}  // namespace meshsim

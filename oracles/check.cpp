#include "oracles/check.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <set>
#include <sstream>

#include "core/cotangent.h"
#include "core/error.h"
#include "core/mutants.h"
#include "core/ops.h"
#include "core/semantics.h"
#include "oracles/localize.h"
#include "oracles/mismatch.h"
#include "oracles/oracle.h"
#include "oracles/recorded.h"
#include "oracles/train.h"
#include "sim/data.h"
#include "sim/interpreter.h"
#include "sim/mesh_node.h"

namespace meshsim {

namespace {

// The larger of two errors, NaN winning (std::max would drop it).
double worse(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b);
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

// A program op's JSON path ("/program/15") by its index, or null (-1: none).
nlohmann::json program_op_json(int k) {
  return k >= 0 ? nlohmann::json("/program/" + std::to_string(k)) : nlohmann::json(nullptr);
}
// The program op event i belongs to (Recorder::event_ops).
nlohmann::json program_op_json(const std::vector<int>& ops, size_t i) { return program_op_json(i < ops.size() ? ops[i] : -1); }

nlohmann::json collectives_json(const std::vector<Event>& events, const std::vector<int>& ops) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.kind != "collective") continue;
    nlohmann::json c = {{"phase", e.phase}, {"op", e.name},           {"axis", e.axis},
                        {"bytes", e.bytes}, {"value", e.value}, {"program_op", program_op_json(ops, i)}};
    if (!e.implicit.empty()) c["implicit"] = true;
    out.push_back(c);
  }
  return out;
}

// The communication table (like PyTorch's CommDebugMode): per mesh axis, phase and collective the
// count and bytes per rank (of them, the planner's implicit ones), and per program op.
nlohmann::json communication_json(const Scenario& sc, const std::vector<Event>& events, const std::vector<int>& ops) {
  struct Row {
    int64_t count = 0, bytes = 0, implicit_count = 0, implicit_bytes = 0;
  };
  std::map<std::tuple<std::string, int, std::string>, Row> by_axis;  // (axis, forward first, collective)
  std::map<int, std::map<std::string, Row>> by_op;                   // op index -> phase -> row
  int64_t total = 0, implicit_total = 0, count = 0, implicit_count = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.kind != "collective") continue;
    const bool imp = !e.implicit.empty();
    for (Row* row : {&by_axis[{e.axis, e.phase == "forward" ? 0 : 1, e.name}],
                     &by_op[i < ops.size() ? ops[i] : -1][e.phase]}) {
      row->count += 1;
      row->bytes += e.bytes;
      row->implicit_count += imp;
      row->implicit_bytes += imp ? e.bytes : 0;
    }
    count += 1;
    total += e.bytes;
    implicit_count += imp;
    implicit_total += imp ? e.bytes : 0;
  }
  auto row_json = [](const Row& r) {
    return nlohmann::json{{"count", r.count}, {"bytes", r.bytes}, {"implicit_count", r.implicit_count},
                          {"implicit_bytes", r.implicit_bytes}};
  };
  nlohmann::json axes = nlohmann::json::array();
  // Axes in the mesh's order.
  for (const auto& axis : sc.mesh.axes())
    for (const auto& [key, row] : by_axis) {
      if (std::get<0>(key) != axis) continue;
      nlohmann::json j = row_json(row);
      j["axis"] = axis;
      j["phase"] = std::get<1>(key) == 0 ? "forward" : "backward";
      j["collective"] = std::get<2>(key);
      axes.push_back(j);
    }
  nlohmann::json per_op = nlohmann::json::array();
  for (const auto& [k, phases] : by_op) {
    nlohmann::json j;
    if (k >= 0 && static_cast<size_t>(k) < sc.program.size()) {
      const OpDecl& op = sc.program[static_cast<size_t>(k)];
      j = {{"op", op.path}, {"name", op.op}, {"out", op.out}};
    } else {
      j = {{"op", nullptr}, {"name", "no program op (the seed, a Function's own backward)"}, {"out", nullptr}};
    }
    Row sum;
    for (const auto& [phase, row] : phases) {
      j[phase] = row_json(row);
      sum.count += row.count;
      sum.bytes += row.bytes;
      sum.implicit_count += row.implicit_count;
      sum.implicit_bytes += row.implicit_bytes;
    }
    const nlohmann::json total_row = row_json(sum);
    for (const auto& [key, v] : total_row.items()) j[key] = v;
    per_op.push_back(j);
  }
  return {{"count", count},   {"bytes", total}, {"implicit_count", implicit_count},
          {"implicit_bytes", implicit_total}, {"by_axis", axes}, {"by_op", per_op}};
}

// Every redistribution the planner inserted, with its reason and the collectives it cost
// (forward, and the backward of an implicit redistribution above autograd).
nlohmann::json implicit_json(const std::vector<ImplicitMove>& moves, const std::vector<Event>& events) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& m : moves) {
    nlohmann::json collectives = nlohmann::json::array();
    int64_t bytes = 0;
    for (const auto& e : events)
      if (e.kind == "collective" && e.implicit == m.reason) {
        collectives.push_back({{"phase", e.phase}, {"op", e.name}, {"axis", e.axis}, {"bytes", e.bytes}});
        bytes += e.bytes;
      }
    nlohmann::json j = {{"phase", m.phase},
                        {"program_op", program_op_json(m.program_op)},
                        {"op", m.op},
                        {"value", m.value},
                        {"from", placements_json(m.from)},
                        {"to", placements_json(m.to)},
                        {"reason", m.reason},
                        {"collectives", collectives},
                        {"bytes", bytes}};
    if (!m.operand.empty()) j["operand"] = m.operand;
    j["operand_index"] = m.operand_index;
    if (!m.rows.empty()) j["rows"] = m.rows;
    if (!m.alternatives.empty()) {
      j["alternatives"] = nlohmann::json::array();
      for (const auto& a : m.alternatives)
        j["alternatives"].push_back({{"axis", a.axis}, {"row", a.row}, {"bytes", a.bytes}, {"verdict", a.verdict}});
    }
    out.push_back(j);
  }
  return out;
}

// The run raised (libtorch refused what it was asked, the oracle could not run a program op the
// mesh ran): the simulation is inconsistent, which is a failed check, not unusable input.
void raised(CheckedRun& out, const RunOptions& options, const std::string& stage, const std::exception& e) {
  nlohmann::json& r = out.result;
  if (is_out_of_memory(e)) {  // the machine's limit, not a bug found: its own status and exit code
    std::string why = first_line(e.what());
    const auto allocator = why.find("DefaultCPUAllocator: ");  // after libtorch's "[enforce fail at ...]"
    if (allocator != std::string::npos) why = why.substr(allocator);
    r["status"] = "error";
    r["error"] = {{"kind", error_kind_name(ErrorKind::OutOfMemory)},
                  {"message", "out of memory in " + stage + ": " + why +
                                  " (meshsim run estimates what a scenario needs before it runs: --max-memory)"}};
    out.exit_code = kExitResource;
    return;
  }
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
  if (!e.path().empty()) r["error"]["path"] = e.path();
  out.exit_code = exit_code_for(e.kind());
}

// A failed comparison in numbers, added to `mismatches`; returns its one-line message (`err`, the
// comparison's max abs error, alone where mismatch_numbers_enabled() is off). A layout
// problem or locals that do not form a tensor (`problem`, `leads`) lead the message, as they did
// before there were numbers; replicas that disagree (assemble's problem otherwise) are the
// mismatch's own to say.
std::string report_mismatch(const std::string& value, const char* kind, const Mesh& mesh, const Spec& spec,
                            const Locals& locals, const at::Tensor& global, const at::Tensor& ref, double err,
                            double tol, const std::string& problem, bool leads,
                            const std::vector<const DTensor*>& context, nlohmann::json& mismatches) {
  if (!mismatch_numbers_enabled()) {  // a run expected to fail: its status is what is read
    std::ostringstream numbers;
    numbers << kind << " " << value << ": max abs error " << err << ", tolerance " << tol
            << " of the oracle's largest magnitude";
    return problem.empty() ? numbers.str() : problem + "; " + numbers.str();
  }
  Mismatch m = describe_mismatch(mesh, spec, locals, global, ref, tol, context);
  const bool numbers = global.defined() && global.sizes() == ref.sizes() && m.mismatched > 0;
  if (!problem.empty() && (leads || !m.replicas_disagree())) m.message = numbers ? problem + "; " + m.message : problem;
  nlohmann::json entry = m.to_json();
  entry["value"] = value;
  entry["kind"] = kind;
  mismatches.push_back(entry);
  return m.message;
}

// A gradient's locals scaled as its assembled global is compared: times its divisor.
Locals scaled(const Locals& locals, int64_t divisor) {
  if (divisor == 1) return locals;
  Locals out;
  for (const auto& t : locals) out.push_back(t * static_cast<double>(divisor));
  return out;
}

// Adds the seconds from its making to stop() (or its end) to `total`.
class Stopwatch {
 public:
  explicit Stopwatch(double& total) : total_(total), t0_(std::chrono::steady_clock::now()) {}
  ~Stopwatch() { stop(); }
  void stop() {
    if (stopped_) return;
    stopped_ = true;
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  double& total_;
  std::chrono::steady_clock::time_point t0_;
  bool stopped_ = false;
};

// The comparisons of a run with its oracle, into the result.
// What the comparison found failing, for the localization.
struct Failed {
  std::vector<std::string> values;  // forward, in scenario order
  bool gradients = false;
  bool any = false;
};

Failed compare(const Scenario& sc, const RunOptions& options, const SimRun& run, const OracleRun& oracle,
               CheckedRun& out) {
  Failed failed_what;
  nlohmann::json& r = out.result;
  const double tol = comparison_tolerance(sc, options);

  Comparison forward, gradient, duality, tracking, from_local;
  const bool hookless = follows(options.semantics, Difference::NoGradientHook);
  std::vector<std::string> unchecked;  // values the oracle cannot know (a local_map without reference)
  nlohmann::json mismatches = nlohmann::json::array();
  // Values whose empty shards may explain a NaN.
  std::vector<const DTensor*> context;
  for (const auto& name : run.named) context.push_back(&run.values.at(name));
  r["values"] = nlohmann::json::object();
  for (const auto& name : run.named) {
    const DTensor& v = run.values.at(name);
    nlohmann::json local_shapes = nlohmann::json::array();
    for (const auto& t : v.locals) local_shapes.push_back(t.sizes().vec());
    r["values"][name] = {{"placements", placements_json(v.spec)}, {"shape", v.shape}, {"local_shapes", local_shapes}};
    Stopwatch numbers(out.seconds.comparison);
    const at::Tensor& ref = oracle.values.at(name);
    if (!ref.defined()) {
      unchecked.push_back(name);
      forward.skip();
      continue;
    }
    std::string problem = layout_problem(sc.mesh, v);
    const bool laid_out = problem.empty();
    // Each local against its block of the reference where that says the same; else assembled.
    std::optional<double> direct;
    if (laid_out && ref.sizes().equals(v.shape)) direct = max_abs_diff_laid_out(sc.mesh, v.spec, v.locals, ref);
    at::Tensor global;
    if (!direct) global = assemble_checked(sc.mesh, v.spec, v.locals, problem);
    double err = direct ? *direct : global.defined() ? max_abs_diff(global, ref) : std::numeric_limits<double>::infinity();
    bool pass = problem.empty() && within(err, tol, ref);
    numbers.stop();
    std::string message;
    if (!pass) {
      if (direct && mismatch_numbers_enabled())
        global = assemble_checked(sc.mesh, v.spec, v.locals, problem);  // for the report's numbers
      message = report_mismatch(name, "value", sc.mesh, v.spec, v.locals, global, ref, err, tol, problem,
                                !laid_out || !global.defined(), context, mismatches);
      failed_what.values.push_back(name);
    }
    forward.add(name, err, pass, message);
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
      const bool pass = within(err, tol, ref);
      std::string message;
      if (!pass)
        message = "no gradient reaches it on the mesh, the oracle's differs from zero: " +
                  report_mismatch(name, "grad", sc.mesh, v.spec, {}, at::zeros_like(ref), ref, err, tol, "", false,
                                  context, mismatches);
      gradient.add("grad " + name, err, pass, message);
      continue;
    }
    const Spec want = cotangent_spec(v.spec);
    const int64_t want_divisor = cotangent_scale_divisor(sc.mesh, v.spec);
    r["grads"][name] = {{"placements", placements_json(got->second.spec)}, {"cotangent", placements_json(want)}};
    // Without the gradient hook (semantics pytorch) a gradient keeps the placements its op's
    // backward gave it, as PyTorch's .grad does: duality is not a rule there, and not a check.
    if (!hookless)
      duality.add(name, 0.0, got->second.spec == want && got->second.divisor == want_divisor,
                  "gradient is " + spec_str(got->second.spec) + ", its cotangent is " + spec_str(want));
    if (!oracle.grads.count(name)) {
      unchecked.push_back("grad " + name);
      gradient.skip();
      continue;
    }
    Stopwatch numbers(out.seconds.comparison);
    std::string problem;
    const at::Tensor& ref = oracle.grads.at(name);
    std::optional<double> direct;
    if (got->second.divisor == 1 && ref.sizes().equals(v.shape))
      direct = max_abs_diff_laid_out(sc.mesh, got->second.spec, run.grads.at(name), ref);
    at::Tensor global;
    auto assembled = [&] {
      global = assemble_checked(sc.mesh, got->second.spec, run.grads.at(name), problem);
      if (global.defined() && got->second.divisor != 1) global = global * static_cast<double>(got->second.divisor);
    };
    if (!direct) assembled();
    double err = direct ? *direct : global.defined() ? max_abs_diff(global, ref) : std::numeric_limits<double>::infinity();
    const bool pass = problem.empty() && within(err, tol, ref);
    numbers.stop();
    std::string message;
    if (!pass && direct && mismatch_numbers_enabled()) assembled();  // for the report's numbers
    if (!pass)
      message = report_mismatch(name, "grad", sc.mesh, got->second.spec,
                                scaled(run.grads.at(name), got->second.divisor), global, ref, err, tol, problem,
                                !global.defined(), context, mismatches);
    gradient.add("grad " + name, err, pass, message);
  }
  for (const auto& p : run.runtime->tracking_problems()) duality.add("tracking", 0.0, false, p);
  for (const auto& name : run.runtime->body_order()) {
    const auto& b = run.runtime->body_values().at(name);
    r["values"][name] = {{"variant", b.variant}, {"reduced", b.reduced}, {"local_shapes", b.local_shapes}};
    if (!b.unreduced.empty()) r["values"][name]["unreduced"] = b.unreduced;
    if (b.untracked) r["values"][name]["untracked"] = true;
    if (b.unchecked) {  // plain local code keeps no sets: null, not the empty (invariant) list
      r["values"][name]["variant"] = nullptr;
      r["values"][name]["reduced"] = nullptr;
      r["values"][name]["variance"] = "unchecked";
    }
  }
  bool any_from_local = false;
  for (const auto& op : sc.program) any_from_local |= op.op == "from_local" && op.attrs.value("run_check", false);
  for (const auto& [check, what] : run.runtime->check_failures())
    if (check == "from_local") from_local.add("from_local", 0.0, false, what);
  for (const auto& u : run.runtime->untracked()) tracking.add("untracked", 0.0, false, u);
  if (!unchecked.empty()) r["unchecked"] = unchecked;

  const std::vector<int>& event_ops = run.runtime->recorder().event_ops();
  r["collectives"] = collectives_json(out.events, event_ops);
  if (result_detail_enabled()) r["communication"] = communication_json(sc, out.events, event_ops);
  r["implicit"] = implicit_json(run.runtime->implicit_moves(), out.events);
  if (nlohmann::json rec = recorded_json(sc, options, r); !rec.is_null()) r["recorded"] = std::move(rec);
  // implicit error: every implicit move that communicates fails the run, each named with its reason.
  Comparison implicit_check;
  if (options.implicit == ImplicitPolicy::Error)
    for (const auto& m : r["implicit"])
      if (!m["collectives"].empty()) {
        std::string cost;
        for (const auto& c : m["collectives"])
          cost += (cost.empty() ? "" : ", ") + c["phase"].get<std::string>() + " " + c["op"].get<std::string>() +
                  " over " + c["axis"].get<std::string>() + " " + std::to_string(c["bytes"].get<int64_t>()) + " B";
        std::string reason = m["reason"].get<std::string>();
        if (reason.rfind("implicit: ", 0) == 0) reason = reason.substr(10);
        implicit_check.add("implicit", 0.0, false, reason + " (" + cost + ")");
      }
  r["checks"] = {{"forward_equivalence", forward.verdict()}};
  if (!hookless) r["checks"]["duality"] = duality.verdict();
  if (any_from_local) r["checks"]["from_local"] = from_local.verdict();
  if (run.ran_backward) r["checks"]["gradient_equivalence"] = gradient.verdict();
  if (options.implicit == ImplicitPolicy::Error) r["checks"]["no_implicit"] = implicit_check.verdict();
  if (run.has_local_map) {
    // Every LTensor passed the exclusivity check after every op and strategy (a violation is an
    // exclusivity_violation error); every value that left a region had tracked sets.
    r["checks"]["exclusivity"] = true;
    r["checks"]["variance_tracking"] = tracking.verdict();
  }
  r["max_abs_error"] = error_json(worse(forward.max_error, gradient.max_error));
  const bool failed = !(forward.ok && gradient.ok && duality.ok && tracking.ok && from_local.ok && implicit_check.ok);
  failed_what.any = failed;
  failed_what.gradients = !gradient.ok;
  // Nothing failed, but a comparison did not run: not a pass (exit 0 all the same: nothing failed).
  const bool partial = forward.not_run || gradient.not_run;
  r["status"] = failed ? "fail" : partial ? "unchecked" : "pass";
  r["error"] = nullptr;
  if (failed) {
    nlohmann::json failures = nlohmann::json::array();
    for (const auto* c : {&forward, &gradient, &duality, &tracking, &from_local, &implicit_check})
      for (const auto& p : c->problems) failures.push_back(p);
    r["failures"] = failures;
    if (!mismatches.empty()) r["mismatches"] = mismatches;
  }
  r["options"] = options.to_json();
  const auto& st = run.runtime->stats();
  r["stats"] = {{"propagation_requests", st.propagation_requests},
                {"propagations", st.propagations},
                {"cache_hits", st.cache_hits}};
  out.exit_code = failed ? 1 : 0;
  return failed_what;
}

// The run's values and input gradients for inspection, with the oracle's where it ran.
std::shared_ptr<RunTensors> kept_tensors(const Scenario& sc, const SimRun& run, const OracleRun* oracle) {
  auto out = std::make_shared<RunTensors>();
  auto global_of = [&](const Spec& spec, const Locals& locals) {
    std::string problem;  // the files show what the locals hold, whatever their problem
    at::Tensor t = assemble_checked(sc.mesh, spec, locals, problem);
    return t.defined() ? t.detach() : t;
  };
  auto oracle_of = [](const std::map<std::string, at::Tensor>* m, const std::string& name) {
    if (!m) return at::Tensor();
    auto it = m->find(name);
    return it == m->end() || !it->second.defined() ? at::Tensor() : it->second.detach();
  };
  for (const auto& name : run.named) {
    const DTensor& v = run.values.at(name);
    out->values.push_back({name, v.spec, detached(v.locals), 1, global_of(v.spec, v.locals),
                           oracle_of(oracle ? &oracle->values : nullptr, name)});
  }
  if (!run.ran_backward) return out;
  for (const auto& name : run.grad_inputs) {
    KeptTensor k;
    k.name = name;
    k.oracle = oracle_of(oracle ? &oracle->grads : nullptr, name);
    auto got = run.grad_specs.find(name);
    auto grads = run.grads.find(name);
    if (got != run.grad_specs.end() && grads != run.grads.end()) {
      k.spec = got->second.spec;
      k.divisor = got->second.divisor;
      k.locals = detached(grads->second);
      k.global = global_of(k.spec, k.locals);
      if (k.global.defined()) k.global = k.global * static_cast<double>(k.divisor);
    } else if (has_cotangent(run.values.at(name).spec)) {
      k.spec = cotangent_spec(run.values.at(name).spec);  // no gradient reached it: where it would be
    }
    out->grads.push_back(std::move(k));
  }
  return out;
}

}  // namespace

// Ops whose results on integer data are integers (the catalog's `exact`: sums, products, maxima
// and moves of data), so that the mesh and the oracle agree bit for bit whatever the order of the
// sums. Every other op rounds: exp, tanh, sin and softmax are transcendental, div and mean divide
// (mean by the global count, each rank its own part), amax and amin split their gradient among ties.
// all_reduce(avg) divides by its group size, checked with the mesh.
bool exact_op(const OpDecl& op) {
  // Built-in Functions: x * x, and a sum over the group.
  static const std::set<std::string> exact_functions = {"local_square", "opaque_all_reduce", "all_reduce_keep_local",
                                                        "opaque_all_reduce_unregistered"};
  const OpSchema* schema = find_op(op.op);
  const bool exact = schema && schema->exact && !is_creation_op(op.op);
  // scale, and a binary op with a scalar `value` (add, sub, mul; div rounds anyway).
  if (op.op == "scale" || (op.attrs.is_object() && op.attrs.contains("value") && exact && schema->scalar_second())) {
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
  return exact;
}

namespace {

// The mesh's assembled values, for the ties that rounding breaks otherwise (oracle.h).
MeshValues mesh_values_of(const Scenario& sc, const SimRun& run) {
  return [&sc, &run](const std::string& name) {
    auto it = run.values.find(name);
    if (it == run.values.end()) return at::Tensor();
    std::string problem;
    at::Tensor t = assemble_checked(sc.mesh, it->second.spec, it->second.locals, problem);
    return problem.empty() ? t : at::Tensor();
  };
}

// The first divergence of a failing run, into the result. Forward: from the comparison. Backward
// (values agree, a gradient does not): from the run itself when it kept every gradient (localize
// always), else from a second run that does, under the same planted bug.
void localize(const Scenario& sc, const RunOptions& options, SimRun& run, const OracleRun& oracle, const Failed& failed,
              CheckedRun& out) {
  nlohmann::json& r = out.result;
  try {
    nlohmann::json d = forward_divergence(sc, failed.values, r.value("mismatches", nlohmann::json::array()));
    if (d.is_null() && failed.gradients && failed.values.empty()) {
      const double tol = comparison_tolerance(sc, options);
      if (options.localize == Localize::Always) {
        d = backward_divergence(sc, run, oracle, tol, options.mutant, options.dtype);
      } else {
        RunOptions again = options;
        again.localize = Localize::Always;
        report_progress(sc.program.size(), sc.program.size(), "looking for the first divergence");
        SimRun second;
        {
          MutantScope planted(parse_mutant(options.mutant));  // the system under test only
          second = run_distributed(sc, again);
        }
        // The same oracle as the first run's, ties included (oracle.h), with every gradient kept.
        const OracleRun second_oracle = run_oracle(sc, second.input_globals, options.dtype,
                                                   mesh_values_of(sc, second), tol, /*keep_graph=*/true, options.seed);
        d = backward_divergence(sc, second, second_oracle, tol, options.mutant, options.dtype);
      }
    }
    if (!d.is_null()) r["first_divergence"] = d;
  } catch (const std::exception& e) {
    r["first_divergence"] = {{"error", "the search for the first divergence raised: " + first_line(e.what())}};
  }
}

}  // namespace

bool& localization_enabled() {
  static thread_local bool enabled = true;
  return enabled;
}

bool& mismatch_numbers_enabled() {
  static thread_local bool enabled = true;
  return enabled;
}

namespace {

// How many program ops the scenario runs (a local_map's body ops each counted).
int64_t op_count_of(const std::vector<OpDecl>& ops) {
  int64_t n = 0;
  for (const auto& op : ops) n += op.body.empty() ? 1 : op_count_of(op.body);
  return n;
}

}  // namespace

double dtype_tolerance(const Scenario& sc, const RunOptions& options) {
  const double u = unit_roundoff(least_precise_dtype(sc, options.dtype));
  // The longest sum a value may take in the dtype: a collective's over the ranks, an op's over one
  // dim of a value (a contraction, a sum).
  int64_t longest = sc.mesh.size();
  for (const auto& in : sc.inputs)
    for (int64_t extent : in.shape) longest = std::max(longest, extent);
  return u * static_cast<double>(2 * op_count_of(sc.program) + longest);
}

double comparison_tolerance(const Scenario& sc, const RunOptions& options) {
  if (float64_reference_run(sc, options.dtype)) return dtype_tolerance(sc, options);
  if (options.dtype == DType::Float32) return 1e-4;
  bool exact = true;
  for (const auto& in : sc.inputs) {
    exact &= in.init != "randn";
    for (double v : in.values) exact &= v == std::trunc(v) && std::abs(v) <= 1024;  // a literal of small integers
  }
  // A division by a group size that is not a power of two (R -> P(sum) divided by 3, P(avg)) rounds.
  for (auto n : sc.mesh.shape()) exact &= (n & (n - 1)) == 0;
  for (const auto& op : sc.program) exact &= exact_op(op);
  return exact ? 0.0 : 1e-12;
}

namespace {

CheckedRun checked_run(const Scenario& sc, const RunOptions& options, bool keep_values) {
  CheckedRun out;
  nlohmann::json& r = out.result;
  r["format"] = "meshsim.result/1";
  r["name"] = sc.name;
  SimRun run;
  try {
    // A planted bug lives in the system under test only; the checks below use the true rules.
    MutantScope planted(parse_mutant(options.mutant));
    Stopwatch timed(out.seconds.simulation);
    run = run_distributed(sc, options);
  } catch (const SemanticError& e) {
    semantic_error(out, e);
    return out;
  } catch (const BackwardRaised& e) {
    raised(out, options, "the run", e);  // never out of memory: guarded() lets that through unwrapped
    // The backward node that raised is where the run first went wrong.
    if (e.program_op >= 0 && static_cast<size_t>(e.program_op) < sc.program.size()) {
      const OpDecl& op = sc.program[static_cast<size_t>(e.program_op)];
      std::string where = op.path + " (" + op.op + " \"" + op.out + "\")";
      nlohmann::json d = {{"phase", "backward"}, {"op", op.path}, {"name", op.op}, {"out", op.out}, {"raised", true}};
      for (const auto& b : op.body)
        if (!e.value.empty() && (b.out == e.value || std::count(b.outs.begin(), b.outs.end(), e.value))) {
          d["body"] = {{"op", b.path}, {"name", b.op}, {"out", b.out}};
          where = b.path + " (" + b.op + " \"" + b.out + "\" in the local_map " + op.path + ")";
        }
      d["message"] = "the backward of " + where + " raised: " + first_line(e.what());
      r["first_divergence"] = d;
    }
    return out;
  } catch (const std::exception& e) {
    raised(out, options, "the run", e);
    // libtorch refusing a node's gradients names the node, and so the program op that made it.
    const std::string what = e.what();
    const auto at = what.find(" at /program/");
    if (at != std::string::npos && !is_out_of_memory(e)) {
      const size_t k = std::strtoul(what.c_str() + at + 13, nullptr, 10);
      if (k < sc.program.size()) {
        const OpDecl& op = sc.program[k];
        r["first_divergence"] = {{"phase", "backward"}, {"op", op.path}, {"name", op.op}, {"out", op.out}, {"raised", true},
                                 {"message", "the backward of " + op.path + " (" + op.op + " \"" + op.out +
                                                 "\") gives a gradient libtorch refuses: " + first_line(what)}};
      }
    }
    return out;
  }
  out.events = run.runtime->recorder().take_events();  // the run is over: nothing adds to them
  // Never throws: what cannot be kept is not kept (no files beat no result).
  auto keep = [&](const OracleRun* oracle) {
    if (!keep_values) return;
    try {
      out.tensors = kept_tensors(sc, run, oracle);
    } catch (const std::exception&) {
      out.tensors.reset();
    }
  };
  OracleRun oracle;
  report_progress(sc.program.size(), sc.program.size(), "the single-device oracle");
  try {
    Stopwatch timed(out.seconds.oracle);
    oracle = run_oracle(sc, run.input_globals, options.dtype, mesh_values_of(sc, run), comparison_tolerance(sc, options),
                        /*keep_graph=*/options.localize == Localize::Always, options.seed);
  } catch (const SemanticError& e) {  // a local_map reference libtorch refuses
    semantic_error(out, e);
    keep(nullptr);
    return out;
  } catch (const std::exception& e) {
    raised(out, options, "the single-device oracle", e);
    keep(nullptr);
    return out;
  }
  keep(&oracle);
  report_progress(sc.program.size(), sc.program.size(), "the comparison");
  Failed failed;
  try {
    // compare() adds its numeric part to seconds.comparison; the rest is the result's.
    Stopwatch timed(out.seconds.result);
    failed = compare(sc, options, run, oracle, out);
    timed.stop();
    out.seconds.result -= out.seconds.comparison;
  } catch (const std::exception& e) {
    nlohmann::json keep = {{"format", r["format"]}, {"name", r["name"]}};
    r = keep;
    raised(out, options, "the comparison with the oracle", e);
    return out;
  }
  if (failed.any && options.localize != Localize::Never && localization_enabled())
    localize(sc, options, run, oracle, failed, out);
  if (sc.train.present) check_train(sc, options, run, oracle, out);  // the steps after the first backward
  return out;
}

}  // namespace

CheckedRun check_scenario(const Scenario& sc, const RunOptions& options, bool keep_values) {
  CheckedRun out = checked_run(sc, options, keep_values);
  attach_sources(sc, out.result);  // imported programs: where the user's code made what failed
  return out;
}

}  // namespace meshsim

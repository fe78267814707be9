#include "oracles/oracle.h"

#include <algorithm>
#include <set>

#include <torch/csrc/autograd/autograd.h>

#include "core/error.h"
#include "core/ops.h"
#include "core/scoped.h"
#include "sim/data.h"
#include "sim/local_map.h"
#include "sim/local_ops.h"

namespace meshsim {

namespace {

// Local code's ends and collectives (the catalog's local_code ops but `call`).
bool is_layout_only_op(const std::string& op) {
  if (op == "to_local" || op == "from_local") return true;
  const OpSchema* s = find_op(op);
  return s && s->local_code && op != "call";
}

// One op on global tensors. What libtorch refuses (c10::Error, or any std::exception) is raised
// again as a SemanticError naming the op's JSON path: in a local_map's reference, which only the
// oracle runs, that is invalid input (`invalid_scenario`, exit 2); elsewhere the mesh ran the op
// and the oracle could not, which check_scenario reports as a failed run.
// Whether every value is to be its own autograd node (run_oracle's keep_graph).
thread_local bool g_own_nodes = false;

// `x` itself, or with keep_graph a view of it (its own node, whose gradient is its consumers'): every
// program value goes through it (an op may return its operand itself).
at::Tensor same_value(const at::Tensor& x) {
  return g_own_nodes && x.defined() && x.requires_grad() ? x.view_as(x) : x;
}


// A Function called in a reference (or in local code) runs its own reference on the global
// tensors: one tensor per output.
std::vector<at::Tensor> call_reference(const OpDecl& op, const std::vector<at::Tensor>& xs) {
  const std::string fn = op.attrs.value("function", "");
  const FunctionReference* ref = find_function_reference(fn);
  if (!ref)
    throw SemanticError(ErrorKind::InvalidScenario,
                        op.path + ": the reference calls Function \"" + fn + "\", which has " +
                            (find_scenario_function(fn) ? "no reference on global tensors (FunctionDef::reference)"
                                                        : "not been registered"));
  std::vector<at::Tensor> out = (*ref)(xs, op.attrs);
  const size_t want = result_names(op).size();
  if (out.size() != want)
    throw SemanticError(ErrorKind::InvalidScenario, op.path + ": Function \"" + fn + "\"'s reference returned " +
                                                        std::to_string(out.size()) + " tensors, the call names " +
                                                        std::to_string(want) + " outputs");
  return out;
}

// The results of a call with several outputs, under their names; false for any other op.
bool several_outputs(const OpDecl& op, const std::vector<at::Tensor>& xs, bool defined,
                     std::map<std::string, at::Tensor>& into) {
  if (op.op != "call" || op.outs.size() < 2) return false;
  std::vector<at::Tensor> ys = defined ? call_reference(op, xs) : std::vector<at::Tensor>(op.outs.size());
  for (size_t k = 0; k < op.outs.size(); ++k) into[op.outs[k]] = same_value(ys[k]);
  return true;
}

at::Tensor global_op(const OpDecl& op, const std::vector<at::Tensor>& xs, bool in_reference, uint64_t seed) {
  if (op.op == "redistribute") return same_value(xs.at(0));
  // Local code in a DTensor program (between to_local and from_local) read as the global
  // computation it stands for: a collective moves the value between layouts and leaves it as it is.
  if (is_layout_only_op(op.op)) return same_value(xs.at(0));
  try {
    if (op.op == "call") return call_reference(op, xs).at(0);
    OpAttrs attrs = op_attrs(op);
    attrs.draw.seed = seed;  // a random op draws the global tensor whole (core/random.h)
    return local_op(op.op, attrs, xs);
  } catch (const SemanticError&) {
    throw;
  } catch (const std::exception& e) {
    const std::string what = op.op + " cannot run on the global tensors: " + first_line(e.what());
    if (in_reference) throw SemanticError(ErrorKind::InvalidScenario, op.path + ": the local_map reference's " + what);
    throw std::runtime_error(op.path + ": the mesh ran it, but " + what);
  }
}

// amax / amin of the oracle's `x` (its result `y`) with the mesh's tie set where the two differ by
// rounding alone (run_oracle's comment in oracle.h): the value stays `y`, the gradient splits g
// among the mesh's ties for those result elements. `y` itself where no result element qualifies.
at::Tensor with_mesh_ties(const OpDecl& op, const at::Tensor& x, const at::Tensor& y, const at::Tensor& x_mesh,
                          double tolerance) {
  if (!x.requires_grad() || !x_mesh.defined() || x_mesh.sizes() != x.sizes() || x.dim() == 0 || x.numel() == 0)
    return y;
  const at::Tensor xd = x.detach();
  const at::Tensor xm = x_mesh.detach().to(xd.scalar_type());
  if (!at::isfinite(xd).all().item<bool>() || !at::isfinite(xm).all().item<bool>()) return y;
  const OpAttrs attrs = op_attrs(op);
  const auto dims = reduced_dims(xd, attrs);
  const bool max = op.op == "amax";
  auto extremum = [&](const at::Tensor& t) { return max ? at::amax(t, dims, true) : at::amin(t, dims, true); };
  auto any = [&](const at::Tensor& b) { return b.sum(dims, true).gt(0); };
  const at::Tensor ext = extremum(xd);
  const at::Tensor ours = xd.eq(ext), theirs = xm.eq(extremum(xm));
  const double bound = tolerance * std::max(1.0, xd.abs().max().item<double>());
  const at::Tensor near = (xd - ext).abs().le(bound);
  // Per result element: the tie sets differ, every element of either is within the bound of the
  // oracle's extremum, and the mesh has one (its operand's assembly may round otherwise).
  const at::Tensor take = any(ours.ne(theirs)) & ~any((ours | theirs) & ~near) & any(theirs);
  if (!take.any().item<bool>()) return y;
  const at::Tensor mask = at::where(take, theirs, ours).to(xd.scalar_type());
  const at::Tensor split = (x * mask).sum(dims, attrs.keepdim) / mask.sum(dims, attrs.keepdim);
  return y.detach() + (split - split.detach());
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// A local_map's `reference`: the same computation on global tensors. Without one, its results
// are unknown (undefined tensors), and so is everything computed from them.
std::vector<at::Tensor> reference(const OpDecl& op, const std::vector<at::Tensor>& args, uint64_t seed, DType dtype) {
  std::map<std::string, at::Tensor> env;
  bool known = !op.reference.empty() || !op.returns.empty();
  for (size_t i = 0; i < args.size(); ++i) {
    env[op.args[i]] = args[i];
    known &= args[i].defined();
  }
  if (op.reference.empty()) {
    // Returns may name arguments directly; anything else is unknown without a reference.
    std::vector<at::Tensor> out;
    for (const auto& r : op.returns) out.push_back(env.count(r) && known ? same_value(env[r]) : at::Tensor());
    return out;
  }
  for (const auto& r : op.reference) {
    std::vector<at::Tensor> xs;
    bool defined = true;
    for (size_t i = 0; i < r.args.size(); ++i) {
      const std::string& a = r.args[i];
      if (!env.count(a))
        throw SemanticError(ErrorKind::InvalidScenario,
                            r.path + "/args/" + std::to_string(i) + ": the local_map reference reads \"" + a +
                                "\", which neither the local_map's args (" + join_names(op.args) +
                                ") nor an earlier op of its reference define");
      xs.push_back(env.at(a));
      defined &= env.at(a).defined();
    }
    if (is_creation_op(r.op)) {  // zeros, ones, full, arange: the value of its shape, no operand
      env[r.out] = created_value(r, dtype);
      continue;
    }
    if (is_split_op(r.op)) {
      const auto pieces = defined ? split_as_narrows(r, xs.at(0).sizes().vec()) : std::vector<OpAttrs>(r.outs.size());
      for (size_t k = 0; k < r.outs.size(); ++k)
        env[r.outs[k]] = !defined ? at::Tensor() : local_op("narrow", pieces.at(k), {xs[0]});
      continue;
    }
    if (several_outputs(r, xs, defined, env)) continue;
    env[r.out] = !defined ? at::Tensor() : global_op(r, xs, true, seed);
  }
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < op.returns.size(); ++k) {
    if (!env.count(op.returns[k]))
      throw SemanticError(ErrorKind::InvalidScenario,
                          op.path + "/returns/" + std::to_string(k) + ": the local_map returns \"" + op.returns[k] +
                              "\", which its reference does not define (the reference computes the returns from the "
                              "args on global tensors, under the same names)");
    out.push_back(same_value(env.at(op.returns[k])));
  }
  return out;
}

}  // namespace

OracleRun run_oracle(const Scenario& sc, const std::map<std::string, at::Tensor>& input_globals, DType dtype,
                     const MeshValues& mesh, double tolerance, bool keep_graph, uint64_t seed) {
  OracleRun run;
  ScopedOverride<bool> own_nodes(g_own_nodes, keep_graph);
  // Mixed dtypes: the reference in float64 (every float value; `to` keeps it), from the mesh's inputs.
  const bool in_float64 = float64_reference_run(sc, dtype);
  ScopedOverride<bool> float64(float64_reference(), in_float64);
  if (in_float64) dtype = DType::Float64;
  std::vector<at::Tensor> leaves;
  std::vector<std::string> leaf_names;
  for (const auto& in : sc.inputs) {
    // The inputs' own storage (no op writes in place): a copy would double every input.
    at::Tensor t = input_globals.at(in.name).detach();
    if (in_float64 && at::isFloatingType(t.scalar_type())) t = t.to(at::kDouble);
    t.requires_grad_(in.requires_grad);
    run.values[in.name] = t;
    if (in.requires_grad) {
      leaves.push_back(t);
      leaf_names.push_back(in.name);
    }
  }
  for (const auto& op : sc.program) {
    std::vector<at::Tensor> xs;
    for (const auto& a : op.args) xs.push_back(run.values.at(a));
    const int k = static_cast<int>(&op - sc.program.data());
    if (keep_graph)  // each use of an operand its own node, as the mesh's (SimRun::operand_uses)
      for (size_t i = 0; i < xs.size(); ++i)
        if (xs[i].defined() && xs[i].requires_grad()) {
          xs[i] = xs[i].view_as(xs[i]);
          run.operand_uses[{k, static_cast<int>(i)}] = xs[i];
        }
    if (is_creation_op(op.op)) {
      run.values[op.out] = op_schema(op.op).gen == GenClass::RandomCreation ? drawn_value(op, seed, dtype)
                                                                             : created_value(op, dtype);
      continue;
    }
    if (op.op == "local_map") {
      std::vector<at::Tensor> outs = reference(op, xs, seed, dtype);
      for (size_t j = 0; j < outs.size(); ++j) run.values[op.outs[j]] = same_value(outs[j]);
      continue;
    }
    bool known = true;
    for (const auto& x : xs) known &= x.defined();
    if (is_split_op(op.op)) {
      const auto pieces = known ? split_as_narrows(op, xs.at(0).sizes().vec()) : std::vector<OpAttrs>(op.outs.size());
      for (size_t j = 0; j < op.outs.size(); ++j)
        run.values[op.outs[j]] = !known ? at::Tensor() : same_value(local_op("narrow", pieces.at(j), {xs[0]}));
      continue;
    }
    if (several_outputs(op, xs, known, run.values)) continue;
    run.values[op.out] = !known ? at::Tensor() : same_value(global_op(op, xs, false, seed));
    if (known && mesh && tolerance > 0 && (op.op == "amax" || op.op == "amin"))
      run.values[op.out] = with_mesh_ties(op, xs.at(0), run.values[op.out], mesh(op.args.at(0)), tolerance);
  }
  if (!sc.backward.empty() && !leaves.empty()) {
    const at::Tensor& loss = run.values.at(sc.backward);
    if (!loss.defined()) {
      // Unknown without a local_map reference: no oracle gradients.
    } else if (loss.requires_grad()) {
      std::vector<at::Tensor> wrt = leaves;
      std::vector<std::string> watched;
      if (keep_graph) {
        std::set<std::string> inputs(leaf_names.begin(), leaf_names.end());
        for (const auto& [name, t] : run.values)
          if (!inputs.count(name) && t.defined() && t.requires_grad()) {
            watched.push_back(name);
            wrt.push_back(t);
          }
      }
      auto grads = torch::autograd::grad({loss}, wrt, {at::ones_like(loss)}, keep_graph, false, true);
      for (size_t i = 0; i < leaves.size(); ++i)
        run.grads[leaf_names[i]] = grads[i].defined() ? grads[i] : at::zeros_like(leaves[i]);
      for (size_t i = 0; i < watched.size(); ++i) run.value_grads[watched[i]] = grads[leaves.size() + i];
    } else {
      for (size_t i = 0; i < leaves.size(); ++i) run.grads[leaf_names[i]] = at::zeros_like(leaves[i]);
    }
  }
  if (keep_graph) run.live = run.values;
  for (auto& [name, t] : run.values)
    if (t.defined()) t = t.detach();
  return run;
}

at::Tensor oracle_contribution(const OracleRun& run, const std::vector<std::string>& outs,
                               const std::vector<at::Tensor>& grads, const at::Tensor& use) {
  std::vector<at::Tensor> ys, gs;
  for (size_t i = 0; i < outs.size(); ++i) {
    auto it = run.live.find(outs[i]);
    if (it == run.live.end() || !it->second.defined() || !it->second.requires_grad() || !grads.at(i).defined()) continue;
    ys.push_back(it->second);
    gs.push_back(grads[i]);
  }
  if (ys.empty() || !use.defined() || !use.requires_grad()) return {};
  return torch::autograd::grad(ys, {use}, gs, /*retain_graph=*/true, false, /*allow_unused=*/true)[0];
}

}  // namespace meshsim

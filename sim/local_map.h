// The local_map region: DTensor arguments become LTensors, the body runs rank-local ops and
// collectives with variance tracking, and the returned LTensors become DTensors again.
// SEMANTICS.md sections 5 and 6.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/scenario.h"
#include "sim/dtensor.h"
#include "sim/ltensor.h"
#include "sim/runtime.h"

namespace meshsim {

class BodyContext {
 public:
  // `checked` false: plain local code (JAX's check_vma=False, PyTorch's local_map and to_local):
  // no sets, no automatic mark_varying or casts, no out-placement check; collectives and
  // Functions run with their own forward and backward only.
  explicit BodyContext(Runtime& rt, bool checked = true) : rt_(rt), checked_(checked) {}
  bool checked() const { return checked_; }

  // Rd -> reduced; S(d) or P(any op) -> variant (under partial_in_local_map unreduced, P(op) ->
  // unreduced by op); R -> neither.
  // The LTensor takes the DTensor's name (a local_map's body sees its args so), or `name`.
  // `grad` (PyTorch's grad_placements / in_grad_placements): the layout the local code's gradient
  // of `x` has, moved to x's cotangent in the backward (kept as it is without the gradient hook).
  LTensor enter(const DTensor& x, const std::string& name = "", const Spec* grad = nullptr);
  // Checks the LTensor's sets against the out placement (as JAX checks out_specs); unchecked, the
  // placement is trusted (DTensor.from_local with run_check false).
  DTensor leave(const LTensor& t, const Spec& out, const std::string& name);

  // A DTensor-level op on the locals: variant by union, reduced by intersection, then a
  // registered strategy; inputs short of an output's variant axis get mark_varying (or a
  // reduced -> varying cast where they are reduced); then the exclusivity check.
  LTensor op(const std::string& op, const nlohmann::json& attrs, std::vector<LTensor> args,
             const std::string& out);

  // A creation op (zeros, ones, full, arange) in local code: its value, of its shape, as every rank's
  // local (shared), invariant over every mesh axis (JAX: a constant in shard_map varies over no
  // axis); no gradient.
  LTensor created(const OpDecl& op);

  // Collectives (an input invariant on the axis is made varying first).
  LTensor all_reduce(const LTensor& x, int axis, ReduceOp op, const std::string& out);
  LTensor all_gather(const LTensor& x, int axis, int64_t dim, bool to_reduced, const std::string& out);
  LTensor reduce_scatter(const LTensor& x, int axis, int64_t dim, const std::string& out);
  LTensor all_to_all(const LTensor& x, int axis, int64_t split_dim, int64_t concat_dim, const std::string& out);
  // all_to_all_single with split sizes: rows of dim 0, rank r sending input_sizes[r][s] rows to the
  // member s of its group and receiving output_sizes[r][s] from it (int64 vectors of one entry per
  // member, data of the body). Checked on every group before anything moves: one entry per member,
  // none negative, the inputs' summing to the local extent, and each rank's input size to s equal
  // to s's output size from it (shape_mismatch naming the ranks and sizes; `path` the op's JSON
  // path). The backward moves the gradient by the transposed sizes.
  LTensor all_to_all_split(const LTensor& x, const LTensor& input_sizes, const LTensor& output_sizes, int axis,
                           const std::string& out, const std::string& path = "all_to_all");
  LTensor mark_varying(const LTensor& x, int axis, const std::string& out);
  LTensor reduced_to_varying(const LTensor& x, int axis, const std::string& out);
  // Reduced -> invariant: free forward; backward the cotangent becomes unreduced (R -> P(sum)).
  LTensor reduced_to_invariant(const LTensor& x, int axis, const std::string& out);

  // The interception wrapper (ltensor_function_call): unwraps the LTensors, runs a custom
  // autograd Function on the locals, computes the outputs' sets (the strategy in force, else the
  // default union / intersection), checks exclusivity and wraps. `Fn` is a
  // torch::autograd::Function whose forward takes (AutogradContext*, at::TensorList); it is called
  // with an at::TensorList (libtorch 1.13 silently does not differentiate a std::vector argument).
  // Rank-local: runs once per rank on that rank's inputs; `call` gives the first output, and
  // `call_outputs` one LTensor per name in `outs` (a Function with several outputs).
  template <class Fn>
  LTensor call(const std::vector<LTensor>& xs, const nlohmann::json& args, const std::string& out) {
    return call_outputs<Fn>(xs, args, {out}).front();
  }
  template <class Fn>
  std::vector<LTensor> call_outputs(const std::vector<LTensor>& xs, const nlohmann::json& args,
                                    const std::vector<std::string>& outs) {
    const size_t n = outs.size();
    return call_rank_local(function_key<Fn>(), strategy_for<Fn>(), xs, args, outs,
                           [n](const std::vector<at::Tensor>& in) {
                             auto all = Fn::apply(at::TensorList(in));
                             return std::vector<at::Tensor>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
                           });
  }
  // Communicating (an opaque kernel): runs once per group of `axis` and sees every member's
  // local of the input, made varying on `axis` first as a collective's is; without a strategy its
  // outputs are flagged untracked. Fn returns one tensor per member, output after output.
  template <class Fn>
  LTensor call_group(const LTensor& x, int axis, const nlohmann::json& args, const std::string& out) {
    return call_group_outputs<Fn>(x, axis, args, {out}).front();
  }
  template <class Fn>
  std::vector<LTensor> call_group_outputs(const LTensor& x, int axis, const nlohmann::json& args,
                                          const std::vector<std::string>& outs) {
    const size_t n = outs.size();
    return call_on_groups(function_key<Fn>(), strategy_for<Fn>(), x, axis, args, outs, [n](const Locals& group) {
      const auto all = Fn::apply(at::TensorList(group));
      std::vector<Locals> per_output(n);
      for (size_t k = 0; k < n; ++k)
        per_output[k].assign(all.begin() + static_cast<std::ptrdiff_t>(k * group.size()),
                             all.begin() + static_cast<std::ptrdiff_t>((k + 1) * group.size()));
      return per_output;
    });
  }

  // One rank's outputs from its inputs; a group's outputs, one Locals (a tensor per member) per output.
  using RankFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
  using GroupFn = std::function<std::vector<Locals>(const Locals&)>;
  // The strategy in force for a call: a registry entry for the called Function's name (the public
  // register_variance_tracking_strategy) first, else `strategy` (the type's entry or its own).
  std::vector<LTensor> call_rank_local(const std::string& key, const std::optional<Strategy>& strategy,
                                       std::vector<LTensor> xs, const nlohmann::json& args,
                                       const std::vector<std::string>& outs, const RankFn& f);
  std::vector<LTensor> call_on_groups(const std::string& key, const std::optional<Strategy>& strategy, LTensor x,
                                      int axis, const nlohmann::json& args, const std::vector<std::string>& outs,
                                      const GroupFn& f);

  // Runs one body op of a scenario: `run_all` gives one LTensor per name in op.outs (a call of a
  // Function with several outputs), `run` the first.
  std::vector<LTensor> run_all(const OpDecl& op, const std::map<std::string, LTensor>& env);
  LTensor run(const OpDecl& op, const std::map<std::string, LTensor>& env) { return run_all(op, env).front(); }

  Runtime& runtime() { return rt_; }

 private:
  // Metadata of an op's output from its inputs and the strategy in force; inputs are then made
  // varying where the output is; exclusivity is checked.
  // Makes inputs varying where the output is, and casts reduced inputs to invariant where the
  // output is neither; returns the output's reduced set.
  // `keep`: axes left as they are (those the output is unreduced over, under partial_in_local_map
  // unreduced: the operand reduced there stays reduced, its gradient unreduced).
  AxisSet fit_inputs(std::vector<LTensor>& xs, const AxisSet& variant, const std::optional<AxisSet>& strategy_reduced,
                     const std::string& out, const AxisSet& keep = {});
  // partial_in_local_map unreduced: what a value unreduced over an axis may meet (docs/semantics.md):
  // the output's unreduced axes; UnreducedMisuse naming the op, the operand and why.
  Unreduced unreduced_of(const std::string& op, const nlohmann::json& attrs, const std::vector<LTensor>& xs) const;
  // A collective `what` over `axis` of x: x's unreduced axes carried (a `linear` collective over
  // other axes), `axis` dropped where the collective `reduces` it; else UnreducedMisuse.
  Unreduced carried(const LTensor& x, int axis, const std::string& what, bool linear, bool reduces) const;
  // The outputs' sets of an op or Function: the strategy's per output, or its one result for each;
  // without a strategy variant by union (reduced, unset, is the fitted inputs' intersection).
  std::vector<StrategyResult> function_sets(const std::vector<LTensor>& xs, const Strategy* strategy,
                                            const nlohmann::json& args, size_t outputs, const std::string& key) const;
  LTensor wrap(const std::string& kind, const std::string& name, const std::string& out, Locals locals,
               AxisSet variant, AxisSet reduced, const std::vector<LTensor>& inputs, Unreduced unreduced = {});
  LTensor varying_on(const LTensor& x, int axis, const std::string& out);
  // A collective as one node over the mesh: the forward step (none: the identity) and the
  // backward (none: the identity; not differentiable: an error if a gradient reaches it).
  struct Backward {
    bool differentiable = true;
    std::optional<RedistStep> step;
  };
  Locals collective_node(const std::string& name, const LTensor& x, const std::string& out,
                         const std::optional<RedistStep>& fwd, const Backward& bwd);
  // Static: a backward records through the Runtime, after the context is gone.
  static void record_step(Runtime& rt, const RedistStep& s, const Locals& in, const Locals& out,
                          const std::string& value, const std::string& note, const std::string& grad_of = "");
  void check_mesh(const std::vector<LTensor>& xs, const std::string& what) const;

  Runtime& rt_;
  bool checked_ = true;
};

void check_exclusive(const Mesh& mesh, const LTensor& t, const std::string& what);

// Functions a scenario can `call` by name (the built-ins are registered on first use).
// An invoker returns one LTensor per name in the call's op.outs.
using FunctionInvoker = std::function<std::vector<LTensor>(BodyContext&, const std::vector<LTensor>&, const OpDecl&)>;
// What a Function's definition says of its calls, for callers without a scenario (the property
// function_backward_matches_reference): how many args a call passes (-1: any).
struct FunctionSignature {
  int arity = 1;
  int outputs = 1;  // how many tensors a call returns
};
void register_scenario_function(const std::string& name, FunctionInvoker invoker, FunctionSignature signature = {});
const FunctionInvoker* find_scenario_function(const std::string& name);
// The signature registered with the Function; the default (1 arg) for an unknown name.
FunctionSignature scenario_function_signature(const std::string& name);
// Every registered Function (built-ins and the user's, plugins included), sorted.
std::vector<std::string> scenario_function_names();

// A Function's reference: the same computation on global tensors, which the oracle runs where a
// local_map's `reference` calls the Function (include/meshsim/meshsim.h, FunctionDef::reference).
// One global tensor per output of the Function.
using FunctionReference =
    std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&, const nlohmann::json& attrs)>;
void register_function_reference(const std::string& name, FunctionReference reference);
void unregister_function_reference(const std::string& name);
const FunctionReference* find_function_reference(const std::string& name);

}  // namespace meshsim

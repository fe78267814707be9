// The DTensor runtime of the fake mesh. All ranks live in one process and one libtorch autograd
// graph: a redistribution or an op is one autograd node whose inputs and outputs are the locals
// of every rank. Gradient placements are tracked through the backward by the same rules as the
// forward, and every gradient contribution is redistributed to the cotangent of its primal (the
// gradient placement hook) before libtorch adds contributions together.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/event.h"
#include "core/mesh.h"
#include "core/propagation.h"
#include "core/scenario.h"
#include "sim/collectives.h"
#include "sim/dtensor.h"

namespace meshsim {

// What the runtime records as it goes, in order, with the context each event was recorded in.
class Recorder {
 public:
  // Stamps `implicit` (where the event has no reason of its own) and keeps `program_op`; drops the
  // event while muted.
  void add(Event e);
  const std::vector<Event>& events() const { return events_; }
  // The events, moved out (none are left): for the run's result once the run is over (a long
  // program's events are not copied). Events added later would be numbered from 0 again.
  std::vector<Event> take_events() {
    std::vector<Event> out;
    out.swap(events_);
    return out;
  }
  // Per event, the index in the scenario's program of the op it belongs to (a backward node's: the
  // op that made it); -1 for the inputs and the backward's seed.
  const std::vector<int>& event_ops() const { return ops_; }

  // The context, set for a scope (ScopedOverride) by the interpreter and the runtime:
  std::string implicit;   // why the planner inserted the steps recorded now (Event::implicit)
  int program_op = -1;    // the program op running (forward) or whose backward node runs
  bool algorithm = false; // an op's own algorithm (loss parallel's all_reduces): never implicit
  bool muted = false;     // a backward re-run to localize a wrong gradient: records nothing
  // The running program op's own `redistribute_mode` (seed 003's per-op opt-out): where the planner
  // moves its operands, above or below autograd; unset: the run's option.
  std::optional<RedistributeMode> redistribute;

 private:
  std::vector<Event> events_;
  std::vector<int> ops_;
};

// What a backward node raised that is not an error of the semantics (libtorch refusing a step: a
// collective's backward that gathers along the wrong dim), with the program op that made the node
// and the value it produced.
struct BackwardRaised : std::runtime_error {
  BackwardRaised(int op, std::string v, const std::string& what)
      : std::runtime_error(what), program_op(op), value(std::move(v)) {}
  int program_op = -1;
  std::string value;
};

// A redistribution the planner inserted because an operand's placements fit no rule row of its op
// as they were (DESIGN.md contract 3, "implicit").
struct ImplicitMove {
  int program_op = -1;     // index in the scenario's program
  std::string op;          // the rule's op ("matmul" for a linear's product)
  std::string value;       // the op's result
  std::string operand;     // the operand moved; "" for a backward rule's incoming gradient
  int operand_index = -1;
  std::string phase;       // "forward", or "backward" for an incoming gradient a backward rule moved
  Spec from, to;
  std::vector<std::string> rows;  // per mesh axis, the row chosen
  std::string reason;      // the text stamped on its events (Event::implicit)
  // Forward: on each axis the move changes, the other legal rows of the op and what they would
  // have cost (core/explain.h), cheapest first.
  struct Alternative {
    std::string axis, row, verdict;
    int64_t bytes = 0;
  };
  std::vector<Alternative> alternatives;
};

// One rule application of the forward (Runtime::apply_op), as propagation is asked it: the op, its
// attributes, its operands' names, specs and global shapes as given, and the result's name.
struct OpApplication {
  std::string op;
  OpAttrs attrs;
  std::vector<std::string> args;
  std::vector<Spec> given;
  std::vector<Shape> shapes;
  std::string out;
};

// Whether events carry a hash of each local they record (Event::hashes, for traces, replay and
// the determinism property): on, but in a scope that writes no trace (ScopedOverride), where
// hashing every local of a long program costs time and memory for nothing. Per thread.
bool& local_hashes_enabled();

// Whether a run keeps what only a person reads of its result: each implicit move's alternatives (the
// op's other legal rows and their cost) and the communication table. On, but in the property
// search (ScopedOverride), whose cases read the verdict, the values and the collectives; the
// counterexample it writes runs again with them. Per thread.
bool& result_detail_enabled();

class Runtime {
 public:
  Runtime(Mesh mesh, RunOptions options);

  const Mesh& mesh() const { return mesh_; }
  const RunOptions& options() const { return options_; }
  Recorder& recorder() { return recorder_; }
  const std::vector<Event>& events() const { return recorder_.events(); }

  // Forward, above autograd: one node; its backward redistributes the incoming gradient from its
  // tracked placement to the cotangent of `x`'s spec.
  // With `cast` (FSDP2's mixed precision of a parameter): x's locals are cast to its param_dtype
  // first (the collectives move that dtype, the result is of it), and the backward casts the
  // incoming gradient to its reduce_dtype before the collectives and to x's dtype after.
  DTensor redistribute(const DTensor& x, const Spec& to, const std::string& out_name,
                       const MixedPrecision* cast = nullptr);

  // Forward of a DTensor op: propagation picks the rule; operands that do not fit it are
  // redistributed first (above or below autograd, by the run's option); the Rd label is restored
  // by the run's policy.
  DTensor apply_op(const std::string& op, const OpAttrs& attrs, const std::vector<DTensor>& args,
                   const std::string& out_name);

  // Backward from `loss`: seeds the all-ones global cotangent laid out as the cotangent of the
  // loss's spec (a Partial cotangent holds it on the coordinate-0 rank of each group, zeros
  // elsewhere) and returns, per input, its per-rank gradient (zeros where none flowed).
  // With `watched_grads`, also the total gradient of every `watched` value (zeros where none
  // flowed: undefined locals), in the layout grad_spec() names, recording no event for them; the
  // graph is then kept for contribution().
  std::vector<Locals> backward(const DTensor& loss, const std::vector<DTensor>& inputs,
                               const std::vector<DTensor>& watched = {}, std::vector<Locals>* watched_grads = nullptr);
  // After a backward that kept its graph: the part of `of`'s gradient that flows from `outs` when
  // their gradients are `grads` (one op's contribution), with the recorder muted (nothing is
  // recorded twice). Undefined locals where none flows.
  Locals contribution(const std::vector<DTensor>& outs, const std::vector<Locals>& grads, const DTensor& of);
  // `x` through an identity node of its own (no event, the same name and placements): so that one
  // op's use of a value, or a value that is another's very tensors, has a gradient of its own.
  // `x` itself when it needs no gradient.
  DTensor alias(const DTensor& x);

  // The tracked layout of the gradient of a value (its cotangent unless a contribution said
  // otherwise); problems found while tracking (two contributions with different layouts).
  GradSpec grad_spec(const std::string& value, const Spec& primal) const;
  // The same for an input after the backward: nothing when no gradient reached it and its primal
  // has no cotangent (a P(max) or P(min) input off the backward path is not an error; one on it
  // raised not_differentiable where the gradient arrived).
  std::optional<GradSpec> input_grad_spec(const std::string& value, const Spec& primal) const;
  const std::vector<std::string>& tracking_problems() const { return tracking_problems_; }
  // Every redistribution the planner inserted, in the order it was made.
  const std::vector<ImplicitMove>& implicit_moves() const { return implicit_moves_; }

  // LTensors of local_map bodies, for the result: their sets and local shapes.
  struct BodyValue {
    std::vector<std::string> variant, reduced;
    std::map<std::string, std::string> unreduced;  // axis -> reduce op (partial_in_local_map unreduced)
    std::vector<std::vector<int64_t>> local_shapes;
    bool untracked = false;
    bool unchecked = false;  // plain local code: no sets
  };
  template <class L>
  void record_body_value(const L& t) {
    if (recorder_.muted) return;  // a body op run again to localize a wrong gradient
    BodyValue v;
    for (int a : t.variant) v.variant.push_back(mesh_.axes()[a]);
    for (int a : t.reduced) v.reduced.push_back(mesh_.axes()[a]);
    for (const auto& [a, op] : t.unreduced) v.unreduced[mesh_.axes()[a]] = reduce_op_name(op);
    for (const auto& l : t.locals) v.local_shapes.push_back(l.sizes().vec());
    v.untracked = t.untracked;
    v.unchecked = t.unchecked;
    if (!body_values_.count(t.name)) body_order_.push_back(t.name);
    body_values_[t.name] = v;
  }
  const std::map<std::string, BodyValue>& body_values() const { return body_values_; }
  const std::vector<std::string>& body_order() const { return body_order_; }
  // A value whose variance is unknown (a communicating Function without a strategy) left a
  // local_map: the result fails, naming it.
  void flag_untracked(const std::string& value, const std::string& why) {
    if (!recorder_.muted) untracked_.push_back(value + ": " + why);
  }
  const std::vector<std::string>& untracked() const { return untracked_; }
  // A check the run itself makes (from_local's run_check), failed: (check name, what is wrong).
  void flag_check_failure(const std::string& check, const std::string& what) { check_failures_.emplace_back(check, what); }
  const std::vector<std::pair<std::string, std::string>>& check_failures() const { return check_failures_; }

  // Called with every rule application before its decision (`meshsim explain` keeps them); none by
  // default.
  void set_op_observer(std::function<void(const OpApplication&)> observer) { observer_ = std::move(observer); }

  // Sharding decisions are cached by op, attributes, operand specs and shapes.
  struct Stats {
    int64_t propagation_requests = 0;
    int64_t propagations = 0;
    int64_t cache_hits = 0;
  };
  const Stats& stats() const { return stats_; }

  // Used by the autograd nodes.
  // Runs a plan step by step, recording each step; in the backward, `grad_of` names the value
  // whose gradient the steps produce (the event's args).
  Locals run_plan(const std::vector<RedistStep>& plan, const Spec& from, Locals locals,
                  const std::string& value, const std::string& note, const std::string& grad_of = "");
  // Redistributes a gradient of `grad_of` to the cotangent of `primal` (events name `value`: the
  // gradient's own value for a hook, the redistribution's output for Redistribute.backward).
  Locals to_cotangent(Locals grads, const GradSpec& from, const Spec& primal, const std::string& grad_of,
                      const std::string& value, const std::string& note);
  // The same to any gradient layout (records it as the gradient's layout of `grad_of`).
  Locals to_grad_layout(Locals grads, const GradSpec& from, const GradSpec& target, const std::string& grad_of,
                        const std::string& value, const std::string& note);
  // Semantics without the gradient hook (PyTorch): a contribution keeps its layout, unless an
  // earlier contribution to the same value recorded another, which it then moves to.
  // Without the hook, the layout a new gradient contribution to `value` must take so that
  // libtorch may add it to the earlier ones: theirs if one was recorded, else `layout`.
  GradSpec accumulated_layout(const std::string& value, const GradSpec& layout) const;
  Locals keep_grad_layout(Locals grads, const GradSpec& layout, const std::string& value, const Spec& primal,
                          const Shape& global, const Locals& primal_locals, const std::string& note);
  // Without the hook, where a value's gradient must reach plain local code (a local_map's result,
  // from_local's result) in its cotangent's layout: an identity node whose backward moves the
  // gradient there (PyTorch's from_local backward redistributes likewise). Otherwise `y` itself.
  DTensor gradient_boundary(const DTensor& y, const std::string& note);
  // to_local's grad_placements, local_map's in_grad_placements: an identity node whose backward
  // takes the local code's gradient of `x` as laid out by `grad` and moves it to x's cotangent
  // (without the gradient hook: keeps it as `grad`, PyTorch's .grad). `x` itself when `grad` is its
  // own placements. Throws SemanticError (shape_mismatch) for a layout that does not fit x.
  DTensor grad_placements_boundary(const DTensor& x, const Spec& grad);
  // Whether the run's semantics profile follows this difference (core/semantics.h).
  bool follows(Difference d) const;
  void record_grad_spec(const std::string& value, const GradSpec& spec);
  std::string phase() const { return phase_; }
  Event make_event(const std::string& kind, const std::string& name, const std::string& value,
                   const Locals& locals) const;

  // backward_rule for an op's backward, cached as the forward's decisions are (a program's ops
  // ask it once per operand, with the same few arguments).
  BackwardDecision backward_decision(const std::string& op, const std::vector<Spec>& in_specs, const Spec& out_spec,
                                     const std::vector<Shape>& shapes, const OpAttrs& attrs, const Spec& grad_in,
                                     size_t input);

 private:
  Mesh mesh_;
  RunOptions options_;
  Recorder recorder_;
  std::string phase_ = "forward";
  int64_t kept_small_graphs_ = 0;  // per-rank graphs of small ops kept from their forward (apply_op)
  std::map<std::string, GradSpec> grad_specs_;
  std::unordered_map<std::string, ShardingDecision> decisions_;
  std::unordered_map<std::string, BackwardDecision> backward_decisions_;
  std::map<std::string, BodyValue> body_values_;
  std::vector<std::string> body_order_;
  std::vector<std::string> untracked_;
  std::vector<std::pair<std::string, std::string>> check_failures_;
  Stats stats_;
  std::function<void(const OpApplication&)> observer_;

  // The decision with the rule bugs planted (none: `d` itself; else a copy, kept in `planted`).
  const ShardingDecision& plant_rule_bugs(const std::string& op, const std::vector<Spec>& given,
                                          const ShardingDecision& d, ShardingDecision& planted) const;
  // The cached decision (a reference into the cache: its entries never move).
  const ShardingDecision& decide(const std::string& op, const OpAttrs& attrs, const std::vector<Spec>& specs,
                          const std::vector<Shape>& shapes);
  // A redistribution of the locals with no autograd node (below autograd).
  DTensor redistribute_locals(const DTensor& x, const Spec& to, const std::string& out_name);
  std::vector<std::string> tracking_problems_;
  std::vector<ImplicitMove> implicit_moves_;
  // Records the move and returns its reason (the text its events carry).
  std::string implicit_move(ImplicitMove m);

 public:
  // A SemanticError raised inside a backward node, raised again after the engine returns.
  std::shared_ptr<SemanticError> pending_error_;

  // Runs a node's backward; a SemanticError is kept (its kind survives the engine) and the node
  // returns no gradients. Anything else it raises (libtorch refusing a step) goes on as a
  // BackwardRaised naming the program op whose node it was.
  template <class F>
  std::vector<at::Tensor> guarded(size_t n_inputs, F&& body, const std::string& value = "") {
    try {
      return body();
    } catch (const SemanticError& e) {
      if (!pending_error_) pending_error_ = std::make_shared<SemanticError>(e);
      return std::vector<at::Tensor>(n_inputs);
    } catch (const BackwardRaised&) {
      throw;
    } catch (const std::exception& e) {
      if (is_out_of_memory(e)) throw;  // the machine's limit (exit 6), not the op's doing
      throw BackwardRaised(recorder_.program_op, value, first_line(e.what()));
    }
  }
};

}  // namespace meshsim

// Training steps on the fake mesh (core/train.h): the gradients of a step's microbatches
// accumulated per rank, clip_grad_norm as the user's code reduces the norm, and the optimizer's
// update of parameters and states, every one a DTensor (per-rank locals and a spec). What moves
// between ranks goes through the in-process collectives and is recorded. The optimizers' arithmetic
// on one tensor (a rank's local, or the oracle's global) is shared with the oracle: what the mesh
// can get wrong is the layout, the reductions and the accumulation, which the oracle does not do.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "core/scenario.h"
#include "sim/collectives.h"
#include "sim/dtensor.h"
#include "sim/interpreter.h"

namespace meshsim {

// The names of a parameter's optimizer states, in a fixed order: sgd with momentum
// "momentum_buffer"; adamw "exp_avg", "exp_avg_sq"; sgd without momentum none.
std::vector<std::string> optimizer_state_names(const OptimizerSpec& opt);

// The placements of a parameter's optimizer states: the optimizer's `states` entry, else the
// parameter's own with Partial and Reduced axes replicated.
Spec optimizer_state_spec(const OptimizerSpec& opt, const std::string& param, const Spec& param_spec);

// One optimizer step on one tensor (torch.optim.SGD / AdamW, single-tensor form): updates
// `param` and `states` (by optimizer_state_names, created at the first step) from `grad`.
// `step` counts from 1.
void optimizer_update(const OptimizerSpec& opt, double lr, int64_t step, at::Tensor& param, const at::Tensor& grad,
                      std::map<std::string, at::Tensor>& states);

// sum |g|^p (p finite) or max |g| (p infinite) of one tensor, as a 0-d tensor.
at::Tensor norm_power(const at::Tensor& g, double p);
// total^(1/p) (or total itself for p infinite).
double norm_root(double total, double p);

// A collective of the training steps (the result's train.collectives).
struct TrainCollective {
  int64_t step = 0;    // from 1
  std::string phase;   // "accumulate" | "clip" | "optimizer"
  std::string op, axis, value;
  int64_t bytes = 0;
};

// The mesh's side of the steps: parameters (in their input placements) and optimizer states (in
// theirs), per rank.
class MeshTrainer {
 public:
  MeshTrainer(const Scenario& sc, const RunOptions& options, std::map<std::string, Locals> params);

  const std::map<std::string, Locals>& params() const { return params_; }
  // state name -> locals, per parameter (empty before the first step).
  const std::map<std::string, std::map<std::string, Locals>>& states() const { return states_; }
  const Spec& param_spec(const std::string& p) const;
  const Spec& state_spec(const std::string& p) const { return state_specs_.at(p); }

  // One microbatch's gradient of `param` (the backward's locals, laid out as `grad`): added to the
  // step's accumulated gradient, in the first microbatch's layout.
  void accumulate(const std::string& param, const GradSpec& grad, const Locals& locals);
  // Ends the step (`step` from 1): clipping, then the optimizer. Returns each rank's total norm
  // (empty without clipping).
  std::vector<double> finish_step(int64_t step);
  const std::vector<TrainCollective>& collectives() const { return collectives_; }

 private:
  Locals move(const Locals& x, const Spec& from, const Spec& to, bool gradient, const std::string& value,
              const std::string& phase);
  Locals all_reduce_axis(const Locals& x, int axis, ReduceOp op, const std::string& value, const std::string& phase);
  std::vector<double> clip();

  const Scenario& sc_;
  RunOptions options_;
  std::map<std::string, Locals> params_;
  std::map<std::string, Spec> state_specs_;
  std::map<std::string, std::map<std::string, Locals>> states_;
  std::map<std::string, Locals> acc_;     // the step's accumulated gradients
  std::map<std::string, Spec> acc_spec_;  // and their layouts
  std::map<std::string, int64_t> microbatches_seen_;
  int64_t step_ = 0;
  std::vector<TrainCollective> collectives_;
};

// The seed of the non-parameter inputs of microbatch `microbatch` of step `step` (both from 0):
// the run's seed for the first, one of its own for every other under "data": "per_microbatch".
uint64_t train_data_seed(const TrainSpec& train, uint64_t seed, int64_t step, int64_t microbatch);

// The mesh's side of every step of sc.train, from the run `first` (step 1's first microbatch, on
// the mesh's initial parameters): each later microbatch runs the program again on the current
// parameters (the collectives through the current communicator, so on a real engine too), with
// the run's planted bug on for the mesh's work only. `on_microbatch(step, microbatch, run)` sees
// every microbatch's run (the first one's too) before its gradients are accumulated;
// `on_step(step, trainer, norms)` sees the state after each step (step from 1) and returns false
// to stop. Both are called outside the planted bug's scope.
using OnMicrobatch = std::function<void(int64_t step, int64_t microbatch, const SimRun& run)>;
using OnStep = std::function<bool(int64_t step, const MeshTrainer& trainer, const std::vector<double>& norms)>;
void run_train_steps(const Scenario& sc, const RunOptions& options, const SimRun& first, const OnMicrobatch& on_microbatch,
                     const OnStep& on_step);

}  // namespace meshsim

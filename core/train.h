// A scenario's `train` (docs/scenario-format.md, "train"): whole training steps. Each step runs the
// program's forward and backward once per microbatch, accumulates the parameters' gradients,
// optionally clips them by their total norm as the user's code computes it, and updates parameters
// and optimizer states (SGD with momentum, AdamW) that are DTensors with placements of their own.
// Pure description: the mesh's and the oracle's loops are in sim/train.h and oracles/train.h.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/mesh.h"
#include "core/placement.h"

namespace meshsim {

struct InputDecl;

enum class OptimizerKind { Sgd, AdamW };
const char* optimizer_name(OptimizerKind k);  // "sgd" | "adamw"

// How each microbatch's non-parameter inputs are drawn: from a seed of their own per (step,
// microbatch) (the first microbatch of the first step from the run's seed), or the same every time.
enum class TrainData { PerMicrobatch, Fixed };

struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::Sgd;
  // SGD (torch.optim.SGD): momentum buffer b = momentum * b + (1 - dampening) * g (b = g at the
  // first step), g + momentum * b with nesterov.
  double momentum = 0.0, dampening = 0.0;
  bool nesterov = false;
  // AdamW (torch.optim.AdamW): decoupled weight decay, bias-corrected moments.
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;  // SGD: added to the gradient; AdamW: p *= 1 - lr * weight_decay (default 0.01)
  // Placements of each parameter's optimizer states (its momentum buffer, exp_avg, exp_avg_sq), by
  // parameter name; a parameter not named keeps its states laid out as itself. ZeRO: states S(0)
  // over dp where the parameter is R.
  std::map<std::string, Spec> states;
};

// torch.nn.utils.clip_grad_norm_ on the named parameters' gradients, as the user's code computes
// the total norm.
struct ClipSpec {
  bool present = false;
  double max_norm = 1.0;
  double norm_type = 2.0;  // a p >= 1, or infinity ("inf")
  double eps = 1e-6;       // clip_coef = max_norm / (total_norm + eps), clamped to 1
  std::vector<std::string> params;  // empty: every parameter
  // How the total norm is reduced. DTensor: each gradient's norm as DTensor computes it (a
  // Partial gradient reduced first, the p-th powers of the local norms summed over the gradient's
  // sharded axes: PyTorch's P(norm) placement) and summed over the parameters. Otherwise, the
  // user's code: every rank sums the p-th powers of its local gradients (max for inf) and
  // all_reduces them over `all_reduce_axes`, in that order (FSDP/HSDP code's own reduction, right
  // or wrong).
  bool dtensor = true;
  std::vector<std::string> all_reduce_axes;
};

struct TrainSpec {
  bool present = false;
  int64_t steps = 1;
  int64_t microbatches = 1;
  TrainData data = TrainData::PerMicrobatch;
  // Inputs cut from the step's batch (a data loader's batch split for accumulation): the input's
  // declared shape is one microbatch's; the step's batch, `microbatches` times it along dim 0, is
  // drawn once per step (from the seed `data` gives the step's first microbatch) and microbatch m
  // takes rows [m b, (m + 1) b). The first microbatch of the first step is the checked run's draw.
  std::vector<std::string> batch;
  std::vector<double> lr;  // one per step (a single number: every step)
  OptimizerSpec optimizer;
  ClipSpec clip;
  std::vector<std::string> params;  // the inputs that require grad, in input order

  double lr_at(int64_t step) const { return lr.at(static_cast<size_t>(step)); }
};

// Reads `train` (the object at /train) against the scenario's mesh and inputs; throws InputError
// naming `file` and the JSON path. The parameters are the inputs that require grad (float, not
// from_local, with a cotangent: no P(max) or P(min)); the scenario must have a backward.
TrainSpec parse_train(const nlohmann::json& train, const std::string& file, const Mesh& mesh,
                      const std::vector<InputDecl>& inputs, bool has_backward);

}  // namespace meshsim

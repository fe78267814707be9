// Training steps checked against the single-device oracle (core/train.h): after a scenario's first
// forward and backward passed its checks, the mesh (sim/train.h) and the oracle run the same steps,
// microbatches and data, and after every step every parameter and optimizer state, and the total
// norm clip_grad_norm used on each rank, is compared. Adds the result's `train` object,
// checks.train_equivalence, and on failure the step's failures and mismatches (contract 3, new
// fields only).
#pragma once

#include <cstdint>

#include "core/scenario.h"
#include "oracles/check.h"
#include "oracles/oracle.h"
#include "sim/interpreter.h"

namespace meshsim {

// The comparison's tolerance for training steps: relative to max(1, the largest |oracle value|),
// 1e-9 in float64 (an optimizer divides and takes roots, and from the second step on the data are
// no longer integers, so sums in another order round differently), 1e-3 in float32.
double train_tolerance(const RunOptions& options);

// `first` and `first_oracle` are the checked run's (step 1, microbatch 1). Never throws: what the
// steps raise is a failed check.
void check_train(const Scenario& sc, const RunOptions& options, const SimRun& first, const OracleRun& first_oracle,
                 CheckedRun& out);

}  // namespace meshsim

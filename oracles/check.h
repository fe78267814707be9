// One checked run: the scenario on the fake mesh and on the single-device oracle, compared, as a
// result (DESIGN.md, contract 3) with the run's events (contract 4).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "core/event.h"
#include "core/placement.h"
#include "core/scenario.h"

namespace meshsim {

// One value of a run kept for inspection (meshsim run --values): the mesh's and the oracle's.
struct KeptTensor {
  std::string name;
  Spec spec;                        // the layout of `locals`
  std::vector<at::Tensor> locals;   // per rank, as laid out (a gradient's: the global gradient / divisor)
  int64_t divisor = 1;              // a gradient's: the assembled locals times this are the gradient
  at::Tensor global;                // assembled (times divisor); undefined when the locals do not assemble
  at::Tensor oracle;                // undefined where the oracle has none
};

// A training step's tensor (a scenario's `train`, with keep_values): a microbatch's data input as
// the mesh ran it, or a parameter or optimizer state after a step, the mesh's and the oracle's.
struct KeptTrainTensor {
  int64_t step = 0;         // from 1
  int64_t microbatch = -1;  // from 0 for a data input; -1 for a value after the step
  std::string kind;         // "input" | "parameter" | "state"
  std::string state;        // an optimizer state's name (exp_avg, ...); "" otherwise
  KeptTensor tensor;
};

struct RunTensors {
  std::vector<KeptTensor> values;  // every named DTensor value, in scenario order
  std::vector<KeptTensor> grads;   // every input gradient, in input order (empty locals: none reached it)
  std::vector<KeptTrainTensor> train;  // the steps' data, parameters and states, in the order they ran
};

struct CheckedRun {
  nlohmann::json result;  // meshsim.result/1
  std::vector<Event> events;
  int exit_code = 0;      // 0 pass, 1 a check failed, 2 or 3 an error (contract 1)
  std::shared_ptr<RunTensors> tensors;  // with keep_values, once the mesh's run finished; else null
  // Where the run's time went, in seconds (not in the result, which a seed reproduces byte for
  // byte): the mesh's run, the single-device oracle, the comparison of every value and gradient
  // with the oracle's (assembling the global, its layout, the difference and the tolerance), and
  // the rest of the result (placements, communication tables, collectives). bench/bench_checked.cpp
  // reports each share.
  struct Phases {
    double simulation = 0, oracle = 0, comparison = 0, result = 0;
  } seconds;
};

// Never throws for a scenario that parsed: errors of the semantics become status "error", and
// whatever libtorch raises (in the run, the oracle or the comparison) a failed check or an error.
// With keep_values, `tensors` holds the run's values and gradients (detached) when the mesh's run
// finished (the oracle's where it ran too).
CheckedRun check_scenario(const Scenario& sc, const RunOptions& options, bool keep_values = false);

// Whether a failing run looks for its first divergence (options.localize permitting): true but
// for a scope that turns it off (ScopedOverride) without changing the run's options (which traces
// record): the property search, whose shrinking runs thousands of failing cases; the counterexample
// it writes is run again, and localized then. Per thread.
bool& localization_enabled();

// Whether a failed comparison is described in numbers by describe_mismatch (the result's
// `mismatches`: the worst element, wrong ranks, a constant factor): true but for a scope that
// expects the run to fail and reads its status alone (ScopedOverride): a property case whose
// program is wrong on purpose. There a failure says the value, its error and the tolerance. Per thread.
bool& mismatch_numbers_enabled();

// How far the mesh's values and gradients may differ from the oracle's, relative to the largest
// finite magnitude of the oracle's (at least 1): 0 (bit for bit) for float64 integer data on meshes
// whose axis sizes are powers of two when every op of the program, local_map bodies and references
// included, is exact on integers (no exp, tanh, sin, softmax, div or mean; scale by an integer or
// a power of two); else 1e-12, and 1e-4 in float32.
// A scenario the oracle computes as the float64 reference (float64_reference_run: half precision,
// or dtypes mixed) allows dtype_tolerance() instead.
double comparison_tolerance(const Scenario& sc, const RunOptions& options);
// u * (2n + K): u the unit roundoff of the least precise dtype the mesh computes in (2^-8 bfloat16,
// 2^-11 float16, 2^-24 float32, 2^-53 float64), n the program's ops (each rounds its result in the
// forward and its gradient in the backward), K the longest sum in the dtype (the mesh's size, or
// the largest extent of an input's dim). docs/semantics.md, "Dtypes and mixed precision".
double dtype_tolerance(const Scenario& sc, const RunOptions& options);

// Whether an op's results on integer data are integers (exact in any order of the sums); the
// generators use it too, to keep rounded values away from relu's kink and large magnitudes.
bool exact_op(const OpDecl& op);

}  // namespace meshsim

// Which dtypes a scenario's mesh computes in, for the oracle and the comparison (docs/semantics.md,
// "Dtypes and mixed precision").
#pragma once

#include "core/scenario.h"

namespace meshsim {

// Whether the oracle computes the scenario as the float64 reference: the run's dtype is half
// precision, or an input, a created value, a `to` or a mixed precision policy names a float dtype
// other than the run's. Every float value is then float64, a `to` keeps its operand, and the
// comparison allows the dtypes' rounding (dtype_tolerance, oracles/check.h).
bool float64_reference_run(const Scenario& sc, DType run_dtype);

// The least precise float dtype the mesh's run computes in (the run's, an input's, a created
// value's, a `to`'s, a mixed precision policy's).
DType least_precise_dtype(const Scenario& sc, DType run_dtype);

}  // namespace meshsim

// meshsim run --values DIR: a run's values and gradients as NumPy .npy files, the mesh's beside the
// oracle's, for inspection in Python (numpy.load) or any tool that reads .npy.
#pragma once

#include <string>

#include "oracles/check.h"

namespace meshsim {

// Writes DIR/values/NAME.npy (the mesh's assembled value), DIR/oracle/NAME.npy, DIR/grads/NAME.npy
// (the mesh's assembled gradient of an input), DIR/oracle_grads/NAME.npy, with `per_rank` also
// DIR/ranks/NAME/rankR.npy and DIR/ranks/grad_NAME/rankR.npy (each rank's local as laid out), and
// DIR/index.json listing every file written (value, kind, placements, shape, dtype) and every
// tensor that could not be (a value whose locals do not assemble, one the oracle has not). NAME is
// the value's name with '/', '\', '%' and control characters escaped as %XX (a name that is "." or
// ".." is spelled %2E), so every file stays in its folder, and under ranks/ a value whose name
// begins with "grad_" has its 'g' spelled %67 (the folder of a gradient); index.json holds the names
// as they are. A gradient's rank files hold the locals as laid out: the gradient divided by the
// index's `divisor` (P(avg) primals), as grads/NAME.npy holds it undivided.
// Needs run.tensors (check_scenario with keep_values); without them only index.json is written.
// DIR is replaced whole (core/files.h, write_directory_atomically): a reader, a kill or a full
// disk leaves the old directory or the new one, never a mix; InputError naming the path and the
// reason when a write fails.
void write_values(const CheckedRun& run, const std::string& dir, bool per_rank);

}  // namespace meshsim

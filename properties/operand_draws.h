// Drawing the operands and attributes of a definitions' case (properties/definitions.cpp), inside a
// RapidCheck generator.
#pragma once

#include <cstdint>

#include "core/layout.h"
#include "core/propagation.h"
#include "properties/kernel_nd.h"

namespace meshsim::kernel_nd {

// A float operand of `shape` (draw_values) appended to the case.
void add_operand(Case& c, const Dims& shape);
// `n` split into `parts` factors (a random divisor at a time), one of them -1 now and then.
Dims factorization(int64_t n, int64_t parts);
// The dims 0 .. rank-1 in a drawn order.
Dims permutation_of(int64_t rank);
// Values drawn for amax / amin: distinct half of the time, else from a few values (ties).
Nd draw_extremum_values(const Dims& shape);
// An operand broadcasting against `out`: a suffix of its dims (all of them half of the time when
// `whole_often`), each kept or made 1.
Dims broadcast_operand(const Dims& out, bool whole_often);
// The reduced dims of a reduction: none (every dim), one `dim`, or a list (possibly empty: every dim).
void draw_reduced_dims(OpAttrs& a, int64_t rank);
// Ids (or targets) uniform in [0, high).
Nd draw_ids(const Dims& shape, int64_t high);
// A bool mask, each element a fair coin.
Nd draw_mask(const Dims& shape);
// A range of a table's `extent` rows held by a rank: its torch.chunk over 1-4 ranks (empty ones too).
Chunk draw_range(int64_t extent);

}  // namespace meshsim::kernel_nd

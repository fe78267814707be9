// Drawing the operands and attributes of a definitions' case (properties/definitions.cpp).
#include "properties/operand_draws.h"

#include <algorithm>

#include <rapidcheck.h>

namespace meshsim::kernel_nd {

void add_operand(Case& c, const Dims& shape) { c.xs.push_back(draw_values(shape, false)); }

// `n` split into `parts` factors (a random divisor at a time), one of them -1 now and then.
Dims factorization(int64_t n, int64_t parts) {
  Dims out;
  for (int64_t p = 0; p + 1 < parts; ++p) {
    Dims divisors;
    for (int64_t q = 1; q <= n; ++q)
      if (n % q == 0) divisors.push_back(q);
    const int64_t q = *rc::gen::elementOf(divisors);
    out.push_back(q);
    n /= q;
  }
  if (parts > 0) out.push_back(n);
  if (parts > 0 && draw_in(0, 3) == 0) out[static_cast<size_t>(draw_in(0, parts - 1))] = -1;
  return out;
}

Dims permutation_of(int64_t rank) {
  Dims left, out;
  for (int64_t d = 0; d < rank; ++d) left.push_back(d);
  while (!left.empty()) {
    const auto i = static_cast<size_t>(draw_in(0, static_cast<int64_t>(left.size()) - 1));
    out.push_back(left[i]);
    left.erase(left.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return out;
}

// Values drawn for amax / amin: distinct half of the time, else from a few values (ties).
Nd draw_extremum_values(const Dims& shape) {
  Nd x = zeros(shape);
  if (coin()) {
    for (auto& e : x.v) e = static_cast<double>(draw_in(-2, 1)) + 0.5;
    return x;
  }
  const Dims order = permutation_of(count_of(shape));
  for (size_t k = 0; k < x.v.size(); ++k) x.v[k] = (static_cast<double>(order[k]) - 3.5) / 2.0;
  return x;
}

// An operand broadcasting against `out`: a suffix of its dims (all of them half of the time when
// `whole_often`), each kept or made 1.
Dims broadcast_operand(const Dims& out, bool whole_often) {
  const auto rank = static_cast<int64_t>(out.size());
  const int64_t r = whole_often && coin() ? rank : draw_in(0, rank);
  Dims s(out.end() - r, out.end());
  for (auto& e : s)
    if (draw_in(0, 3) == 0) e = 1;
  return s;
}

// The reduced dims of a reduction: none (every dim), one `dim`, or a list (possibly empty: every dim).
void draw_reduced_dims(OpAttrs& a, int64_t rank) {
  a.keepdim = coin();
  const int64_t form = rank == 0 ? 0 : draw_in(0, 2);
  if (form == 1) a.dim = as_given(draw_in(0, rank - 1), rank);
  if (form == 2) {
    a.dims_given = true;
    const Dims perm = permutation_of(rank);
    const int64_t n = draw_in(0, rank);
    for (int64_t i = 0; i < n; ++i) a.dims.push_back(as_given(perm[static_cast<size_t>(i)], rank));
  }
}

// Ids (or targets) uniform in [0, high).
Nd draw_ids(const Dims& shape, int64_t high) {
  Nd x = zeros(shape);
  for (auto& e : x.v) e = static_cast<double>(draw_in(0, high - 1));
  return x;
}

Nd draw_mask(const Dims& shape) {
  Nd x = zeros(shape);
  for (auto& e : x.v) e = coin() ? 1.0 : 0.0;
  return x;
}

// A range of a table's `extent` rows held by a rank: its torch.chunk over 1-4 ranks (empty
// ones too).
Chunk draw_range(int64_t extent) {
  const int64_t ranks = draw_in(1, 4), r = draw_in(0, ranks - 1);
  const int64_t size = (extent + ranks - 1) / ranks, offset = std::min(extent, r * size);
  return {offset, std::min(size, extent - offset)};
}

}  // namespace meshsim::kernel_nd

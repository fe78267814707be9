// How a distributed value differs from the oracle's, in numbers, as torch.testing.assert_close
// reports it: how many elements differ, the greatest absolute and relative differences and where,
// which ranks hold wrong locals, replicas that disagree, a constant factor that is the size of mesh
// axes (the classic missing or doubled all_reduce), and where a NaN comes from.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "core/mesh.h"
#include "core/placement.h"
#include "sim/collectives.h"
#include "sim/dtensor.h"

namespace meshsim {

// One element of the comparison: its global index (row-major unravel; [] for a 0-d value).
struct MismatchPoint {
  bool defined = false;  // false when no element gives one (every difference is NaN)
  std::vector<int64_t> index;
  double expected = 0.0, actual = 0.0, diff = 0.0;
};

// actual = ratio * expected at every element (0 where expected is 0).
struct MismatchFactor {
  double ratio = 1.0;
  // The mesh axes whose sizes n (multiplied) give the ratio by `form`: n or 1/n (their product is
  // the ratio or its inverse), else one axis and a normalization's form; may be empty.
  std::vector<std::string> axes;
  std::vector<std::vector<std::string>> alternatives;  // other sets of axes with the same product
  std::string direction;                               // "actual = 4 x expected", "actual = expected / 4"
  // How the ratio follows from n, the product of the sizes of `axes`: "" for n or 1/n (the ratio
  // itself), else one of sqrt(n), 1/sqrt(n), n-1, 1/(n-1), (n-1)/n, n/(n-1), n^2, 1/n^2.
  std::string form;
};

// Two ranks of a Replicate or Reduced axis whose locals differ (they must be equal).
struct ReplicaPair {
  int64_t first = 0, other = 0;
  std::string axis;
  // The first local index where they differ (row-major), with the two ranks' values there; empty
  // where their locals' shapes differ.
  std::vector<int64_t> index;
  double first_value = 0, other_value = 0;
};

struct Mismatch {
  int64_t mismatched = 0, total = 0;
  double allowed = 0.0;  // the greatest absolute difference within tolerance
  MismatchPoint max_abs, max_rel;
  // Ranks whose local differs from the oracle's value laid out by the same spec. Over a Partial
  // axis one rank's part means nothing alone: there a rank is named when its group's reduction
  // (the sum, for P(sum)) differs, so every member of a wrong group is named.
  std::vector<int64_t> ranks;
  std::vector<ReplicaPair> replicas;  // non-empty: replicas disagree
  std::optional<MismatchFactor> factor;
  std::string nan;      // where a NaN stands on one side only, and why when an empty shard explains it
  // Where the layout's shards are uneven: "dp=3 shards dim 0 of 16 unevenly: ranks 0, 1, 2 hold
  // [6, 8], [5, 8], [5, 8]" (they are where a wrong padding or chunking shows); "" when even.
  std::string uneven;
  std::string message;  // one line, under ~300 characters

  bool replicas_disagree() const { return !replicas.empty(); }
  // {"mismatched", "total", "allowed", "max_abs", "max_rel", "ranks", "replicas_disagree",
  //  "replica_pairs", "factor", "uneven", "nan", "message"}; NaN and infinity are null.
  nlohmann::json to_json() const;
};

// Compares `actual` (the assembled value, or undefined when its locals do not assemble) with
// `expected` (the oracle's) elementwise under the tolerance of within() (sim/data.h): an element
// differs when |actual - expected| > tol * max(1, the largest finite |expected|), NaN against NaN
// and equal infinities agree, and NaN against a number differs. `locals` are the per-rank locals
// as laid out by `spec` (scaled as `actual` is). `context`: other values of the run whose empty
// shards may explain a NaN (the value's own locals are looked at first). Never throws for
// tensors libtorch can compare; an undefined `actual` or another shape gives a message only.
Mismatch describe_mismatch(const Mesh& mesh, const Spec& spec, const Locals& locals, const at::Tensor& actual,
                           const at::Tensor& expected, double tol, const std::vector<const DTensor*>& context = {});

}  // namespace meshsim

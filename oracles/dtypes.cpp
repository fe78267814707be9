#include "oracles/dtypes.h"

namespace meshsim {

namespace {

// The float dtype an op's `dtype` names (a `to`'s, a created value's); nothing for "float" (the
// run's), "int64", "bool" or none.
std::optional<DType> named_dtype(const nlohmann::json& attrs) {
  if (!attrs.is_object() || !attrs.contains("dtype") || !attrs["dtype"].is_string()) return std::nullopt;
  return find_dtype(attrs["dtype"].get<std::string>());
}

// Every float dtype the ops (local_map bodies and references included) name, given to `f`.
template <class F>
void each_named(const std::vector<OpDecl>& ops, F&& f) {
  for (const auto& op : ops) {
    if (auto d = named_dtype(op.attrs)) f(*d);
    each_named(op.body, f);
    each_named(op.reference, f);
  }
}

}  // namespace

DType least_precise_dtype(const Scenario& sc, DType run_dtype) {
  DType least = run_dtype;
  for (const auto& in : sc.inputs) {
    if (in.dtype != ElementType::Float) continue;
    least = least_precise(least, in.float_dtype.value_or(run_dtype));
    for (const auto& d : {in.mixed_precision.param_dtype, in.mixed_precision.reduce_dtype})
      if (d) least = least_precise(least, *d);
  }
  each_named(sc.program, [&](DType d) { least = least_precise(least, d); });
  return least;
}

bool float64_reference_run(const Scenario& sc, DType run_dtype) {
  if (is_half(run_dtype)) return true;
  bool mixed = false;
  for (const auto& in : sc.inputs)
    mixed |= in.float_dtype.value_or(run_dtype) != run_dtype || in.mixed_precision.present;
  each_named(sc.program, [&](DType d) { mixed |= d != run_dtype; });
  return mixed;
}

}  // namespace meshsim

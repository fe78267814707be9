// LTensor: variance tracking of rank-local tensors inside a local_map region (SEMANTICS.md
// sections 5 and 6). An LTensor is every rank's local tensor plus the mesh axes along which its
// values differ (variant) and those along which it is replicated but its gradient must be reduced
// (reduced); the two never share an axis.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/mesh.h"
#include "core/mutants.h"
#include "sim/collectives.h"

namespace meshsim {

using AxisSet = std::set<int>;  // mesh axis indices
using Unreduced = std::map<int, ReduceOp>;  // mesh axis index -> the reduction its locals still need

struct LTensor {
  std::string name;
  const Mesh* mesh = nullptr;
  Locals locals;  // one per rank
  AxisSet variant;
  AxisSet reduced;
  // Computed by a Function that communicates and has no variance strategy: its sets mean nothing.
  bool untracked = false;
  std::string untracked_why;
  // Plain local code (a local_map with check_variance false, or to_local's result): no sets are
  // kept, nothing is inserted, and the oracle alone says whether the code is right.
  bool unchecked = false;
  // partial_in_local_map unreduced: the axes a Partial entered on, with its reduce op; the locals
  // still need that reduction (JAX 0.10's {U:axis}). Never shares an axis with variant or reduced.
  Unreduced unreduced = {};
};

std::string axes_str(const Mesh& mesh, const AxisSet& axes);  // "[dp, tp]"
std::string meta_str(const Mesh& mesh, const LTensor& t);     // "variant=[dp] reduced=[]" (+ " unreduced=[tp:sum]")

// ---------------------------------------------------------------------------------------------
// Variance-tracking strategies: one registry serves ops (keyed by op name) and Functions (keyed by
// their C++ type); a Function may instead declare a static strategy on its class (the mixin style).

struct StrategyInput {
  const std::vector<AxisSet>& variant;  // per input
  const std::vector<AxisSet>& reduced;  // per input
  const Mesh& mesh;
  const nlohmann::json& args;           // the op's or call's attributes
};

struct StrategyResult {
  AxisSet variant;
  std::optional<AxisSet> reduced;  // absent: the default (intersection of the inputs')
  // A Function with several outputs: one result per output (`variant` and `reduced` above are then
  // unused); empty: every output gets the result above (seed 001's "single or tuple return").
  std::vector<StrategyResult> outputs = {};
};

using Strategy = std::function<StrategyResult(const StrategyInput&)>;

// Registers (or replaces) the strategy of an op or Function key.
void register_variance_tracking_strategy(const std::string& key, Strategy strategy);
void unregister_variance_tracking_strategy(const std::string& key);
const Strategy* find_variance_tracking_strategy(const std::string& key);

// The registry key of a Function by the name scenarios `call` it (the public API's targets).
inline std::string function_name_key(const std::string& name) { return "function:name:" + name; }

// The registry key of a Function type.
template <class Fn>
std::string function_key() {
  return std::string("function:") + typeid(Fn).name();
}

// Decorator style: register_variance_tracking_strategy<MyFunction>(strategy).
template <class Fn>
void register_variance_tracking_strategy(Strategy strategy) {
  register_variance_tracking_strategy(function_key<Fn>(), std::move(strategy));
}

// Mixin style: a Function class that declares
//   static StrategyResult variance_strategy(const StrategyInput&);
template <class Fn, class = void>
struct has_variance_strategy : std::false_type {};
template <class Fn>
struct has_variance_strategy<Fn, std::void_t<decltype(&Fn::variance_strategy)>> : std::true_type {};

// The strategy in force for a Function type: the registry first, then the class's own, else none.
template <class Fn>
std::optional<Strategy> strategy_for() {
  if (const Strategy* s = find_variance_tracking_strategy(function_key<Fn>())) return *s;
  if constexpr (has_variance_strategy<Fn>::value)
    if (!mutant_on(Mutant::StrategyRegistryIgnored)) return Strategy(&Fn::variance_strategy);
  return std::nullopt;
}

}  // namespace meshsim

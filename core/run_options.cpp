// Run options: their spellings (one table per enum serves both parsing and naming), their JSON,
// and setting one from a scenario's "options" or a command line's --option key=value.
#include <charconv>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "core/mutants.h"
#include "core/scenario.h"
#include "core/scenario_reader.h"

namespace meshsim {

using json = nlohmann::json;
using namespace scenario_detail;

namespace {

// ---- option spellings: one table per enum serves both parsing and naming ----

template <class E>
struct Choice {
  const char* name;
  E value;
};

constexpr Choice<RedistributeMode> kRedistributeModes[] = {
    {"above_autograd", RedistributeMode::AboveAutograd},
    {"below_autograd", RedistributeMode::BelowAutograd}};
constexpr Choice<ReducedPropagation> kReducedPropagations[] = {
    {"intersection", ReducedPropagation::Intersection},
    {"union", ReducedPropagation::Union},
    {"strict", ReducedPropagation::Strict}};
constexpr Choice<PartialFromReplicate> kPartialFromReplicate[] = {
    {"divide", PartialFromReplicate::Divide}, {"rank0", PartialFromReplicate::Rank0}};
constexpr Choice<Semantics> kSemantics[] = {{"meshsim", Semantics::Meshsim}, {"pytorch", Semantics::Pytorch}};
constexpr Choice<ImplicitPolicy> kImplicitPolicies[] = {{"allow", ImplicitPolicy::Allow}, {"error", ImplicitPolicy::Error}};
constexpr Choice<Localize> kLocalize[] = {
    {"on_failure", Localize::OnFailure}, {"always", Localize::Always}, {"never", Localize::Never}};
constexpr Choice<PartialEntry> kPartialEntries[] = {{"variant", PartialEntry::Variant},
                                                    {"unreduced", PartialEntry::Unreduced}};
constexpr Choice<DType> kDTypes[] = {{"float64", DType::Float64},
                                     {"float32", DType::Float32},
                                     {"bfloat16", DType::BFloat16},
                                     {"float16", DType::Float16}};
constexpr Choice<ElementType> kElementTypes[] = {
    {"float", ElementType::Float}, {"bool", ElementType::Bool}, {"int64", ElementType::Int64}};

constexpr const char* kOptionKeys =
    "redistribute, reduced_propagation, partial_from_replicate, seed, dtype, mutant, semantics, implicit, localize, "
    "partial_in_local_map";

template <class E, size_t N>
const char* name_of(E value, const Choice<E> (&choices)[N]) {
  for (const auto& c : choices)
    if (c.value == value) return c.name;
  return choices[0].name;
}

template <class E, size_t N>
std::string choice_list(const Choice<E> (&choices)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i)
    out += (i ? (i + 1 == N ? " or " : ", ") : "") + std::string(choices[i].name);
  return out;
}

// A short rendering of any JSON value for messages (never throws on bad UTF-8).

template <class E, size_t N>
E pick(const std::string& key, const json& value, const Choice<E> (&choices)[N]) {
  if (value.is_string())
    for (const auto& c : choices)
      if (value.get_ref<const std::string&>() == c.name) return c.value;
  throw std::invalid_argument("option " + key + ": expected " + choice_list(choices) + ", got " +
                              brief(value));
}

uint64_t parse_seed(const json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) return value.get<uint64_t>();
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    uint64_t seed = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), seed);
    if (!s.empty() && ec == std::errc() && end == s.data() + s.size()) return seed;
  }
  throw std::invalid_argument("option seed: expected a non-negative integer, got " + brief(value));
}

std::string mutant_option(const json& value) {
  if (value.is_null()) return {};
  if (value.is_string()) {
    try {
      parse_mutant(value.get<std::string>());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("option mutant: ") + e.what());
    }
    return value.get<std::string>();
  }
  throw std::invalid_argument("option mutant: expected a mutant name (string) or null, got " +
                              brief(value));
}

}  // namespace

namespace scenario_detail {

std::string dtype_choices() { return choice_list(kDTypes); }

}  // namespace scenario_detail

const char* redistribute_mode_name(RedistributeMode m) { return name_of(m, kRedistributeModes); }
const char* reduced_propagation_name(ReducedPropagation r) {
  return name_of(r, kReducedPropagations);
}
const char* dtype_name(DType d) { return name_of(d, kDTypes); }
std::optional<DType> find_dtype(const std::string& text) {
  for (const auto& c : kDTypes)
    if (text == c.name) return c.value;
  return std::nullopt;
}
const char* element_type_name(ElementType t) { return name_of(t, kElementTypes); }
ElementType parse_element_type(const std::string& text) {
  for (const auto& c : kElementTypes)
    if (text == c.name) return c.value;
  if (find_dtype(text)) return ElementType::Float;
  std::string names;  // every element type, then every float dtype: "float, bool, int64, ... or float16"
  for (const auto& c : kElementTypes) names += std::string(names.empty() ? "" : ", ") + c.name;
  const std::string dtypes = choice_list(kDTypes);
  throw std::invalid_argument("unknown dtype " + in_quotes(text) + " (expected " + names + ", " + dtypes + ")");
}

json RunOptions::to_json() const {
  json out = {{"redistribute", redistribute_mode_name(redistribute)},
              {"reduced_propagation", reduced_propagation_name(reduced_propagation)},
              {"partial_from_replicate", partial_from_replicate_name(partial_from_replicate)},
              {"seed", seed},
              {"dtype", dtype_name(dtype)},
              {"mutant", mutant.empty() ? json(nullptr) : json(mutant)},
              {"semantics", semantics_name(semantics)}};
  // The checking options only where they differ from the default (traces of runs without them
  // read as they always did).
  if (implicit != ImplicitPolicy::Allow) out["implicit"] = name_of(implicit, kImplicitPolicies);
  if (localize != Localize::OnFailure) out["localize"] = name_of(localize, kLocalize);
  if (partial_entry != PartialEntry::Variant) out["partial_in_local_map"] = name_of(partial_entry, kPartialEntries);
  return out;
}

RunOptions with_overrides(RunOptions options, const std::vector<std::string>& overrides) {
  for (const auto& kv : overrides) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InputError("--option", "", "expected key=value, got \"" + shown(kv) + "\"");
    try {
      set_option(options, kv.substr(0, eq), json(kv.substr(eq + 1)));
    } catch (const std::invalid_argument& e) {
      throw InputError("--option", "/" + kv.substr(0, eq), e.what());
    }
  }
  return options;
}

void set_option(RunOptions& options, const std::string& key, const json& value) {
  if (key == "redistribute")
    options.redistribute = pick(key, value, kRedistributeModes);
  else if (key == "reduced_propagation")
    options.reduced_propagation = pick(key, value, kReducedPropagations);
  else if (key == "partial_from_replicate")
    options.partial_from_replicate = pick(key, value, kPartialFromReplicate);
  else if (key == "seed")
    options.seed = parse_seed(value);
  else if (key == "dtype")
    options.dtype = pick(key, value, kDTypes);
  else if (key == "mutant")
    options.mutant = mutant_option(value);
  else if (key == "semantics")
    options.semantics = pick(key, value, kSemantics);
  else if (key == "implicit")
    options.implicit = pick(key, value, kImplicitPolicies);
  else if (key == "localize")
    options.localize = pick(key, value, kLocalize);
  else if (key == "partial_in_local_map")
    options.partial_entry = pick(key, value, kPartialEntries);
  else
    throw std::invalid_argument("unknown option " + in_quotes(key) + " (known: " + kOptionKeys +
                                ")");
}

}  // namespace meshsim

#include "core/mutants.h"

#include <stdexcept>

namespace meshsim {

namespace {
Mutant g_active = Mutant::None;
}

const std::vector<MutantInfo>& mutant_catalog() {
  static const std::vector<MutantInfo> catalog = {
      {Mutant::CotangentPsumAsR, "cotangent_psum_as_r", "the cotangent of P(sum) taken as R"},
      {Mutant::UnevenArraySplit, "uneven_array_split",
       "uneven sharding as numpy.array_split instead of torch.chunk in the collectives"},
  };
  return catalog;
}

Mutant parse_mutant(const std::string& name) {
  if (name.empty()) return Mutant::None;
  std::string known;
  for (const auto& m : mutant_catalog()) {
    if (name == m.name) return m.id;
    known += (known.empty() ? "" : ", ") + std::string(m.name);
  }
  throw std::invalid_argument("unknown mutant \"" + name + "\" (known: " + known + ")");
}

Mutant active_mutant() { return g_active; }
bool mutant_on(Mutant m) { return g_active == m; }

MutantScope::MutantScope(Mutant m) : previous_(g_active) { g_active = m; }
MutantScope::~MutantScope() { g_active = previous_; }

}  // namespace meshsim

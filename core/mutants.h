// Planted bugs (mutants): switches of a run, off by default, so that the property suite can prove
// it finds real bug classes. The catalog is kept in alphabetical order.
#pragma once

#include <string>
#include <vector>

namespace meshsim {

enum class Mutant {
  None,
  CotangentPsumAsR,   // core: the cotangent of P(sum) taken as R
  UnevenArraySplit,   // sim: collectives chunk uneven dims as numpy.array_split, not torch.chunk
};

struct MutantInfo {
  Mutant id;
  const char* name;
  const char* bug;  // the bug class it plants
};

const std::vector<MutantInfo>& mutant_catalog();
// Throws std::invalid_argument for an unknown name; "" is Mutant::None.
Mutant parse_mutant(const std::string& name);

// The planted bug in force for the current run (one run at a time per process).
Mutant active_mutant();
bool mutant_on(Mutant m);

// Switches a mutant on for a scope.
class MutantScope {
 public:
  explicit MutantScope(Mutant m);
  ~MutantScope();
  MutantScope(const MutantScope&) = delete;
  MutantScope& operator=(const MutantScope&) = delete;

 private:
  Mutant previous_;
};

}  // namespace meshsim

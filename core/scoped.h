// Sets a variable for a scope and puts its previous value back at the scope's end: the one shape
// of meshsim's run-wide switches (the planted bug, the communicator, a kernel's group).
#pragma once

#include <utility>

namespace meshsim {

template <class T>
class ScopedOverride {
 public:
  ScopedOverride(T& slot, T value) : slot_(slot), previous_(std::exchange(slot, std::move(value))) {}
  ~ScopedOverride() { slot_ = std::move(previous_); }
  ScopedOverride(const ScopedOverride&) = delete;
  ScopedOverride& operator=(const ScopedOverride&) = delete;

 private:
  T& slot_;
  T previous_;
};

}  // namespace meshsim

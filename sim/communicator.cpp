#include "sim/communicator.h"

namespace meshsim {

namespace {
SimCommunicator& simulation() {
  static SimCommunicator sim;
  return sim;
}
Communicator* g_current = nullptr;
Ranks g_group;
}  // namespace

Communicator& communicator() { return g_current ? *g_current : simulation(); }

UseCommunicator::UseCommunicator(Communicator& c) : ScopedOverride(g_current, &c) {}

const Ranks& current_group() { return g_group; }
InGroup::InGroup(Ranks ranks) : ScopedOverride(g_group, std::move(ranks)) {}

}  // namespace meshsim

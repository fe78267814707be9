#include "sim/communicator.h"

#include <utility>

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

UseCommunicator::UseCommunicator(Communicator& c) : previous_(g_current) { g_current = &c; }
UseCommunicator::~UseCommunicator() { g_current = previous_; }

const Ranks& current_group() { return g_group; }
InGroup::InGroup(Ranks ranks) : previous_(std::exchange(g_group, std::move(ranks))) {}
InGroup::~InGroup() { g_group = std::move(previous_); }

}  // namespace meshsim

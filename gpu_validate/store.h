// The rendezvous store the real engines meet through: a c10d FileStore (workers on one machine,
// a private directory) or a c10d TCPStore served by rank 0 (workers started by hand anywhere).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "sim/communicator.h"

namespace meshsim {

struct StoreConfig {
  int64_t rank = 0;
  int64_t world = 1;
  std::chrono::milliseconds timeout{30000};
  std::string file;          // FileStore path; or
  std::string master_addr;   // TCPStore address ...
  int master_port = 29500;   // ... and port
};

c10::intrusive_ptr<c10d::Store> make_store(const StoreConfig& config);

// "meshsim/group/0/2": the store prefix of a mesh group.
std::string group_key(const Ranks& ranks);

}  // namespace meshsim

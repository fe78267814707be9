#include "gpu_validate/store.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace meshsim {

c10::intrusive_ptr<c10d::Store> make_store(const StoreConfig& config) {
  c10::intrusive_ptr<c10d::Store> store;
  if (!config.file.empty()) {
    store = c10::make_intrusive<c10d::FileStore>(config.file, static_cast<int>(config.world));
  } else {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(config.master_port);
    opts.isServer = config.rank == 0;
    opts.numWorkers = static_cast<size_t>(config.world);
    opts.timeout = config.timeout;
    store = c10::make_intrusive<c10d::TCPStore>(config.master_addr, opts);
  }
  store->setTimeout(config.timeout);
  return store;
}

std::string group_key(const Ranks& ranks) {
  std::string key = "meshsim/group";
  for (auto r : ranks) key += "/" + std::to_string(r);
  return key;
}

}  // namespace meshsim

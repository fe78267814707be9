// The Gloo engine: libtorch's c10d ProcessGroupGloo (Debian's libtorch-dev, built on
// libgloo-dev), one process per rank, talking TCP. One process group per mesh group this rank
// belongs to, made up front in a fixed order (axis, then group) through a store: a c10d
// FileStore in a private directory for workers on one machine, a TCPStore for workers started by
// hand on several.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "core/mesh.h"
#include "gpu_validate/real_engine.h"

namespace meshsim {

struct GlooConfig : EngineConfig {
  std::string hostname;       // the address this worker listens on; default 127.0.0.1 with a
                              // FileStore, this machine's hostname with a TCPStore
};

class GlooCommunicator : public RealCommunicator {
 public:
  GlooCommunicator(const Mesh& mesh, const GlooConfig& config);
  ~GlooCommunicator() override;
  const char* name() const override { return "gloo"; }
  void finish() override;

 protected:
  at::Tensor real_all_gather(const Ranks& ranks, size_t k, const Locals& group, int64_t dim) override;
  at::Tensor real_all_reduce(const Ranks& ranks, size_t k, const at::Tensor& mine, ReduceOp op) override;
  at::Tensor real_all_to_all(const Ranks& ranks, size_t k, const Locals& group, int64_t split_dim,
                             int64_t concat_dim) override;
  at::Tensor real_all_to_all_split(const Ranks& ranks, size_t k, const Locals& group, const SplitTable& sends) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshsim

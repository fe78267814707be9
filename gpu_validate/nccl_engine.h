// The NCCL engine: one process per GPU, each rank's local staged into device memory for every
// collective (Debian's libtorch is CPU-only, so locals live on the host between collectives),
// the collective run by NCCL on one communicator per mesh group (made up front, ids exchanged
// through the store), the result copied back. Built when CMake finds CUDA and NCCL (the machine
// image's /usr/local/cuda); without them, or without GPUs enough, validate says so and skips.
// NCCL_ALGO=Ring and NCCL_PROTO=Simple are pinned (unless set) so reductions are reproducible.
#pragma once

#include <memory>
#include <string>

#include "core/mesh.h"
#include "gpu_validate/real_engine.h"

namespace meshsim {

using NcclConfig = EngineConfig;

// Why NCCL cannot run `world` ranks on this machine (not built, no CUDA device, fewer GPUs than
// ranks: NCCL refuses two ranks on one GPU), or "" when it can.
std::string nccl_unavailable(int64_t world);

// Throws EngineUnavailable when nccl_unavailable says why.
std::unique_ptr<RealCommunicator> make_nccl_communicator(const Mesh& mesh, const NcclConfig& config);

}  // namespace meshsim

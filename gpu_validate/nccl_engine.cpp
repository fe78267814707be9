#include "gpu_validate/nccl_engine.h"

#include <stdlib.h>

#include <map>
#include <stdexcept>
#include <thread>

#ifdef MESHSIM_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace meshsim {

#ifndef MESHSIM_WITH_NCCL

std::string nccl_unavailable(int64_t) {
  return "this meshsim was built without NCCL (CMake found no CUDA toolkit with nccl.h; the machine "
         "image has them under /usr/local/cuda)";
}

std::unique_ptr<RealCommunicator> make_nccl_communicator(const Mesh&, const NcclConfig&) {
  throw EngineUnavailable(nccl_unavailable(0));
}

#else

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string("NCCL ") + what + ": " + ncclGetErrorString(r));
}

ncclDataType_t nccl_type(const at::Tensor& t) {
  if (t.scalar_type() == at::kDouble) return ncclFloat64;
  if (t.scalar_type() == at::kFloat) return ncclFloat32;
  if (t.scalar_type() == at::kLong) return ncclInt64;  // ids, targets
  if (t.scalar_type() == at::kByte) return ncclUint8;  // bool, carried as uint8 (real_engine.cpp)
  throw std::runtime_error("NCCL engine: only float64, float32, int64 and bool locals");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    default: return ncclSum;  // avg: the sum, divided on the host as the simulation does
  }
}

// Device memory for one collective.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { check_cuda(cudaMalloc(&ptr, bytes ? bytes : 1), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

class NcclCommunicator : public RealCommunicator {
 public:
  NcclCommunicator(const Mesh& mesh, const NcclConfig& config)
      : RealCommunicator(config), timeout_(config.store.timeout) {
    ::setenv("NCCL_ALGO", "Ring", 0);
    ::setenv("NCCL_PROTO", "Simple", 0);
    int count = 0;
    check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    check_cuda(cudaSetDevice(static_cast<int>(config.store.rank % count)), "cudaSetDevice");
    check_cuda(cudaStreamCreate(&stream_), "cudaStreamCreate");
    auto store = make_store(config.store);
    // One communicator per group of this rank (member_groups' order); the group's first member
    // makes the id and publishes it.
    for (const auto& g : member_groups(mesh, config.store.rank)) {
      ncclUniqueId id;
      const std::string key = group_key(g.ranks) + "/nccl_id";
      if (g.position == 0) {
        check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
        store->set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof id.internal));
      } else {
        const std::vector<uint8_t> bytes = store->get(key);
        std::copy(bytes.begin(), bytes.end(), id.internal);
      }
      ncclComm_t comm;
      check_nccl(ncclCommInitRank(&comm, static_cast<int>(g.ranks.size()), id, static_cast<int>(g.position)),
                 "ncclCommInitRank");
      comms_[g.ranks] = comm;
    }
  }
  ~NcclCommunicator() override {
    for (auto& [ranks, comm] : comms_) ncclCommDestroy(comm);
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "nccl"; }

 protected:
  at::Tensor real_all_gather(const Ranks& ranks, size_t k, const Locals& group, int64_t dim) override {
    at::Tensor mine = padded_for_gather(group, k, dim);
    const size_t bytes = static_cast<size_t>(mine.numel()) * mine.element_size();
    DeviceBuffer send(bytes), recv(bytes * ranks.size());
    to_device(send, mine);
    check_nccl(ncclAllGather(send.ptr, recv.ptr, static_cast<size_t>(mine.numel()), nccl_type(mine), comm(ranks), stream_),
               "ncclAllGather");
    synchronize("all_gather");
    at::Tensor all = at::empty({static_cast<int64_t>(ranks.size()) * mine.numel()}, mine.options());
    from_device(all, recv);
    std::vector<at::Tensor> pieces;
    for (size_t s = 0; s < group.size(); ++s)
      pieces.push_back(all.narrow(0, static_cast<int64_t>(s) * mine.numel(), mine.numel()).view(mine.sizes()));
    return unpad_gathered(pieces, group, dim);
  }

  at::Tensor real_all_reduce(const Ranks& ranks, size_t, const at::Tensor& mine, ReduceOp op) override {
    at::Tensor host = mine.detach().contiguous().clone();
    const size_t bytes = static_cast<size_t>(host.numel()) * host.element_size();
    DeviceBuffer buf(bytes);
    to_device(buf, host);
    check_nccl(ncclAllReduce(buf.ptr, buf.ptr, static_cast<size_t>(host.numel()), nccl_type(host), nccl_op(op), comm(ranks), stream_),
               "ncclAllReduce");
    synchronize("all_reduce");
    from_device(host, buf);
    if (op == ReduceOp::Avg) host.div_(static_cast<double>(ranks.size()));
    return host;
  }

  at::Tensor real_all_to_all(const Ranks& ranks, size_t k, const Locals& group, int64_t split_dim,
                             int64_t concat_dim) override {
    const auto n = static_cast<int64_t>(ranks.size());
    std::vector<at::Tensor> send_pieces, recv_pieces;
    for (int64_t d = 0; d < n; ++d) send_pieces.push_back(chunk_piece(group[k].detach(), split_dim, n, d).clone(at::MemoryFormat::Contiguous));
    for (int64_t s = 0; s < n; ++s)
      recv_pieces.push_back(at::empty(chunk_piece(group[s], split_dim, n, static_cast<int64_t>(k)).sizes(), group[k].options().requires_grad(false)));
    std::vector<std::unique_ptr<DeviceBuffer>> sends, recvs;
    for (auto& p : send_pieces) {
      sends.push_back(std::make_unique<DeviceBuffer>(static_cast<size_t>(p.numel()) * p.element_size()));
      to_device(*sends.back(), p);
    }
    for (auto& p : recv_pieces) recvs.push_back(std::make_unique<DeviceBuffer>(static_cast<size_t>(p.numel()) * p.element_size()));
    ncclComm_t c = comm(ranks);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int64_t p = 0; p < n; ++p) {
      check_nccl(ncclSend(sends[p]->ptr, static_cast<size_t>(send_pieces[p].numel()), nccl_type(send_pieces[p]), static_cast<int>(p), c, stream_), "ncclSend");
      check_nccl(ncclRecv(recvs[p]->ptr, static_cast<size_t>(recv_pieces[p].numel()), nccl_type(recv_pieces[p]), static_cast<int>(p), c, stream_), "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    synchronize("all_to_all");
    for (int64_t p = 0; p < n; ++p) from_device(recv_pieces[p], *recvs[p]);
    return at::cat(recv_pieces, concat_dim);
  }

  // Uneven rows of dim 0: one ncclSend and one ncclRecv per peer with rows to move, in one group
  // (a peer with no rows either way is skipped on both sides: the table is the same on every rank).
  at::Tensor real_all_to_all_split(const Ranks& ranks, size_t k, const Locals& group, const SplitTable& sends) override {
    const size_t n = ranks.size();
    at::Tensor mine = group[k].detach().contiguous();
    const int64_t row = mine.dim() == 0 ? 1 : mine.numel() / std::max<int64_t>(mine.size(0), 1);
    int64_t rows = 0;
    for (size_t s = 0; s < n; ++s) rows += sends[s][k];
    std::vector<int64_t> shape = mine.sizes().vec();
    shape[0] = rows;
    at::Tensor out = at::empty(shape, mine.options().requires_grad(false));
    const size_t es = mine.element_size();
    DeviceBuffer send(std::max<size_t>(static_cast<size_t>(mine.numel()) * es, 1)),
        recv(std::max<size_t>(static_cast<size_t>(out.numel()) * es, 1));
    if (mine.numel()) to_device(send, mine);
    ncclComm_t c = comm(ranks);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    int64_t sent = 0, received = 0;
    for (size_t p = 0; p < n; ++p) {
      const int64_t out_rows = sends[k][p], in_rows = sends[p][k];
      if (out_rows > 0)
        check_nccl(ncclSend(static_cast<char*>(send.ptr) + sent * row * static_cast<int64_t>(es),
                            static_cast<size_t>(out_rows * row), nccl_type(mine), static_cast<int>(p), c, stream_),
                   "ncclSend");
      if (in_rows > 0)
        check_nccl(ncclRecv(static_cast<char*>(recv.ptr) + received * row * static_cast<int64_t>(es),
                            static_cast<size_t>(in_rows * row), nccl_type(mine), static_cast<int>(p), c, stream_),
                   "ncclRecv");
      sent += out_rows;
      received += in_rows;
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    synchronize("all_to_all");
    if (out.numel()) from_device(out, recv);
    return out;
  }

 private:
  ncclComm_t comm(const Ranks& ranks) {
    auto it = comms_.find(ranks);
    if (it == comms_.end()) throw std::logic_error("nccl: no communicator for " + group_key(ranks));
    return it->second;
  }
  void to_device(DeviceBuffer& d, const at::Tensor& host) {
    check_cuda(cudaMemcpyAsync(d.ptr, host.data_ptr(), static_cast<size_t>(host.numel()) * host.element_size(),
                               cudaMemcpyHostToDevice, stream_), "copy to device");
  }
  void from_device(at::Tensor& host, const DeviceBuffer& d) {
    check_cuda(cudaMemcpyAsync(host.data_ptr(), d.ptr, static_cast<size_t>(host.numel()) * host.element_size(),
                               cudaMemcpyDeviceToHost, stream_), "copy to host");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  // Waits for the stream with the timeout: a peer that died or hangs leaves NCCL waiting, so the
  // communicators are aborted and the collective reported.
  void synchronize(const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) check_cuda(e, what);
      ncclResult_t async = ncclSuccess;
      for (auto& [ranks, c] : comms_) {
        ncclCommGetAsyncError(c, &async);
        if (async != ncclSuccess && async != ncclInProgress) break;
      }
      if ((async != ncclSuccess && async != ncclInProgress) || std::chrono::steady_clock::now() > deadline) {
        for (auto& [ranks, c] : comms_) ncclCommAbort(c);
        comms_.clear();
        throw std::runtime_error(std::string("NCCL ") + what + (async != ncclSuccess ? std::string(" failed: ") + ncclGetErrorString(async)
                                                                                     : " timed out after " + std::to_string(timeout_.count()) + " ms"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  std::chrono::milliseconds timeout_;
  cudaStream_t stream_ = nullptr;
  std::map<Ranks, ncclComm_t> comms_;
};

}  // namespace

std::string nccl_unavailable(int64_t world) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return std::string("no CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
  if (count == 0) return "no CUDA device";
  if (world > count)
    return "the mesh has " + std::to_string(world) + " ranks and NCCL needs one GPU per rank (it refuses two ranks on "
           "one GPU); this machine has " + std::to_string(count) + ", so it validates meshes of at most " +
           std::to_string(count) + " ranks here (several machines: docs/engines.md)";
  return "";
}

std::unique_ptr<RealCommunicator> make_nccl_communicator(const Mesh& mesh, const NcclConfig& config) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) throw EngineUnavailable(nccl_unavailable(mesh.size()));
  return std::make_unique<NcclCommunicator>(mesh, config);
}

#endif

}  // namespace meshsim

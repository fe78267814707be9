#include "gpu_validate/gloo_engine.h"

#define USE_C10D_GLOO 1
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <stdexcept>

#include "core/error.h"

namespace meshsim {

namespace {

// Waits for a collective, naming it when the engine fails or times out.
void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what, const Ranks& ranks,
          std::chrono::milliseconds timeout) {
  auto fail = [&](const std::string& why) {
    std::string group;
    for (auto r : ranks) group += (group.empty() ? "" : ",") + std::to_string(r);
    return std::runtime_error(std::string("gloo ") + what + (group.empty() ? "" : " over ranks {" + group + "}") +
                              " failed: " + why);
  };
  try {
    work->wait(timeout);
  } catch (const c10::Error& e) {
    throw fail(first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw fail(first_line(e.what()));
  }
}

// Half-precision data: bfloat16, which the Gloo of Debian's libtorch refuses ("Invalid scalar
// type"), moved as its 16-bit patterns viewed as float16 (an all_gather moves bytes: bit for bit
// what a native one moves), and reduced in float32 then rounded back once (as code does where a backend lacks the
// dtype; a native reduction in the dtype rounds after every addition instead).
bool half(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf; }
at::Tensor as_bits(const at::Tensor& t) { return half(t) ? t.view(at::kHalf) : t; }  // Gloo moves float16

c10d::ReduceOp c10d_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;  // avg: the sum, divided below as the simulation does
  }
}

}  // namespace

struct GlooCommunicator::Impl {
  std::chrono::milliseconds timeout;
  c10::intrusive_ptr<c10d::Store> store;
  std::map<Ranks, c10::intrusive_ptr<c10d::ProcessGroupGloo>> groups;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> world;  // every rank: the closing barrier

  c10d::ProcessGroupGloo& group(const Ranks& ranks) {
    auto it = groups.find(ranks);
    if (it == groups.end()) throw std::logic_error("gloo: no process group for " + group_key(ranks));
    return *it->second;
  }
};

GlooCommunicator::GlooCommunicator(const Mesh& mesh, const GlooConfig& config)
    : RealCommunicator(config), impl_(std::make_unique<Impl>()) {
  const StoreConfig& sc = config.store;
  impl_->timeout = sc.timeout;
  // Meeting the store (a TCP client waits for rank 0's server) and each process group's
  // constructor wait for the other members: a wait like a collective's.
  note_progress("in the rendezvous");
  try {
    impl_->store = make_store(sc);
    std::string host = config.hostname;
    if (host.empty() && !sc.file.empty()) host = "127.0.0.1";  // one machine: loopback
    auto options = c10d::ProcessGroupGloo::Options::create(sc.timeout);
    options->devices.push_back(host.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                                            : c10d::ProcessGroupGloo::createDeviceForHostname(host));
    options->threads = 1;
    for (const auto& g : member_groups(mesh, sc.rank))
      impl_->groups[g.ranks] = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>(group_key(g.ranks), impl_->store), static_cast<int>(g.position),
          static_cast<int>(g.ranks.size()), options);
    if (sc.world > 1)
      impl_->world = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>("meshsim/world", impl_->store), static_cast<int>(sc.rank),
          static_cast<int>(sc.world), options);
  } catch (const c10::Error& e) {  // its what() carries a C++ backtrace
    throw std::runtime_error("gloo rendezvous failed: " + first_line(e.what_without_backtrace()));
  }
  note_progress("after the rendezvous");
}

GlooCommunicator::~GlooCommunicator() = default;

void GlooCommunicator::finish() {
  // No rank leaves (closing its connections) before every rank is done with its collectives.
  if (!impl_->world) return;
  note_progress("in the closing barrier");
  wait(impl_->world->barrier(), "closing barrier", {}, impl_->timeout);
  note_progress("after the closing barrier");
}

at::Tensor GlooCommunicator::real_all_gather(const Ranks& ranks, size_t k, const Locals& group, int64_t dim) {
  at::Tensor mine = padded_for_gather(group, k, dim);
  std::vector<at::Tensor> inputs{as_bits(mine)};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (size_t s = 0; s < group.size(); ++s) outputs[0].push_back(at::empty_like(inputs[0]));
  wait(impl_->group(ranks).allgather(outputs, inputs), "all_gather", ranks, impl_->timeout);
  if (half(mine))
    for (auto& o : outputs[0]) o = o.view(mine.scalar_type());
  return unpad_gathered(outputs[0], group, dim);
}

at::Tensor GlooCommunicator::real_all_reduce(const Ranks& ranks, size_t k, const at::Tensor& mine, ReduceOp op) {
  std::vector<at::Tensor> buffer{half(mine) ? mine.detach().to(at::kFloat).contiguous() : mine.detach().clone().contiguous()};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d_op(op);
  wait(impl_->group(ranks).allreduce(buffer, options), "all_reduce", ranks, impl_->timeout);
  if (op == ReduceOp::Avg) buffer[0].div_(static_cast<double>(ranks.size()));
  return half(mine) ? buffer[0].to(mine.scalar_type()) : buffer[0];
}

at::Tensor GlooCommunicator::real_all_to_all(const Ranks& ranks, size_t k, const Locals& group, int64_t split_dim,
                                             int64_t concat_dim) {
  // Gloo's alltoall_base moves runs of elements along dim 0: the pieces go out flattened, one run
  // per destination, and come back as one run per source, reshaped to the source's piece.
  const auto n = static_cast<int64_t>(ranks.size());
  std::vector<at::Tensor> send;
  std::vector<int64_t> send_sizes, recv_sizes;
  std::vector<std::vector<int64_t>> recv_shapes;
  for (int64_t d = 0; d < n; ++d) {
    // A copy: chunk_piece may give a view made outside the dispatcher (collectives.cpp), which
    // is not to be viewed again.
    at::Tensor piece = chunk_piece(group[k].detach(), split_dim, n, d).clone(at::MemoryFormat::Contiguous).reshape({-1});
    send_sizes.push_back(piece.numel());
    send.push_back(piece);
  }
  int64_t total = 0;
  for (int64_t s = 0; s < n; ++s) {
    at::Tensor theirs = chunk_piece(group[s], split_dim, n, static_cast<int64_t>(k));
    recv_shapes.push_back(theirs.sizes().vec());
    recv_sizes.push_back(theirs.numel());
    total += theirs.numel();
  }
  at::Tensor in = at::cat(send), out = at::empty({total}, in.options());
  // c10d takes the split sizes by reference and moves them into its work: it gets copies.
  std::vector<int64_t> out_splits = recv_sizes, in_splits = send_sizes;
  wait(impl_->group(ranks).alltoall_base(out, in, out_splits, in_splits), "all_to_all", ranks, impl_->timeout);
  std::vector<at::Tensor> pieces;
  int64_t offset = 0;
  for (int64_t s = 0; s < n; ++s) {
    pieces.push_back(out.narrow(0, offset, recv_sizes[s]).reshape(recv_shapes[s]));
    offset += recv_sizes[s];
  }
  return at::cat(pieces, concat_dim);
}

at::Tensor GlooCommunicator::real_all_to_all_split(const Ranks& ranks, size_t k, const Locals& group,
                                                   const SplitTable& sends) {
  // Gloo's alltoall_base takes split sizes in rows of dim 0 (alltoallv): this rank's rows to each
  // member, and the rows each member sends it.
  const size_t n = ranks.size();
  std::vector<int64_t> in_splits = sends[k], out_splits;
  int64_t rows = 0;
  for (size_t s = 0; s < n; ++s) {
    out_splits.push_back(sends[s][k]);
    rows += sends[s][k];
  }
  at::Tensor in = group[k].detach().contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] = rows;
  at::Tensor out = at::empty(shape, in.options().requires_grad(false));
  wait(impl_->group(ranks).alltoall_base(out, in, out_splits, in_splits), "all_to_all", ranks, impl_->timeout);
  return out;
}

}  // namespace meshsim

// Collectives: the simulated all_gather, reduce_scatter, all_reduce and all_to_all of
// sim/collectives.h over one group, against a plain memcpy of the same bytes (every byte of every
// member's local, n * local bytes, copied once): `ratio` into a buffer allocated beforehand,
// `ratio_alloc_memcpy` into a buffer allocated for the copy, as a collective's result must be.
//
// Arguments: group size n, float64 elements per rank (a [rows, 64] local, rows divisible by n).
#include <cstring>
#include <vector>

#include "bench/bench_common.h"
#include "sim/collectives.h"

namespace meshsim::bench {
namespace {

enum class Coll { AllGather, AllReduce, ReduceScatter, AllToAll };

Locals make_group(int64_t n, int64_t elems) {
  Locals g;
  const int64_t cols = 64, rows = elems / cols;
  for (int64_t r = 0; r < n; ++r)
    g.push_back(at::arange(rows * cols, at::kDouble).reshape({rows, cols}).add_(static_cast<double>(r)));
  return g;
}

void BM_Collective(benchmark::State& state, Coll which) {
  const int64_t n = state.range(0), elems = state.range(1);
  const Locals group = make_group(n, elems);
  const size_t bytes = static_cast<size_t>(n * elems) * sizeof(double);
  // The memcpy baseline: the group's bytes laid end to end, copied into a warm buffer (both
  // 64-byte aligned, as libtorch allocates).
  at::Tensor src = at::ones({static_cast<int64_t>(bytes)}, at::kByte), dst = at::zeros_like(src);
  auto baseline = [&] {
    std::memcpy(dst.data_ptr(), src.data_ptr(), bytes);
    benchmark::DoNotOptimize(dst.data_ptr());
    benchmark::ClobberMemory();
  };
  // The same copy into a buffer allocated for it (what any implementation that returns new
  // tensors pays at least: above glibc's mmap threshold, fresh pages and their faults).
  auto fresh = [&] {
    at::Tensor out = at::empty({static_cast<int64_t>(bytes)}, at::kByte);
    std::memcpy(out.data_ptr(), src.data_ptr(), bytes);
    benchmark::DoNotOptimize(out.data_ptr());
    benchmark::ClobberMemory();
  };
  auto subject = [&] {
    Locals out;
    switch (which) {
      case Coll::AllGather: out = all_gather(group, 0); break;
      case Coll::AllReduce: out = all_reduce(group, ReduceOp::Sum); break;
      case Coll::ReduceScatter: out = reduce_scatter(group, ReduceOp::Sum, 0); break;
      case Coll::AllToAll: out = all_to_all(group, 0, 1); break;
    }
    benchmark::DoNotOptimize(out[0].data_ptr());
  };
  paired(state, baseline, subject, {{"alloc_memcpy", fresh}});
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t elems : {1 << 10, 1 << 15, 1 << 19}) b->Args({8, elems});  // 8 KiB, 256 KiB, 4 MiB per rank
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(BM_Collective, all_gather, Coll::AllGather)->Apply(sizes);
BENCHMARK_CAPTURE(BM_Collective, reduce_scatter, Coll::ReduceScatter)->Apply(sizes);
BENCHMARK_CAPTURE(BM_Collective, all_reduce, Coll::AllReduce)->Apply(sizes);
BENCHMARK_CAPTURE(BM_Collective, all_to_all, Coll::AllToAll)->Apply(sizes);

}  // namespace
}  // namespace meshsim::bench

MESHSIM_BENCH_MAIN()

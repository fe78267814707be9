// Scaling: the cost of a collective against the number of ranks (1 to 4096) and the bytes per
// rank. Every figure is also reported per rank and byte (ns_per_rank_kib: the time over ranks x
// KiB per rank), which stays flat when the cost grows linearly in ranks x bytes; a hidden
// quadratic term (copying or hashing a shared replicated result once per rank) shows as a column
// that grows with the rank count.
//
//   BM_ApplyStep/<kind>/<ranks>/<elems>   sim/collectives.h apply_step over a 1-D mesh
//   BM_Redistribute/<kind>/<ranks>/<elems> Runtime::redistribute: the step plus its events
//                                          (local shapes and a hash of every rank's local)
//   BM_FsdpMlp/<side>                      run_distributed of a 2-layer MLP, hybrid-sharded
//                                          (HSDP) on a side x side mesh, forward and backward
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "core/scenario.h"
#include "sim/collectives.h"
#include "sim/interpreter.h"
#include "sim/runtime.h"

namespace meshsim::bench {
namespace {

enum class Coll { AllGather, AllReduce, ReduceScatter, AllToAll };

// Per rank a [rows, cols] float64 local with cols = max(ranks, 64) (so dim 1 splits evenly over
// the group) and rows * cols = elems (at least one row).
struct LocalShape {
  int64_t rows, cols;
};
LocalShape local_shape(int64_t n, int64_t elems) {
  const int64_t cols = std::max<int64_t>(n, 64);
  return {std::max<int64_t>(1, elems / cols), cols};
}

Locals make_locals(int64_t n, LocalShape s) {
  Locals out;
  at::Tensor base = at::arange(s.rows * s.cols, at::kDouble).reshape({s.rows, s.cols});
  for (int64_t r = 0; r < n; ++r) out.push_back(base + static_cast<double>(r));
  return out;
}

void set_rate(benchmark::State& state, int64_t n, LocalShape s, double seconds) {
  const double kib = static_cast<double>(s.rows * s.cols * 8) / 1024.0;
  state.counters["ranks"] = static_cast<double>(n);
  state.counters["kib_per_rank"] = kib;
  state.counters["ns_per_rank_kib"] = seconds * 1e9 / (static_cast<double>(n) * kib);
}

RedistStep step_of(Coll which) {
  RedistStep s;
  s.axis = 0;
  switch (which) {
    case Coll::AllGather:
      s.kind = StepKind::AllGather, s.dim = 0, s.from = Placement::shard(0), s.to = Placement::replicate();
      break;
    case Coll::AllReduce:
      s.kind = StepKind::AllReduce, s.from = Placement::partial(ReduceOp::Sum), s.to = Placement::replicate();
      break;
    case Coll::ReduceScatter:
      s.kind = StepKind::ReduceScatter, s.dim = 1, s.from = Placement::partial(ReduceOp::Sum),
      s.to = Placement::shard(1);
      break;
    case Coll::AllToAll:
      s.kind = StepKind::AllToAll, s.split_dim = 1, s.concat_dim = 0, s.from = Placement::shard(0),
      s.to = Placement::shard(1);
      break;
  }
  return s;
}

void BM_ApplyStep(benchmark::State& state, Coll which) {
  const int64_t n = state.range(0);
  const LocalShape s = local_shape(n, state.range(1));
  const Mesh mesh({"dp"}, {n});
  const Locals locals = make_locals(n, s);
  const RedistStep step = step_of(which);
  std::vector<double> t;
  for (auto _ : state) {
    t.push_back(time_once([&] {
      benchmark::DoNotOptimize(step_bytes(mesh, step, locals));
      Locals out = apply_step(mesh, step, locals);
      benchmark::DoNotOptimize(out.back().data_ptr());
    }));
    state.SetIterationTime(t.back());
  }
  set_rate(state, n, s, median(t));
}

void BM_Redistribute(benchmark::State& state, Coll which) {
  const int64_t n = state.range(0);
  const LocalShape s = local_shape(n, state.range(1));
  const Mesh mesh({"dp"}, {n});
  const RedistStep step = step_of(which);
  DTensor x{"x", {}, {step.from}, make_locals(n, s)};
  x.shape = step.from.is_shard() ? Shape{n * s.rows, s.cols} : Shape{s.rows, s.cols};
  std::vector<double> t;
  for (auto _ : state) {
    Runtime rt(mesh, RunOptions{});
    t.push_back(time_once([&] {
      DTensor y = rt.redistribute(x, {step.to}, "y");
      benchmark::DoNotOptimize(y.locals.back().data_ptr());
    }));
    state.SetIterationTime(t.back());
  }
  set_rate(state, n, s, median(t));
}

// HSDP: x [2 * ranks, 64] sharded over both axes (2 rows per rank); w1, w2 [64, 64] replicated
// over dp and sharded over fsdp, gathered as Rd for the matmuls; their P(sum) gradients
// reduce_scatter over fsdp and all_reduce over dp. examples/scale/fsdp_4096.json is side 64.
nlohmann::json hsdp_scenario(int64_t side) {
  using nlohmann::json;
  const int64_t ranks = side * side;
  auto w = [](const std::string& name) {
    return json{{"name", name}, {"shape", {64, 64}}, {"placements", {"R", "S(0)"}}, {"requires_grad", true}};
  };
  return json{{"format", "meshsim.scenario/1"},
              {"name", "hsdp_mlp"},
              {"mesh", {{"axes", {"dp", "fsdp"}}, {"shape", {side, side}}}},
              {"inputs", {json{{"name", "x"}, {"shape", {2 * ranks, 64}}, {"placements", {"S(0)", "S(0)"}}}, w("w1"), w("w2")}},
              {"program",
               {{{"out", "w1f"}, {"op", "redistribute"}, {"args", {"w1"}}, {"placements", {"Rd", "Rd"}}},
                {{"out", "h"}, {"op", "mm"}, {"args", {"x", "w1f"}}},
                {{"out", "w2f"}, {"op", "redistribute"}, {"args", {"w2"}}, {"placements", {"Rd", "Rd"}}},
                {{"out", "y"}, {"op", "mm"}, {"args", {"h", "w2f"}}},
                {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}}},
              {"backward", "loss"}};
}

void BM_FsdpMlp(benchmark::State& state) {
  const int64_t side = state.range(0);
  const Scenario sc = parse_scenario(hsdp_scenario(side), "<bench>");
  std::vector<double> t;
  for (auto _ : state) {
    t.push_back(time_once([&] {
      SimRun run = run_distributed(sc, sc.options);
      benchmark::DoNotOptimize(run.grads.at("w1")[0].data_ptr());
    }));
    state.SetIterationTime(t.back());
  }
  state.counters["ranks"] = static_cast<double>(side * side);
  state.counters["us_per_rank"] = median(t) * 1e6 / static_cast<double>(side * side);
}

void ranks_and_sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {1, 4, 16, 64, 256, 1024, 4096}) b->Args({n, 4096});     // 32 KiB per rank
  for (int64_t e : {512, 32768, 262144}) b->Args({64, e});                   // 4 KiB .. 2 MiB per rank
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(BM_ApplyStep, all_gather, Coll::AllGather)->Apply(ranks_and_sizes);
BENCHMARK_CAPTURE(BM_ApplyStep, reduce_scatter, Coll::ReduceScatter)->Apply(ranks_and_sizes);
BENCHMARK_CAPTURE(BM_ApplyStep, all_reduce, Coll::AllReduce)->Apply(ranks_and_sizes);
BENCHMARK_CAPTURE(BM_ApplyStep, all_to_all, Coll::AllToAll)->Apply(ranks_and_sizes);
BENCHMARK_CAPTURE(BM_Redistribute, all_gather, Coll::AllGather)->Apply(ranks_and_sizes);
BENCHMARK_CAPTURE(BM_Redistribute, reduce_scatter, Coll::ReduceScatter)->Apply(ranks_and_sizes);
BENCHMARK_CAPTURE(BM_Redistribute, all_reduce, Coll::AllReduce)->Apply(ranks_and_sizes);
BENCHMARK_CAPTURE(BM_Redistribute, all_to_all, Coll::AllToAll)->Apply(ranks_and_sizes);
BENCHMARK(BM_FsdpMlp)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Arg(32)->Arg(64)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace meshsim::bench

MESHSIM_BENCH_MAIN()

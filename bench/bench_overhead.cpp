// Overhead: a 2-layer MLP forward and backward on 8 data-parallel ranks through meshsim's scenario
// interpreter (run_distributed: inputs from the seed, the DTensor runtime, events and hashes, the
// backward with its gradient placement hooks; not the oracle), against the same per-rank libtorch
// ops called directly in a loop with plain libtorch autograd per rank.
//
//   x [8n, n] S(0) on dp=8 (each rank holds n x n), w1, w2 [n, n] Rd or R, requires_grad
//   h = mm(x, w1); y = mm(h, w2); loss = sum(y); backward from loss
//
// With R weights meshsim all_reduces their P(sum) gradients; the baseline then adds the 8
// per-rank gradients too (the arithmetic of that all_reduce), so both do the same math.
#include <string>
#include <vector>

#include <torch/csrc/autograd/autograd.h>

#include "bench/bench_common.h"
#include "core/scenario.h"
#include "sim/interpreter.h"

namespace meshsim::bench {
namespace {

constexpr int64_t kRanks = 8;

nlohmann::json mlp_scenario(int64_t n, const std::string& wp) {
  using nlohmann::json;
  auto input = [](const std::string& name, json shape, const std::string& p, bool grad) {
    return json{{"name", name}, {"shape", shape}, {"placements", {p}}, {"requires_grad", grad}};
  };
  return json{{"format", "meshsim.scenario/1"},
              {"name", "mlp_overhead"},
              {"mesh", {{"axes", {"dp"}}, {"shape", {kRanks}}}},
              {"inputs",
               {input("x", {kRanks * n, n}, "S(0)", false), input("w1", {n, n}, wp, true),
                input("w2", {n, n}, wp, true)}},
              {"program",
               {{{"out", "h"}, {"op", "mm"}, {"args", {"x", "w1"}}},
                {{"out", "y"}, {"op", "mm"}, {"args", {"h", "w2"}}},
                {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}}},
              {"backward", "loss"}};
}

void BM_MlpOverhead(benchmark::State& state, const std::string& wp) {
  const int64_t n = state.range(0);
  const Scenario sc = parse_scenario(mlp_scenario(n, wp), "<bench>");
  const RunOptions options = sc.options;
  // The baseline's inputs: the same locals meshsim makes (made once, outside the timing).
  std::map<std::string, at::Tensor> globals;
  const std::vector<DTensor> inputs = make_inputs(sc, options, globals);
  std::vector<at::Tensor> x, w1, w2;
  for (int64_t r = 0; r < kRanks; ++r) {
    x.push_back(inputs[0].locals[r].detach());
    w1.push_back(inputs[1].locals[r].detach());
    w2.push_back(inputs[2].locals[r].detach());
  }
  const bool all_reduce = wp == "R";

  auto baseline = [&] {
    std::vector<at::Tensor> g1(kRanks), g2(kRanks);
    for (int64_t r = 0; r < kRanks; ++r) {
      at::Tensor a = w1[r].detach().requires_grad_(true), b = w2[r].detach().requires_grad_(true);
      at::Tensor loss = at::mm(at::mm(x[r], a), b).sum();
      auto g = torch::autograd::grad({loss}, {a, b});
      g1[r] = g[0];
      g2[r] = g[1];
    }
    if (all_reduce) {
      for (auto* g : {&g1, &g2}) {
        at::Tensor acc = (*g)[0].clone();
        for (int64_t r = 1; r < kRanks; ++r) acc.add_((*g)[r]);
        benchmark::DoNotOptimize(acc.data_ptr());
      }
    }
    benchmark::DoNotOptimize(g1[0].data_ptr());
  };
  auto subject = [&] {
    SimRun run = run_distributed(sc, options);
    benchmark::DoNotOptimize(run.grads.at("w1")[0].data_ptr());
  };
  paired(state, baseline, subject);

  // Where meshsim's time goes, part 1: making the inputs from the seed (in the subject above).
  std::vector<double> ti;
  for (int k = 0; k < 5; ++k)
    ti.push_back(time_once([&] {
      std::map<std::string, at::Tensor> g;
      benchmark::DoNotOptimize(make_inputs(sc, options, g).size());
    }));
  state.counters["inputs_us"] = median(ti) * 1e6;
}

BENCHMARK_CAPTURE(BM_MlpOverhead, Rd, std::string("Rd"))->Arg(64)->Arg(512)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpOverhead, R, std::string("R"))->Arg(64)->Arg(512)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace meshsim::bench

MESHSIM_BENCH_MAIN()

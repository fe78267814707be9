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
//
// Attention: multi-head attention with the 8 heads sharded over tp=8 (examples/
// attention_heads_sharded.json without the bias and the final all_reduce), x [2, s, d] R,
// wq/wk/wv [d, d] S(0), wo [d, d] S(1): q, k, v = linear(x, w); view to heads, permute; scores
// = q @ k^T / 2; softmax; @ v; permute back, reshape, linear(ctx, wo): P(sum); loss = sum.
// Backward: meshsim all_reduces x's three gradient contributions (one hook each); the baseline
// adds the 8 ranks' gradients of x once per contribution too.
//
// Transformer layer: one pre-norm layer on tp=8 (examples/transformer_block_tp.json with 8 heads,
// one per rank): rms_norm, the normed input gathered as Rd (Megatron's f: identity forward, one
// all_reduce of its gradient backward), attention with a causal mask made by creation ops (ones
// bool, triu 1, masked_fill -inf), row-parallel output all_reduced (R), residual; rms_norm, Rd,
// column-parallel w1, gelu, row-parallel w2 all_reduced, residual; loss = sum. The baseline is one
// plain autograd graph over the 8 ranks' locals: each all_reduce is the sum of the 8 ranks' partial
// outputs, and autograd's accumulation of the gradient of the sum's consumers and of the normed
// input over 8 ranks does the arithmetic of meshsim's backward all_reduces.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <torch/csrc/autograd/autograd.h>

#include "bench/bench_common.h"
#include "core/scenario.h"
#include "sim/interpreter.h"

namespace meshsim::bench {
namespace {

constexpr int64_t kRanks = 8;

// One op of a scenario's program: {out, op, args, ...extra}.
nlohmann::json op(const std::string& out, const std::string& name, nlohmann::json args,
                  nlohmann::json extra = nlohmann::json::object()) {
  extra["out"] = out;
  extra["op"] = name;
  extra["args"] = std::move(args);
  return extra;
}

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

// meshsim's run of `sc` paired with `baseline` (the same per-rank libtorch ops run directly); with
// `inputs_too`, the counter inputs_us: the part of meshsim's time spent making the inputs from the
// seed (inside the subject).
void paired_with_meshsim(benchmark::State& state, const Scenario& sc, const RunOptions& options,
                         const std::function<void()>& baseline, const std::string& grad_of, bool inputs_too) {
  auto subject = [&] {
    SimRun run = run_distributed(sc, options);
    benchmark::DoNotOptimize(run.grads.at(grad_of)[0].data_ptr());
  };
  paired(state, baseline, subject);
  if (!inputs_too) return;
  std::vector<double> ti;
  for (int k = 0; k < 5; ++k)
    ti.push_back(time_once([&] {
      std::map<std::string, at::Tensor> g;
      benchmark::DoNotOptimize(make_inputs(sc, options, g).size());
    }));
  state.counters["inputs_us"] = median(ti) * 1e6;
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
  paired_with_meshsim(state, sc, options, baseline, "w1", /*inputs_too=*/true);
}

nlohmann::json attention_scenario(int64_t s, int64_t d) {
  using nlohmann::json;
  auto input = [](const std::string& name, json shape, const std::string& p) {
    return json{{"name", name}, {"shape", shape}, {"placements", {p}}, {"requires_grad", true}};
  };
  const int64_t hd = d / kRanks;
  return json{{"format", "meshsim.scenario/1"},
              {"name", "attention_overhead"},
              {"mesh", {{"axes", {"tp"}}, {"shape", {kRanks}}}},
              {"inputs",
               {input("x", {2, s, d}, "R"), input("wq", {d, d}, "S(0)"), input("wk", {d, d}, "S(0)"),
                input("wv", {d, d}, "S(0)"), input("wo", {d, d}, "S(1)")}},
              {"program",
               {op("q", "linear", {"x", "wq"}), op("k", "linear", {"x", "wk"}), op("v", "linear", {"x", "wv"}),
                op("q4", "view", {"q"}, {{"shape", {2, s, kRanks, hd}}}),
                op("k4", "view", {"k"}, {{"shape", {2, s, kRanks, hd}}}),
                op("v4", "view", {"v"}, {{"shape", {2, s, kRanks, hd}}}),
                op("qh", "permute", {"q4"}, {{"dims", {0, 2, 1, 3}}}), op("kt", "permute", {"k4"}, {{"dims", {0, 2, 3, 1}}}),
                op("vh", "permute", {"v4"}, {{"dims", {0, 2, 1, 3}}}), op("scores", "matmul", {"qh", "kt"}),
                op("scaled", "mul", {"scores"}, {{"value", 0.5}}), op("probs", "softmax", {"scaled"}, {{"dim", -1}}),
                op("ctx", "matmul", {"probs", "vh"}), op("ctx_t", "permute", {"ctx"}, {{"dims", {0, 2, 1, 3}}}),
                op("merged", "reshape", {"ctx_t"}, {{"shape", {2, s, -1}}}), op("y", "linear", {"merged", "wo"}),
                op("loss", "sum", {"y"})}},
              {"backward", "loss"}};
}

void BM_AttentionOverhead(benchmark::State& state) {
  const int64_t d = state.range(0), s = 15, hd = d / kRanks;  // an uneven sequence length
  const Scenario sc = parse_scenario(attention_scenario(s, d), "<bench>");
  const RunOptions options = sc.options;
  std::map<std::string, at::Tensor> globals;
  const std::vector<DTensor> inputs = make_inputs(sc, options, globals);
  auto local = [&](size_t i, int64_t r) { return inputs[i].locals[r].detach(); };
  auto baseline = [&] {
    std::vector<at::Tensor> gx(kRanks * 3);
    std::vector<at::Tensor> gw;
    for (int64_t r = 0; r < kRanks; ++r) {
      std::vector<at::Tensor> leaves;
      for (size_t i = 0; i < 5; ++i) leaves.push_back(local(i, r).requires_grad_(true));
      // x enters each projection as its own leaf, as meshsim moves each contribution by itself.
      std::vector<at::Tensor> xs = {local(0, r).requires_grad_(true), local(0, r).requires_grad_(true),
                                    local(0, r).requires_grad_(true)};
      auto heads = [&](size_t i, std::vector<int64_t> dims) {
        return at::matmul(xs[i - 1], leaves[i].t()).view({2, s, 1, hd}).permute(dims).contiguous();
      };
      const at::Tensor q = heads(1, {0, 2, 1, 3}), k = heads(2, {0, 2, 3, 1}), v = heads(3, {0, 2, 1, 3});
      const at::Tensor p = at::softmax(at::matmul(q, k) * 0.5, -1);
      const at::Tensor ctx = at::matmul(p, v).permute({0, 2, 1, 3}).contiguous().reshape({2, s, hd});
      const at::Tensor loss = at::matmul(ctx, leaves[4].t()).sum();
      auto g = torch::autograd::grad({loss}, {xs[0], xs[1], xs[2], leaves[1], leaves[2], leaves[3], leaves[4]});
      for (size_t c = 0; c < 3; ++c) gx[static_cast<size_t>(r) * 3 + c] = g[c];
      gw.push_back(g[3]);
    }
    for (size_t c = 0; c < 3; ++c) {  // the all_reduce of each contribution to x's gradient
      at::Tensor acc = gx[c].clone();
      for (int64_t r = 1; r < kRanks; ++r) acc.add_(gx[static_cast<size_t>(r) * 3 + c]);
      benchmark::DoNotOptimize(acc.data_ptr());
    }
    benchmark::DoNotOptimize(gw[0].data_ptr());
  };
  paired_with_meshsim(state, sc, options, baseline, "wq", /*inputs_too=*/false);
}

nlohmann::json transformer_layer_scenario(int64_t s, int64_t d) {
  using nlohmann::json;
  // Inputs: small integers (the default init, as the other overhead benchmarks), norm weights ones.
  auto input = [](const std::string& name, json shape, const std::string& p, const char* init = "int") {
    return json{{"name", name}, {"shape", shape}, {"placements", {p}}, {"requires_grad", true}, {"init", init}};
  };
  const int64_t hd = d / kRanks, f = 4 * d;
  return json{{"format", "meshsim.scenario/1"},
              {"name", "transformer_layer_overhead"},
              {"mesh", {{"axes", {"tp"}}, {"shape", {kRanks}}}},
              {"inputs",
               {input("x", {2, s, d}, "R"), input("norm1", {d}, "R", "ones"), input("wq", {d, d}, "S(0)"),
                input("wk", {d, d}, "S(0)"), input("wv", {d, d}, "S(0)"), input("wo", {d, d}, "S(1)"),
                input("norm2", {d}, "R", "ones"), input("w1", {f, d}, "S(0)"), input("w2", {d, f}, "S(1)")}},
              {"program",
               {op("ones_tt", "ones", json::array(), {{"shape", {s, s}}, {"placements", {"R"}}, {"dtype", "bool"}}),
                op("causal", "triu", {"ones_tt"}, {{"diagonal", 1}}),
                op("n1", "rms_norm", {"x", "norm1"}, {{"normalized_shape", {d}}}),
                op("n1_rd", "redistribute", {"n1"}, {{"placements", {"Rd"}}}),
                op("q", "linear", {"n1_rd", "wq"}), op("k", "linear", {"n1_rd", "wk"}), op("v", "linear", {"n1_rd", "wv"}),
                op("q4", "view", {"q"}, {{"shape", {2, s, kRanks, hd}}}),
                op("k4", "view", {"k"}, {{"shape", {2, s, kRanks, hd}}}),
                op("v4", "view", {"v"}, {{"shape", {2, s, kRanks, hd}}}),
                op("qh", "permute", {"q4"}, {{"dims", {0, 2, 1, 3}}}), op("kt", "permute", {"k4"}, {{"dims", {0, 2, 3, 1}}}),
                op("vh", "permute", {"v4"}, {{"dims", {0, 2, 1, 3}}}), op("scores", "matmul", {"qh", "kt"}),
                op("scaled", "mul", {"scores"}, {{"value", 0.25}}),
                op("masked", "masked_fill", {"scaled", "causal"}, {{"value", "-inf"}}),
                op("probs", "softmax", {"masked"}, {{"dim", -1}}), op("ctx", "matmul", {"probs", "vh"}),
                op("ctx_t", "permute", {"ctx"}, {{"dims", {0, 2, 1, 3}}}),
                op("merged", "reshape", {"ctx_t"}, {{"shape", {2, s, -1}}}), op("attn", "linear", {"merged", "wo"}),
                op("attn_r", "redistribute", {"attn"}, {{"placements", {"R"}}}), op("h1", "add", {"x", "attn_r"}),
                op("n2", "rms_norm", {"h1", "norm2"}, {{"normalized_shape", {d}}}),
                op("n2_rd", "redistribute", {"n2"}, {{"placements", {"Rd"}}}), op("up", "linear", {"n2_rd", "w1"}),
                op("act", "gelu", {"up"}), op("down", "linear", {"act", "w2"}),
                op("mlp_r", "redistribute", {"down"}, {{"placements", {"R"}}}), op("h2", "add", {"h1", "mlp_r"}),
                op("loss", "sum", {"h2"})}},
              {"backward", "loss"}};
}

void BM_TransformerLayerOverhead(benchmark::State& state) {
  const int64_t d = state.range(0), s = 16, hd = d / kRanks;
  const Scenario sc = parse_scenario(transformer_layer_scenario(s, d), "<bench>");
  const RunOptions options = sc.options;
  std::map<std::string, at::Tensor> globals;
  const std::vector<DTensor> inputs = make_inputs(sc, options, globals);
  enum { X, Norm1, Wq, Wk, Wv, Wo, Norm2, W1, W2, Count };
  const double eps = std::numeric_limits<double>::epsilon();  // rms_norm's default, as meshsim's
  auto rms = [&](const at::Tensor& x, const at::Tensor& w) {
    return x * at::rsqrt(x.pow(2).mean({-1}, /*keepdim=*/true) + eps) * w;
  };
  auto baseline = [&] {
    const at::Tensor mask = at::ones({s, s}, at::kBool).triu(1);
    std::vector<std::vector<at::Tensor>> leaf(kRanks);
    std::vector<at::Tensor> all;
    for (int64_t r = 0; r < kRanks; ++r)
      for (size_t i = 0; i < Count; ++i) {
        leaf[r].push_back(inputs[i].locals[r].detach().requires_grad_(true));
        all.push_back(leaf[r].back());
      }
    std::vector<at::Tensor> h1(kRanks), n2(kRanks);
    at::Tensor attn, down;
    for (int64_t r = 0; r < kRanks; ++r) {  // attention, each rank its head
      const auto& l = leaf[r];
      const at::Tensor n1 = rms(l[X], l[Norm1]);
      auto heads = [&](size_t w, std::vector<int64_t> dims) {
        return at::matmul(n1, l[w].t()).view({2, s, 1, hd}).permute(dims);
      };
      const at::Tensor q = heads(Wq, {0, 2, 1, 3}), k = heads(Wk, {0, 2, 3, 1}), v = heads(Wv, {0, 2, 1, 3});
      const at::Tensor p = at::softmax((at::matmul(q, k) * 0.25).masked_fill(mask, -INFINITY), -1);
      const at::Tensor ctx = at::matmul(p, v).permute({0, 2, 1, 3}).reshape({2, s, hd});
      const at::Tensor part = at::matmul(ctx, l[Wo].t());
      attn = r == 0 ? part : attn + part;  // the forward all_reduce
    }
    for (int64_t r = 0; r < kRanks; ++r) {  // the MLP, each rank its column and row block
      const auto& l = leaf[r];
      h1[r] = l[X] + attn;
      const at::Tensor part = at::matmul(at::gelu(at::matmul(rms(h1[r], l[Norm2]), l[W1].t())), l[W2].t());
      down = r == 0 ? part : down + part;
    }
    at::Tensor loss;
    for (int64_t r = 0; r < kRanks; ++r) loss = r == 0 ? (h1[r] + down).sum() : loss + (h1[r] + down).sum();
    auto g = torch::autograd::grad({loss}, all);
    benchmark::DoNotOptimize(g[0].data_ptr());
  };
  paired_with_meshsim(state, sc, options, baseline, "wq", /*inputs_too=*/true);
}

BENCHMARK(BM_TransformerLayerOverhead)->Arg(128)->Arg(256)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionOverhead)->Arg(16)->Arg(64)->Arg(256)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpOverhead, Rd, std::string("Rd"))->Arg(8)->Arg(64)->Arg(512)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpOverhead, R, std::string("R"))->Arg(64)->Arg(512)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace meshsim::bench

MESHSIM_BENCH_MAIN()

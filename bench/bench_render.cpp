// Rendering a large trace (traces/render.h): the DOT text and its libgvc layout, timed apart.
//
// The trace is synthetic and built here, with no simulator: a 250-layer residual MLP with FSDP
// weights on a 4-rank mesh, 1000 forward ops (per layer: redistribute w -> wf with its all_gather
// step, mm, tanh, add), the backward (a gradient contribution per operand, a reduce_scatter per
// weight, an input gradient per weight): 3252 events.
//
//   cmake --build build --target meshsim_bench_render && build/bench/meshsim_bench_render
//
// The budget: a 1000-op trace renders in under 5 seconds (DOT + SVG layout). Its layout
// size is over kRenderMaxLayoutSize, so it is drawn collapsed, as are the 5,000- and 20,000-op
// traces of the same shape below (the budget of #16: a 20,000-op program to SVG in under 10 s;
// before collapsing, dot took minutes on 5,000 ops and crashed on 20,000).
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "traces/render.h"
#include "traces/trace.h"

namespace {

using meshsim::Event;
using meshsim::Trace;

constexpr int kRanks = 4;

struct Builder {
  Trace trace;

  void add(const std::string& phase, const std::string& kind, const std::string& name, const std::string& value,
           std::vector<std::string> args, std::vector<std::string> in_specs, const std::string& out_spec,
           std::vector<int64_t> local_shape, const std::string& axis = "", int64_t bytes = 0,
           const std::string& note = "") {
    Event e;
    e.seq = static_cast<int64_t>(trace.events.size());
    e.phase = phase;
    e.kind = kind;
    e.name = name;
    e.value = value;
    e.args = std::move(args);
    e.in_specs = std::move(in_specs);
    e.out_spec = out_spec;
    e.axis = axis;
    e.bytes = bytes;
    e.note = note;
    e.local_shapes.assign(kRanks, local_shape);
    e.hashes.assign(kRanks, "00000000000000" + std::to_string(e.seq % 100));
    trace.events.push_back(std::move(e));
  }
};

// `layers` layers of 4 ops each.
Trace mlp_trace(int layers) {
  Builder b;
  b.trace.version = "bench";
  b.trace.scenario = {{"format", "meshsim.scenario/1"},
                      {"name", "synthetic_mlp_" + std::to_string(4 * layers) + "_ops"},
                      {"mesh", {{"axes", {"dp"}}, {"shape", {kRanks}}}}};
  b.trace.options = {{"redistribute", "above_autograd"}, {"seed", 0}};
  auto n = [](const char* base, int i) { return base + std::to_string(i); };
  b.add("forward", "input", "x", "h0", {}, {}, "[S(0)]", {2, 16});
  for (int i = 0; i < layers; ++i) b.add("forward", "input", n("w", i), n("w", i), {}, {}, "[S(0)]", {4, 16});
  for (int i = 0; i < layers; ++i) {
    b.add("forward", "collective", "all_gather", n("wf", i), {}, {"[S(0)]"}, "[Rd]", {16, 16}, "dp", 1024);
    b.add("forward", "op", "redistribute", n("wf", i), {n("w", i)}, {"[S(0)]"}, "[Rd]", {16, 16});
    b.add("forward", "op", "mm", n("m", i), {n("h", i), n("wf", i)}, {"[S(0)]", "[Rd]"}, "[S(0)]", {2, 16}, "", 0,
          "mm: S(0), R -> S(0)");
    b.add("forward", "op", "tanh", n("t", i), {n("m", i)}, {"[S(0)]"}, "[S(0)]", {2, 16}, "", 0,
          "tanh: S(0) -> S(0)");
    b.add("forward", "op", "add", n("h", i + 1), {n("h", i), n("t", i)}, {"[S(0)]", "[S(0)]"}, "[S(0)]", {2, 16},
          "", 0, "add: S(0), S(0) -> S(0)");
  }
  b.add("backward", "seed", "ones", n("h", layers), {}, {}, "[Rd]", {2, 16});
  for (int i = layers - 1; i >= 0; --i) {
    b.add("backward", "grad", "add", n("t", i), {n("h", i + 1)}, {"[S(0)]"}, "[S(0)]", {2, 16});
    b.add("backward", "grad", "add", n("h", i), {n("h", i + 1)}, {"[S(0)]"}, "[S(0)]", {2, 16});
    b.add("backward", "grad", "tanh", n("m", i), {n("t", i)}, {"[S(0)]"}, "[S(0)]", {2, 16});
    b.add("backward", "grad", "mm", n("h", i), {n("m", i)}, {"[S(0)]"}, "[S(0)]", {2, 16});
    b.add("backward", "grad", "mm", n("wf", i), {n("m", i)}, {"[S(0)]"}, "[P(sum)]", {16, 16});
    b.add("backward", "collective", "reduce_scatter", n("wf", i), {n("w", i)}, {"[P(sum)]"}, "[S(0)]", {4, 16},
          "dp", 1024, "backward of redistribute [S(0)] -> [Rd]");
  }
  for (int i = 0; i < layers; ++i)
    b.add("backward", "input_grad", "", n("w", i), {}, {}, "[S(0)]", {4, 16}, "", 0, "cotangent [S(0)]");
  b.trace.result = {{"format", "meshsim.result/1"}, {"status", "pass"}, {"error", nullptr}};
  return b.trace;
}

// The same trace on a 4096-rank mesh, 64 x 64 (the rank view collapses it to 4 ranks).
Trace wide_mesh_trace(int layers) {
  Trace t = mlp_trace(layers);
  t.scenario["mesh"] = {{"axes", {"dp", "tp"}}, {"shape", {64, 64}}};
  for (auto& e : t.events) {
    e.local_shapes.assign(4096, e.local_shapes.front());
    e.hashes.assign(4096, e.hashes.front());
  }
  return t;
}

size_t count_nodes(const std::string& dot) {
  size_t nodes = 0;
  for (auto at = dot.find(" [label="); at != std::string::npos; at = dot.find(" [label=", at + 1)) ++nodes;
  return nodes;
}

void set_counters(benchmark::State& state, const Trace& t, const std::string& dot) {
  int64_t ops = 0;
  for (const auto& e : t.events) ops += e.kind == "op";
  state.counters["ops"] = static_cast<double>(ops);
  state.counters["events"] = static_cast<double>(t.events.size());
  state.counters["dot_bytes"] = static_cast<double>(dot.size());
}

// DOT text of the logical view.
void BM_RenderDot_Logical_1000Ops(benchmark::State& state) {
  const Trace t = mlp_trace(250);
  std::string dot;
  for (auto _ : state) {
    dot = meshsim::render_dot(t);
    benchmark::DoNotOptimize(dot.data());
  }
  set_counters(state, t, dot);
}
BENCHMARK(BM_RenderDot_Logical_1000Ops)->Unit(benchmark::kMillisecond);

// libgvc's dot layout and SVG output of that DOT text (the DOT is made once, outside the timing).
void BM_LayoutSvg_Logical_1000Ops(benchmark::State& state) {
  const Trace t = mlp_trace(250);
  const std::string dot = meshsim::render_dot(t);
  for (auto _ : state) {
    std::string svg = meshsim::layout_dot(dot, "svg");
    benchmark::DoNotOptimize(svg.data());
  }
  set_counters(state, t, dot);
}
BENCHMARK(BM_LayoutSvg_Logical_1000Ops)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

// DOT text of the rank view, 4 ranks: every value on every rank.
void BM_RenderDot_Ranks_1000Ops(benchmark::State& state) {
  const Trace t = mlp_trace(250);
  std::string dot;
  for (auto _ : state) {
    dot = meshsim::render_dot(t, meshsim::RenderView::Ranks);
    benchmark::DoNotOptimize(dot.data());
  }
  set_counters(state, t, dot);
}
BENCHMARK(BM_RenderDot_Ranks_1000Ops)->Unit(benchmark::kMillisecond);

// DOT and SVG of `t` in `view`, laid out by Graphviz each iteration.
void render_svg(benchmark::State& state, const Trace& t, meshsim::RenderView view) {
  std::string dot;
  for (auto _ : state) {
    dot = meshsim::render_dot(t, view);
    std::string svg = meshsim::layout_dot(dot, "svg");
    benchmark::DoNotOptimize(svg.data());
  }
  set_counters(state, t, dot);
  state.counters["dot_nodes"] = static_cast<double>(count_nodes(dot));
}

// DOT and SVG of long programs, collapsed: each layer's ops fold into one node, "×N repetitions".
void BM_RenderSvg_Logical(benchmark::State& state) {
  render_svg(state, mlp_trace(static_cast<int>(state.range(0)) / 4), meshsim::RenderView::Logical);
}
BENCHMARK(BM_RenderSvg_Logical)->Arg(5000)->Arg(20000)->Unit(benchmark::kMillisecond)->UseRealTime();

// The rank view of the same programs, collapsed the same way.
void BM_RenderSvg_Ranks(benchmark::State& state) {
  render_svg(state, mlp_trace(static_cast<int>(state.range(0)) / 4), meshsim::RenderView::Ranks);
}
BENCHMARK(BM_RenderSvg_Ranks)->Arg(20000)->Unit(benchmark::kMillisecond)->UseRealTime();

// A 4096-rank trace, rank view: collapsed to 4 ranks, DOT and SVG.
void BM_RenderSvg_Ranks_4096Ranks(benchmark::State& state) {
  render_svg(state, wide_mesh_trace(5), meshsim::RenderView::Ranks);
}
BENCHMARK(BM_RenderSvg_Ranks_4096Ranks)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

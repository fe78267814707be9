// Peak memory of `meshsim run` on one large tensor, against the bytes the scenario holds
// (docs/performance.md, "Memory: one large tensor"). Each case runs the meshsim command as a child
// process and reads its peak resident set (wait4's ru_maxrss); the same program on a 1-element
// tensor gives the process's own baseline (libtorch loaded, nothing held), subtracted.
//
// held: the bytes of the scenario's values and input gradients, each once at its global size (a
// sharded value's locals together are its global tensor). ratio = (peak - baseline) / held; the
// goal is at most 4.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

enum class Program { Input, Forward, Backward };

// x of `numel` float64 elements over 4 ranks (S(0)); Input: nothing more; Forward: y = x * x,
// loss = sum(y); Backward: the same and the gradient of x.
json scenario(int64_t numel, Program p) {
  json sc = {{"format", "meshsim.scenario/1"},
             {"name", "one_large_tensor"},
             {"mesh", {{"axes", {"dp"}}, {"shape", {4}}}},
             {"inputs", {{{"name", "x"}, {"shape", {numel}}, {"placements", {"S(0)"}},
                          {"requires_grad", p == Program::Backward}}}},
             {"program", json::array()}};
  if (p != Program::Input) {
    sc["program"] = {{{"out", "y"}, {"op", "mul"}, {"args", {"x", "x"}}},
                     {{"out", "loss"}, {"op", "sum"}, {"args", {"y"}}}};
  }
  if (p == Program::Backward) sc["backward"] = "loss";
  return sc;
}

double held_bytes(int64_t numel, Program p) {
  const double tensor = 8.0 * static_cast<double>(numel);
  return p == Program::Input ? tensor : p == Program::Forward ? 2 * tensor : 3 * tensor;
}

// Peak resident bytes of `meshsim run FILE`; -1 when it did not exit 0.
double peak_of(const std::string& file) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::freopen("/dev/null", "w", stdout);
    ::execl(MESHSIM_BIN, MESHSIM_BIN, "run", file.c_str(), "--max-memory", "1T", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  rusage usage{};
  ::wait4(pid, &status, 0, &usage);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

std::string write_scenario(const json& sc, const std::string& name) {
  const fs::path path = fs::temp_directory_path() / ("meshsim_bench_memory_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path) << sc.dump();
  return path.string();
}

void BM_OneLargeTensor(benchmark::State& state) {
  const int64_t numel = state.range(0);
  const auto program = static_cast<Program>(state.range(1));
  const std::string big = write_scenario(scenario(numel, program), "big.json");
  const std::string tiny = write_scenario(scenario(1, program), "tiny.json");
  double peak = 0, baseline = 0;
  for (auto _ : state) {
    peak = peak_of(big);
    baseline = peak_of(tiny);
    if (peak < 0 || baseline < 0) {
      state.SkipWithError("meshsim run failed");
      break;
    }
  }
  fs::remove(big);
  fs::remove(tiny);
  const double held = held_bytes(numel, program);
  state.counters["held_MiB"] = held / (1 << 20);
  state.counters["peak_MiB"] = (peak - baseline) / (1 << 20);
  state.counters["baseline_MiB"] = baseline / (1 << 20);
  state.counters["ratio"] = (peak - baseline) / held;
}

// {elements, program}: 10^7 (80 MB) and the audit's 10^8 (800 MB).
BENCHMARK(BM_OneLargeTensor)
    ->ArgNames({"numel", "program"})
    ->ArgsProduct({{10000000, 100000000}, {0, 1, 2}})
    ->Iterations(1)
    ->Unit(benchmark::kSecond);

}  // namespace

BENCHMARK_MAIN();

#!/usr/bin/env bash
# Builds the benchmarks in Release and runs them all; docs/performance.md explains the figures.
#   scripts/bench.sh            every bench executable, then the 4096-rank FSDP run
#   scripts/bench.sh FILTER     only benchmarks whose name matches FILTER (a Google Benchmark regex)
# Writes out/bench/NAME.json (Google Benchmark's JSON, counters included) and out/bench/NAME.txt
# (the console table) per executable, and out/bench/fsdp_4096.txt (time and peak memory).
# MESHSIM_BENCH_BUILD_DIR (default build-bench) is the build directory; MESHSIM_BENCH_THREADS
# (default 1) libtorch's intra-op threads; MESHSIM_BENCH_JOBS (default 2) the build's jobs.
set -euo pipefail
cd "$(dirname "$0")/.."

filter=${1:-}
build=${MESHSIM_BENCH_BUILD_DIR:-build-bench}
out=out/bench
mkdir -p "$out"

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
targets=$(cmake --build "$build" --target help | sed -n 's/^\(meshsim_bench_[a-z_0-9]*\):.*/\1/p' | sort -u)
if [ -z "$targets" ]; then
  echo "no bench targets in $build" >&2
  exit 1
fi
# shellcheck disable=SC2086
cmake --build "$build" -j"${MESHSIM_BENCH_JOBS:-2}" --target $targets meshsim

export MESHSIM_BENCH_THREADS=${MESHSIM_BENCH_THREADS:-1}
echo "machine: $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "BLAS: $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo unknown)"
for t in $targets; do
  name=${t#meshsim_bench_}
  args=(--benchmark_out="$out/$name.json" --benchmark_out_format=json)
  [ -n "$filter" ] && args+=(--benchmark_filter="$filter")
  echo
  echo "== $t"
  "$build/bench/$t" "${args[@]}" 2>&1 | tee "$out/$name.txt"
done

# Collectives again with glibc's malloc keeping freed memory (no fresh, faulting pages per result):
# the page-fault share of the large sizes (docs/performance.md, "collectives").
if [ -z "$filter" ]; then
  echo
  echo "== meshsim_bench_collectives, MALLOC_MMAP_THRESHOLD_=4 GiB MALLOC_TRIM_THRESHOLD_=16 GiB"
  MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=17179869184 \
    "$build/bench/meshsim_bench_collectives" --benchmark_out="$out/collectives_malloc_kept.json" \
    --benchmark_out_format=json 2>&1 | tee "$out/collectives_malloc_kept.txt"
fi

# The 4096-rank FSDP step through the command line (oracle and checks included): wall time and
# peak resident memory.
if [ -z "$filter" ]; then
  echo
  echo "== meshsim run examples/scale/fsdp_4096.json"
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -v "$build/cli/meshsim" run examples/scale/fsdp_4096.json 2> "$out/fsdp_4096.time" | tee "$out/fsdp_4096.txt"
    grep -E "Elapsed|Maximum resident|User time|System time" "$out/fsdp_4096.time" | tee -a "$out/fsdp_4096.txt"
  else  # Debian's `time` package is not installed: wall time only
    { time "$build/cli/meshsim" run examples/scale/fsdp_4096.json; } 2>&1 | tee "$out/fsdp_4096.txt"
  fi
fi
echo
echo "results: $out/*.json"

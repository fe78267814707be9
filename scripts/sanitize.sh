#!/usr/bin/env bash
# The part of the test suite that CI runs under AddressSanitizer and UndefinedBehaviorSanitizer
# (docs/testing.md, "Hostile input: fuzzing and sanitizers"): every reader of files (scenarios,
# traces, the fuzz regression corpus), the simulator and the oracle on every bundled
# example, and the diagrams. Needs what scripts/setup.sh installs. Build directory: build-asan
# (MESHSIM_SANITIZE_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${MESHSIM_SANITIZE_BUILD_DIR:-build-asan}
tests=(test_scenario test_files test_traces test_examples)
fuzz=(fuzz_replay_scenario fuzz_replay_trace fuzz_replay_render)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMESHSIM_SANITIZE=ON -DMESHSIM_BUILD_BENCH=OFF \
  ${MESHSIM_WERROR:+-DMESHSIM_WERROR=ON} >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${tests[@]}" "${fuzz[@]}"
# Leaks count; libtorch's own start-up allocations are suppressed by name (fuzz/lsan.supp).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
labels=$(IFS='|'; echo "${tests[*]}|fuzz")
ctest --test-dir "$build" -L "$labels" --output-on-failure -j"$(nproc)"

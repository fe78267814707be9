#!/usr/bin/env bash
# Fuzz meshsim's input paths with libFuzzer (docs/testing.md, "Fuzzing"):
#   scripts/fuzz.sh SECONDS [scenario|trace|render]...   (default: all three, one after another)
# Builds the targets with clang, AddressSanitizer and UndefinedBehaviorSanitizer in build-fuzz/,
# seeds each from fuzz/regressions/TARGET and examples/, and runs it SECONDS. A crash, a hang
# (over 20 s on one input), a leak or an input over 4 GiB of memory stops the target; its input
# is copied into fuzz/regressions/TARGET, where ctest runs it from then on (fuzz_corpus_TARGET).
# Exit 0: no target found anything; 1: something was found (listed); 2: usage.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-}
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: scripts/fuzz.sh SECONDS [scenario|trace|render]..." >&2
  exit 2
fi
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(scenario trace render)
for t in "${targets[@]}"; do
  case "$t" in scenario | trace | render) ;; *) echo "scripts/fuzz.sh: unknown target \"$t\" (scenario, trace, render)" >&2; exit 2 ;; esac
done

# clang and its runtime (libFuzzer, the sanitizers) from Debian, besides what the build needs.
packages=(clang libclang-rt-14-dev)
. scripts/install_missing.sh
install_missing "${packages[@]}"

build=${MESHSIM_FUZZ_BUILD_DIR:-build-fuzz}
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMESHSIM_FUZZ=ON \
  -DBUILD_TESTING=OFF -DMESHSIM_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/#/fuzz_}"

# Leaks count, except inside Graphviz and its font libraries (fuzz/lsan.supp).
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp:print_suppressions=0}
found=()
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  crashes="$build/crashes/$t"
  mkdir -p "$corpus" "$crashes"
  seeds=(fuzz/regressions/"$t")
  case "$t" in
    scenario) seeds+=(examples) ;;
    render) seeds+=(fuzz/regressions/scenario examples) ;;
  esac
  echo "fuzz_$t: $seconds s (corpus $corpus)"
  rc=0
  # New inputs go to the first directory (the working corpus); the seeds are only read.
  "$build/fuzz/fuzz_$t" "$corpus" "${seeds[@]}" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 \
    -max_len=262144 -dict=fuzz/json.dict -artifact_prefix="$crashes/" -print_final_stats=1 \
    >"$build/fuzz_$t.log" 2>&1 || rc=$?
  grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)' "$build/fuzz_$t.log" | sed 's/^/  /' || true
  if [ "$rc" -ne 0 ]; then
    for f in "$crashes"/*; do
      [ -e "$f" ] || continue
      cp "$f" "fuzz/regressions/$t/"
      found+=("$t: $(basename "$f") (now fuzz/regressions/$t/$(basename "$f"); log $build/fuzz_$t.log)")
    done
    [ ${#found[@]} -gt 0 ] || found+=("$t: libFuzzer exited $rc without an input (log $build/fuzz_$t.log)")
  fi
done
if ((${#found[@]})); then
  echo "found:"
  printf '  %s\n' "${found[@]}"
  exit 1
fi
echo "no crash, hang or leak in ${targets[*]} ($seconds s each)"

#!/usr/bin/env bash
# Start-up of the command (docs/performance.md, "Start-up"): each command line ROUNDS times (5),
# alternated, through `meshsim` (the front, no libtorch) and `meshsim-torch` (the full command);
# CPU time (user + system) and wall time, the median and the minimum. BUILD: the build directory.
#   scripts/startup_times.sh [BUILD] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-5}
front=$build/cli/meshsim
full=$build/cli/meshsim-torch
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$full" run examples/tp_rowwise_partial.json --trace "$work/trace.json" >/dev/null
names=() lines=()
add() { names+=("$1"); lines+=("$2"); }
for side in front full; do
  bin=${!side}
  add "$side --version" "$bin --version"
  add "$side --help" "$bin --help"
  add "$side ops --json" "$bin ops --json"
  add "$side render TRACE" "$bin render $work/trace.json -o $work/d.svg"
  add "$side run dp_reduced" "$bin run examples/dp_reduced.json"
done
for ((r = 0; r < rounds; r++)); do
  for i in "${!lines[@]}"; do
    /usr/bin/time -f "%U %S %e" -a -o "$work/t$i" ${lines[$i]} >/dev/null 2>&1 || true
  done
done
for i in "${!lines[@]}"; do
  python3 - "$work/t$i" "${names[$i]}" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l[:1].isdigit()]
cpu = sorted(r[0] + r[1] for r in rows)
wall = sorted(r[2] for r in rows)
print(f"{sys.argv[2]:<24} cpu median {statistics.median(cpu):.2f} s (min {cpu[0]:.2f})   "
      f"wall median {statistics.median(wall):.2f} s (min {wall[0]:.2f})")
PY
done

#!/usr/bin/env bash
# The deep check: every property for many seeds at many cases, the run that finds what the default
# case counts miss (issue #38 found two such failures at 10,000 cases). Run it before closing a change
# to rules, kernels or generators; its last result is kept in docs/testing.md ("Deep check").
#
#   scripts/deep_check.sh [--seeds A-B] [--cases N] [--jobs J] [--out DIR]
#
# Defaults: seeds 1-10, 10,000 cases a property, one job per core, DIR build/deep_check. Each seed is
# one `meshsim check --seed S --cases N --json` (shards of one seed never overlap seeds: the seeds run
# side by side). DIR gets SEED.json per seed, counterexamples under ce-SEED/, and summary.md, which
# is also printed. Exit 0 when every property passed for every seed, 1 otherwise, 2 on bad usage.
# MESHSIM names the binary (default: BUILD/cli/meshsim, BUILD from MESHSIM_BUILD_DIR or build); it is
# copied first, so rebuilding while the check runs does not change what it runs.
set -euo pipefail
cd "$(dirname "$0")/.."

seeds=1-10 cases=10000 jobs=$(nproc) out=${MESHSIM_BUILD_DIR:-build}/deep_check
usage() { echo "usage: scripts/deep_check.sh [--seeds A-B] [--cases N] [--jobs J] [--out DIR]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) [ $# -ge 2 ] || usage; seeds=$2; shift 2 ;;
    --cases) [ $# -ge 2 ] || usage; cases=$2; shift 2 ;;
    --jobs) [ $# -ge 2 ] || usage; jobs=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    *) usage ;;
  esac
done
[[ "$seeds" =~ ^([0-9]+)-([0-9]+)$ ]] || [[ "$seeds" =~ ^([0-9]+)()$ ]] || usage
first=${BASH_REMATCH[1]} last=${BASH_REMATCH[2]:-${BASH_REMATCH[1]}}
[[ "$cases" =~ ^[1-9][0-9]*$ && "$jobs" =~ ^[1-9][0-9]*$ && $first -le $last ]] || usage

binary=${MESHSIM:-${MESHSIM_BUILD_DIR:-build}/cli/meshsim}
[ -x "$binary" ] || { echo "deep_check: no meshsim at $binary (build it, or set MESHSIM)" >&2; exit 2; }
mkdir -p "$out"
cp "$binary" "$out/meshsim"
version=$("$out/meshsim" --version 2>/dev/null || echo unknown)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain 2>/dev/null)" ] || commit="$commit+changes"

start=$(date +%s)
export out cases
seq "$first" "$last" | xargs -P "$jobs" -I{} bash -c '
  s={}; t0=$(date +%s)
  "$out/meshsim" check --seed "$s" --cases "$cases" --json --out "$out/ce-$s" >"$out/$s.json" 2>"$out/$s.err" || true
  echo "seed $s done in $(( $(date +%s) - t0 )) s" >&2'
elapsed=$(( $(date +%s) - start ))

python3 - "$out" "$first" "$last" "$cases" "$jobs" "$elapsed" "$commit" "$version" <<'EOF'
import json, sys, os
out, first, last, cases, jobs, elapsed, commit, version = sys.argv[1:]
lines, failed, props = [], 0, None
rows = []
for s in range(int(first), int(last) + 1):
    path = os.path.join(out, f"{s}.json")
    try:
        doc = json.load(open(path))
    except Exception as e:
        failed += 1
        err = open(os.path.join(out, f"{s}.err")).read().strip().splitlines()
        rows.append(f"| {s} | no result | {(err[-1] if err else str(e))[:200]} |")
        continue
    bad = [p for p in doc["properties"] if p["status"] != "pass"]
    props = len(doc["properties"])
    if bad:
        failed += 1
        for p in bad:
            why = p.get("failure", {}).get("description", p["status"]).replace("|", "\\|")
            rows.append(f"| {s} | **{p['name']}** after {p['cases']} cases | {why[:300]} |")
    else:
        rows.append(f"| {s} | all {props} properties pass | |")
lines.append(f"# meshsim deep check")
lines.append("")
lines.append(f"`scripts/deep_check.sh --seeds {first}-{last} --cases {cases} --jobs {jobs}` on {commit} "
             f"({version}): {int(last) - int(first) + 1 - failed} of {int(last) - int(first) + 1} seeds pass, "
             f"{props or '?'} properties each, {elapsed} s wall clock.")
lines.append("")
lines.append("| seed | result | failure |")
lines.append("|---|---|---|")
lines += rows
text = "\n".join(lines) + "\n"
open(os.path.join(out, "summary.md"), "w").write(text)
print(text, end="")
sys.exit(1 if failed else 0)
EOF

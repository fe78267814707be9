#!/usr/bin/env python3
"""The CI ratio check (docs/performance.md, "Ratio check").

Runs meshsim_bench_overhead on the benchmarks of bench/ratio_baseline.json and compares each one's
`ratio` counter (meshsim's median time over bare libtorch's doing the same per-rank ops, the two
interleaved in one process, so that the machine's speed cancels) with its baseline. A ratio above
baseline * limit_factor is measured again, up to `tries` times in all; the check fails only when
every try is above (a real slowdown stays, a noisy minute does not). Never a timed assertion.

  perf_ratio.py BENCH BASELINE          exit 0: every ratio within; 1: a ratio above in every try
"""
import json
import re
import subprocess
import sys


def measure(bench, names, min_time):
    pattern = "^(" + "|".join(re.escape(n.removesuffix("/manual_time")) for n in names) + ")/manual_time$"
    out = subprocess.run([bench, "--benchmark_filter=" + pattern, "--benchmark_min_time=%g" % min_time,
                          "--benchmark_format=json"], check=True, capture_output=True, text=True).stdout
    return {b["name"]: b["ratio"] for b in json.loads(out)["benchmarks"] if "ratio" in b}


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    bench, baseline_path = sys.argv[1:]
    with open(baseline_path) as f:
        base = json.load(f)
    factor, tries, min_time = base["limit_factor"], base["tries"], base["min_time"]
    todo = dict(base["ratios"])
    for attempt in range(1, tries + 1):
        got = measure(bench, list(todo), min_time)
        missing = [n for n in todo if n not in got]
        if missing:
            print("perf_ratio: the benchmark reported no ratio for " + ", ".join(missing), file=sys.stderr)
            return 1
        above = {}
        for name, b in todo.items():
            limit = b * factor
            verdict = "above" if got[name] > limit else "ok"
            print(f"try {attempt}: {name}: ratio {got[name]:.3f} (baseline {b:.3f}, limit {limit:.3f}) {verdict}")
            if got[name] > limit:
                above[name] = b
        if not above:
            return 0
        todo = above
    for name, b in todo.items():
        print(f"perf_ratio: {name} is slower than its baseline in all {tries} tries: "
              f"meshsim over libtorch above {b * factor:.3f} (baseline {b:.3f} x {factor})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The cost of redistribution at dispatch (issue #33, item 7; seed 003).

Seed 003 moves the redistribution of an op's operands above autograd: __torch_function__ runs a
quick sharding propagation, and an op whose operands fit no rule row is redistributed
(Redistribute.apply) and called again, so it pays one more propagation and a second dispatch;
"most ops don't need redistribution, so the fast path is common", and a cache keyed by
(op, input specs) would spare the repeated propagation. This script measures both claims on the
bundled examples and on generated programs, with `meshsim run --json`:

- ops: the program's top-level DTensor ops, i.e. those dispatched through sharding propagation
  (not redistribute, local_map, to_local / from_local and the local code between them,
  collectives of local code, creation ops); dispatches: the rule applications they make
  (`stats.propagation_requests`: linear is a transpose, a matmul and an add, cross_entropy
  several, split one narrow per piece, as PyTorch decomposes them).
- needing a redistribution: the ops (dispatches) with at least one forward `implicit` entry (the
  planner moved an operand because its placements fit no row), split into communicating (some
  entry of the op has a collective, in the forward or, above autograd, the backward of the move:
  `meshsim run`'s own "N communicating, M local") and local only (a local chunk, or a move over a
  mesh axis of size 1). Backward `implicit` entries (a backward rule moving its incoming gradient)
  are not dispatch-time redistributions; they are counted apart.
- propagations: requested (one per dispatch), computed (meshsim's per-run cache keyed by op,
  attributes, operand specs and shapes: the number of distinct keys in the run) and cache hits
  (what that cache saves today). The seed's design: __torch_function__ and __torch_dispatch__
  both propagate (2 per dispatch without a cache), plus the re-called op's propagation on the
  redistributed specs for a dispatch that needed one; with a cache keyed on (op, attributes,
  specs, shapes) it computes at most the run's distinct keys plus one new key per dispatch that
  needed a redistribution (the result does not give the keys, so whether a re-dispatch's key was
  already seen cannot be told: an upper bound).

Usage: scripts/dispatch_cost.py [--meshsim build/cli/meshsim] [--cases N] [--seed S] [--json OUT]
Python 3 standard library only. The output is deterministic for a given tree and meshsim.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# Program ops that do not go through sharding propagation (meshsim ops --json: no rule family).
NOT_DISPATCHED = {
    "redistribute", "local_map", "to_local", "from_local", "call",
    "arange", "full", "ones", "zeros",
    "all_gather", "all_reduce", "all_to_all", "reduce_scatter", "mark_varying",
}
BATCH = 40  # scenarios per `meshsim run` (one JSON array); a batch that fails runs file by file


def outs_of(op):
    if "outs" in op:
        return list(op["outs"])
    return [op["out"]] if "out" in op else []


def dispatched_ops(scenario):
    """The JSON paths of the top-level program ops dispatched through sharding propagation."""
    local = set()  # names of local tensors (to_local's results and the local code's)
    paths = []
    for k, op in enumerate(scenario.get("program", [])):
        name = op.get("op")
        args = op.get("args", [])
        if name == "to_local":
            local.update(outs_of(op))
            continue
        if name == "from_local":
            continue
        if any(a in local for a in args):  # local code between to_local and from_local
            local.update(outs_of(op))
            continue
        if name in NOT_DISPATCHED:
            continue
        paths.append("/program/%d" % k)
    return paths


def wait_for(meshsim, seconds=600):
    """A rebuild may remove the binary for a moment: wait for it to come back."""
    end = time.time() + seconds
    while not os.access(meshsim, os.X_OK):
        if time.time() > end:
            sys.exit("dispatch_cost: no meshsim at %s (build it, or give --meshsim)" % meshsim)
        time.sleep(5)


def run_meshsim(meshsim, files):
    """`meshsim run FILES --json` (several files give one JSON array, each file run on its own, as
    `meshsim run FILE --json` runs it): one result per file, in order (file by file when a batch
    fails)."""
    results = []
    for i in range(0, len(files), BATCH):
        chunk = files[i:i + BATCH]
        wait_for(meshsim)
        got = None
        p = subprocess.run([meshsim, "run", *chunk, "--json"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, universal_newlines=True)
        try:
            got = json.loads(p.stdout)
            if len(chunk) == 1:
                got = [got] if isinstance(got, dict) else got
            if not isinstance(got, list) or len(got) != len(chunk):
                got = None
        except ValueError:
            got = None
        if got is None:
            got = []
            for f in chunk:
                wait_for(meshsim)
                p = subprocess.run([meshsim, "run", f, "--json"], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, universal_newlines=True)
                try:
                    got.append(json.loads(p.stdout))
                except ValueError:
                    got.append({"status": "error", "error": {"kind": "crash", "message": "exit %d" % p.returncode}})
        results.extend(got)
    return results


def measure(scenario, result, generated=False):
    """One scenario's counts, or None when the run has no result to count (error, skipped)."""
    if result.get("status") not in ("pass", "fail", "unchecked") or "stats" not in result:
        return None
    ops = dispatched_ops(scenario)
    st = result["stats"]
    fwd = [m for m in result.get("implicit", []) if m.get("phase") == "forward"]
    bwd = [m for m in result.get("implicit", []) if m.get("phase") != "forward"]
    by_op, by_dispatch = {}, {}
    for m in fwd:
        comm = bool(m.get("collectives"))
        by_op[m["program_op"]] = by_op.get(m["program_op"], False) or comm
        key = (m["program_op"], m.get("value"))
        by_dispatch[key] = by_dispatch.get(key, False) or comm
    unknown = sorted(set(by_op) - set(ops))  # a move at an op the classifier missed (reported)
    # The generators end every program with the harness's scalarization: `weighted = mul(y, c)`
    # (c a constant of random placements) and `loss = sum(weighted)`; counted apart too.
    harness = set()
    if generated:
        harness = {"/program/%d" % k for k, op in enumerate(scenario.get("program", []))
                   if op.get("out") in ("weighted", "loss")} & (set(ops) | set(by_op))
    return {
        "ops": len(ops) + len(unknown),
        "dispatches": st["propagation_requests"],
        "ops_implicit": len(by_op),
        "ops_implicit_comm": sum(1 for c in by_op.values() if c),
        "ops_implicit_local": sum(1 for c in by_op.values() if not c),
        "dispatches_implicit": len(by_dispatch),
        "moves_forward": len(fwd),
        "moves_backward": len(bwd),
        "requests": st["propagation_requests"],
        "computed": st["propagations"],
        "cache_hits": st["cache_hits"],
        "unclassified_ops": unknown,
        "harness_ops": len(harness),
        "harness_ops_implicit": len(harness & set(by_op)),
        # Imported programs: the ops PyTorch itself redistributed an operand of at dispatch
        # (`recorded.collectives`, from the import under LocalTensorMode).
        "recorded_ops": sum(1 for op in scenario.get("program", []) if "recorded" in op),
        "recorded_ops_moved": sum(1 for op in scenario.get("program", [])
                                  if (op.get("recorded") or {}).get("collectives")),
    }


FIELDS = ["ops", "dispatches", "ops_implicit", "ops_implicit_comm", "ops_implicit_local",
          "dispatches_implicit", "moves_forward", "moves_backward", "requests", "computed", "cache_hits",
          "recorded_ops", "recorded_ops_moved", "harness_ops", "harness_ops_implicit"]


def total(rows):
    t = {f: sum(r[f] for r in rows) for f in FIELDS}
    t["scenarios"] = len(rows)
    t["scenarios_with_implicit"] = sum(1 for r in rows if r["ops_implicit"])
    # The seed's design: both __torch_function__ and __torch_dispatch__ propagate; a dispatch
    # that needs a redistribution propagates once more (the re-called op, redistributed specs).
    t["seed_requests"] = 2 * t["dispatches"] + t["dispatches_implicit"]
    t["seed_computed_at_most"] = t["computed"] + t["dispatches_implicit"]
    return t


def pct(a, b):
    return "%.1f%%" % (100.0 * a / b) if b else "-"


def table(groups):
    lines = ["| group | scenarios (with a move) | ops | ops needing a redistribution: communicating + local "
             "| dispatches | dispatches needing one | backward moves | propagations requested / computed / cache hits "
             "| seed design: requested without a cache (+ re-dispatch) | seed design: computed with a cache, at most |",
             "|" + "---|" * 10]
    for name, t in groups:
        lines.append("| %s | %d (%d) | %d | %d (%s): %d + %d | %d | %d (%s) | %d | %d / %d / %d (%s saved) | %d (+%d) | %d |" % (
            name, t["scenarios"], t["scenarios_with_implicit"], t["ops"],
            t["ops_implicit"], pct(t["ops_implicit"], t["ops"]), t["ops_implicit_comm"], t["ops_implicit_local"],
            t["dispatches"], t["dispatches_implicit"], pct(t["dispatches_implicit"], t["dispatches"]),
            t["moves_backward"], t["requests"], t["computed"], t["cache_hits"], pct(t["cache_hits"], t["requests"]),
            t["seed_requests"], t["dispatches_implicit"], t["seed_computed_at_most"]))
    return "\n".join(lines)


def bundled_group(rel):
    parts = rel.split("/")
    return "examples/" + (parts[1] + "/" if len(parts) > 2 else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--meshsim", default="build/cli/meshsim", help="the meshsim binary (default build/cli/meshsim)")
    ap.add_argument("--cases", type=int, default=500, help="generated programs (default 500)")
    ap.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    ap.add_argument("--json", dest="json_out", help="write every scenario's counts and the totals here")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    meshsim = a.meshsim if os.path.isabs(a.meshsim) else os.path.join(root, a.meshsim)
    wait_for(meshsim)

    # Bundled examples: every scenario under examples/, bugs/ and failing/ included (their forward
    # dispatch is a real program's; only the gradients are wrong), plugin ones skipped.
    bundled, skipped = [], []
    for d, _, names in sorted(os.walk(os.path.join(root, "examples"))):
        for n in sorted(names):
            if not n.endswith(".json"):
                continue
            path = os.path.join(d, n)
            rel = os.path.relpath(path, root)
            try:
                with open(path) as f:
                    sc = json.load(f)
            except ValueError:
                continue
            if not isinstance(sc, dict) or sc.get("format") != "meshsim.scenario/1":
                continue
            if sc.get("requires", {}).get("functions"):
                skipped.append((rel, "requires.functions (a plugin)"))
                continue
            bundled.append((rel, path, sc))
    bundled.sort(key=lambda x: x[0])

    with tempfile.TemporaryDirectory(prefix="dispatch_cost.") as tmp:
        generated = []
        if a.cases > 0:
            subprocess.run([meshsim, "check", "--emit", tmp, "--cases", str(a.cases), "--seed", str(a.seed)],
                           check=True, stdout=subprocess.DEVNULL)
            with open(os.path.join(tmp, "emitted.json")) as f:
                emitted = json.load(f)["cases"]
            for c in emitted:
                path = os.path.join(tmp, c["file"])
                with open(path) as f:
                    generated.append(("generated/" + c["file"], path, json.load(f), c["generator"]))
        res_b = run_meshsim(meshsim, [p for _, p, _ in bundled])
        res_g = run_meshsim(meshsim, [p for _, p, _, _ in generated])

    records, excluded = [], []
    for (rel, _, sc), r in zip(bundled, res_b):
        m = measure(sc, r)
        if m is None:
            excluded.append((rel, "%s%s" % (r.get("status"), (": " + r["error"]["kind"]) if r.get("error") else "")))
            continue
        m.update(file=rel, group=bundled_group(rel))
        records.append(m)
    for (rel, _, sc, gen), r in zip(generated, res_g):
        m = measure(sc, r, generated=True)
        if m is None:
            excluded.append((rel, "%s%s" % (r.get("status"), (": " + r["error"]["kind"]) if r.get("error") else "")))
            continue
        m.update(file=rel, group="generated: " + gen)
        records.append(m)

    def rows_of(pred):
        return [r for r in records if pred(r)]

    groups = []
    bgroups = sorted({r["group"] for r in records if r["group"].startswith("examples/")})
    for g in bgroups:
        groups.append((g, total(rows_of(lambda r, g=g: r["group"] == g))))
    groups.append(("**bundled examples, all**", total(rows_of(lambda r: r["group"].startswith("examples/")))))
    ggroups = sorted({r["group"] for r in records if r["group"].startswith("generated")})
    for g in ggroups:
        groups.append((g, total(rows_of(lambda r, g=g: r["group"] == g))))
    if ggroups:
        groups.append(("**generated, all** (seed %d, %d cases)" % (a.seed, a.cases),
                       total(rows_of(lambda r: r["group"].startswith("generated")))))

    print("# The cost of redistribution at dispatch (meshsim run --json; seed %d, %d generated programs)\n"
          % (a.seed, a.cases))
    print(table(groups))
    print()
    if skipped or excluded:
        print("Not counted: " + "; ".join("%s (%s)" % x for x in skipped + excluded) + ".")
    for name, t in groups:
        if t["recorded_ops"]:
            print("%s: PyTorch itself (recorded at import) redistributed an operand at dispatch in %d of %d ops (%s)."
                  % (name.replace("**", ""), t["recorded_ops_moved"], t["recorded_ops"], pct(t["recorded_ops_moved"], t["recorded_ops"])))
    for name, t in groups:
        if t["harness_ops"]:
            a_, b_ = t["ops_implicit"] - t["harness_ops_implicit"], t["ops"] - t["harness_ops"]
            print("%s: %d of the %d ops needing a redistribution are the harness's loss weighting (`weighted = mul(y, c)`); "
                  "without it and `loss = sum(weighted)`: %d of %d ops (%s)."
                  % (name.replace("**", ""), t["harness_ops_implicit"], t["ops_implicit"], a_, b_, pct(a_, b_)))
    unclassified = [(r["file"], p) for r in records for p in r["unclassified_ops"]]
    if unclassified:
        print("Moves at ops the classifier did not count as dispatched (counted as ops): " +
              ", ".join("%s %s" % x for x in unclassified) + ".")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"format": "meshsim.dispatch_cost/1", "seed": a.seed, "cases": a.cases,
                       "groups": [{"group": n.replace("**", ""), **t} for n, t in groups],
                       "scenarios": records, "skipped": skipped, "excluded": excluded},
                      f, indent=1, sort_keys=True)
            f.write("\n")


if __name__ == "__main__":
    main()

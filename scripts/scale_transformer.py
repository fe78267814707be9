#!/usr/bin/env python3
"""Time and memory of a transformer training step against the number of ranks (issue #35, item 5).

Runs `meshsim run` (the mesh, the single-device oracle and every check) of
examples/scale/transformer_1024.json at each data-parallel size (scripts/gen_scale_transformer.py:
dp x 8 ranks), one process per run, and reads its wall time, CPU time and peak resident set from
wait4. The 8-rank run (dp = 1) is taken first as the fixed cost (start-up, libtorch's memory), and
each size's figures above it are fitted as a power of ranks by least squares on the logarithms:
an exponent of 1 is linear. Prints a table and the fits, and writes an SVG plot where asked:

    scripts/scale_transformer.py --build build --dp 8,32,128,512,2048 --max-memory 40G \
        --svg docs/images/scale_transformer.svg
"""
import argparse
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run_one(meshsim, scenario, max_memory):
    """Wall seconds, CPU seconds (user + system) and peak resident MiB of one `meshsim run`."""
    start = time.monotonic()
    cmd = [meshsim, "run", scenario] + (["--max-memory", max_memory] if max_memory else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    out = proc.stdout.read().decode()
    err = proc.stderr.read().decode()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit("scale_transformer.py: meshsim run %s exited %d\n%s%s" % (scenario, code, out[-2000:], err[-2000:]))
    if "gradient_equivalence=ok" not in out:
        sys.exit("scale_transformer.py: %s did not pass its checks:\n%s" % (scenario, out[-2000:]))
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0


def fit(xs, ys):
    """Least squares of log y = a + b log x: (b, a)."""
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    n = len(lx)
    mx, my = sum(lx) / n, sum(ly) / n
    sxx = sum((x - mx) ** 2 for x in lx)
    b = sum((x - mx) * (y - my) for x, y in zip(lx, ly)) / sxx
    return b, my - b * mx


def svg_plot(rows, fits, path):
    """A log-log plot of CPU seconds and peak MiB above the fixed cost against ranks, with the fitted lines."""
    W, H, L, R, T, B = 640, 400, 70, 70, 30, 50
    ranks = [r["ranks"] for r in rows]
    x0, x1 = math.log10(min(ranks)), math.log10(max(ranks))
    series = [("cpu_s", "CPU seconds above the 8-rank run", "#1f5fa8", "left"),
              ("rss_mib", "peak resident MiB above the 8-rank run", "#b2461f", "right")]
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, H),
           '<rect width="100%" height="100%" fill="white"/>']

    def px(x):
        return L + (math.log10(x) - x0) / (x1 - x0) * (W - L - R)

    for key, label, colour, side in series:
        vals = [r[key + "_above"] for r in rows]
        y0, y1 = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
        if y1 == y0:
            y1 += 1

        def py(y, y0=y0, y1=y1):
            return H - B - (math.log10(y) - y0) / (y1 - y0) * (H - T - B)

        ax = L if side == "left" else W - R
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s"/>' % (ax, T, ax, H - B, colour))
        for e in range(y0, y1 + 1):
            y = py(10 ** e)
            tx = ax - 6 if side == "left" else ax + 6
            anchor = "end" if side == "left" else "start"
            out.append('<text x="%d" y="%.1f" text-anchor="%s" fill="%s">%g</text>' % (tx, y + 4, anchor, colour, 10 ** e))
        b, a = fits[key]
        out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="4 3"/>' % (
            px(min(ranks)), py(math.exp(a) * min(ranks) ** b), px(max(ranks)), py(math.exp(a) * max(ranks) ** b), colour))
        pts = " ".join("%.1f,%.1f" % (px(r["ranks"]), py(r[key + "_above"])) for r in rows)
        out.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>' % (pts, colour))
        for r in rows:
            out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (px(r["ranks"]), py(r[key + "_above"]), colour))
        ly = T + 14 if side == "left" else T + 30
        out.append('<text x="%d" y="%d" fill="%s">%s: ranks^%.2f (dashed: the fit)</text>' % (L + 10, ly, colour, label, b))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, H - B, W - R, H - B))
    for r in ranks:
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (px(r), H - B + 16, r))
    out.append('<text x="%d" y="%d" text-anchor="middle">ranks (dp x 8), log scale</text>' % ((L + W - R) // 2, H - 12))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description="time and memory of a transformer step against ranks")
    ap.add_argument("--build", default="build", help="the build directory (its cli/meshsim runs)")
    ap.add_argument("--dp", default="8,32,128,512", help="data-parallel sizes, comma separated")
    ap.add_argument("--svg", help="write a log-log plot here")
    ap.add_argument("--max-memory", help="meshsim run's --max-memory (its estimate errs high: 38.8 GiB for the "
                                         "16,384-rank step, which needs less than a third of it)")
    args = ap.parse_args()
    meshsim = os.path.join(args.build, "cli", "meshsim")
    if not os.access(meshsim, os.X_OK):
        sys.exit("scale_transformer.py: %s not found: build first" % meshsim)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dp in [1] + [int(x) for x in args.dp.split(",")]:
            path = os.path.join(tmp, "t%d.json" % dp)
            with open(path, "w") as f:
                subprocess.run([sys.executable, os.path.join(HERE, "gen_scale_transformer.py"), "--dp", str(dp)],
                               stdout=f, check=True)
            wall, cpu, rss = run_one(meshsim, path, args.max_memory)
            rows.append({"dp": dp, "ranks": dp * 8, "wall_s": wall, "cpu_s": cpu, "rss_mib": rss})
            print("dp=%d ranks=%d wall %.2f s cpu %.2f s peak %.0f MiB" % (dp, dp * 8, wall, cpu, rss), flush=True)
    base, rows = rows[0], rows[1:]
    for r in rows:
        for k in ("wall_s", "cpu_s", "rss_mib"):
            r[k + "_above"] = max(r[k] - base[k], 1e-3)
    fits = {k: fit([r["ranks"] for r in rows], [r[k + "_above"] for r in rows]) for k in ("wall_s", "cpu_s", "rss_mib")}
    print()
    print("fixed cost (8 ranks): wall %.2f s, CPU %.2f s, peak %.0f MiB" % (base["wall_s"], base["cpu_s"], base["rss_mib"]))
    print()
    print("| ranks | wall s | CPU s | peak MiB | CPU ms per rank above the fixed cost | KiB per rank above it |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| %d | %.2f | %.2f | %.0f | %.2f | %.0f |" % (r["ranks"], r["wall_s"], r["cpu_s"], r["rss_mib"],
                                                         1000 * r["cpu_s_above"] / r["ranks"],
                                                         1024 * r["rss_mib_above"] / r["ranks"]))
    print()
    for k, (b, a) in fits.items():
        print("fit %s above the fixed cost = %.3g * ranks^%.3f" % (k, math.exp(a), b))
    if args.svg:
        svg_plot(rows, fits, args.svg)
        print("wrote", args.svg)


if __name__ == "__main__":
    main()

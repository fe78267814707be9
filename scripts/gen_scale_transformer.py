#!/usr/bin/env python3
"""Writes examples/scale/transformer_1024.json at another data-parallel size: the same 2-layer
FSDP + TP + SP training step on a dp x 8 mesh, one token per rank (ids [dp, 8], targets [dp * 8]),
the model's dims unchanged (d = 128, so past dp = 128 the FSDP shards of a weight are uneven and
some ranks hold none of it). Used by docs/performance.md's scale figures (issue #35, item 5):

    scripts/gen_scale_transformer.py --dp 512 > /tmp/t4096.json   # 4096 ranks
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "..", "examples", "scale", "transformer_1024.json")
TEMPLATE_DP = 128


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dp", type=int, required=True, help="data-parallel size (ranks = dp * 8)")
    args = ap.parse_args()
    if args.dp < 1:
        sys.exit("gen_scale_transformer.py: --dp must be at least 1")
    with open(TEMPLATE) as f:
        s = json.load(f)
    dp = args.dp
    tp = s["mesh"]["shape"][1]
    s["name"] = "transformer_%d" % (dp * tp)
    s["mesh"]["shape"] = [dp, tp]
    for i in s["inputs"]:
        if i["name"] == "ids":
            i["shape"] = [dp, tp]
        elif i["name"] == "targets":
            i["shape"] = [dp * tp]
    for op in s["program"]:
        if op["op"] in ("view", "reshape") and op["shape"][0] == TEMPLATE_DP:
            op["shape"][0] = dp
    json.dump(s, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

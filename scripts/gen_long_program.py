#!/usr/bin/env python3
"""Writes a long meshsim scenario, to time and check the rendering of large programs.

    scripts/gen_long_program.py --ops 20000 --shape chain > /tmp/chain_20000.json
    scripts/gen_long_program.py --ops 5000 --shape pattern > /tmp/pattern_5000.json
    build/cli/meshsim render /tmp/chain_20000.json -o /tmp/chain_20000.svg

Shapes (tensors stay tiny, [8, 4] on a 4-rank mesh, so the time goes to drawing, not simulating):
  chain    x -> add 1 -> mul 0.5 -> add 1 -> ... elementwise ops on a S(0) tensor, one sum at the end
  pattern  a repeated block of four distinct ops (add, tanh, mul by a weight, sub), and every 50
           blocks a redistribution S(0) -> R -> S(0) (an all_gather forward; backward a local step
           and a reduce_scatter or all_reduce)
  mixed    no repetition: each op is drawn from the elementwise ops by a seeded generator, so no
           run repeats (the renderer must elide rather than fold)
"""
import argparse
import json
import random
import sys


def chain(n):
    program = []
    prev = "x"
    for i in range(n - 1):
        out = f"h{i}"
        if i % 2 == 0:
            program.append({"out": out, "op": "add", "args": [prev], "value": 1.0})
        else:
            program.append({"out": out, "op": "mul", "args": [prev], "value": 0.5})
        prev = out
    program.append({"out": "loss", "op": "sum", "args": [prev]})
    return program


def pattern(n):
    program = []
    prev = "x"
    i = 0
    block = 0
    while len(program) < n - 1:
        if block % 50 == 49 and len(program) + 2 < n - 1:
            program.append({"out": f"r{i}", "op": "redistribute", "args": [prev], "placements": ["R"]})
            program.append({"out": f"s{i}", "op": "redistribute", "args": [f"r{i}"], "placements": ["S(0)"]})
            prev = f"s{i}"
        for op in ("add", "tanh", "mul", "sub"):
            if len(program) >= n - 1:
                break
            out = f"{'d' if op == 'sub' else op[0]}{i}"
            if op == "add":
                program.append({"out": out, "op": "add", "args": [prev, "b"]})
            elif op == "tanh":
                program.append({"out": out, "op": "tanh", "args": [prev]})
            elif op == "mul":
                program.append({"out": out, "op": "mul", "args": [prev, "w"]})
            else:
                program.append({"out": out, "op": "sub", "args": [prev], "value": 0.25})
            prev = out
        i += 1
        block += 1
    program.append({"out": "loss", "op": "sum", "args": [prev]})
    return program


def mixed(n, seed):
    rng = random.Random(seed)
    program = []
    prev = "x"
    for i in range(n - 1):
        op = rng.choice(["add", "mul", "sub", "tanh", "sin", "neg", "abs"])
        out = f"m{i}"
        if op in ("add", "mul", "sub"):
            program.append({"out": out, "op": op, "args": [prev], "value": round(rng.uniform(0.5, 1.5), 2)})
        else:
            program.append({"out": out, "op": op, "args": [prev]})
        prev = out
    program.append({"out": "loss", "op": "sum", "args": [prev]})
    return program


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=20000, help="ops in the program (at least 2)")
    parser.add_argument("--shape", choices=["chain", "pattern", "mixed"], default="chain")
    parser.add_argument("--seed", type=int, default=0, help="for --shape mixed")
    args = parser.parse_args()
    if args.ops < 2:
        parser.error("--ops must be at least 2")
    inputs = [{"name": "x", "shape": [8, 4], "placements": ["S(0)"], "requires_grad": True}]
    if args.shape == "chain":
        program = chain(args.ops)
    elif args.shape == "pattern":
        inputs += [{"name": "b", "shape": [8, 4], "placements": ["S(0)"], "requires_grad": True},
                   {"name": "w", "shape": [8, 4], "placements": ["S(0)"], "requires_grad": True}]
        program = pattern(args.ops)
    else:
        program = mixed(args.ops, args.seed)
    doc = {
        "format": "meshsim.scenario/1",
        "name": f"long_{args.shape}_{len(program)}_ops",
        "mesh": {"axes": ["dp"], "shape": [4]},
        "inputs": inputs,
        "program": program,
        "backward": "loss",
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

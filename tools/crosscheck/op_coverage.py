"""Whether each crosscheck backend covers meshsim's op catalog (`meshsim ops --json`,
meshsim.ops/1): every op a scenario may write (scopes other than only "internal") is translated
by the backend, or listed in its NOT_COMPARABLE with the reason.

The backends import torch and jax at their top, so they are read here as source (`ast`), never
imported: this check needs only Python's standard library. A backend declares, as module-level
literals:

- `OP_TABLES`: the names of its module-level dicts and sets of op names by which it dispatches
  (`OPS`, and the sets of ops it handles by name elsewhere); their keys or members are the ops it
  translates;
- `NOT_COMPARABLE`: `{op: why}` for the ops it does not translate (the reason it reports).
"""

from __future__ import annotations

import ast
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEMS = ("pytorch", "jax")


def top_level(path: str) -> dict[str, ast.expr]:
    """The module-level assignments `NAME = value` of a Python file, by name (the last wins)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def names_in(node: ast.expr) -> set[str]:
    """The string keys of a dict display, or the string members of a set, list or tuple display."""
    if isinstance(node, ast.Dict):
        items = node.keys
    else:
        items = node.elts if isinstance(node, (ast.Set, ast.List, ast.Tuple)) else []
    return {k.value for k in items if isinstance(k, ast.Constant) and isinstance(k.value, str)}


class BackendTables:
    """A backend's translated ops and its not-comparable ones with their reasons, read from its source."""

    def __init__(self, system: str):
        self.system = system
        self.file = f"{system}_backend.py"
        found = top_level(os.path.join(HERE, self.file))
        self.problems: list[str] = []
        tables = sorted(names_in(found["OP_TABLES"])) if "OP_TABLES" in found else []
        if not tables:
            self.problems.append(f"{self.file} has no OP_TABLES (the names of its tables of ops)")
        self.translated: set[str] = set()
        for t in tables:
            if t in found:
                self.translated |= names_in(found[t])
            else:
                self.problems.append(f"{self.file}: OP_TABLES names {t}, which it does not define")
        self.not_comparable: dict[str, str] = {}
        node = found.get("NOT_COMPARABLE")
        if not isinstance(node, ast.Dict):
            self.problems.append(f"{self.file} has no NOT_COMPARABLE = {{op: why}} dict")
            return
        for k, v in zip(node.keys, node.values):
            if isinstance(v, ast.Name) and isinstance(found.get(v.id), ast.Constant):
                v = found[v.id]  # a reason shared by several ops, named once
            if isinstance(k, ast.Constant) and isinstance(k.value, str):
                self.not_comparable[k.value] = v.value if isinstance(v, ast.Constant) else None


def scenario_ops(catalog: dict) -> list[str]:
    """The ops of a catalog (meshsim.ops/1) that a scenario may write, in its order."""
    if catalog.get("format") != "meshsim.ops/1":
        raise ValueError(f"not an op catalog (format {catalog.get('format')!r}, expected 'meshsim.ops/1')")
    return [op["name"] for op in catalog["ops"] if set(op.get("scopes", [])) - {"internal"}]


def check(catalog: dict, system: str) -> tuple[list[str], list[str]]:
    """(failures, notes) of `system`'s backend against the catalog: an op neither translated nor
    listed as not comparable, listed without a reason, or both, fails; the backend's names that are
    no op of the catalog are notes (a translation ready for an op not yet there, or a stale one)."""
    b = BackendTables(system)
    failures = list(b.problems)
    ops = scenario_ops(catalog)
    for op in ops:
        if op in b.translated and op in b.not_comparable:
            failures.append(f"{op}: both translated and listed in NOT_COMPARABLE of {b.file}")
        elif op in b.not_comparable and not (isinstance(b.not_comparable[op], str) and b.not_comparable[op].strip()):
            failures.append(f"{op}: listed in NOT_COMPARABLE of {b.file} without a reason")
        elif op not in b.translated and op not in b.not_comparable:
            failures.append(f"{op}: neither translated by {b.file} nor listed in its NOT_COMPARABLE with why")
    unknown = sorted((b.translated | set(b.not_comparable)) - set(ops))
    notes = [f"{b.file} names ops the catalog does not have: {', '.join(unknown)}"] if unknown else []
    return failures, notes

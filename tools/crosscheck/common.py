"""What the crosscheck backends share: a job (one scenario and meshsim's run of it, read from
`meshsim run FILE --json --values DIR --values-per-rank`), placements, and the comparison of arrays
that says which element differs, by how much, expected and actual.

A backend (pytorch_backend.py, jax_backend.py) is run by `crosscheck` under its own virtual
environment as `python BACKEND.py JOBS.json`; JOBS.json is a list of jobs (below); it prints one
JSON report per job, one per line, in order (see `Report`). Needs numpy (both environments have it).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

# Ops exact on small integers (docs/semantics.md, "Checks and exactness"); a program of these
# alone, in float64 without randn inputs on power-of-two axes, must agree bit for bit.
EXACT_OPS = {
    "redistribute", "add", "sub", "mul", "neg", "relu", "mm", "bmm", "matmul", "linear", "transpose",
    "permute", "view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "expand", "cat",
    "stack", "narrow", "sum", "scale", "split", "chunk", "zeros", "ones", "full", "arange", "where",
    "masked_fill", "tril", "triu", "embedding", "to_local", "from_local", "all_reduce", "all_gather",
    "reduce_scatter", "all_to_all", "mark_varying", "local_map", "abs",
    "max", "min", "argmax", "argmin", "sort", "argsort", "topk", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_and", "logical_or", "logical_not", "gather", "index_select", "scatter", "scatter_add",
    "index_add", "floor_divide", "remainder", "cumsum", "clamp", "one_hot", "bincount",
    "repeat", "repeat_interleave",
}
# Relative tolerance otherwise, relative to the largest finite magnitude of meshsim's value (at
# least 1): looser than meshsim's own 1e-12, since two libtorch versions (and XLA) may round
# transcendental kernels and reductions differently in the last bits.
RTOL = {"float64": 1e-9, "float32": 1e-4, "bfloat16": 3e-2, "float16": 4e-3}
# The float dtypes, least precise last (docs/semantics.md, "Dtypes and mixed precision").
FLOAT_DTYPES = ["float64", "float32", "float16", "bfloat16"]


@dataclass
class Placement:
    kind: str  # "S" | "SS" | "R" | "P" | "Rd"
    dim: int = 0
    split: int = 1  # SS
    reduce: str = "sum"  # P

    def __str__(self) -> str:
        if self.kind == "S":
            return f"S({self.dim})"
        if self.kind == "SS":
            return f"SS({self.dim},{self.split})"
        if self.kind == "P":
            return f"P({self.reduce})"
        return self.kind


_SPELLINGS = [
    (re.compile(r"^(?:S|Shard)\((?:dim=)?(-?\d+)\)$"), lambda m: Placement("S", int(m[1]))),
    (re.compile(r"^(?:SS|_?StridedShard)\((?:dim=)?(-?\d+),\s*(?:split_factor=)?(\d+)\)$"),
     lambda m: Placement("SS", int(m[1]), int(m[2])) if int(m[2]) > 1 else Placement("S", int(m[1]))),
    (re.compile(r"^(?:R|Replicate\(\))$"), lambda m: Placement("R")),
    (re.compile(r"^(?:Rd|Reduced\(\))$"), lambda m: Placement("Rd")),
    (re.compile(r"^Partial\(\)$"), lambda m: Placement("P", reduce="sum")),
    (re.compile(r"^(?:P|Partial)\((?:reduce_op=)?(sum|avg|max|min)\)$"), lambda m: Placement("P", reduce=m[1])),
    # A vector norm's partial, P(norm2) (PyTorch's _NormPartial(2)): reduce "norm2".
    (re.compile(r"^(?:P\(norm|_NormPartial\((?:norm_type=)?)(-?[0-9.eE+-]+)\)$"),
     lambda m: Placement("P", reduce="norm" + m[1])),
]


def parse_placement(text: str, ndim: int | None = None) -> Placement:
    """A placement in any spelling the scenario format reads; a negative shard dim is wrapped by
    `ndim` when given."""
    t = text.strip()
    for pattern, make in _SPELLINGS:
        m = pattern.match(t)
        if m:
            p = make(m)
            if p.kind in ("S", "SS") and p.dim < 0 and ndim is not None:
                p.dim += ndim
            return p
    raise ValueError(f"unknown placement {text!r}")


def spec_str(spec) -> str:
    return "[" + ", ".join(str(p) for p in spec) + "]"


@dataclass
class Job:
    """One scenario and meshsim's run of it. `doc` is the scenario as written (options already as
    meshsim ran them: see `options`), `result` meshsim's result (meshsim.result/1)."""
    id: str
    scenario: str  # the file
    doc: dict
    result: dict
    values_dir: str
    index: dict = field(default_factory=dict)

    @staticmethod
    def from_json(j: dict) -> "Job":
        with open(os.path.join(j["values_dir"], "index.json")) as f:
            index = json.load(f)
        return Job(j["id"], j["scenario"], j["doc"], j["result"], j["values_dir"], index)

    @property
    def options(self) -> dict:
        return self.result.get("options") or {}

    @property
    def mesh_axes(self) -> list[str]:
        return list(self.doc["mesh"]["axes"])

    @property
    def mesh_shape(self) -> list[int]:
        return list(self.doc["mesh"]["shape"])

    @property
    def world(self) -> int:
        return math.prod(self.mesh_shape)

    def _load(self, rel: str) -> np.ndarray | None:
        path = os.path.join(self.values_dir, rel)
        return np.load(path) if os.path.exists(path) else None

    def _file(self, kind: str, name: str, rank: int | None = None) -> np.ndarray | None:
        for f in self.index.get("files", []):
            if f["kind"] == kind and f["value"] == name and (rank is None or f.get("rank") == rank):
                return self._load(f["path"])
        return None

    def value(self, name: str) -> np.ndarray | None:
        """meshsim's value of `name`, assembled from its locals by its placements."""
        return self._file("value", name)

    def oracle(self, name: str) -> np.ndarray | None:
        return self._file("oracle", name)

    def grad(self, name: str) -> np.ndarray | None:
        """meshsim's gradient of input `name`, assembled."""
        return self._file("grad", name)

    def local(self, name: str, rank: int) -> np.ndarray | None:
        """Rank `rank`'s local tensor of `name` (an input's, as meshsim laid it out)."""
        return self._file("rank", name, rank)

    def placements(self, name: str) -> list[str] | None:
        v = (self.result.get("values") or {}).get(name)
        return None if v is None else v.get("placements")

    def grad_placements(self, name: str) -> list[str] | None:
        g = (self.result.get("grads") or {}).get(name)
        return None if g is None else g.get("placements")

    def ops(self):
        """Every op of the program, local_map bodies and references included."""
        def walk(ops):
            for op in ops:
                yield op
                yield from walk(op.get("body", []))
                yield from walk(op.get("reference", []))
        yield from walk(self.doc.get("program", []))

    def least_dtype(self) -> str:
        """The least precise float dtype the run computes in: the run's, an input's, a created
        value's, a `to`'s or a mixed precision policy's (the comparisons' tolerance follows it)."""
        named = [self.options.get("dtype", "float64")]
        for i in self.doc.get("inputs", []):
            named.append(i.get("dtype", "float"))
            named += list((i.get("mixed_precision") or {}).values())
        named += [op.get("dtype", "float") for op in self.ops()]
        return max((d for d in named if d in FLOAT_DTYPES), key=FLOAT_DTYPES.index)

    def exact(self) -> bool:
        """Whether values must agree bit for bit (docs/semantics.md, "Checks and exactness")."""
        if self.least_dtype() != "float64":
            return False
        if any(i.get("init") == "randn" for i in self.doc.get("inputs", [])):
            return False
        if any(not literal_exact(i.get("init")) for i in self.doc.get("inputs", [])):
            return False
        if any(s & (s - 1) for s in self.mesh_shape):
            return False
        for op in self.ops():
            name = op.get("op")
            if name not in EXACT_OPS:
                return False
            if name in ("add", "sub", "mul") and "value" in op and float(op["value"]) != int(float(op["value"])):
                return False
            if name == "scale" and float(op["value"]) != int(float(op["value"])):
                return False
        return True


def literal_exact(init) -> bool:
    """Whether an input's init keeps a program exact: a tensor literal ({"values": [...]}) only of
    integers of magnitude at most 1024, as meshsim's rule (oracles/check.cpp)."""
    if not isinstance(init, dict) or "values" not in init:
        return True

    def flat(v):
        if isinstance(v, list):
            for x in v:
                yield from flat(x)
        else:
            yield v
    return all(isinstance(x, bool) or (float(x) == int(float(x)) and abs(float(x)) <= 1024) for x in flat(init["values"]))


def compare(what: str, expected: np.ndarray | None, actual: np.ndarray | None, exact: bool,
            dtype: str = "float64") -> dict | None:
    """None when `actual` agrees with meshsim's `expected`; otherwise a difference naming the first
    element that differs most, with both numbers. NaN agrees with NaN at the same place."""
    if expected is None or actual is None:
        if expected is None and actual is None:
            return None
        return {"kind": "missing", "what": what,
                "detail": f"{what}: meshsim has {'no value' if expected is None else 'a value'}, "
                          f"the other system {'none' if actual is None else 'one'}"}
    e = np.asarray(expected)
    a = np.asarray(actual)
    if e.shape != a.shape:
        return {"kind": "shape", "what": what, "meshsim": list(e.shape), "other": list(a.shape),
                "detail": f"{what}: shape {list(a.shape)}, meshsim {list(e.shape)}"}
    if e.dtype == np.bool_ or a.dtype == np.bool_ or np.issubdtype(e.dtype, np.integer):
        bad = e != a
        if not bad.any():
            return None
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return {"kind": "value", "what": what, "index": list(idx), "meshsim": e[idx].item(), "other": a[idx].item(),
                "detail": f"{what}{list(idx)}: {a[idx].item()}, meshsim {e[idx].item()}"}
    e = e.astype(np.float64)
    a = a.astype(np.float64)
    both_nan = np.isnan(e) & np.isnan(a)
    same_inf = np.isinf(e) & (e == a)
    finite = np.abs(e[np.isfinite(e)])
    scale = max(1.0, float(finite.max()) if finite.size else 1.0)
    tol = 0.0 if exact else RTOL.get(dtype, 1e-9) * scale
    with np.errstate(invalid="ignore"):
        diff = np.where(both_nan | same_inf, 0.0, np.abs(e - a))
    diff = np.where(np.isnan(diff), np.inf, diff)
    if not (diff > tol).any():
        return None
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape)) if diff.ndim else ()
    n_bad = int((diff > tol).sum())
    return {"kind": "value", "what": what, "index": list(idx), "meshsim": float(e[idx]), "other": float(a[idx]),
            "detail": f"{what}{list(idx)}: {float(a[idx])!r}, meshsim {float(e[idx])!r} "
                      f"(|diff| {float(diff[idx]):.3g} > {'0, exact' if exact else f'{tol:.3g}'}; "
                      f"{n_bad} of {diff.size} elements differ)"}


def with_cause(d: dict, cause: str, causes: dict[str, str]) -> dict:
    """Labels difference `d` with its cause (an id of known_differences.json) and the backend's
    explanation of it (its CAUSES table)."""
    d["cause"] = cause
    d["explanation"] = causes[cause]
    return d


class NotComparable(Exception):
    """The scenario has no equivalent in the other system; the message says why."""


def report(job: Job, system: str, version: str, differences: list[dict], compared: dict,
           notes: list[str] | None = None) -> dict:
    verdict = "differ" if differences else "agree"
    return {"id": job.id, "scenario": job.scenario, "system": system, "version": version, "verdict": verdict,
            "differences": differences, "compared": compared, "notes": notes or []}


def main(system: str, version: Callable[[], str], check: Callable[[Job], dict]) -> int:
    """The backend's entry: reads JOBS.json (argv[1]), prints one report per job, one per line.
    `check(job)` returns a report (`report(...)`) or raises NotComparable; any other exception is
    the translator's failure and is reported as verdict "error" with its message."""
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    ver = version()
    for j in jobs:
        job = Job.from_json(j)
        try:
            out = check(job)
        except NotComparable as e:
            out = {"id": job.id, "scenario": job.scenario, "system": system, "version": ver,
                   "verdict": "not_comparable", "reason": str(e), "differences": [], "compared": {}, "notes": []}
        except Exception as e:  # the translator's own failure: reported, never hidden
            last = traceback.extract_tb(e.__traceback__)[-1]
            out = {"id": job.id, "scenario": job.scenario, "system": system, "version": ver, "verdict": "error",
                   "reason": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                             f"({os.path.basename(last.filename)}:{last.lineno})",
                   "differences": [], "compared": {}, "notes": []}
        print(json.dumps(out), flush=True)
    return 0

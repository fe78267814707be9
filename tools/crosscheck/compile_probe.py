"""compile_probe: which collectives PyTorch's DTensor runs for a meshsim scenario, eagerly and
under torch.compile (AOTAutograd), next to meshsim's prediction in four modes. A measurement
tool for docs/findings.md (issue #33, item 6; seed 003, open question 3), not a test: ctest does
not run it, and nothing fails when the systems differ.

    build/crosscheck/venv-pytorch/bin/python tools/crosscheck/compile_probe.py [--json OUT] FILES...

For each scenario FILE:

- meshsim: `meshsim run FILE --json` under `--option semantics=meshsim` and `semantics=pytorch`
  (DTensor's rules as released), each with `--option redistribute=above_autograd` and
  `below_autograd`; each collective listed with its phase, op, mesh axis, bytes per rank and the
  program op it is charged to.
- PyTorch eager: the scenario translated to a DTensor program by pytorch_backend.py's translator
  (imported, its OPS table and Program class; only inputs and the op loop are this file's), run on
  a fake process group ("fake" backend, FakeStore, rank 0 of the mesh's world size, no
  LocalTensorMode: rank 0 alone shows which collectives run; values are not compared). The
  collectives are recorded by a CommDebugMode (forward and backward each under its own), extended
  to note each collective's process group (hence its mesh axis) and input size. A forward
  collective is charged to the program op that ran it; a backward one to the program op whose
  output's grad_fn ran last before it (a pre-hook per op).
- PyTorch explicit (where meshsim's above run makes implicit redistributions): the same program
  with each of them written as a `DTensor.redistribute` of the operand before its op, i.e. the
  Redistribute autograd.Function that seed 003 would insert from `__torch_function__`, done by
  hand; eager and compiled as below.
- PyTorch compiled: the same program as one function of the inputs, `torch.compile(fullgraph=True)`
  (falling back to graph breaks, which are reported) with an `aot_autograd` backend whose
  fw_compiler and bw_compiler record the FX graphs AOTAutograd hands them and run them as they are
  (aot_eager). Each program op runs under `torch.fx.traceback.annotate({"program_op": path})`, which
  AOTAutograd copies onto the forward and backward nodes it traces from that op; the collectives are
  the graphs' `_c10d_functional` / `_dtensor` collective nodes (each `wait_tensor` is counted
  separately and only checked), with their group name and input size.
- An imported scenario (`imported.file`, `imported.function`, `imported.mesh`) is also compiled from
  its model: FUNC(mesh) -> (model, inputs, loss_fn) on an init_device_mesh of the fake process group,
  `loss_fn(model(*inputs))` eager and compiled; those collectives are listed as one row, `(model)`.

Each measurement (program, explicit, model) runs in a fresh Python process (see `isolated`), and
dynamo is never run under CommDebugMode (a dispatch mode stops it from tracing): compiled
collectives are read from the graphs.

Bytes per rank follow meshsim's convention (docs/semantics.md, Communication volume): for B bytes
in full over n ranks, all_gather, reduce_scatter and all_to_all (n-1)/n * B, all_reduce 2(n-1)/n * B.
Output is deterministic: no timings, rows in program order. Needs torch 2.15 (the crosscheck venv).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import math
import os
import subprocess
import sys
import warnings
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.fx.traceback as fx_traceback  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor  # noqa: E402
from torch.distributed.tensor.debug import CommDebugMode  # noqa: E402

import common  # noqa: E402
import pytorch_backend as pb  # noqa: E402

logging.getLogger("torch").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

# meshsim's modes: its own rules above and below autograd, and DTensor's rules (semantics=pytorch:
# Redistribute.backward as PyTorch's, no gradient hook) above and below.
MODES = (("above", ["--option", "semantics=meshsim", "--option", "redistribute=above_autograd"]),
         ("below", ["--option", "semantics=meshsim", "--option", "redistribute=below_autograd"]),
         ("pytorch above", ["--option", "semantics=pytorch", "--option", "redistribute=above_autograd"]),
         ("pytorch below", ["--option", "semantics=pytorch", "--option", "redistribute=below_autograd"]))
# The collective ops of the graphs and of eager dispatch, by their name in meshsim's terms.
COLLECTIVES = {
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_reduce": "all_reduce", "all_reduce_": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_to_all_single": "all_to_all", "shard_dim_alltoall": "all_to_all", "broadcast": "broadcast",
    # c10d's in-place ops (dist.all_gather_into_tensor etc., as FSDP2 calls them)
    "_allgather_base_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather", "allgather_": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter", "allreduce_": "all_reduce", "alltoall_base_": "all_to_all",
    "broadcast_": "broadcast",
}
WAIT = "wait_tensor"


# --- meshsim ---------------------------------------------------------------------------------------

def run_meshsim(exe: str, path: str) -> dict:
    """meshsim's result in each mode: {mode: {"status", "collectives": [...], "grads", "result"}}."""
    out = {}
    for mode, opts in MODES:
        proc = subprocess.run([exe, "run", path, "--json", *opts], capture_output=True, text=True, cwd=ROOT)
        try:
            res = json.loads(proc.stdout)
        except json.JSONDecodeError:
            out[mode] = {"status": "error", "error": (proc.stderr or proc.stdout).strip()[:300], "collectives": []}
            continue
        colls = [{"phase": c["phase"], "op": c["op"], "axis": c.get("axis", ""), "bytes": int(c.get("bytes", 0)),
                  "program_op": c.get("program_op") or ""} for c in res.get("collectives") or []]
        grads = {k: v.get("placements") for k, v in (res.get("grads") or {}).items()}
        err = res.get("error")
        out[mode] = {"status": res.get("status"), "collectives": colls, "grads": grads, "result": res,
                     "error": None if not err else f"{err.get('kind')}: {(err.get('message') or '').splitlines()[0]}"}
    return out


# --- collectives as PyTorch runs them -------------------------------------------------------------

class Axes:
    """Process-group names -> meshsim's mesh axis names (one mesh per scenario)."""

    def __init__(self, mesh, names: list[str]):
        self.by_group = {mesh.get_group(i).group_name: names[i] for i in range(mesh.ndim)}
        self.sizes = {names[i]: mesh.size(i) for i in range(mesh.ndim)}

    def axis(self, args) -> str:
        for a in args:
            if isinstance(a, torch.ScriptObject):  # c10d's ops take the ProcessGroup boxed
                a = dist.ProcessGroup.unbox(a)
            if isinstance(a, dist.ProcessGroup):
                a = a.group_name
            if isinstance(a, str) and a in self.by_group:
                return self.by_group[a]
        return "?"


def per_rank_bytes(kind: str, numel: int, itemsize: int, n: int) -> int:
    """meshsim's bytes per rank for a collective whose input holds `numel` elements on each rank."""
    local = numel * itemsize
    full = local * n if kind == "all_gather" else local
    factor = 2 if kind == "all_reduce" else 1
    return factor * (n - 1) * full // n


def collective(kind: str, axis: str, shape, dtype, axes: Axes, phase: str, where: str) -> dict:
    n = axes.sizes.get(axis, 1)
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return {"phase": phase, "op": kind, "axis": axis, "bytes": per_rank_bytes(kind, numel, itemsize, n),
            "program_op": where}


class RecordingCommMode(CommDebugMode):
    """CommDebugMode that also notes each collective's group (mesh axis), input size and the program
    op it is charged to (`self.where`, set by the runner and the backward pre-hooks)."""

    def __init__(self, axes: Axes, phase: str):
        super().__init__()
        self.axes, self.phase, self.where, self.seen = axes, phase, "", []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is NotImplemented or isinstance(func, torch._ops.HigherOrderOperator):
            return out
        name = func._overloadpacket.__name__
        if name in COLLECTIVES and args:
            # c10d's _allgather_base_ / _reduce_scatter_base_ take (output, input, ...), allreduce_ a list
            x = args[1] if name in ("_allgather_base_", "_reduce_scatter_base_") else args[0]
            x = x[0] if isinstance(x, (list, tuple)) and x else x
            if isinstance(x, torch.Tensor):
                self.seen.append(collective(COLLECTIVES[name], self.axes.axis(list(args) + list((kwargs or {}).values())),
                                            x.shape, x.dtype, self.axes, self.phase, self.where))
        return out


def graph_collectives(gm: torch.fx.GraphModule, axes: Axes, phase: str) -> tuple[list[dict], int]:
    """The collective nodes of an AOTAutograd graph (with their program_op annotation) and the count
    of wait_tensor nodes."""
    found, waits = [], 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or not hasattr(node.target, "_overloadpacket"):
            continue
        name = node.target._overloadpacket.__name__
        if name == WAIT:
            waits += 1
        if name not in COLLECTIVES:
            continue
        val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        shape, dtype = (tuple(val.shape), val.dtype) if isinstance(val, torch.Tensor) else ((0,), torch.float64)
        where = (node.meta.get("custom") or {}).get("program_op", "")
        found.append(collective(COLLECTIVES[name], axes.axis(node.args), shape, dtype, axes, phase, where))
    return found, waits


class Recorder:
    """The aot_autograd backend: records every forward and backward graph and runs it as traced."""

    def __init__(self):
        self.graphs: list[tuple[str, torch.fx.GraphModule]] = []

    def compiler(self, phase: str):
        def compile_graph(gm, example_inputs):
            self.graphs.append((phase, gm))
            return gm
        return compile_graph

    def backend(self):
        return aot_autograd(fw_compiler=self.compiler("forward"), bw_compiler=self.compiler("backward"))


# --- the translated program -------------------------------------------------------------------------

class ProbeProgram(pb.Program):
    """pytorch_backend's Program on plain DTensors of rank 0 (no LocalTensorMode): inputs made here,
    placements parsed once (the compiled pass finds them cached, so dynamo never traces the regexes),
    and an op loop that charges collectives to program ops (eager) or annotates them (compiled)."""

    def __init__(self, job: common.Job, run: pb.Run, cache: dict, explicit: dict | None = None):
        super().__init__(job, None, run)
        self.cache = cache
        # {(program_op, operand_index): placements}: meshsim's implicit redistributions, made
        # explicit DTensor.redistribute calls (the Redistribute autograd.Function) before the op
        self.explicit = explicit or {}
        self.comm: RecordingCommMode | None = None
        self.outputs: list[tuple[str, torch.Tensor]] = []

    def placements(self, spec, ndim=None):
        key = (tuple(spec), ndim)
        if key not in self.cache:
            self.cache[key] = super().placements(spec, ndim)
        return self.cache[key]

    def create(self, op, make):
        """A creation op as a user writes it in traced code: the global tensor on every rank as a
        Replicate DTensor (from_local), then cut to the placements (no data moves). The translator's
        distribute_tensor broadcasts from rank 0 (src_data_rank), which dynamo cannot trace."""
        dtype = self.elem_type(op.get("dtype"))
        t = make(dtype).reshape(op["shape"])
        placements = self.placements(op["placements"], len(op["shape"]))
        x = DTensor.from_local(t, self.mesh, [Replicate()] * self.mesh.ndim, run_check=False)
        return x if all(isinstance(p, Replicate) for p in placements) else x.redistribute(self.mesh, placements)

    def make_inputs(self) -> list[DTensor]:
        """Every input with rank 0's local of meshsim's layout (random data, seeded): the global
        tensor distributed as R, redistributed to the placements with Partial read as R, and
        wrapped by from_local with the global shape and the Partial placements."""
        torch.manual_seed(int(self.job.options.get("seed", 0)))
        made = []
        for inp in self.job.doc["inputs"]:
            dtype = self.elem_type(inp.get("dtype"))
            shape, init = list(inp["shape"]), inp.get("init")
            if isinstance(init, dict):
                t = torch.randint(0, int(init["ids"]), shape)
            elif dtype == torch.bool:
                t = torch.randint(0, 2, shape).bool()
            elif dtype == torch.int64:
                t = torch.randint(0, 4, shape)
            else:
                t = torch.randn(shape, dtype=dtype)
            placements = self.placements(inp["placements"], len(shape))
            rep = distribute_tensor(t, self.mesh, [Replicate()] * self.mesh.ndim)
            rep = rep.redistribute(self.mesh, [Replicate() if isinstance(p, Partial) else p for p in placements])
            x = DTensor.from_local(rep.to_local(), self.mesh, placements, run_check=False, shape=rep.shape,
                                   stride=rep.stride())
            if inp.get("requires_grad"):
                x.requires_grad_(True)
            made.append(x)
        return made

    def run_ops(self, ops, env, path, timings=None):
        compiling = torch.compiler.is_compiling()
        for i, op in enumerate(ops):
            here = f"{path}/{i}"
            args = [env[a] for a in op.get("args", [])]
            if not compiling and self.comm is not None:
                self.comm.where = here
            for j, a in enumerate(args):
                if (here, j) in self.explicit and isinstance(a, DTensor):
                    with fx_traceback.annotate({"program_op": here}):
                        args[j] = a.redistribute(self.mesh, self.placements(self.explicit[(here, j)], a.ndim))
            with fx_traceback.annotate({"program_op": here}):
                out = self.op(op, args, here)
            names = op.get("outs", op.get("out"))
            if not isinstance(names, list):
                names, out = [names], out if isinstance(out, (tuple, list)) else [out]
            for name, value in zip(names, out):
                env[name] = value
                if not compiling:
                    self.outputs.append((here, value))

    def program(self, *inputs):
        """The whole scenario as one function of its inputs: the loss (or the last value)."""
        env = {inp["name"]: x for inp, x in zip(self.job.doc["inputs"], inputs)}
        self.run_ops(self.job.doc["program"], env, "/program")
        return env[self.job.doc.get("backward") or self.job.doc["program"][-1]["out"]]


def backward_of(loss: torch.Tensor) -> None:
    loss.backward() if loss.ndim == 0 else loss.backward(torch.ones_like(loss))


def grad_placements(inputs: list, names: list[str]) -> dict:
    out = {}
    for name, x in zip(names, inputs):
        if x.requires_grad:
            g = x.grad
            out[name] = None if g is None else [pb.placement_text(p) for p in g.placements] \
                if isinstance(g, DTensor) else "plain tensor"
    return out


def first_line(e: BaseException) -> str:
    """The exception's type and first line; for a backend's failure, the first line it wraps."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if text.endswith("raised:") and len(lines) > 1:
        text += " " + lines[1]
    return f"{type(e).__name__}: {text[:300]}"


def implicit_redistributions(result: dict) -> dict:
    """meshsim's implicit (forward) redistributions of a run: {(program_op, operand_index): to}.
    One to a Partial placement is left out: DTensor.redistribute refuses R -> Partial (and meshsim
    moves no data for it), so the op's own strategy makes it in PyTorch."""
    return {(r["program_op"], int(r["operand_index"])): r["to"] for r in result.get("implicit") or []
            if r.get("phase", "forward") == "forward" and "to" in r and "operand_index" in r
            and not any(common.parse_placement(p).kind == "P" for p in r["to"])}


def dynamo_user_frame(e: BaseException) -> str:
    """Where in the translator dynamo gave up: the innermost frame outside torch of the trace."""
    where = ""
    for fs in getattr(e, "real_stack", None) or []:
        if os.sep + "torch" + os.sep not in fs.filename:
            where = f"{os.path.basename(fs.filename)}:{fs.lineno} {fs.line or ''}".strip()
    return where


def probe_program(job: common.Job, explicit: dict | None = None, fullgraph: bool = True) -> dict:
    """The translated scenario on PyTorch, eager and compiled (see the module's docstring); with
    `explicit`, those redistributions are made explicit before their ops (seed 003's design by hand)."""
    pb.fresh_world(job.world)
    run = pb.Run()
    cache: dict = {}
    prog = ProbeProgram(job, run, cache, explicit)
    axes = Axes(prog.mesh, job.mesh_axes)
    names = [i["name"] for i in job.doc["inputs"]]
    res: dict = {"eager": {}, "compiled": {}}
    # eager
    try:
        inputs = prog.make_inputs()
        fw = RecordingCommMode(axes, "forward")
        prog.comm = fw
        with fw:
            loss = prog.program(*inputs)
        bw = RecordingCommMode(axes, "backward")
        prog.comm = None
        hooks = []

        def pre_hook(where):
            def hook(grad_outputs):
                bw.where = where
            return hook
        for where, value in prog.outputs:
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                hooks.append(value.grad_fn.register_prehook(pre_hook(where)))
        if loss.requires_grad:
            with bw:
                backward_of(loss)
        for h in hooks:
            h.remove()
        counted = fw.get_total_counts() + bw.get_total_counts()
        res["eager"] = {"collectives": fw.seen + bw.seen, "grads": grad_placements(inputs, names),
                        "comm_debug_mode_total": counted, "notes": sorted(run.notes)}
        if counted != len(fw.seen) + len(bw.seen):
            res["eager"]["notes"].append(f"CommDebugMode counted {counted}, the recorder {len(fw.seen) + len(bw.seen)}")
    except Exception as e:  # noqa: BLE001 - a refusal is a result
        res["eager"] = {"error": first_line(e)}
    # compiled: fresh inputs, the same program object and mesh. A second DeviceMesh equal to the
    # first (as a fresh Program would make) after an eager DTensor run on the first breaks
    # AOTAutograd's partitioner ("Node tangents_2 was invalid, but is output"; PyTorch 2.15).
    torch._dynamo.reset()
    prog.comm, prog.outputs = None, []
    rec = Recorder()
    notes = []
    try:
        inputs = prog.make_inputs()
        try:
            loss = torch.compile(prog.program, backend=rec.backend(), fullgraph=fullgraph)(*inputs)
        except torch._dynamo.exc.Unsupported as e:
            # compiled again with graph breaks by the caller, in a fresh process (a failed trace
            # leaves fake tensors behind: "Mixing fake modes NYI")
            res["compiled"] = {"error": first_line(e), "fullgraph_failed": True,
                               "break_at": dynamo_user_frame(e)}
            return res
        if loss.requires_grad:
            backward_of(loss)
        res["compiled"] = summarize_graphs(rec, axes)
        res["compiled"]["grads"] = grad_placements(inputs, names)
        res["compiled"]["notes"] = notes + ([] if fullgraph else ["compiled with graph breaks (fullgraph=False)"])
        res["compiled"]["graph_breaks"] = int(sum(torch._dynamo.utils.counters["graph_break"].values()))
        res["compiled"]["graph_break_reasons"] = sorted(str(k).splitlines()[0][:160]
                                                         for k in torch._dynamo.utils.counters["graph_break"])
    except Exception as e:  # noqa: BLE001
        res["compiled"] = {"error": first_line(e), "notes": notes}
    return res


def summarize_graphs(rec: Recorder, axes: Axes) -> dict:
    colls, waits, count = [], 0, defaultdict(int)
    for phase, gm in rec.graphs:
        found, w = graph_collectives(gm, axes, phase)
        colls += found
        waits += w
        count[phase] += 1
    out = {"collectives": colls, "graphs": dict(sorted(count.items())), "wait_tensor": waits}
    if waits != len(colls):
        out["notes_waits"] = f"{waits} wait_tensor nodes for {len(colls)} collectives"
    return out


# --- a model, compiled from its Python file -------------------------------------------------------------

def probe_model(info: dict) -> dict:
    """FUNC(mesh) of an imported scenario's model file, eager and compiled, all its collectives
    under one row. FSDP2's hooks run outside dynamo's graphs by default
    (torch._dynamo.config.skip_fsdp_hooks), which is reported with what the graphs hold."""
    path = os.path.join(ROOT, info["file"])
    axes_spec = [kv.split("=") for kv in info["mesh"].split(",")]
    names, shape = [a for a, _ in axes_spec], [int(n) for _, n in axes_spec]
    pb.fresh_world(math.prod(shape))
    spec = importlib.util.spec_from_file_location("probe_model_" + info["function"], path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    func = getattr(module, info["function"])
    mesh = init_device_mesh("cpu", tuple(shape), mesh_dim_names=tuple(names))
    axes = Axes(mesh, names)
    res: dict = {"function": f"{info['file']}:{info['function']}", "mesh": info["mesh"],
                 "skip_fsdp_hooks": bool(getattr(torch._dynamo.config, "skip_fsdp_hooks", False))}
    # loss_parallel()'s backward must run in its context too (its docstring; the importer does so)
    from torch.distributed.tensor.parallel import loss_parallel
    around_backward = loss_parallel if hasattr(module, "loss_parallel") else contextlib.nullcontext

    def step(model, loss_fn, inputs):
        return loss_fn(model(*inputs))
    try:
        torch.manual_seed(0)
        model, inputs, loss_fn = func(mesh)
        fw, bw = RecordingCommMode(axes, "forward"), RecordingCommMode(axes, "backward")
        fw.where = bw.where = "(model)"
        with fw:
            loss = step(model, loss_fn, inputs)
        with bw, around_backward():
            backward_of(loss)
        res["eager"] = {"collectives": fw.seen + bw.seen}
    except Exception as e:  # noqa: BLE001
        res["eager"] = {"error": first_line(e)}
    torch._dynamo.reset()
    rec = Recorder()
    try:
        torch.manual_seed(0)
        model, inputs, loss_fn = func(mesh)
        # no CommDebugMode here: dynamo does not trace a frame while a dispatch mode is active
        compiled = torch.compile(lambda *a: step(model, loss_fn, a), backend=rec.backend())
        loss = compiled(*inputs)
        with around_backward():
            backward_of(loss)
        res["compiled"] = summarize_graphs(rec, axes)
        for c in res["compiled"]["collectives"]:
            c["program_op"] = "(model)"
        breaks = torch._dynamo.utils.counters["graph_break"]
        res["compiled"]["graph_breaks"] = int(sum(breaks.values()))
        res["compiled"]["graph_break_reasons"] = sorted(str(k).splitlines()[0][:160] for k in breaks)
    except Exception as e:  # noqa: BLE001
        res["compiled"] = {"error": first_line(e)}
    return res


# --- the table -------------------------------------------------------------------------------------------

def cell(colls: list[dict]) -> str:
    """`fw all_gather(tp) 288 B` etc., one per (phase, op, axis), counts folded (`2x`)."""
    if not colls:
        return "-"
    agg: dict = {}
    for c in colls:
        key = (0 if c["phase"] == "forward" else 1, c["op"], c["axis"])
        n, b = agg.get(key, (0, 0))
        agg[key] = (n + 1, b + c["bytes"])
    parts = []
    for (ph, op, axis), (n, b) in sorted(agg.items()):
        parts.append(f"{'fw' if ph == 0 else 'bw'} {'' if n == 1 else f'{n}x '}{op}({axis}) {b}")
    return "; ".join(parts)


def op_order(key: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 10**9 for p in key.strip("/").split("/")[1:]) if key.startswith("/") \
        else (10**9, key)


def rows(doc: dict, meshsim: dict, torch_res: dict, per_op: bool, explicit: dict | None = None) -> list[dict]:
    """One row per program op that some side charges a collective to (or one row, `(all ops)`)."""
    sides = {f"meshsim {m}": meshsim[m].get("collectives", []) for m, _ in MODES}
    for kind in ("eager", "compiled"):
        sides[f"pytorch {kind}"] = torch_res.get(kind, {}).get("collectives", [])
    for kind in ("eager", "compiled"):
        if explicit is not None:
            sides[f"pytorch explicit {kind}"] = explicit.get(kind, {}).get("collectives", [])
    keys = sorted({c["program_op"] if per_op else "(all ops)" for cs in sides.values() for c in cs}, key=op_order)
    flat = {}

    def op_name(path: str) -> str:
        node: object = {"program": doc["program"]}
        try:
            for p in path.strip("/").split("/"):
                node = node[int(p)] if isinstance(node, list) else node[p]
            return node["op"]
        except (KeyError, IndexError, ValueError, TypeError):
            return ""
    for key in keys:
        row = {"program_op": key, "op": op_name(key) if per_op else ""}
        for side, cs in sides.items():
            row[side] = cell([c for c in cs if not per_op or c["program_op"] == key])
        flat[key] = row
    return list(flat.values())


def print_torch(label: str, res: dict) -> None:
    for kind in ("eager", "compiled"):
        t = res.get(kind, {})
        if "error" in t:
            print(f"   {label} {kind}: ERROR {t['error']}")
            continue
        extra = f", graphs {t['graphs']}, wait_tensor {t['wait_tensor']}" if kind == "compiled" else ""
        print(f"   {label} {kind}: grads {json.dumps(t.get('grads'), sort_keys=True)}{extra}")
        for n in t.get("notes", []):
            print(f"      note: {n}")


def print_scenario(path: str, r: dict) -> None:
    doc = r["doc"]
    mesh = ", ".join(f"{a}={n}" for a, n in zip(doc["mesh"]["axes"], doc["mesh"]["shape"]))
    print(f"== {path} (mesh {mesh})")
    for mode, _ in MODES:
        m = r["meshsim"][mode]
        extra = f" ({m['error']})" if m.get("error") else ""
        print(f"   meshsim {mode}: {m.get('status')}{extra}; grads {json.dumps(m.get('grads'), sort_keys=True)}")
    if "pytorch_explicit" in r:
        said = ", ".join(f"{x['program_op']} operand {x['operand_index']} -> {common.spec_str(x['to'])}"
                         for x in r["pytorch_explicit"]["redistributions"])
        print(f"   pytorch explicit: meshsim's implicit redistributions (above) as DTensor.redistribute calls: {said}")
    for label, res in (("pytorch", r["pytorch"]), ("pytorch explicit", r.get("pytorch_explicit"))):
        if res is not None:
            print_torch(label, res)

    for per_op in (True, False):
        table = rows(doc, r["meshsim"], r["pytorch"], per_op, r.get("pytorch_explicit"))
        cols = list(table[0].keys()) if table else []
        if not table:
            print("   no collectives on any side")
            break
        print("   | " + " | ".join(cols) + " |")
        for row in table:
            print("   | " + " | ".join(str(row[c]) for c in cols) + " |")
    if "model" in r:
        m = r["model"]
        print(f"   model {m.get('function', '?')} on {m.get('mesh', '?')} (skip_fsdp_hooks={m.get('skip_fsdp_hooks')}):")
        for kind in ("eager", "compiled"):
            t = m.get(kind, {})
            if "error" in t:
                print(f"      {kind}: ERROR {t['error']}")
                continue
            print(f"      {kind}: {cell(t['collectives'])}")
            if kind == "compiled":
                print(f"      compiled graphs {t['graphs']}, graph breaks {t['graph_breaks']}, "
                      f"wait_tensor {t['wait_tensor']}")
                for reason in t.get("graph_break_reasons", []):
                    print(f"         graph break: {reason}")
    print()


def measure(kind: str, path: str, exe: str) -> dict:
    """One measurement of one scenario in this process: "program", "explicit" or "model"."""
    with open(path) as f:
        doc = json.load(f)
    if kind == "model":
        return probe_model(doc["imported"])
    meshsim = run_meshsim(exe, path)
    # Shapes of values come from meshsim's semantics=pytorch run (from_local's global shapes).
    result = meshsim["pytorch above"].get("result") or meshsim["above"].get("result") or {}
    job = common.Job(os.path.basename(path), path, doc, result, "", {})
    kind, _, breaks = kind.partition(":")
    if kind == "program":
        return probe_program(job, fullgraph=not breaks)
    explicit = implicit_redistributions(meshsim["above"].get("result") or {})
    out = probe_program(job, explicit, fullgraph=not breaks)
    out["redistributions"] = [{"program_op": k[0], "operand_index": k[1], "to": v} for k, v in sorted(explicit.items())]
    return out


def isolated(kind: str, path: str, exe: str) -> dict:
    """`measure` in a fresh Python process. Within one process, an eager DTensor run on one mesh
    followed by a compile on another, equal mesh (the next scenario's, or a second program's) makes
    AOTAutograd's partitioner fail ("Node tangents_2 was invalid, but is output"; PyTorch 2.15)."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--meshsim", exe, "--isolated", kind, path],
                          capture_output=True, text=True, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"eager": {"error": f"probe process failed: {tail[:240]}"}, "compiled": {"error": "not run"}}
    out = json.loads(lines[-1])
    failed = out.get("compiled", {})
    if failed.get("fullgraph_failed"):
        again = isolated(kind + ":breaks", path, exe)
        out["compiled"] = again.get("compiled", {})
        out["compiled"].setdefault("notes", []).insert(
            0, f"fullgraph=True fails: {failed['error']} (at {failed.get('break_at') or '?'})")
    return out


def probe(path: str, exe: str, model: bool) -> dict:
    with open(path) as f:
        doc = json.load(f)
    meshsim = run_meshsim(exe, path)
    out = {"doc": doc, "meshsim": meshsim, "pytorch": isolated("program", path, exe)}
    if implicit_redistributions(meshsim["above"].get("result") or {}):
        out["pytorch_explicit"] = isolated("explicit", path, exe)
    if model and isinstance(doc.get("imported"), dict) and doc["imported"].get("system") == "pytorch":
        out["model"] = isolated("model", path, exe)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--meshsim", default=os.path.join(ROOT, "build", "cli", "meshsim"))
    ap.add_argument("--no-model", action="store_true", help="do not compile imported scenarios' models")
    ap.add_argument("--isolated", choices=("program", "explicit", "model", "program:breaks", "explicit:breaks"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.isolated:
        print(json.dumps(measure(a.isolated, a.files[0], a.meshsim), sort_keys=True))
        return 0
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, fake process group, aot_autograd "
          f"(fw/bw compilers that record the graphs), CPU\n")
    report = {}
    for path in a.files:
        r = probe(path, a.meshsim, not a.no_model)
        print_scenario(path, r)
        for m in r["meshsim"].values():
            m.pop("result", None)
        r.pop("doc")
        with open(path) as f:
            r["rows"] = rows(json.load(f), r["meshsim"], r["pytorch"], True, r.get("pytorch_explicit"))
        report[path] = r
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "scenarios": report}, f, indent=1, sort_keys=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The PyTorch backend of crosscheck: runs a meshsim scenario on PyTorch's own DTensor, every rank in
one process under LocalTensorMode, and compares placements, values and input gradients with
meshsim's run under `--option semantics=pytorch` (DTensor's rules as released).

    python pytorch_backend.py JOBS.json      (see common.py: one JSON report per job, per line)

How a scenario becomes a PyTorch program:

- The mesh is a DeviceMesh of the scenario's shape and axis names over a fake process group of
  the mesh's world size, made afresh for each job (see `fresh_world`).
- Every input is made from meshsim's own per-rank locals with `DTensor.from_local(..., shape=,
  stride=)`, so uneven shards and meshsim's uneven splits of Partial inputs are reproduced bit for
  bit. Placements map one to one (`S(d)` Shard, `SS(d,k)` _StridedShard, `R` Replicate, `P(op)`
  Partial), but meshsim's Reduced `Rd`, which PyTorch cannot spell, becomes Replicate.
- Each op becomes the DTensor call a user would write (`OPS` below); `to_local` and everything
  computed from it is plain local code on LocalTensors, whose collectives are
  torch.distributed._functional_collectives (with their registered autograd); a `local_map` is
  torch.distributed.tensor.experimental.local_map with the body as plain local code.
- `backward` calls `.backward()` on the loss and collects each input's `.grad`.

Each difference names, where it is understood, its `cause` (a key of CAUSES) with an
`explanation` citing the PyTorch source, and for values and gradients which side meshsim's
single-device oracle agrees with (`oracle_agrees_with`).

What cannot be compared raises common.NotComparable with the reason (a planted bug, Functions of
the user's own, options with no PyTorch meaning, too many ranks). A PyTorch exception is reported
as a difference of kind "error" at the op's JSON path; when meshsim refused the same op, both
refuse, which is agreement (noted).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import pytorch_train  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode  # noqa: E402
from torch.distributed.tensor import DeviceMesh, DTensor, Partial, Replicate, Shard, distribute_tensor  # noqa: E402
from torch.distributed.tensor.experimental import local_map  # noqa: E402
from torch.distributed.tensor._ops._mask_buffer import MaskBuffer  # noqa: E402
from torch.distributed.tensor.placement_types import _MaskPartial, _StridedShard  # noqa: E402
from torch.distributed.tensor._ops._math_ops import _NormPartial  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

SYSTEM = "pytorch"
# LocalTensorMode runs every op once per rank in Python; past this many ranks a scenario takes
# minutes (examples/scale/fsdp_4096.json has 4096).
MAX_RANKS = 64
# The run's float type (options.dtype); int64 and bool inputs keep theirs.
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Where the tensors live: "cpu" (the default), or "cuda" with `crosscheck --device cuda` (the
# ranks' locals on one GPU under LocalTensorMode; scripts/gpu_check.sh). Tensors made without a
# device (creation ops, offsets) follow torch's default device, set here.
DEVICE = os.environ.get("MESHSIM_CROSSCHECK_DEVICE", "cpu")
if DEVICE != "cpu":
    torch.set_default_device(DEVICE)

# PyTorch logs a warning per multi-axis redistribution and per rank; they are noise here.
logging.getLogger("torch.distributed").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")


def version_fn() -> str:
    return torch.__version__


# --- placements ----------------------------------------------------------------------------------

def to_torch_placement(text: str, ndim: int | None = None):
    """meshsim's placement (any spelling) as PyTorch's; Reduced has none and becomes Replicate."""
    p = common.parse_placement(text, ndim)
    if p.kind == "S":
        return Shard(p.dim)
    if p.kind == "SS":
        return _StridedShard(p.dim, split_factor=p.split)
    if p.kind == "P":
        return Partial(p.reduce)
    return Replicate()


def placement_text(p) -> str:
    """PyTorch's placement in meshsim's spelling (a _MaskPartial, embedding's, is a P(sum))."""
    if isinstance(p, _StridedShard):
        return f"SS({p.dim},{p.split_factor})"
    if isinstance(p, Shard):
        return f"S({p.dim})"
    if isinstance(p, _NormPartial):  # a vector norm's partial: meshsim's P(norm2)
        return f"P(norm{float(p.norm_type):g})"
    if isinstance(p, Partial):
        return f"P({p.reduce_op})"
    if isinstance(p, Replicate):
        return "R"
    return type(p).__name__


def meshsim_as_pytorch(spec: list[str] | None) -> list[str] | None:
    """meshsim's placements as PyTorch can hold them: Rd read as R, shard dims as printed."""
    if spec is None:
        return None
    return ["R" if s == "Rd" else str(common.parse_placement(s)) for s in spec]


# --- the process group and the mesh ---------------------------------------------------------------

def fresh_world(size: int) -> None:
    """A new fake process group of `size` ranks for each job (LocalTensorMode simulates every
    collective on it; making one takes well under a millisecond). A process group kept across jobs
    keeps the sub-groups of earlier meshes' dims, and a later mesh of the same world size but another
    shape can pick one up: after a [4, 1] mesh, a [2, 2] mesh's P(avg) axis reduced over a group of
    one rank (full_tensor() gave rank 0's part)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)


def rank_coordinates(shape: list[int], rank: int) -> list[int]:
    """A rank's coordinate on each mesh axis (ranks are row-major over the axes)."""
    return [int(c) for c in np.unravel_index(rank, shape)]


# --- what a run gives ------------------------------------------------------------------------------

@dataclass
class Run:
    """What `execute` hands `check`: every DTensor value (its placements in meshsim's spelling and
    its global data), every input gradient, and PyTorch's first refusal (JSON path, message)."""
    values: dict[str, tuple[list[str], np.ndarray]] = field(default_factory=dict)
    grads: dict[str, tuple[list[str] | None, np.ndarray | None]] = field(default_factory=dict)
    error: tuple[str, str] | None = None
    notes: list[str] = field(default_factory=list)
    # Training steps (pytorch_train.py): differences after the steps, and how many values compared.
    train_diffs: list[dict] = field(default_factory=list)
    train_compared: int = 0


class OpFailed(Exception):
    """PyTorch raised at the op at `path` (the innermost one, local_map bodies included)."""

    def __init__(self, path: str, error: BaseException):
        super().__init__(f"{path}: {error}")
        self.path = path
        self.error = error


class Refusal(ValueError):
    """What a real run of PyTorch refuses but LocalTensorMode would let through or fail on in its
    own way (collectives of unequal pieces): raised by the translator itself, in PyTorch's stead."""


def uneven_locals(args: list) -> bool:
    """Whether some argument is a LocalTensor whose ranks hold locals of different shapes."""
    return any(isinstance(a, LocalTensor) and len({tuple(t.shape) for t in a._local_tensors.values()}) > 1
               for a in args)


def first_line(e: BaseException) -> str:
    """The exception's type and first line, and where in torch it was raised (file:function),
    which is what names a PyTorch bug whose message says little (`KeyError: 0`)."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    root = e
    while (root.__cause__ or root.__context__) is not None:  # DTensor re-raises a strategy's KeyError
        root = root.__cause__ or root.__context__
    tb, where = root.__traceback__, None
    while tb is not None:
        code = tb.tb_frame.f_code
        if os.sep + "torch" + os.sep in code.co_filename:
            where = f"{code.co_filename.split(os.sep + 'torch' + os.sep, 1)[1]}:{code.co_name}"
        tb = tb.tb_next
    return f"{type(e).__name__}: {line}" + (f" (raised in torch/{where})" if where else "")


def scalar(v) -> float:
    """A scenario number: a JSON number, "inf" or "-inf"."""
    return float(v)


def bound(v, x):
    """clamp's min or max: absent, or of int64 data an int (a float bound would promote the result)."""
    if v is None:
        return None
    return int(v) if not x.dtype.is_floating_point else float(v)


def clamp(op: dict, x):
    """torch.clamp; under CLAMP_ON_BOUNDS with the gradient passing on the bounds too, as libtorch
    1.13's clamp_backward (meshsim's kernels and oracle), where PyTorch 2.15's gives 0 there."""
    lo, hi = bound(op.get("min"), x), bound(op.get("max"), x)
    y = torch.clamp(x, min=lo, max=hi)
    if not CLAMP_ON_BOUNDS or not x.dtype.is_floating_point:
        return y
    inside = None
    for keep in ([x >= lo] if lo is not None else []) + ([x <= hi] if hi is not None else []):
        inside = keep if inside is None else inside & keep
    return torch.where(inside, x, y.detach())


# Reruns only: clamp's gradient passes on its bounds (clamp_bound_gradient).
CLAMP_ON_BOUNDS = False


def arange(op: dict, dtype):
    """arange: start + step * i in row-major order (its shape's elements), or torch.arange(start, end,
    step) where the scenario gives end (then its shape may be left off)."""
    start, step = op.get("start", 0), op.get("step", 1)
    if "end" in op:
        return torch.arange(start, op["end"], step, dtype=torch.float64).to(dtype)
    return (torch.arange(math.prod(op["shape"]), dtype=torch.float64) * step + start).to(dtype)


# --- local collectives (plain local code: to_local results and local_map bodies) -----------------

class _LocalSquare(torch.autograd.Function):
    """meshsim's built-in `local_square`: x * x on each rank's local, backward 2 x g."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class _OpaqueAllReduce(torch.autograd.Function):
    """meshsim's built-in `opaque_all_reduce`: an all_reduce(sum) kernel autograd cannot see into,
    whose backward is the identity (sim/builtin_functions.cpp, OpaqueAllReduce)."""

    @staticmethod
    def forward(ctx, x, group):
        return funcol.all_reduce(x, "sum", group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _AllReduceKeepLocal(torch.autograd.Function):
    """meshsim's built-in `all_reduce_keep_local`: two outputs, the all_reduce(sum) kernel's and the
    local kept beside it; backward the sum of the two cotangents (OpaqueAllReduceKeepLocal)."""

    @staticmethod
    def forward(ctx, x, group):
        return funcol.all_reduce(x, "sum", group), x.clone()

    @staticmethod
    def backward(ctx, g_sum, g_kept):
        if g_sum is None:
            return g_kept, None
        return (g_sum if g_kept is None else g_sum + g_kept), None


FUNCTIONS = {
    "local_square": lambda x, group: _LocalSquare.apply(x),
    "all_reduce_keep_local": lambda x, group: list(_AllReduceKeepLocal.apply(x, group)),
    "opaque_all_reduce": lambda x, group: _OpaqueAllReduce.apply(x, group),
    "opaque_all_reduce_unregistered": lambda x, group: _OpaqueAllReduce.apply(x, group),
}


# --- the translator ------------------------------------------------------------------------------

class Program:
    """One job's program on PyTorch: the mesh, the values by name, and one method per op."""

    def __init__(self, job: common.Job, mode: LocalTensorMode, run: Run):
        self.job = job
        self.mode = mode
        self.run = run
        self.dtype = DTYPES[job.options.get("dtype", "float64")]
        self.mesh = DeviceMesh(DEVICE, torch.arange(job.world, device="cpu").reshape(job.mesh_shape),
                               mesh_dim_names=tuple(job.mesh_axes))
        self.env: dict[str, torch.Tensor] = {}
        self.inputs: dict[str, DTensor] = {}
        # global data of values whose placements can be reduced only once (see `freeze`)
        self.frozen: dict[str, np.ndarray] = {}
        self._noted: set[str] = set()

    def note(self, text: str) -> None:
        if text not in self._noted:
            self._noted.add(text)
            self.run.notes.append(text)

    # -- inputs --

    def elem_type(self, name: str | None) -> torch.dtype:
        return {"int64": torch.int64, "bool": torch.bool, **DTYPES}.get(name or "float", self.dtype)

    def placements(self, spec: list[str], ndim: int | None = None) -> list:
        if "Rd" in spec or "Reduced()" in spec:
            self.note("Rd has no PyTorch spelling: it runs as Replicate, and meshsim's Rd is compared as R")
        return [to_torch_placement(s, ndim) for s in spec]

    def make_inputs(self) -> None:
        """Every input as meshsim laid it out: its locals, its placements, its global shape."""
        for i, inp in enumerate(self.job.doc["inputs"]):
            name = inp["name"]
            dtype = self.elem_type(inp.get("dtype"))
            meta = (self.job.result.get("values") or {}).get(name) or {}
            shape = meta.get("shape")
            try:
                placements = self.placements(inp["placements"], len(shape) if shape is not None else len(inp["shape"]))
                if self.job.local(name, 0) is not None and shape is not None:
                    loc = self.mode.rank_map(
                        lambda r: torch.from_numpy(np.array(self.job.local(name, r))).to(DEVICE, dtype))
                    x = DTensor.from_local(loc, self.mesh, placements, run_check=False,
                                           shape=torch.Size(shape), stride=contiguous_stride(shape))
                else:
                    x = self.generated_input(inp, dtype, placements)
                if inp.get("requires_grad"):
                    x.requires_grad_(True)
            except Exception as e:  # noqa: BLE001 - PyTorch's refusal is a result
                raise OpFailed(f"/inputs/{i}", e) from e
            self.env[name] = x
            self.inputs[name] = x

    def generated_input(self, inp: dict, dtype: torch.dtype, placements: list) -> DTensor:
        """An input meshsim wrote no locals of (its run refused the scenario): small integers of
        the input's shape, distributed by PyTorch itself, only to see whether PyTorch refuses too."""
        self.note("meshsim kept no tensors (it refused the scenario): inputs are PyTorch's own small "
                  "integers, and only refusals are compared")
        gen = torch.Generator().manual_seed(0)  # drawn on the CPU on either device: the same data
        shape = inp["shape"]
        init = inp.get("init", "int")
        with self.mode.disable():
            if isinstance(init, dict):
                t = torch.randint(0, int(init["ids"]), shape, generator=gen, device="cpu")
            elif dtype == torch.bool:
                t = torch.randint(0, 2, shape, generator=gen, device="cpu").bool()
            else:
                t = torch.randint(-4, 5, shape, generator=gen, device="cpu").to(dtype)
            t = t.to(DEVICE)
        rep = DTensor.from_local(self.mode.rank_map(lambda r: t.clone()), self.mesh,
                                 [Replicate()] * self.mesh.ndim, run_check=False)
        if not inp.get("from_local"):  # shards cut by PyTorch; a Partial axis's parts are replicas
            rep = rep.redistribute(self.mesh, [Replicate() if p.is_partial() else p for p in placements])
        return DTensor.from_local(rep.to_local(), self.mesh, placements, run_check=False,
                                  shape=rep.shape, stride=rep.stride())

    # -- running --

    def run_ops(self, ops: list[dict], env: dict, path: str, timings: list | None = None) -> None:
        for i, op in enumerate(ops):
            here = f"{path}/{i}"
            args = [env[a] for a in op.get("args", [])]
            start, start_cpu = time.perf_counter(), time.process_time()
            try:
                out = self.op(op, args, here)
            except (OpFailed, common.NotComparable):
                raise
            except NotImplementedError as e:
                raise common.NotComparable(f"{here}: op {op['op']}: {e}") from e
            except Refusal as e:
                raise OpFailed(here, e) from e
            except Exception as e:  # noqa: BLE001 - PyTorch's refusal is a result
                if uneven_locals(args):
                    raise common.NotComparable(
                        f"{here}: op {op['op']} on local tensors of different shapes over the ranks: LocalTensorMode "
                        f"cannot run it ({first_line(e)}), where each rank of a real run would run its own") from e
                raise OpFailed(here, e) from e
            if timings is not None:
                if DEVICE != "cpu":
                    torch.cuda.synchronize()  # the op's kernels finished, not only launched
                timings.append((op["op"], time.perf_counter() - start, time.process_time() - start_cpu))
            names = op.get("outs", op.get("out"))
            if isinstance(names, list):
                if len(out) != len(names):
                    raise OpFailed(here, ValueError(f"{op['op']} gives {len(out)} results, the scenario names {len(names)}"))
            else:
                names, out = [names], out if isinstance(out, (tuple, list)) else [out]
            for name, value in zip(names, out):
                env[name] = value
                try:
                    self.freeze(name, value)
                except Exception as e:  # noqa: BLE001 - PyTorch cannot reduce the op's result
                    if simulation_artifact(e):
                        raise common.NotComparable(
                            f"{here}: LocalTensorMode cannot reduce {name} ({first_line(e)}), an artifact of "
                            "running every rank in one process") from e
                    raise OpFailed(here, RuntimeError(f"full_tensor() of {name} fails: {first_line(e)}")) from e

    def freeze(self, name: str, value) -> None:
        """Reads the global data of a value with a _MaskPartial placement (embedding's
        vocab-parallel output) now: its reduction consumes the placement's mask buffer, so after
        a later op has reduced it, full_tensor() fails (placement_types.py, _MaskPartial._reduce_value)."""
        if isinstance(value, DTensor) and any(isinstance(p, _MaskPartial) for p in value.placements):
            self.frozen[name] = global_data(self, value)

    def op(self, op: dict, args: list, path: str):
        """One op on PyTorch: its value, or a list of values (split, chunk, a local_map's returns)."""
        name = op["op"]
        if name == "local_map":
            return self.local_map(op, args, path)
        if name == "call":
            return self.call(op, args)
        fn = OPS.get(name)
        if fn is None:
            raise NotImplementedError(NOT_COMPARABLE.get(name, "no PyTorch translation"))
        return fn(self, op, *args)

    def group(self, op: dict):
        """The (mesh, axis index) group funcol takes for a collective over `op["axis"]`."""
        return (self.mesh, self.job.mesh_axes.index(op["axis"]))

    def call(self, op: dict, args: list):
        fn = FUNCTIONS.get(op["function"])
        if fn is None:
            raise NotImplementedError(f"Function {op['function']!r} exists only in meshsim")
        if len(args) != 1:
            raise ValueError(f"call {op['function']} takes 1 argument, got {len(args)}")
        group = self.group(op) if "axis" in op else None
        return fn(args[0], group)

    def reduced_grad(self, name: str, placements):
        """With REDUCED_GRAD_AS_PARTIAL, the gradient placements that spell the cotangent of
        `name`'s Rd axes, Partial(sum), the rest as `placements`; otherwise None (PyTorch's
        default)."""
        spec = self.job.placements(name)
        if not REDUCED_GRAD_AS_PARTIAL or placements is None or not spec or "Rd" not in spec:
            return None
        return tuple(Partial() if m == "Rd" else p for m, p in zip(spec, placements))

    def local_map(self, op: dict, args: list, path: str):
        """torch.distributed.tensor.experimental.local_map with the body as plain local code:
        PyTorch's local_map keeps no variance (varying/reduced) sets."""
        if op.get("check_variance"):
            self.note("local_map check_variance: true: meshsim tracks variance (inserting mark_varying and casts); "
                      "PyTorch's local_map runs the body untracked (spmd_types=True needs the spmd_types package)")
        names = op["args"]
        in_spec = op.get("in_placements")
        in_pl = None
        if in_spec is not None:
            in_pl = tuple(tuple(self.placements(s, a.ndim)) for s, a in zip(in_spec, args))
        out_pl = tuple(tuple(self.placements(s)) for s in op["out_placements"])

        def body(*locals_):
            scope = dict(zip(names, locals_))
            self.run_ops(op["body"], scope, f"{path}/body")
            outs = tuple(scope[r] for r in op["returns"])
            for r, v in zip(op["returns"], outs):
                if uneven_locals([v]):
                    raise OpFailed(path, Refusal(
                        f"local_map returns locals of {r} in different shapes over the ranks; "
                        "its DTensor.from_local infers each rank's global shape from its own local"))
            return outs

        in_grad = None
        if op.get("in_grad_placements") is not None:  # the scenario's own spelling, as PyTorch's
            in_grad = tuple(tuple(self.placements(s, a.ndim)) for s, a in zip(op["in_grad_placements"], args))
        elif REDUCED_GRAD_AS_PARTIAL:
            given = in_pl or tuple(tuple(a.placements) if isinstance(a, DTensor) else None for a in args)
            in_grad = tuple(self.reduced_grad(n, g) or g for n, g in zip(names, given))
        fn = local_map(body, out_placements=out_pl, in_placements=in_pl, in_grad_placements=in_grad,
                       device_mesh=self.mesh, redistribute_inputs=True)
        return tuple(fn(*args))

    # -- creation --

    def create(self, op: dict, make) -> DTensor:
        """A creation op: the global tensor made by `make(dtype)` on every rank, laid out by
        distribute_tensor (as torch.distributed.tensor.zeros/ones/full do)."""
        dtype = self.elem_type(op.get("dtype"))
        t = make(dtype)
        shape = op.get("shape", list(t.shape))  # arange's 1-D form leaves it off
        t = t.reshape(shape)
        if "placements" not in op:  # local code's (a local_map body, or after to_local): a plain tensor
            return t
        return distribute_tensor(t, self.mesh, self.placements(op["placements"], len(shape)))


def contiguous_stride(shape: list[int]) -> tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(stride))


def reduced_dims(op, x):
    """A reduction's dims: every dim when `dim` is absent or [], else the one or the list."""
    d = op.get("dim")
    return list(range(x.ndim)) if d is None or d == [] else [d] if isinstance(d, int) else list(d)


def reduction(fn):
    """sum/mean/amax/amin over `dim`: one dim, a list, or every dim (absent or []), `keepdim`."""
    def run(p, op, x):
        d = op.get("dim")
        dims = list(range(x.ndim)) if d is None or d == [] else [d] if isinstance(d, int) else list(d)
        return fn(x, dim=dims, keepdim=bool(op.get("keepdim", False)))
    return run


def binary(fn):
    """add/sub/mul/div of two operands, or of one and the scalar `value` (a whole value against
    int64 data as a Python int, so that integer arithmetic stays int64 as meshsim's does)."""
    def run(p, op, a, b=None):
        if "value" in op:
            if b is not None:
                raise ValueError(f"{op['op']} takes 1 argument (with a scalar \"value\"), got 2")
            v = scalar(op["value"])
            if not a.is_floating_point() and a.dtype != torch.bool and v.is_integer():
                v = int(v)
            return fn(a, v)
        return fn(a, b)
    return run


def all_to_all(p: Program, op: dict, x: torch.Tensor, input_split_sizes=None, output_split_sizes=None) -> torch.Tensor:
    """all_to_all {split_dim, concat_dim}: piece j of split_dim goes to member j, and the pieces a
    member receives are joined along concat_dim in member order. funcol's all_to_all_single moves
    pieces of dim 0, so split_dim is moved to the front around it. With split sizes (int64 local
    tensors of the body), all_to_all_single with the lists expert-parallel code passes: the
    tensors' `tolist()`, one int per rank under LocalTensorMode; its autograd moves the gradient
    back with the sizes swapped."""
    group = p.group(op)
    if input_split_sizes is not None:
        return funcol.all_to_all_single_autograd(x, output_split_sizes.tolist(), input_split_sizes.tolist(), group)
    n = p.job.mesh_shape[group[1]]
    split, concat = op.get("split_dim", 0) % x.ndim, op.get("concat_dim", 0) % x.ndim
    equal_pieces(p, op, x, split, "all_to_all")
    front = x.movedim(split, 0).contiguous()
    got = funcol.all_to_all_single_autograd(front, None, None, group).movedim(0, split)
    return torch.cat(torch.chunk(got, n, dim=split), dim=concat)


def local_offsets(p: Program, op: dict, extent: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank's [start, end) of a dim of `extent` chunked over `op["axis"]` (torch.chunk)."""
    axis = p.job.mesh_axes.index(op["axis"])
    n = p.job.mesh_shape[axis]
    c = -(-extent // n)

    def bound(r: int, k: int) -> torch.Tensor:
        return torch.tensor(min(extent, (rank_coordinates(p.job.mesh_shape, r)[axis] + k) * c))
    return p.mode.rank_map(lambda r: bound(r, 0)), p.mode.rank_map(lambda r: bound(r, 1))


def embedding(p: Program, op: dict, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.embedding; in a body with {axis, vocab}, the vocab-parallel lookup of the rank's rows
    (ids outside its range give zeros), as PyTorch's _MaskPartial does it in local code."""
    if "axis" not in op:
        return F.embedding(ids, weight)
    start, end = local_offsets(p, op, int(op["vocab"]))
    outside = (ids < start) | (ids >= end)
    local_ids = torch.where(outside, torch.zeros_like(ids), ids - start)
    return F.embedding(local_ids, weight) * (~outside).unsqueeze(-1).to(weight.dtype)


def nll_loss(p: Program, op: dict, logp: torch.Tensor, target: torch.Tensor, weight=None) -> torch.Tensor:
    """F.nll_loss (with its class weight); in a body with {axis, classes}, the class-parallel pick of
    the targets in the rank's class range (0 elsewhere), summed or averaged over the kept targets, or
    each row's (reduction none)."""
    reduction_ = op.get("reduction", "mean")
    ignore = op.get("ignore_index")
    if "axis" not in op:
        return F.nll_loss(logp, target, weight=weight, reduction=reduction_,
                          ignore_index=-100 if ignore is None else int(ignore))
    start, end = local_offsets(p, op, int(op["classes"]))
    kept = torch.ones_like(target, dtype=torch.bool) if ignore is None else target != int(ignore)
    mine = kept & (target >= start) & (target < end)
    col = torch.where(mine, target - start, torch.zeros_like(target)).unsqueeze(1)
    picked = -logp.gather(1, col).squeeze(1) * mine.to(logp.dtype)
    if reduction_ == "none":
        return picked
    total = picked.sum()
    return total if reduction_ == "sum" else total / kept.sum().to(logp.dtype)


def redistribute(p: Program, op: dict, x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, DTensor):
        raise TypeError("redistribute of a local tensor")
    return x.redistribute(p.mesh, p.placements(op["placements"], x.ndim))


def from_local(p: Program, op: dict, x: torch.Tensor) -> DTensor:
    """DTensor.from_local with the global shape meshsim gives the value (shape= and stride= as a
    user passes them for uneven locals; without them PyTorch assumes even shards)."""
    meta = (p.job.result.get("values") or {}).get(op["out"]) or {}
    shape = meta.get("shape")
    kw = {} if shape is None else {"shape": torch.Size(shape), "stride": contiguous_stride(shape)}
    if op.get("run_check"):
        p.note("from_local run_check: PyTorch broadcasts the coordinate-0 replica of each Replicate axis; "
               "meshsim checks that the replicas agree (docs/semantics.md, Semantics profiles)")
    placements = p.placements(op["placements"], x.ndim)
    if REDUCED_GRAD_AS_PARTIAL and "Rd" in op["placements"]:
        kw["grad_placements"] = tuple(Partial() if m == "Rd" else q for m, q in zip(op["placements"], placements))
    return DTensor.from_local(x, p.mesh, placements, run_check=bool(op.get("run_check", False)), **kw)


# When True, the local collectives run with meshsim's backward convention instead of PyTorch's
# (all_reduce: the identity for sum, a division by n for avg; mark_varying: an all_reduce). `check`
# reruns a program so when its gradients differ, to tell whether the convention is all that differs.
MESHSIM_CONVENTION = False
# When True, a local_map, to_local or from_local of a value meshsim holds as Rd gets Partial(sum) as
# the gradient placement of those axes (in_grad_placements / grad_placements): the spelling of Rd's
# cotangent that PyTorch has. `check` reruns a program so when its gradients differ and it uses Rd in local code.
REDUCED_GRAD_AS_PARTIAL = False


class _AllReduceMeshsimBackward(torch.autograd.Function):
    """all_reduce(sum | avg) with meshsim's backward for plain local code: g, or g / n for avg."""

    @staticmethod
    def forward(ctx, x, reduce, group, n):
        ctx.scale = 1.0 / n if reduce == "avg" else 1.0
        return funcol.all_reduce(x, reduce, group)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale if ctx.scale != 1.0 else g, None, None, None


class _MarkVaryingMeshsimBackward(torch.autograd.Function):
    """mark_varying with meshsim's backward for plain local code: the identity forward, an all_reduce(sum) of
    the gradient backward (Megatron's f)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return funcol.all_reduce(g, "sum", ctx.group), None


def mark_varying(p: Program, op: dict, x: torch.Tensor) -> torch.Tensor:
    if MESHSIM_CONVENTION:
        return _MarkVaryingMeshsimBackward.apply(x, p.group(op))
    p.note("mark_varying is the identity in PyTorch, forward and backward (meshsim's backward is an all_reduce)")
    return x.view_as(x)


def equal_pieces(p: Program, op: dict, x: torch.Tensor, dim: int, what: str) -> None:
    """c10d's all_gather_into_tensor and all_to_all_single move equal pieces: locals of different
    shapes over the group (uneven shards), or a dim the group does not divide, are refused, as on a
    real backend (LocalTensorMode would fail later, in the backward, with an internal error)."""
    if isinstance(x, LocalTensor):
        shapes = {r: tuple(t.shape) for r, t in x._local_tensors.items()}
        if len(set(shapes.values())) > 1:
            raise Refusal(f"{what}: funcol needs one local shape on every rank, the ranks hold "
                             + ", ".join(f"{r}: {list(s)}" for r, s in sorted(shapes.items())))
    if dim is not None:
        n = p.job.mesh_shape[p.group(op)[1]]
        if x.shape[dim] % n:
            raise Refusal(f"{what}: dim {dim} of extent {x.shape[dim]} does not split into {n} equal pieces")


def all_gather(p: Program, op: dict, x: torch.Tensor) -> torch.Tensor:
    equal_pieces(p, op, x, None, "all_gather")
    if "to" in op:
        p.note("all_gather's `to` (varying or reduced) is a variance label PyTorch does not keep")
    return funcol.all_gather_tensor_autograd(x, gather_dim=op["dim"] % x.ndim, group=p.group(op))


def all_reduce(p: Program, op: dict, x: torch.Tensor) -> torch.Tensor:
    p.note("all_reduce runs as funcol.all_reduce, whose registered backward all_reduces the gradient "
           "(torch/distributed/_functional_collectives.py, all_reduce_backward); meshsim's is the identity "
           "for sum, a division by n for avg")
    reduce = op.get("reduce", "sum")
    if MESHSIM_CONVENTION and reduce in ("sum", "avg"):
        return _AllReduceMeshsimBackward.apply(x, reduce, p.group(op), p.job.mesh_shape[p.group(op)[1]])
    return funcol.all_reduce(x, reduce, p.group(op))


def reduce_scatter(p: Program, op: dict, x: torch.Tensor) -> torch.Tensor:
    equal_pieces(p, op, x, op["dim"] % x.ndim, "reduce_scatter")
    return funcol.reduce_scatter_tensor_autograd(x, "sum", scatter_dim=op["dim"] % x.ndim, group=p.group(op))


def sdpa(p: Program, op: dict, q, k, v, m=None):
    """F.scaled_dot_product_attention. On DTensors it is written out as its math kernel's parts
    (repeat_interleave of grouped k/v heads, matmul, scale, the causal and given masks, softmax,
    matmul), each placed by DTensor: on CPU PyTorch 2.15 cannot run it whole on DTensors (the fused
    aten._scaled_dot_product_flash_attention_for_cpu has no sharding strategy, and the math backend
    adds its causal mask as a plain tensor to DTensor scores: "got mixed torch.Tensor and DTensor").
    The causal mask is a replicated DTensor here. A row with no key is zeros, as torch's math kernel
    (its _safe_softmax) and meshsim give it: softmax of such a row alone would be NaN."""
    causal = bool(op.get("is_causal", False))
    scale = 1.0 / math.sqrt(q.shape[-1]) if op.get("scale") is None else float(op["scale"])
    if not isinstance(q, DTensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, scale=scale,
                                              enable_gqa=bool(op.get("enable_gqa", False)))
    p.note("scaled_dot_product_attention on DTensors runs as its math kernel's parts (the CPU flash kernel has "
           "no DTensor strategy): DTensor places each part")
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
        keep = distribute_tensor(keep, q.device_mesh, [Replicate()] * q.device_mesh.ndim)
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if m is not None:
        scores = scores.masked_fill(m.logical_not(), float("-inf")) if m.dtype == torch.bool else scores + m
    none = scores.detach().amax(dim=-1, keepdim=True) == float("-inf")  # rows with no key
    probs = torch.softmax(scores.masked_fill(none, 0.0), dim=-1).masked_fill(none, 0.0)
    return torch.matmul(probs, v)


def squeeze(p: Program, op: dict, x):
    return x.squeeze() if op.get("dim") is None else x.squeeze(op["dim"])


def split(p: Program, op: dict, x):
    size = op["sizes"] if "sizes" in op else op["size"]
    return list(torch.split(x, size, dim=op.get("dim", 0)))


OPS = {
    "redistribute": redistribute,
    "add": binary(torch.add), "sub": binary(torch.sub), "mul": binary(torch.mul), "div": binary(torch.div),
    "floor_divide": binary(torch.floor_divide), "remainder": binary(torch.remainder),
    "cumsum": lambda p, op, x: torch.cumsum(x, op["dim"]),
    "clamp": lambda p, op, x: clamp(op, x),
    "one_hot": lambda p, op, x: F.one_hot(x, op["num_classes"]),
    "bincount": lambda p, op, x: torch.bincount(x, minlength=op["minlength"]),
    "repeat": lambda p, op, x: x.repeat(op["sizes"]),
    "repeat_interleave": lambda p, op, x: torch.repeat_interleave(x, op["repeats"], dim=op["dim"]),
    "scaled_dot_product_attention": lambda p, op, q, k, v, m=None: sdpa(p, op, q, k, v, m),
    "neg": lambda p, op, x: torch.neg(x),
    "detach": lambda p, op, x: x.detach(),
    "to": lambda p, op, x: x.to(DTYPES[op["dtype"]]),
    "exp": lambda p, op, x: torch.exp(x),
    "tanh": lambda p, op, x: torch.tanh(x),
    "relu": lambda p, op, x: torch.relu(x),
    "sin": lambda p, op, x: torch.sin(x),
    "cos": lambda p, op, x: torch.cos(x),
    "abs": lambda p, op, x: torch.abs(x),
    "log": lambda p, op, x: torch.log(x),
    "sigmoid": lambda p, op, x: torch.sigmoid(x),
    "silu": lambda p, op, x: F.silu(x),
    "sqrt": lambda p, op, x: torch.sqrt(x),
    "rsqrt": lambda p, op, x: torch.rsqrt(x),
    "gelu": lambda p, op, x: F.gelu(x, approximate=op.get("approximate", "none")),
    "pow": lambda p, op, x: torch.pow(x, scalar(op["exponent"])),
    "scale": lambda p, op, x: torch.mul(x, scalar(op["value"])),
    "where": lambda p, op, c, x, y: torch.where(c, x, y),
    "masked_fill": lambda p, op, x, m: x.masked_fill(m, scalar(op["value"])),
    "tril": lambda p, op, x: torch.tril(x, op.get("diagonal", 0)),
    "triu": lambda p, op, x: torch.triu(x, op.get("diagonal", 0)),
    "zeros": lambda p, op: p.create(op, lambda dt: torch.zeros(math.prod(op["shape"]), dtype=dt)),
    "ones": lambda p, op: p.create(op, lambda dt: torch.ones(math.prod(op["shape"]), dtype=dt)),
    "full": lambda p, op: p.create(op, lambda dt: torch.full((math.prod(op["shape"]),), scalar(op["value"]), dtype=dt)),
    "arange": lambda p, op: p.create(op, lambda dt: arange(op, dt)),
    "layer_norm": lambda p, op, x, w=None, b=None: F.layer_norm(x, op["normalized_shape"], w, b, op.get("eps", 1e-5)),
    "rms_norm": lambda p, op, x, w=None: F.rms_norm(x, op["normalized_shape"], w, op.get("eps")),
    "embedding": embedding,
    "log_softmax": lambda p, op, x: F.log_softmax(x, dim=op["dim"]),
    "softmax": lambda p, op, x: F.softmax(x, dim=op["dim"]),
    "cross_entropy": lambda p, op, s, t, w=None: F.cross_entropy(
        s, t, weight=w, reduction=op.get("reduction", "mean"),
        ignore_index=-100 if op.get("ignore_index") is None else int(op["ignore_index"]),
        label_smoothing=float(op.get("label_smoothing", 0.0))),
    "nll_loss": nll_loss,
    "mm": lambda p, op, a, b: torch.mm(a, b),
    "bmm": lambda p, op, a, b: torch.bmm(a, b),
    "matmul": lambda p, op, a, b: torch.matmul(a, b),
    "linear": lambda p, op, x, w, b=None: F.linear(x, w, b),
    "transpose": lambda p, op, x: torch.transpose(x, op["dim0"], op["dim1"]),
    "permute": lambda p, op, x: torch.permute(x, op["dims"]),
    # meshsim's view is reshape (every layout is contiguous there): after a permute, PyTorch's view
    # would refuse a non-contiguous operand that meshsim accepts.
    "view": lambda p, op, x: torch.reshape(x, op["shape"]),
    "reshape": lambda p, op, x: torch.reshape(x, op["shape"]),
    "flatten": lambda p, op, x: torch.flatten(x, op.get("start_dim", 0), op.get("end_dim", -1)),
    "unflatten": lambda p, op, x: torch.unflatten(x, op["dim"], op["sizes"]),
    "squeeze": squeeze,
    "unsqueeze": lambda p, op, x: torch.unsqueeze(x, op["dim"]),
    "expand": lambda p, op, x: x.expand(op["shape"]),
    "cat": lambda p, op, *xs: torch.cat(xs, dim=op["dim"]),
    "stack": lambda p, op, *xs: torch.stack(xs, dim=op["dim"]),
    "narrow": lambda p, op, x: torch.narrow(x, op["dim"], op["start"], op["length"]),
    "split": split,
    "chunk": lambda p, op, x: list(torch.chunk(x, op["chunks"], dim=op.get("dim", 0))),
    "sum": reduction(torch.sum),
    "mean": reduction(torch.mean),
    "amax": reduction(torch.amax),
    "amin": reduction(torch.amin),
    "linalg_vector_norm": lambda p, op, x: torch.linalg.vector_norm(
        x, ord=scalar(op.get("ord", 2)), dim=reduced_dims(op, x), keepdim=bool(op.get("keepdim", False))),
    # Selection and order (meshsim's catalog gives the values or the indices, one op each): sorts
    # stable, as meshsim's kernels (torch.topk's ties may pick other positions: the same values).
    "max": lambda p, op, x: torch.max(x, dim=op["dim"], keepdim=bool(op.get("keepdim", False))).values,
    "min": lambda p, op, x: torch.min(x, dim=op["dim"], keepdim=bool(op.get("keepdim", False))).values,
    "argmax": lambda p, op, x: torch.argmax(x, dim=op["dim"], keepdim=bool(op.get("keepdim", False))),
    "argmin": lambda p, op, x: torch.argmin(x, dim=op["dim"], keepdim=bool(op.get("keepdim", False))),
    "sort": lambda p, op, x: torch.sort(x, dim=op.get("dim", -1), descending=bool(op.get("descending", False)),
                                        stable=True).values,
    "argsort": lambda p, op, x: torch.argsort(x, dim=op.get("dim", -1), descending=bool(op.get("descending", False)),
                                              stable=True),
    "topk": lambda p, op, x: torch.topk(x, op["k"], dim=op.get("dim", -1), largest=bool(op.get("largest", True))).values,
    # Indexing along dim by an int64 index operand.
    "gather": lambda p, op, x, index: torch.gather(x, op["dim"], index),
    "index_select": lambda p, op, x, index: torch.index_select(x, op["dim"], index),
    # Into x along dim at an int64 index: src written or added (index_add: source's slices).
    "scatter": lambda p, op, x, index, src: torch.scatter(x, op["dim"], index, src),
    "scatter_add": lambda p, op, x, index, src: torch.scatter_add(x, op["dim"], index, src),
    "index_add": lambda p, op, x, index, source: torch.index_add(x, op["dim"], index, source),
    # Comparisons and logic: bool results.
    "eq": binary(torch.eq), "ne": binary(torch.ne), "lt": binary(torch.lt), "le": binary(torch.le),
    "gt": binary(torch.gt), "ge": binary(torch.ge),
    "logical_and": lambda p, op, x, y: torch.logical_and(x, y),
    "logical_or": lambda p, op, x, y: torch.logical_or(x, y),
    "logical_not": lambda p, op, x: torch.logical_not(x),
    "to_local": lambda p, op, x: x.to_local(
        grad_placements=tuple(p.placements(op["grad_placements"], x.ndim)) if op.get("grad_placements")
        else p.reduced_grad(op["args"][0], x.placements)),
    "from_local": from_local,
    "all_reduce": all_reduce,
    "all_gather": all_gather,
    "reduce_scatter": reduce_scatter,
    "all_to_all": all_to_all,
    "mark_varying": mark_varying,
}
# Ops translated by name outside OPS (Program.op).
SPECIAL_OPS = {"local_map", "call"}
# The ops of meshsim's catalog this backend does not translate, each with why (reported as the
# reason a scenario using it is not comparable). `crosscheck --check-ops` (op_coverage.py) fails
# for an op of the catalog that OP_TABLES' tables do not translate and that is not listed here.
RANDOM = ("meshsim draws its own counter-based stream (docs/semantics.md, Randomness), indexed by each "
          "element's global position; PyTorch's Philox values on its device are another stream, so the two "
          "agree on layout invariance, not on values")
ITEM = ("Tensor.item() gives a Python number, not a tensor a DTensor program (or LocalTensorMode's per-rank "
        "locals) goes on with; and DTensor.item() of a Partial read each rank's own local in PyTorch's releases "
        "before pull request 167598 (issues 144054, 166638), where meshsim reduces it first")
NOT_COMPARABLE: dict[str, str] = {"dropout": RANDOM, "rand": RANDOM, "randn": RANDOM, "item": ITEM}
OP_TABLES = ("OPS", "SPECIAL_OPS")


# --- execute and check -----------------------------------------------------------------------------

def not_comparable_reason(job: common.Job) -> str | None:
    """Why the job cannot be compared at all, before anything runs."""
    opts = job.options
    if opts.get("mutant"):
        return f"a planted bug (mutant {opts['mutant']}) lives only in meshsim"
    if (job.doc.get("requires") or {}).get("functions"):
        return "calls Functions of the user's own (requires.functions), which only meshsim can load"
    if "options" in job.result and opts.get("semantics", "meshsim") != "pytorch":
        return "meshsim ran with semantics=meshsim: compare runs made with --option semantics=pytorch"
    if job.world > MAX_RANKS:
        return f"too many ranks for LocalTensorMode here ({job.world} > {MAX_RANKS})"
    err = (job.result.get("error") or {}) if job.result.get("status") == "error" else {}
    kind, msg = err.get("kind"), err.get("message", "")
    if err and (err.get("path") == "/options" or msg.startswith("/options")):
        return f"meshsim refuses the options under semantics=pytorch ({msg.splitlines()[0] if msg else kind})"
    if kind in ("unsupported_op", "resource_limit", "out_of_memory", "no_result"):
        return f"meshsim could not run it ({kind}: {msg.splitlines()[0] if msg else ''})"
    if kind in ("reduced_mismatch",):
        return ("meshsim refuses a mix of Rd and R under reduced_propagation=strict; PyTorch has no Reduced "
                "placement (Rd is R there), so it cannot refuse it")
    if kind in ("exclusivity_violation", "out_spec_mismatch"):
        return f"meshsim's variance tracking refuses it ({kind}); PyTorch's local_map tracks no variance"
    if err and job.doc.get("inputs") is None:
        return f"meshsim could not read the scenario ({kind})"
    if any("mixed_precision" in i for i in job.doc.get("inputs", [])):
        return ("mixed_precision is FSDP2's casting around its own collectives: a DTensor redistribute of a cast "
                "value would reduce-scatter in param_dtype, not reduce_dtype (fully_shard itself is not translated)")
    return None


def execute(job: common.Job, timings: list | None = None, whole: dict | None = None, steps: bool = False) -> Run:
    """Runs the job's program on DTensor under LocalTensorMode, forward and backward, and returns
    what `check` compares. With `timings` a list, appends (op name, wall seconds, CPU seconds) per
    program op; with `whole` a dict, sets its "wall" and "cpu" to the program's (the inputs laid
    out, every op, the backward; not what `check` collects after it). With `steps`, a scenario's
    training steps run after it (pytorch_train.py) when meshsim ran them."""
    reason = not_comparable_reason(job)
    if reason:
        raise common.NotComparable(reason)
    run = Run()
    if job.options.get("redistribute") == "below_autograd":
        run.notes.append("redistribute=below_autograd has no PyTorch counterpart: DTensor.redistribute is always "
                         "an autograd Function (tensor/_redistribute.py, Redistribute), so PyTorch runs it as "
                         "above_autograd; the values must agree, gradient placements may differ")
    start, start_cpu = time.perf_counter(), time.process_time()
    fresh_world(job.world)
    torch.manual_seed(int(job.options.get("seed", 0)))
    with LocalTensorMode(job.world) as mode:
        prog = Program(job, mode, run)
        try:
            prog.make_inputs()
            prog.run_ops(job.doc["program"], prog.env, "/program", timings)
            loss_name = job.doc.get("backward")
            if loss_name is not None:
                loss = prog.env[loss_name]
                if not loss.requires_grad:
                    prog.note(f"{loss_name} depends on no input that requires grad: PyTorch has no backward to run "
                              "(meshsim's gradients are zeros)")
                else:
                    try:
                        loss.backward() if loss.ndim == 0 else loss.backward(torch.ones_like(loss))
                    except Exception as e:  # noqa: BLE001
                        raise OpFailed("/backward", e) from e
        except OpFailed as f:
            if simulation_artifact(f.error):
                raise common.NotComparable(f"{f.path}: LocalTensorMode cannot simulate it ({first_line(f.error)}), "
                                           "an artifact of running every rank in one process") from f
            run.error = (f.path, first_line(f.error))
        if whole is not None:
            if DEVICE != "cpu":
                torch.cuda.synchronize()
            whole.update(wall=time.perf_counter() - start, cpu=time.process_time() - start_cpu)
        collect(prog, run)
        if steps and run.error is None and ((job.result.get("train") or {}).get("ran")):
            try:
                pytorch_train.Steps(prog, run, DEVICE, contiguous_stride).run_all()
            except (OpFailed, pytorch_train.StepFailed) as f:
                where = f.path if isinstance(f, OpFailed) else f.where
                d = {"kind": "error", "what": where,
                     "detail": f"training steps: PyTorch raises at {where}: {first_line(f.error)}; meshsim runs them"}
                if "in-place operations that require placement changes" in str(f.error) and short_shard(job):
                    with_cause(d, "inplace_update_short_shard_refused")
                else:
                    explain_error(job, d, str(f.error))
                run.train_diffs.append(d)
    return run


def short_shard(job: common.Job) -> bool:
    """Whether a training step's parameter, or an optimizer state laid out otherwise, is sharded on
    a dim shorter than its mesh axis (a rank holds none of it): CAUSES["inplace_update_short_shard_refused"]."""
    states = ((job.doc.get("train") or {}).get("optimizer") or {}).get("states") or {}
    for inp in job.doc.get("inputs", []):
        if not inp.get("requires_grad"):
            continue
        for specs in (inp.get("placements", []), states.get(inp["name"], [])):
            for axis, spec in enumerate(specs):
                c = common.parse_placement(spec, len(inp["shape"]))
                if c.kind in ("S", "SS") and inp["shape"][c.dim] < job.mesh_shape[axis]:
                    return True
    return False


def simulation_artifact(e: BaseException) -> bool:
    """Whether PyTorch failed inside LocalTensorMode's own machinery (per-rank sizes it cannot
    reconcile), not in DTensor's rules: a real one-process-per-rank run would not fail there."""
    chain = [e]
    while (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    if any(word in str(x) for x in chain for word in ("SymInt", "SymNode", "LocalIntNode")):
        return True
    tb, last = chain[-1].__traceback__, None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last is not None and os.sep + "_local_tensor" + os.sep in last


def collect(prog: Program, run: Run) -> None:
    """Every DTensor value's placements and global data, and every input gradient (rank 0's copy
    of full_tensor(): every rank holds the same after it)."""
    for name, v in prog.env.items():
        if not isinstance(v, DTensor):  # local code's values are not compared: meshsim writes none
            continue
        try:
            data = prog.frozen[name] if name in prog.frozen else global_data(prog, v)
        except Exception as e:  # noqa: BLE001
            if run.error is not None:  # the program failed already, at the value that cannot be read
                run.notes.append(f"{name}: not compared, PyTorch cannot assemble it ({first_line(e)})")
                continue
            if not simulation_artifact(e):
                raise
            run.notes.append(f"{name}: not compared, LocalTensorMode cannot assemble it ({first_line(e)})")
            continue
        run.values[name] = ([placement_text(p) for p in v.placements], data)
    if run.error is None and prog.job.doc.get("backward") is not None:
        for name, x in prog.inputs.items():
            if x.requires_grad:
                g = x.grad
                run.grads[name] = (None, None) if g is None else (
                    [placement_text(p) for p in g.placements], global_data(prog, g))


def global_data(prog: Program, v: DTensor) -> np.ndarray:
    """v's global value (rank 0's copy of full_tensor(); every rank holds the same after it). A
    _MaskPartial is reduced through a copy of its mask, leaving v's own for the program."""
    with torch.no_grad():
        if any(isinstance(p, _MaskPartial) for p in v.placements):
            placements = [_MaskPartial(p.reduce_op, MaskBuffer(p.mask_buffer.data, 1), p.offset_shape, p.offset_dim)
                          if isinstance(p, _MaskPartial) else p for p in v.placements]
            v = DTensor.from_local(v.to_local().detach().clone(), prog.mesh, placements, run_check=False,
                                   shape=v.shape, stride=v.stride())
        full = v.full_tensor()
    with prog.mode.disable():
        t = full._local_tensors[min(full._local_tensors)] if isinstance(full, LocalTensor) else full
        t = t.detach().cpu().clone()
        # NumPy has no bfloat16: half-precision values compare as the float32 numbers they hold.
        return (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).numpy()


# Known reasons a PyTorch 2.15 run differs from meshsim's semantics=pytorch run, each with the
# PyTorch source that explains it (paths under torch/distributed/). A difference that matches one
# carries it as `cause` and `explanation`.
CAUSES = {
    "label_smoothing_partial_refused":
        "F.cross_entropy with label_smoothing computes the smoothing term as a sum of the (weighted) "
        "log-probabilities over the classes and zeroes the ignored rows in place "
        "(aten/src/ATen/native/LossNLL.cpp, cross_entropy_loss_label_smoothing: "
        "smooth_loss.masked_fill_(ignore_mask, 0.0)); where the classes are sharded there (a class weight "
        "sharded over a mesh axis), that sum is Partial(sum), and DTensor refuses an in-place masked_fill_ "
        "on a Partial (tensor/_ops/utils.py: 'in-place operations that require placement changes are not "
        "supported'), though a zero fill keeps every part's sum. meshsim masks the rows and runs it.",
    "bincount_no_strategy":
        "DTensor registers no sharding strategy for aten.bincount (none under tensor/_ops/), and its "
        "propagation's fake-tensor run of bincount refuses a data-dependent length "
        "(torch/_subclasses/fake_impls.py), so a DTensor's bincount raises on every placement; meshsim counts a "
        "shard's own values over the same minlength bins, S(0) -> P(sum) (docs/semantics.md, 'one_hot "
        "and bincount').",
    "clamp_bound_gradient":
        "PyTorch 2.15's gradient of clamp is 0 where the operand sits on a bound (torch.clamp(x, -1, 1) of "
        "[-1, 0, 1] gives [0, 1, 0], eager and DTensor alike), where libtorch 1.13's clamp_backward, which "
        "meshsim's kernels and its oracle run, passes g on the bounds (min <= x <= max): the two libtorch "
        "versions differ there, DTensor places it alike (docs/semantics.md, 'clamp').",
    "inplace_update_short_shard_refused":
        "torch.optim updates a parameter in place, and DTensor refuses an in-place op no strategy of "
        "which keeps the parameter's placements (tensor/_ops/utils.py: 'in-place operations that require "
        "placement changes are not supported'); a strategy that moves an operand to a shard of a dim "
        "shorter than its mesh axis is left out (tensor/_ops/single_dim_strategy.py, try_propagate: "
        "is_tensor_shardable), so a parameter (or an "
        "optimizer state) sharded so that a rank holds none of it cannot be updated with operands laid "
        "out otherwise (its optimizer states, a replicated gradient). meshsim moves them and updates it.",
    "grad_keeps_backward_placement":
        "PyTorch stores an input's .grad as the op's backward made it: DTensor redistributes operands "
        "below autograd (tensor/_dispatch.py, OpDispatcher.dispatch -> redistribute_local_args), so "
        "nothing moves the gradient back to the input's own sharding; meshsim's pytorch profile moves a "
        "gradient sharded otherwise than its input to the input's cotangent (docs/semantics.md, "
        "no_gradient_hook). The values agree.",
    "from_local_avg_backward":
        "DTensor.from_local's backward (tensor/_api.py, _FromTorchTensor.backward) redistributes the "
        "gradient to the placements from_local asserted, and R -> Partial(avg) keeps every rank's value, "
        "so each rank's local tensor gets the whole gradient; its cotangent is 1/n of it (the average's "
        "derivative), which meshsim gives. A loss computed per rank and asserted P(avg) over the data "
        "axes gets n-fold gradients in PyTorch.",
    "local_all_reduce_backward":
        "funcol.all_reduce's registered backward all_reduces the gradient (_functional_collectives.py, "
        "all_reduce_backward), and mark_varying has no PyTorch op (the identity both ways); meshsim's "
        "plain local code gives all_reduce(sum) the identity backward and mark_varying an all_reduce "
        "(Megatron's g and f). A body that uses one with the other's convention gets n-fold gradients.",
    "redistribute_to_partial_refused":
        "DTensor.redistribute (tensor/_api.py) accepts a Partial target only where the source already "
        "has it (same type: a _MaskPartial is not Partial(sum)) or from a Shard to Partial(sum); "
        "meshsim's pytorch profile runs R -> P(sum) (divided) and treats embedding's masked partial as P(sum).",
    "flatten_sharded_dim_refused":
        "PyTorch 2.11's view rule (tensor/_ops/_view_ops.py, get_in_dim_to_shard) refuses a view that "
        "flattens dims of which a later one is sharded, where 2.15 and meshsim redistribute first.",
    "funcol_all_reduce_avg_backward_refused":
        "PyTorch 2.11's all_reduce backward (_functional_collectives.py, all_reduce_backward) refuses "
        "avg; 2.15 differentiates it (local_all_reduce_backward).",
    "funcol_equal_pieces":
        "c10d's all_gather_into_tensor / reduce_scatter_tensor / all_to_all_single move equal pieces "
        "(_functional_collectives.py); meshsim's local collectives gather and split uneven torch.chunk pieces.",
    "mean_uneven_replicated":
        "PyTorch 2.15 fixed pytorch/pytorch#162692: mean's P(avg) strategy is rejected for unevenly "
        "sharded reduced dims (tensor/_ops/_math_ops.py, _mean_full_mesh_strategy_filter), so the "
        "operand is gathered and the mean is R and right; meshsim's profile (DTensor 2.9 to 2.11) keeps P(avg).",
    "nll_loss_mean_replicated":
        "nll_loss with reduction mean has no sharded strategy in PyTorch 2.15 (tensor/_ops/_math_ops.py, "
        "nll_loss_forward_single_dim_strategy lists rows for none and sum only), so the batch is gathered "
        "and the loss is R; meshsim's pytorch profile keeps the batch shard and gives P(sum).",
    "reduced_has_no_pytorch_spelling":
        "meshsim's Rd (an Rd input, a redistribute to Rd, or an op's output labelled Rd by the "
        "reduced_propagation policy) has P(sum) as cotangent; PyTorch holds it as Replicate, whose "
        "gradient stays R: the same gradient under other labels, but in local code an R cotangent "
        "reaching a local collective's backward (all_gather's reduce_scatter) is summed n times where "
        "meshsim's P(sum) parts are not.",
    "mixed_partial_refused":
        "PyTorch 2.15 refuses placements mixing Partial reduce ops other than sum with avg "
        "(tensor/_utils.py, assert_no_mixed_partial_types, called by DTensor.from_local and "
        "distribute_tensor); meshsim reduces mixed Partial axes outermost first.",
    "local_map_uneven_outputs":
        "local_map wraps each output with DTensor.from_local without shape= (tensor/experimental/_func_map.py), "
        "so every rank infers the global shape from its own local, assuming even shards: locals of different "
        "shapes (uneven shards) give no consistent DTensor; meshsim takes the global shape from the layout.",
    "strategy_choice":
        "The values agree, the placements differ: PyTorch's sharding propagation picks another strategy "
        "(tensor/_sharding_prop.py, the cheapest over all mesh axes by its cost model, or an op's "
        "decomposition: matmul into view+mm, linear into addmm), where meshsim's profile keeps meshsim's "
        "rows that differ from PyTorch's only in collectives (docs/semantics.md, Semantics profiles).",
    "grad_strategy_choice":
        "The gradients' values agree, their placements differ: PyTorch's .grad keeps what the backward "
        "ops' strategies give (tensor/_sharding_prop.py; no hook moves it), where meshsim's profile "
        "runs its own backward rows and moves a gradient sharded otherwise than its input to the input's "
        "cotangent (docs/semantics.md, no_gradient_hook).",
    "expand_sharded_unit_dim_crashes":
        "A PyTorch 2.15 bug: expand of an extent-1 dim that a mesh axis shards (unevenly: one rank "
        "holds the row, the others none) raises KeyError in the view strategy "
        "(tensor/_ops/_view_ops.py, _rewrite_plain_shard) instead of gathering it; meshsim gathers it.",
    "strict_view_refuses_redistribution":
        "aten.view (as opposed to reshape) refuses to redistribute a shard it would reshape or remove "
        "(tensor/_ops/_view_ops.py, strict_view: 'This operation would remove or reshape sharded "
        "dimension'); autograd's own views (matmul's backward) hit it; meshsim gathers first.",
    "shard_to_partial_allowed":
        "DTensor.redistribute in PyTorch 2.15 accepts Shard -> Partial(sum) (tensor/_api.py, redistribute: "
        "'only Shard to Partial(sum) redistribution is supported'; each rank's shard padded with zeros), "
        "where meshsim refuses a forward S -> P as illegal_redistribute.",
    "mask_partial_buffer":
        "PyTorch bugs of embedding's vocab-parallel output: its _MaskPartial placement carries one mask buffer "
        "(tensor/_ops/_mask_buffer.py), laid out for the embedding's own output and consumed by the first "
        "reduction (placement_types.py, _MaskPartial._reduce_value releases it). A view or transpose of the "
        "output keeps the placement with the old mask ('The shape of the mask ... does not match'); a weight "
        "whose rows end up sharded over two mesh axes materializes the one buffer twice ('materialized with "
        "conflicting data') or reduces it twice (AssertionError: the buffer is gone). meshsim's masked partial "
        "is a P(sum) of zeroed locals per mesh axis, with no buffer.",
    "extremum_empty_shard":
        "aten.amax/amin refuse an empty reduction ('Expected reduction dim ... to have non-zero size'): a rank "
        "holding an empty shard of the reduced dim (uneven sharding) fails in DTensor's local amax, which gives "
        "such a rank no identity; meshsim reduces an empty local to -inf / +inf, so the P(max) parts combine "
        "to the right value.",
    "vector_norm_inf_empty_shard":
        "linalg.vector_norm with ord inf or -inf refuses an empty reduction ('cannot compute the inf norm on "
        "the dimension ... because this dimension is empty'): a rank holding an empty shard of the reduced dim "
        "(uneven sharding) fails in DTensor's local norm; meshsim's empty local norm is 0 (+inf for -inf), the "
        "identity of its P(max) (P(min)) among norms, so the parts combine to the right value.",
    "uneven_view_refused":
        "PyTorch 2.15's view strategy refuses to unflatten (or view) an unevenly sharded dim "
        "(tensor/_ops/_view_ops.py, _analyze_split / _analyze_flatten: 'Cannot (un)flatten unevenly sharded tensor ... Please "
        "redistribute'); meshsim gathers what it cannot keep sharded (semantics.md, uneven views).",
    "split_unused_outputs_backward":
        "autograd fills the gradients of split's unused outputs with plain zero tensors and cats them with "
        "the DTensor gradients of the used ones (split's backward), which DTensor refuses ('got mixed "
        "torch.Tensor and DTensor'): in PyTorch a DTensor split of which only some pieces reach the loss "
        "cannot be differentiated; meshsim's gradient of an unused piece is zeros in its placements.",
    "extremum_partial_refused":
        "amax/amin over a sharded dim gives P(max)/P(min); PyTorch differentiates it (amax's derivative "
        "formula compares the input with the result, which DTensor reduces first: "
        "tools/autograd/derivatives.yaml, amax), where meshsim refuses: its per-rank autograd would compare "
        "each rank's local extremum (docs/findings.md, section 10).",
}


def with_cause(d: dict, cause: str) -> dict:
    return common.with_cause(d, cause, CAUSES)


def program_ops(job: common.Job) -> set[str]:
    return {op["op"] for op in job.ops()}


def explain_error(job: common.Job, d: dict, msg: str) -> dict:
    if ("The shape of the mask" in msg or "MaskBuffer has been materialized with conflicting data" in msg
            or "MaskBuffer has not been materialized" in msg
            or "_reduce_value" in msg and program_ops(job) & {"embedding"}):
        return with_cause(d, "mask_partial_buffer")
    if ("masked_fill_" in msg and "Partial" in msg and "in-place operations that require placement changes" in msg
            and any(op.get("op") == "cross_entropy" and op.get("label_smoothing") for op in job.ops())):
        return with_cause(d, "label_smoothing_partial_refused")
    if "aten.bincount" in msg:
        return with_cause(d, "bincount_no_strategy")
    if "cannot compute the" in msg and "inf norm" in msg and "does not have an identity" in msg:
        return with_cause(d, "vector_norm_inf_empty_shard")
    if "Expected reduction dim" in msg and "non-zero size" in msg:
        return with_cause(d, "extremum_empty_shard")
    if ("Cannot unflatten unevenly sharded tensor" in msg or "Cannot flatten unevenly sharded tensor" in msg):
        return with_cause(d, "uneven_view_refused")
    if "got mixed torch.Tensor and DTensor" in msg and program_ops(job) & {"split", "chunk"}:
        return with_cause(d, "split_unused_outputs_backward")
    if ("only Shard to Partial(sum) redistribution is supported" in msg
            or "redistributing to Partial is for internal use only" in msg):  # the second: 2.11's words
        return with_cause(d, "redistribute_to_partial_refused")
    if "Attempted to flatten multiple dimensions" in msg and "being sharded" in msg:
        return with_cause(d, "flatten_sharded_dim_refused")
    if "all_reduce backward only supports 'sum' reduction" in msg:
        return with_cause(d, "funcol_all_reduce_avg_backward_refused")
    if "_rewrite_plain_shard" in msg:
        return with_cause(d, "expand_sharded_unit_dim_crashes")
    if "would remove or reshape sharded" in msg:
        return with_cause(d, "strict_view_refuses_redistribution")
    if "Mixed Partial reduce types" in msg:
        return with_cause(d, "mixed_partial_refused")
    if "local_map returns locals" in msg:
        return with_cause(d, "local_map_uneven_outputs")
    if "funcol needs one local shape" in msg or "does not split into" in msg:
        return with_cause(d, "funcol_equal_pieces")
    return d


def axes_factor(expected, actual, mesh_shape: list[int]) -> str | None:
    """"n" or "1/n" when `actual` is `expected` times n or over n everywhere, n a product of some
    mesh axes' sizes (an n-fold gradient of a local collective's backward convention); else None."""
    if expected is None or actual is None or np.shape(expected) != np.shape(actual):
        return None
    sizes = {1}
    for k in mesh_shape:
        sizes |= {s * k for s in sizes}
    e, a = np.asarray(expected, dtype=np.float64), np.asarray(actual, dtype=np.float64)
    for n in sorted(sizes - {1}):
        for f, text in ((n, f"{n}"), (1.0 / n, f"1/{n}")):
            if np.allclose(a, e * f, rtol=1e-9, atol=1e-12 * max(1.0, float(np.abs(e).max(initial=0.0)))):
                return text
    return None


def from_local_avg_factors(job: common.Job) -> set[str]:
    """The sizes ("2", "4") of the mesh axes, and their products, over which a from_local of the
    program asserts P(avg): where PyTorch's from_local backward leaves each rank the whole gradient."""
    axes = job.mesh_axes
    sizes: set[int] = set()
    for op in job.doc.get("program", []):
        if op.get("op") != "from_local":
            continue
        on = [job.mesh_shape[a] for a, p in enumerate(op.get("placements", [])) if p in ("P(avg)", "Partial(avg)")
              and a < len(axes)]
        prod = 1
        for n in on:
            sizes.add(n)
            prod *= n
        if on:
            sizes.add(prod)
    return {str(n) for n in sizes}


def uneven_mean_and_after(job: common.Job) -> set[str]:
    """The results of `mean` ops whose operand meshsim holds unevenly (its ranks' local shapes
    differ), and every value computed from them: where 2.15's fix of #162692 applies."""
    values = job.result.get("values") or {}
    found: set[str] = set()
    for op in job.doc.get("program", []):
        out = op.get("out")
        outs = op.get("outs") or (out if isinstance(out, list) else [out] if out else [])
        args = op.get("args", [])
        if op.get("op") == "mean" and args:
            shapes = (values.get(args[0]) or {}).get("local_shapes") or []
            if len({tuple(s) for s in shapes}) > 1:
                found.update(outs)
        elif found & set(args):
            found.update(outs)
    return found


def input_placements(job: common.Job, name: str) -> list[str]:
    spec = next(i["placements"] for i in job.doc["inputs"] if i["name"] == name)
    return [str(common.parse_placement(p)) for p in spec]


def uses_reduced(job: common.Job) -> bool:
    """Whether meshsim's run has an Rd anywhere (an input, a redistribute, a local_map spec)."""
    return any(p == "Rd" for meta in (job.result.get("values") or {}).values() for p in meta.get("placements") or [])


def grad_placement_verdict(job: common.Job, name: str, meshsim: list[str] | None, ours: list[str] | None):
    """None when the gradients' placements agree; "reduced" when they differ only on axes where
    the input is Rd (meshsim's P(sum), its cotangent, against PyTorch's R or P(sum): the same
    gradient, as Rd is R in PyTorch); otherwise the difference, with its cause where known."""
    if meshsim is None or ours is None:
        return None if meshsim == ours else {}
    mine = input_placements(job, name)
    axes = [a for a, (m, o) in enumerate(zip(meshsim, ours)) if m != "Rd" and str(common.parse_placement(m)) != o
            or m == "Rd" and o != "R"]
    if not axes:
        return None
    if all(mine[a] == "Rd" and meshsim[a] == "P(sum)" and ours[a] in ("R", "P(sum)") for a in axes):
        return "reduced"
    d: dict = {}
    if all(mine[a] == meshsim[a] and mine[a].startswith("S") for a in axes):
        with_cause(d, "grad_keeps_backward_placement")
    elif uses_reduced(job) and all(meshsim[a] == "P(sum)" and ours[a] == "R" for a in axes):
        with_cause(d, "reduced_has_no_pytorch_spelling")
    return d


def oracle_side(job: common.Job, kind: str, name: str, data, exact: bool, dtype: str) -> str | None:
    """Which side agrees with meshsim's single-device oracle, when they differ."""
    oracle = job._file("oracle_grad" if kind == "grad" else "oracle", name)
    if oracle is None or data is None:
        return None
    ours = common.compare(name, oracle, data, exact, dtype) is None
    theirs = common.compare(name, oracle, job.grad(name) if kind == "grad" else job.value(name), exact, dtype) is None
    return {(True, False): "pytorch", (False, True): "meshsim", (True, True): "both", (False, False): "neither"}[(ours, theirs)]


def check(job: common.Job) -> dict:
    """Runs the job on PyTorch and compares it with meshsim's run (see the module's docstring)."""
    run = execute(job, steps=True)
    notes = list(run.notes)
    meshsim_error = job.result.get("error") if job.result.get("status") == "error" else None
    if meshsim_error is not None:
        return refusal_report(job, run, meshsim_error, notes)
    diffs: list[dict] = []
    compared = {"values": 0, "placements": 0, "grads": 0, "grad_placements": 0}
    if run.error is not None:
        path, msg = run.error
        diffs.append(explain_error(job, {"kind": "error", "what": path,
                                         "detail": f"{path}: PyTorch raises {msg}; meshsim runs it"}, msg))
    exact = job.exact()
    dtype = job.least_dtype()
    ops = program_ops(job)
    values = job.result.get("values") or {}
    after_uneven_mean = uneven_mean_and_after(job)
    for name, meta in values.items():
        if "placements" not in meta or name not in run.values:
            continue  # meshsim's internal values (dotted names), plain local code, or after a refusal
        ours, data = run.values[name]
        compared["placements"] += 1
        if ours != meshsim_as_pytorch(meta["placements"]):
            d = {"kind": "placement", "what": name, "meshsim": meta["placements"], "other": ours,
                 "detail": f"{name}: placements {common.spec_str(ours)}, meshsim {common.spec_str(meta['placements'])}"}
            made_by = next((op for op in job.doc["program"] if op.get("out") == name), {})
            producer = made_by.get("op")
            if "P(avg)" in meta["placements"] and name in after_uneven_mean:
                with_cause(d, "mean_uneven_replicated")
            elif (producer in ("cross_entropy", "nll_loss") and made_by.get("reduction", "mean") == "mean"
                  and "P(sum)" in meta["placements"]):
                with_cause(d, "nll_loss_mean_replicated")
            placement_diff = d
            diffs.append(d)
        else:
            placement_diff = None
        if job.value(name) is None:
            continue
        compared["values"] += 1
        d = common.compare(name, job.value(name), data, exact, dtype)
        if placement_diff is not None and d is None and "cause" not in placement_diff:
            with_cause(placement_diff, "strategy_choice")
        if d:
            d["oracle_agrees_with"] = oracle_side(job, "value", name, data, exact, dtype)
            if name in after_uneven_mean and d["oracle_agrees_with"] == "pytorch":
                with_cause(d, "mean_uneven_replicated")
            diffs.append(d)
    local_collectives = bool(ops & {"all_reduce", "mark_varying"})
    convention: list[tuple[str, dict]] = []  # gradient differences in a program with local collectives
    reduced_local: list[tuple[str, dict]] = []  # ... in a program with Rd values in local code
    grad_diffs: list[tuple[str, dict, dict | None]] = []  # every gradient that differs, and its placement's
    for name, meta in (job.result.get("grads") or {}).items():
        if name not in run.grads:
            continue
        ours, data = run.grads[name]
        expected = job.grad(name)
        if data is None and (expected is None or not np.any(expected)):
            notes.append(f"grad {name}: no gradient reaches it in PyTorch (.grad is None); meshsim's is "
                         f"{'absent' if expected is None else 'zeros'}")
            continue
        compared["grad_placements"] += 1
        verdict = grad_placement_verdict(job, name, meta.get("placements"), ours)
        if verdict == "reduced":
            notes.append(f"grad {name}: meshsim {common.spec_str(meta['placements'])} (P(sum) is the cotangent of its "
                         f"Rd axes), PyTorch {common.spec_str(ours)}: the same gradient, as Rd runs as R")
        placement_diff = None
        if verdict not in (None, "reduced"):
            placement_diff = {"kind": "grad_placement", "what": name, "meshsim": meta.get("placements"), "other": ours,
                              "detail": f"grad {name}: placements {common.spec_str(ours or [])}, meshsim "
                                        f"{common.spec_str(meta.get('placements') or [])}", **verdict}
            diffs.append(placement_diff)
        compared["grads"] += 1
        if expected is None and data is not None and not np.any(data):
            continue  # no gradient reached it in meshsim; PyTorch's is zeros
        d = common.compare(f"grad {name}", expected, data, exact, dtype)
        if placement_diff is not None and d is None and "cause" not in placement_diff:
            with_cause(placement_diff, "grad_strategy_choice")
        if d:
            d["kind"] = "grad"
            d["oracle_agrees_with"] = oracle_side(job, "grad", name, data, exact, dtype)
            factor = axes_factor(expected, data, job.mesh_shape)
            if factor and factor in from_local_avg_factors(job) and d["oracle_agrees_with"] == "meshsim":
                d["detail"] += f"; PyTorch's = meshsim's x {factor}"
                with_cause(d, "from_local_avg_backward")
            elif local_collectives:
                if factor:
                    d["detail"] += f"; PyTorch's = meshsim's x {factor}"
                convention.append((name, d))  # explained below if the convention is all that differs
            elif uses_reduced(job) and ops & {"to_local", "local_map", "from_local"}:
                if factor:
                    d["detail"] += f"; PyTorch's = meshsim's x {factor}"
                reduced_local.append((name, d))  # explained below if Rd's spelling is all that differs
            elif after_uneven_mean and d["oracle_agrees_with"] == "pytorch":
                with_cause(d, "mean_uneven_replicated")
            grad_diffs.append((name, d, placement_diff))
            diffs.append(d)
    # The same program once more with one thing spelled as meshsim means it: a gradient that then
    # agrees differed by that alone. First the local collectives' backward convention, then the
    # cotangent spelling of Rd and P(sum) values entering local code, then both together.
    pending = convention + reduced_local
    for flags, cause, said in (
            ((True, False), "local_all_reduce_backward",
             "PyTorch agrees with meshsim under meshsim's backward convention for the local collectives"),
            ((False, True), "reduced_has_no_pytorch_spelling",
             "PyTorch agrees with meshsim when the gradient of Rd values entering or leaving local code is "
             "spelled as their cotangent, Partial(sum) (in_grad_placements, grad_placements)"),
            ((True, True), "local_all_reduce_backward",
             "PyTorch agrees with meshsim under meshsim's backward convention for the local collectives and "
             "with the gradient of Rd values spelled as their cotangent, Partial(sum)")):
        if not flags[1] and not convention or flags[1] and not uses_reduced(job):
            continue
        todo = [(name, d) for name, d in pending if "cause" not in d]
        if not todo:
            break
        again = rerun(job, *flags)
        for name, d in todo:
            theirs = again.grads.get(name, (None, None))[1] if again.error is None else None
            if theirs is not None and common.compare(name, job.grad(name), theirs, exact, dtype) is None:
                d["detail"] += "; " + said
                with_cause(d, cause)
    # clamp's gradient on its bounds: PyTorch 2.15's 0, libtorch 1.13's g (clamp_bound_gradient).
    clamped = [(name, d, pd) for name, d, pd in grad_diffs
               if "cause" not in d and d.get("oracle_agrees_with") == "meshsim" and "clamp" in ops]
    if clamped:
        again = rerun_clamp_on_bounds(job)
        for name, d, placement_diff in clamped:
            theirs = again.grads.get(name, (None, None))[1] if again.error is None else None
            if theirs is not None and common.compare(name, job.grad(name), theirs, exact, dtype) is None:
                d["detail"] += "; PyTorch agrees with meshsim when clamp's gradient passes on its bounds"
                with_cause(d, "clamp_bound_gradient")
                if placement_diff is not None and "cause" not in placement_diff:  # the values agree then
                    with_cause(placement_diff, "grad_strategy_choice")
    for name, d in pending:
        if "cause" not in d and "PyTorch's = meshsim's x" in d["detail"] and rd_output(job):
            # An Rd result of local code: PyTorch has no way to give it Rd's cotangent (an R gradient
            # reaches the body), so the n-fold factor and the Rd result are the evidence.
            d["detail"] += "; an Rd result of local code, whose R gradient PyTorch cannot spell as P(sum)"
            with_cause(d, "reduced_has_no_pytorch_spelling")
    if job.doc.get("train"):
        compared["train_values"] = run.train_compared
        diffs += run.train_diffs
    return common.report(job, SYSTEM, torch.__version__, diffs, compared, notes)


def rd_output(job: common.Job) -> bool:
    """Whether local code gives a value meshsim holds as Rd (a local_map's out placement, from_local)."""
    for op in job.ops():
        specs = op.get("out_placements") or ([op["placements"]] if op.get("op") == "from_local" else [])
        if any("Rd" in spec for spec in specs):
            return True
    return False


def rerun_clamp_on_bounds(job: common.Job) -> Run:
    """The job once more with clamp's gradient passing on its bounds (CLAMP_ON_BOUNDS)."""
    global CLAMP_ON_BOUNDS
    CLAMP_ON_BOUNDS = True
    try:
        return execute(job)
    finally:
        CLAMP_ON_BOUNDS = False


def rerun(job: common.Job, meshsim_convention: bool, reduced_grad_as_partial: bool) -> Run:
    """The job once more with the local collectives' backward as meshsim's and/or Rd's gradient
    spelled Partial(sum) (see MESHSIM_CONVENTION, REDUCED_GRAD_AS_PARTIAL)."""
    global MESHSIM_CONVENTION, REDUCED_GRAD_AS_PARTIAL
    MESHSIM_CONVENTION, REDUCED_GRAD_AS_PARTIAL = meshsim_convention, reduced_grad_as_partial
    try:
        return execute(job)
    finally:
        MESHSIM_CONVENTION = REDUCED_GRAD_AS_PARTIAL = False


def refusal_report(job: common.Job, run: Run, err: dict, notes: list[str]) -> dict:
    """meshsim refused the scenario: agreement if PyTorch refuses the same op (noted), else a
    difference of kind "error" saying who refuses what."""
    msg = (err.get("message") or "").splitlines()
    msg = msg[0] if msg else ""
    where, kind = err.get("path") or msg.split(":", 1)[0], err.get("kind")
    diffs = []
    if run.error is not None:
        path, theirs = run.error
        if path == where or where.startswith(path + "/") or path.startswith(where + "/"):
            notes.append(f"both refuse at {path}: meshsim {kind} ({msg}); PyTorch {theirs}")
        else:
            diffs.append(explain_error(job, {"kind": "error", "what": path,
                                             "detail": f"PyTorch refuses at {path} ({theirs}); meshsim refuses at "
                                                       f"{where} ({kind}: {msg})"}, theirs))
    else:
        d = {"kind": "error", "what": where,
             "detail": f"meshsim refuses at {where} ({kind}: {msg}); PyTorch runs the whole program"}
        if "a shard cannot become a partial" in msg:
            with_cause(d, "shard_to_partial_allowed")
        elif kind == "not_differentiable" and "amax/amin" in msg:
            with_cause(d, "extremum_partial_refused")
        diffs.append(d)
    return common.report(job, SYSTEM, torch.__version__, diffs, {}, notes)


if __name__ == "__main__":
    sys.exit(common.main(SYSTEM, version_fn, check))

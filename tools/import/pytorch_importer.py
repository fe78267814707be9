"""meshsim import pytorch: one training step of the user's parallelized model, recorded as a meshsim
scenario (docs/import.md).

    python pytorch_importer.py --file F.py --func build --mesh dp=2,tp=2 --out OUT.json

FUNC(mesh) returns (model, inputs, loss_fn). Under LocalTensorMode with a fake process group, the
importer runs model(*inputs), loss_fn(output) and loss.backward() once, and records:

- every DTensor op: DTensors are given a subclass (_Traced) whose __torch_dispatch__ sees each aten
  op with its operands' specs (DTensor's own C++ fast path sees them otherwise, below any hook), and
  the implicit redistributions DTensor makes before it (redistribute_local_tensor, wrapped);
- every op on plain (local) tensors, through a TorchDispatchMode above LocalTensorMode;
- DTensor.from_local, .to_local, .redistribute (wrapped), and FSDP2's unshard (FSDPParam.to_unsharded:
  the parameter redistributed to Rd on the FSDP axes) with its internal ops left out;
- in the backward, every collective PyTorch ran, by kind and mesh axis (FSDP2's all-gathers that
  re-unshard a parameter for the backward are left out: they repeat the forward's).

aten ops become meshsim ops through aten_table.py. Values on the data axes (those FSDP shards over,
and mesh axes no DTensor lives on) are lifted: a plain tensor there is each rank's part of a global
value whose dim 0 (the batch) is S(0) over those axes.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import re
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import aten_table  # noqa: E402
import common  # noqa: E402

logging.getLogger("torch.distributed").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.tensor._dispatch as _dispatch  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard  # noqa: E402
from torch.distributed.tensor.placement_types import _StridedShard  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

try:
    import torch.distributed.fsdp._fully_shard._fsdp_param as _fsdp_param
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as _fsdp_group
except ImportError:  # an older PyTorch without FSDP2
    _fsdp_param = _fsdp_group = None

METADATA_OPS = {"sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "dim", "is_same_size", "size",
                "stride", "numel", "is_contiguous", "_local_scalar_dense", "device", "equal"}
COLLECTIVE_KINDS = (("all_gather", "all_gather"), ("allgather", "all_gather"), ("reduce_scatter", "reduce_scatter"),
                    ("all_reduce", "all_reduce"), ("allreduce", "all_reduce"), ("all_to_all", "all_to_all"),
                    ("alltoall", "all_to_all"))


def placement_text(p) -> str:
    if isinstance(p, _StridedShard):
        return f"SS({p.dim},{p.split_factor})"
    if isinstance(p, Shard):
        return f"S({p.dim})"
    if isinstance(p, Partial):
        return f"P({p.reduce_op})"
    if isinstance(p, Replicate):
        return "R"
    return type(p).__name__


def dtype_text(dt) -> str:
    if dt in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        return "int64"
    if dt == torch.bool:
        return "bool"
    return "float"


class Unmapped(Exception):
    pass


class ImporterBug(Exception):
    """An exception of the recorder's own code (exit 7 with its traceback), never the user's."""


def guarded(method):
    """The recorder's own code: what it raises is an importer bug, kept apart from the user's errors."""
    def run(*a, **k):
        try:
            return method(*a, **k)
        except (ImporterBug, common.UserError):
            raise
        except UserSide as e:
            raise e.original.with_traceback(e.original.__traceback__) from None
        except Exception as e:  # noqa: BLE001
            raise ImporterBug(f"{type(e).__name__}: {e}") from e
    return run


class UserSide(Exception):
    """PyTorch's own exception inside a wrapped call: the user's, passed on as it is."""

    def __init__(self, original):
        super().__init__(str(original))
        self.original = original


def call_user(fn, *a, **k):
    try:
        return fn(*a, **k)
    except Exception as e:  # noqa: BLE001
        raise UserSide(e) from None


def bug_in(e: BaseException):
    while e is not None:
        if isinstance(e, ImporterBug):
            return e
        e = e.__cause__ or e.__context__
    return None


class Val:
    """A scenario value: `dt` (a DTensor of the scenario's mesh) or `local` (local code)."""

    def __init__(self, name, kind, bdim=None, dpart=None):
        self.name, self.kind, self.bdim, self.dpart = name, kind, bdim, dpart
        self.local = None  # its to_local value, once made
        self.input = None  # its input record, for inputs
        self.dtype = "float"  # its element type in the scenario
        # local code: per dim, its parts [(local extent, factor)], outer first; the global extent the
        # oracle sees is the product of extent * factor (a factor: the ranks a shard splits it over)
        self.comps = None
        self.creation = None  # the program records that made it from a creation op alone (a constant)
        self.lshape = None  # its shape as PyTorch has it, where no tensor of the program holds it


def comps_of_shape(shape, factors=None):
    factors = factors or [1] * len(shape)
    return [[(int(e), int(f))] for e, f in zip(shape, factors)]


def factor(dim_comps):
    f = 1
    for _, x in dim_comps:
        f *= x
    return f


def extent(dim_comps):
    e = 1
    for x, _ in dim_comps:
        e *= x
    return e


def view_comps(comps, out_shape):
    """The parts of a local view's result dims, or None when a sharded part would be cut across."""
    parts = [c for d in comps for c in d if c[0] != 1 or c[1] != 1]
    out = []
    for n in out_shape:
        mine, got = [], 1
        if n == 1 and parts and parts[0][1] != 1:  # a shard of one piece per rank: its dim is 1 here
            e, f = parts.pop(0)
            mine.append((1, f))
            if e != 1:
                parts.insert(0, (e, 1))
        while got < n:
            if not parts:
                return None
            e, f = parts.pop(0)
            if got * e <= n:
                mine.append((e, f))
                got *= e
            elif n % got == 0 and e % (n // got) == 0:
                need = n // got
                mine.append((need, f))  # the outer part keeps the shard factor
                parts.insert(0, (e // need, 1))
                got *= need
            else:
                return None
        out.append(mine or [(1, 1)])
    if parts:
        return None
    return out


class _Traced(DTensor):
    """A DTensor whose ops come to Python (the recorder) before DTensor's own dispatch."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return RECORDER.dtensor_op(func, types, args, kwargs or {})


RECORDER = None


def traced(t):
    if type(t) is DTensor:
        t.__class__ = _Traced
    return t


LOCAL_TENSOR_DIR = os.sep + "_local_tensor" + os.sep


def local_tensor_internals() -> bool:
    """Whether the op being dispatched comes from LocalTensor's own Python code (a method such as
    tolist or reconcile running one op per rank), not from the program."""
    f = sys._getframe(2)
    for _ in range(12):
        if f is None:
            return False
        if LOCAL_TENSOR_DIR in f.f_code.co_filename:
            return True
        f = f.f_back
    return False


class Recorder(TorchDispatchMode):
    def __init__(self, file, mesh_arg, mesh, model, inputs, loss_fn):
        super().__init__()
        self.file, self.mesh_arg, self.mesh = file, mesh_arg, mesh
        self.axes = mesh_arg.axes
        self.sizes = dict(zip(mesh_arg.axes, mesh_arg.shape))
        self.depth = 0
        self.phase = "setup"
        self.vals: dict[int, Val] = {}
        self.keep = []  # keeps recorded tensors alive, so their ids stay theirs
        self.names: set[str] = set()
        self.inputs: list[dict] = []
        self.program: list[dict] = []
        self.modules: list[str] = []  # the qualified names of the modules running, innermost last
        self.module_names = {id(m): n for n, m in model.named_modules()}
        self.unmapped: dict[str, list] = {}
        self.backward_counts: dict[tuple, int] = {}
        self.cur = None
        self.fsdp_pending: dict[int, object] = {}
        self.loss_parallel = False
        self.in_unshard = 0
        self.fsdp_reduce_tensors = 0
        self.group_axes = {}
        for i, a in enumerate(self.axes):
            try:
                self.group_axes[mesh.get_group(i).group_name] = a
            except Exception:  # noqa: BLE001
                pass
        self.data_axes = self.find_data_axes(model)
        self.data_size = 1
        for a in self.data_axes:
            self.data_size *= self.sizes[a]
        self.leaf_names = self.name_leaves(model, inputs, loss_fn)
        self.data_leaves = {id(t) for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)}
        for fv, cell in zip(getattr(getattr(loss_fn, "__code__", None), "co_freevars", ()),
                            getattr(loss_fn, "__closure__", None) or ()):
            try:
                if isinstance(cell.cell_contents, torch.Tensor):
                    self.data_leaves.add(id(cell.cell_contents))
            except ValueError:
                pass
        self.add_parameters(model)

    # --- the mesh's axes -----------------------------------------------------------------------------

    def fsdp_params(self, model):
        out = []
        for m in model.modules():
            get = getattr(m, "_get_fsdp_state", None)
            if get is None:
                continue
            group = getattr(get(), "_fsdp_param_group", None)
            if group is not None:
                out += list(group.fsdp_params)
        return out

    def find_data_axes(self, model):
        fsdp_axes, used = set(), set()
        for fp in self.fsdp_params(model):
            names = fp.mesh_info.mesh.mesh_dim_names or ()
            fsdp_axes.update(names)
        for _, p in model.named_parameters():
            if isinstance(p, DTensor):
                used.update(p.device_mesh.mesh_dim_names or ())
        self.fsdp_axes = [a for a in self.axes if a in fsdp_axes]
        return [a for a in self.axes if a in fsdp_axes or a not in used]

    def full_placements(self, mesh, placements, val=None, null_data=False):
        """A DTensor's placements on its mesh as the scenario's, one per axis of --mesh."""
        names = list(mesh.mesh_dim_names or ())
        out = []
        for a in self.axes:
            if a in names:
                out.append(placement_text(placements[names.index(a)]))
            elif null_data:
                out.append(None)
            elif a in self.data_axes and val is not None:
                out.append(self.data_placement(val))
            else:
                out.append("R")
        return out

    def data_placement(self, val):
        if val.bdim is not None:
            return f"S({val.bdim})"
        return {"sum": "P(sum)", "avg": "P(avg)"}.get(val.dpart, "R")

    # --- names and sources ---------------------------------------------------------------------------

    def unique(self, base):
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in base).strip("_") or "v"
        if base[0].isdigit():
            base = "v_" + base
        name, k = base, 1
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        return name

    def module(self):
        return self.modules[-1] if self.modules else ""

    def source(self, module=None):
        module = self.module() if module is None else module
        frame = common.user_frame(self.file, 2)
        if frame is None:
            return {"module": module or "(root)"}
        return common.source_of(self.file, frame.f_lineno, module or "(root)")

    def name_leaves(self, model, inputs, loss_fn):
        names = {}
        for n, b in model.named_buffers():
            names[id(b)] = n
        for fv, cell in zip(getattr(getattr(loss_fn, "__code__", None), "co_freevars", ()),
                            getattr(loss_fn, "__closure__", None) or ()):
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            if isinstance(v, torch.Tensor):
                names.setdefault(id(v), fv)
        for i, t in enumerate(pytree.tree_leaves(inputs)):
            if isinstance(t, torch.Tensor):
                names.setdefault(id(t), f"input{i}" if len(pytree.tree_leaves(inputs)) > 1 else "x")
        return names

    # --- inputs ----------------------------------------------------------------------------------------

    def bind(self, t, val):
        self.vals[id(t)] = val
        self.keep.append(t)
        return val

    def add_input(self, name, shape, placements, dtype, module, init=None, requires_grad=False, tensor=None):
        name = self.unique(name)
        rec = {"name": name, "shape": list(shape), "placements": placements}
        if dtype != "float":
            rec["dtype"] = dtype
        if init is not None:
            rec["init"] = init
        if requires_grad:
            rec["requires_grad"] = True
        rec["source"] = {"module": module or "(root)"}
        self.inputs.append(rec)
        val = Val(name, "dt")
        val.input = rec
        val.dtype = dtype
        rec["_tensor"] = tensor
        return val

    def add_parameters(self, model):
        fsdp = {id(fp.sharded_param): fp for fp in self.fsdp_params(model)}
        for fqn, p in model.named_parameters():
            module = fqn.rpartition(".")[0]
            if isinstance(p, DTensor):
                placements = self.full_placements(p.device_mesh, p.placements)
                shape = list(p.shape)
            else:
                placements, shape = ["R"] * len(self.axes), list(p.shape)
            val = self.add_input(fqn.replace(".", "_"), shape, placements, dtype_text(p.dtype), module,
                                 init="randn", requires_grad=p.requires_grad)
            line = creation_line(model, fqn, self.file)
            val.input["source"] = (common.source_of(self.file, line, module or "(root)") if line
                                   else {"module": module or "(root)"})
            self.bind(traced(p), val)
            if id(p) in fsdp:
                fsdp[id(p)]._meshsim_val = val
                fsdp[id(p)]._meshsim_module = module

    def leaf(self, t):
        """A tensor the program uses that no recorded op made: a new input."""
        if isinstance(t, DTensor):
            name = self.leaf_names.get(id(t), "const")
            val = self.add_input(name, list(t.shape), self.full_placements(t.device_mesh, t.placements),
                                 dtype_text(t.dtype), self.module(), tensor=t)
            return self.bind(traced(t), val)
        data = id(t) in self.data_leaves
        name = self.leaf_names.get(id(t), "const")
        shape = list(t.shape)
        bdim = None
        if data and shape:
            shape[0] *= self.data_size
            bdim = 0
        val = self.add_input(name, shape, None, dtype_text(t.dtype), self.module(), tensor=t)
        val.bdim = bdim
        val.input["_pending"] = True
        val.input["_data"] = data
        return self.bind(t, val)

    def fix_input(self, val, mesh=None, placements=None):
        """A plain input's placements, at its first use: its from_local's on the mesh it is made a
        DTensor of, R elsewhere, S(0) on the data axes."""
        rec = val.input
        if rec is None or not rec.get("_pending"):
            return False
        rec["_pending"] = False
        names = list(mesh.mesh_dim_names or ()) if mesh is not None else []
        out = []
        for a in self.axes:
            if a in names:
                p = placements[names.index(a)]
                out.append(placement_text(p))
                if isinstance(p, Shard):
                    rec["shape"][p.dim % len(rec["shape"])] *= self.sizes[a]
            elif a in self.data_axes and val.bdim is not None:
                out.append(f"S({val.bdim})")
            else:
                out.append("R")
        rec["placements"] = out
        return True

    def val_of(self, t):
        v = self.vals.get(id(t))
        if v is None:
            inner = getattr(t, "elem", None)  # an AsyncCollectiveTensor's tensor
            if inner is not None and id(inner) in self.vals:
                return self.vals[id(inner)]
            if id(t) in self.fsdp_pending:
                return self.unshard_value(t)
            v = self.leaf(t)
        if v.input is not None and v.input.get("_pending"):
            self.fix_input(v)
        return v

    @guarded
    def unshard_value(self, t):
        fp = self.fsdp_pending.pop(id(t))
        src = fp._meshsim_val
        if isinstance(t, DTensor):
            names = list(t.device_mesh.mesh_dim_names or ())
            placements = [placement_text(t.placements[names.index(a)]) if a in names else
                          ("Rd" if a in self.fsdp_axes else "R") for a in self.axes]
        else:
            placements = ["Rd" if a in self.fsdp_axes else "R" for a in self.axes]
        val = Val(self.unique(src.name + "_unsharded"), "dt")
        self.program.append({"out": val.name, "op": "redistribute", "args": [src.name], "placements": placements,
                             "source": self.source(fp._meshsim_module)})
        return self.bind(traced(t), val)

    @guarded
    def alias_tree(self, before, after):
        """Tensors FSDP2's hooks hand on in place of the module's (autograd Functions that return
        their inputs): the same values."""
        b = [t for t in pytree.tree_leaves(before) if isinstance(t, torch.Tensor)]
        a = [t for t in pytree.tree_leaves(after) if isinstance(t, torch.Tensor)]
        if len(a) != len(b):
            return
        for x, y in zip(b, a):
            if x is not y and id(y) not in self.vals and id(x) in self.vals:
                self.bind(y, self.vals[id(x)])

    # --- ops -------------------------------------------------------------------------------------------

    def emit(self, op, args, attrs, bdim=None, dpart=None, kind=None, outs=None, module=None):
        kind = kind or ("local" if any(a.kind == "local" for a in args) else "dt")
        if kind == "local":
            args = [self.as_local(a) for a in args]
        mod = self.module() if module is None else module
        if outs is None:
            val = Val(self.unique(f"{mod}_{op}" if mod else op), kind, bdim, dpart)
            rec = {"out": val.name, "op": op, "args": [a.name for a in args], **attrs}
        else:
            val = [Val(self.unique(f"{mod}_{op}" if mod else op), kind, bdim, dpart) for _ in range(outs)]
            rec = {"outs": [v.name for v in val], "op": op, "args": [a.name for a in args], **attrs}
        rec["source"] = self.source(mod)
        self.program.append(rec)

        return val, rec

    def as_local(self, v):
        if v.kind == "local":
            return v
        if v.local is None:
            v.local = Val(self.unique(v.name + "_local"), "local", v.bdim, v.dpart)
            v.local.dtype, v.local.lshape = v.dtype, v.lshape
            self.program.append({"out": v.local.name, "op": "to_local", "args": [v.name],
                                 "source": self.source()})
        return v.local

    def dtensor_op(self, func, types, args, kwargs):
        record = self.phase == "forward" and self.depth == 0
        if record:
            self.cur = {"redists": []}
        self.depth += 1
        try:
            out = DTensor.__torch_dispatch__.__func__(DTensor, func, types, args, kwargs)
        finally:
            self.depth -= 1
        out = pytree.tree_map(traced, out)
        if record:
            redists, self.cur = self.cur["redists"], None
            flat = pytree.tree_leaves(args)
            self.translate(func, args, kwargs, out, dtensor=True,
                           redists=[(flat[i], a, b) for i, a, b in redists if i < len(flat)])
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
        ns = getattr(func, "namespace", "aten")
        if self.phase == "backward" and ns in ("_c10d_functional", "c10d", "c10d_functional"):
            self.count_backward(func, args)
        if self.phase != "forward" or self.depth > 0 or name in METADATA_OPS:
            return func(*args, **kwargs)
        if local_tensor_internals():
            return func(*args, **kwargs)  # LocalTensor's own per-rank work (its Python methods)
        out = func(*args, **kwargs)
        if not any(isinstance(o, torch.Tensor) for o in pytree.tree_leaves(out)):
            return out
        self.translate(func, args, kwargs, out, dtensor=False, redists=[])
        return out

    @guarded
    def count_backward(self, func, args):
        name = func._schema.name.split("::")[-1] if hasattr(func, "_schema") else str(func)
        if name in ("wait_tensor", "_wrap_tensor_autograd") or self.in_unshard:
            return
        kind = next((k for word, k in COLLECTIVE_KINDS if word in name), None)
        if kind is None:
            return
        group = next((a for a in pytree.tree_leaves(args) if isinstance(a, str) and a in self.group_axes), None)
        if group is None:
            for a in pytree.tree_leaves(args):
                gn = getattr(a, "group_name", None)
                if gn in self.group_axes:
                    group = gn
        axis = self.group_axes.get(group)
        if axis is None:
            axis = ",".join(self.fsdp_axes) if self.fsdp_reduce_tensors and self.fsdp_axes else "?"
        n = 1
        if kind == "reduce_scatter" and self.fsdp_reduce_tensors:
            n = self.fsdp_reduce_tensors
        self.backward_counts[(kind, axis)] = self.backward_counts.get((kind, axis), 0) + n

    @guarded
    def translate(self, func, args, kwargs, out, dtensor, redists):
        packet = str(getattr(func, "overloadpacket", func))
        if os.environ.get("MESHSIM_IMPORT_DEBUG"):
            print(f"aten {func} dtensor={dtensor}", file=sys.stderr)
        row = aten_table.TABLE.get(packet)
        inplace = row is None and packet.endswith("_") and not packet.endswith("__")
        if inplace:
            row = aten_table.TABLE.get(packet[:-1])
        if packet in ("aten._log_softmax", "aten.nll_loss_forward") and dtensor:
            handlers = getattr(DTensor._op_dispatcher, "_custom_op_handlers", {})
            self.loss_parallel = self.loss_parallel or any(str(getattr(k, "overloadpacket", "")) == packet
                                                           for k in handlers)
        schema = getattr(func, "_schema", None)
        full = list(args)
        if schema is not None:
            full = []
            for i, a in enumerate(schema.arguments):
                if i < len(args) and not a.kwarg_only:
                    full.append(args[i])
                elif a.name in kwargs:
                    full.append(kwargs[a.name])
                elif a.has_default_value():
                    full.append(a.default_value)
                else:
                    full.append(None)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        b = Builder(self, func, full, kwargs, outs, dtensor, redists)
        try:
            if row is None:
                raise Unmapped("no row in the table")
            if row.emit is None:
                res = b.value(full[0])
            else:
                res = row.emit(b, [b.value(a) if isinstance(a, torch.Tensor) else
                                   ([b.value(x) for x in a] if isinstance(a, (list, tuple)) and a and
                                    isinstance(a[0], torch.Tensor) else a) for a in full])
        except Unmapped as e:
            first = self.source()
            entry = self.unmapped.setdefault(packet, [0, first, str(e)])
            entry[0] += 1
            res = None
        results = res if isinstance(res, (tuple, list)) else (res,)
        if inplace and results and results[0] is not None and isinstance(full[0], torch.Tensor):
            self.vals[id(full[0])] = results[0]  # the tensor written now holds the op's result
        for t, v in zip(outs, results):
            if isinstance(t, torch.Tensor):
                if v is None:
                    v = Val(self.unique("unmapped"), "dt")
                self.bind(t, v)

    @guarded
    def funcol(self, kind, x, out, group, dim=None, reduce=None, splits=None):
        """A functional collective called in local code: one body op, its dim as the user gave it."""
        try:
            import torch.distributed._functional_collectives as fc
            axis = self.group_axes.get(str(fc._resolve_group_name(group)))
        except Exception:  # noqa: BLE001
            axis = None
        packet = f"_functional_collectives.{kind}"
        if axis is None or (splits is not None and any(s is not None for s in splits)):
            why = "over a group that is no axis of the mesh" if axis is None else "with split sizes"
            entry = self.unmapped.setdefault(packet, [0, self.source(), why])
            entry[0] += 1
            self.bind(out, Val(self.unique("unmapped"), "dt"))
            return
        v = self.val_of(x)
        lv = self.as_local(v)
        n = self.sizes[axis]
        src = lv.comps or comps_of_shape(list(x.shape))
        comps = [list(c) for c in src]
        attrs = {"axis": axis}
        if kind == "all_reduce":
            attrs["reduce"] = reduce if isinstance(reduce, str) else str(reduce).split(".")[-1].lower()
        elif kind == "all_gather":
            d = dim % max(x.dim(), 1)
            attrs["dim"] = dim
            f = factor(src[d])
            comps[d] = [(extent(src[d]) * n, f // n if f % n == 0 else 1)]
        elif kind == "reduce_scatter":
            d = dim % max(x.dim(), 1)
            attrs["dim"] = dim
            comps[d] = [(extent(src[d]) // n, factor(src[d]) * n)]
        else:
            attrs.update({"split_dim": 0, "concat_dim": 0})
        res, rec = self.emit(kind, [lv], attrs, bdim=lv.bdim, dpart=lv.dpart, kind="local")
        res.comps, res.dtype = comps, lv.dtype
        self.bind(out, res)
        inner = getattr(out, "elem", None)
        if isinstance(inner, torch.Tensor):
            self.bind(inner, res)

    # --- from_local, to_local, redistribute, FSDP ------------------------------------------------------

    @guarded
    def from_local(self, orig, local_tensor, device_mesh=None, placements=None, **kw):
        record = self.phase == "forward" and self.depth == 0
        self.depth += 1
        try:
            out = call_user(orig, local_tensor, device_mesh, placements, **kw)
        finally:
            self.depth -= 1
        out = traced(out)
        if not record:
            return out
        v = self.vals.get(id(local_tensor)) or (self.vals.get(id(getattr(local_tensor, "elem", None))))
        if v is None:
            v = self.leaf(local_tensor)
        mesh, pl = out.device_mesh, out.placements
        if v.input is not None and v.input.get("_pending"):
            self.fix_input(v, mesh, pl)
            self.bind(out, v)
            return out
        if v.kind == "dt" and all(isinstance(p, Replicate) for p in pl):
            self.bind(out, v)
            return out
        lv = self.as_local(v)
        res = Val(self.unique(f"{self.module()}_from_local" if self.module() else "from_local"), "dt", lv.bdim, lv.dpart)
        rec = {"out": res.name, "op": "from_local", "args": [lv.name],
               "placements": self.full_placements(mesh, pl, lv), "source": self.source()}
        self.program.append(rec)
        self.bind(out, res)
        return out

    @guarded
    def to_local(self, orig, dt, *a, **k):
        record = self.phase == "forward" and self.depth == 0
        self.depth += 1
        try:
            out = call_user(orig, dt, *a, **k)
        finally:
            self.depth -= 1
        if not record:
            return out
        v = self.val_of(dt)
        lv = self.as_local(v)  # a replicated value's local too is local code, as in PyTorch (its backward too)
        if lv.comps is None:
            names = list(dt.device_mesh.mesh_dim_names or ())
            factors = [1] * dt.dim()
            for a, p in zip(names, dt.placements):
                if isinstance(p, Shard):
                    factors[p.dim % dt.dim()] *= self.sizes[a]
            if v.bdim is not None:
                factors[v.bdim] *= self.data_size
            lv.comps = comps_of_shape(list(out.shape), factors)
        self.bind(out, lv)
        return out

    @guarded
    def redistribute(self, orig, dt, device_mesh=None, placements=None, **k):
        record = self.phase == "forward" and self.depth == 0
        self.depth += 1
        try:
            out = call_user(orig, dt, device_mesh, placements, **k)
        finally:
            self.depth -= 1
        out = traced(out)
        if not record:
            return out
        v = self.val_of(dt)
        if list(out.placements) == list(dt.placements):
            self.bind(out, v)
            return out
        res = Val(self.unique(f"{self.module()}_redistribute" if self.module() else "redistribute"), "dt", v.bdim,
                  v.dpart)
        self.program.append({"out": res.name, "op": "redistribute", "args": [v.name],
                             "placements": self.full_placements(out.device_mesh, out.placements, v),
                             "source": self.source()})
        self.bind(out, res)
        return out

class Builder:
    """What aten_table's emitters see of one aten op (see aten_table's docstring)."""

    def __init__(self, rec: Recorder, func, full, kwargs, outs, dtensor, redists):
        self.rec, self.func, self.full, self.kwargs, self.outs = rec, func, full, kwargs, outs
        self.dtensor, self.redists = dtensor, redists
        self.tensors = {}  # id(Val) -> torch tensor of the op's argument

    def value(self, t):
        v = self.rec.val_of(t)
        self.tensors.setdefault(id(v), t)
        return v

    def unmapped(self, why):
        return Unmapped(why)

    def is_value(self, x):
        return isinstance(x, Val)

    def arg_tensor(self, i):
        a = self.full[i]
        return a[0] if isinstance(a, (list, tuple)) else a

    def val(self, i):
        a = self.full[i]
        t = a[0] if isinstance(a, (list, tuple)) else a
        return self.rec.vals.get(id(t)) or self.rec.vals.get(id(getattr(t, "elem", None)))

    def bdim_of(self, i, *_):
        v = self.val(i)
        return v.bdim if v is not None else None

    def ndim_of(self, i):
        return self.arg_tensor(i).dim()

    def shape_of(self, i):
        return list(self.arg_tensor(i).shape)

    def moved_bdim(self, i, f):
        bd = self.bdim_of(i)
        return None if bd is None else f(bd)

    def scaled(self):
        return self.rec.data_size > 1

    def is_local(self):
        return any(isinstance(v, Val) and v.kind == "local" for v in self.arg_vals())

    def arg_vals(self):
        out = []
        for a in self.full:
            for t in (a if isinstance(a, (list, tuple)) else [a]):
                if isinstance(t, torch.Tensor):
                    out.append(self.rec.vals.get(id(t)) or self.rec.vals.get(id(getattr(t, "elem", None))))
        return out

    def comps_in(self, i):
        """Local code: the parts of argument i's dims (a value that is not local yet: as its to_local)."""
        return self.comps_of(self.arg_tensor(i))

    def comps_of(self, t):
        v = self.rec.vals.get(id(t)) or self.rec.vals.get(id(getattr(t, "elem", None)))
        if v is not None and v.kind == "local" and v.comps is not None:
            return v.comps
        factors = [1] * t.dim()
        if v is not None and v.bdim is not None and v.kind == "dt":
            factors[v.bdim] = self.rec.data_size
        return comps_of_shape(list(t.shape), factors)

    def view_shape(self, shape, bd):
        """A view's shape: scaled on the batch dim for a DTensor of the scenario; for local code, the
        local shape with -1 on the one dim a shard splits (so the oracle's global view is the same)."""
        if not self.is_local():
            return self.batch_shape(shape, bd)
        lshape = list(self.outs[0].shape)
        comps = view_comps(self.comps_in(0), lshape)
        if comps is None:
            raise Unmapped("a local view that cuts across a sharded dim")
        split = [i for i, c in enumerate(comps) if factor(c) != 1]
        if len(split) > 1:
            raise Unmapped("a local view with two sharded dims in its result")
        self.pending_comps = comps
        return [-1 if i in split else n for i, n in enumerate(lshape)]

    def local_view(self, x):
        """A view in local code as flatten and unflatten of the dims after those it keeps, when the
        result has two sharded dims (the batch over the data axes and one more): a single -1 in one
        view cannot say both, but each dim it keeps needs no size."""
        src = self.comps_in(0)
        lshape = list(self.outs[0].shape)
        comps = view_comps(src, lshape)
        if comps is None:
            raise Unmapped("a local view that cuts across a sharded dim")
        split = [i for i, c in enumerate(comps) if factor(c) != 1]
        if len(split) <= 1:
            return None
        k = 0
        while k < min(len(src), len(comps)) and src[k] == comps[k]:
            k += 1
        rest = [i for i in split if i >= k]
        if len(rest) > 1 or k >= len(src):
            raise Unmapped("a local view with two sharded dims in its result")
        val = x
        if len(src) - k > 1:
            val, rec = self.rec.emit("flatten", [val], {"start_dim": k}, bdim=x.bdim, kind="local")
        if len(lshape) - k > 1 or len(src) - k == 0:
            sizes = [-1 if i in rest else lshape[i] for i in range(k, len(lshape))]
            if not rest:
                sizes[0] = -1
            val, rec = self.rec.emit("unflatten", [val], {"dim": k, "sizes": sizes}, bdim=x.bdim, kind="local")
        val.comps = comps
        val.dtype = dtype_text(self.outs[0].dtype)
        return val

    def expand_shape(self, shape, pos):
        if not self.is_local():
            return self.batch_shape(shape, pos)
        src = self.comps_in(0)
        lshape = list(self.outs[0].shape)
        off = len(lshape) - len(src)
        out, comps = [], []
        for i, n in enumerate(lshape):
            j = i - off
            if j >= 0 and extent(src[j]) == n:
                out.append(-1)
                comps.append(src[j])
            else:
                if j >= 0 and factor(src[j]) != 1:
                    raise Unmapped("a local expand of a sharded dim")
                out.append(n)
                comps.append([(n, 1)])
        self.pending_comps = comps
        return out

    def comps_val(self, v):
        """The parts of an operand value's dims, as local code sees it."""
        if v.comps is not None and v.kind == "local":
            return v.comps
        t = self.tensors.get(id(v))
        shape = list(t.shape) if t is not None else getattr(v, "lshape", None)
        if shape is None:
            return None
        factors = [1] * len(shape)
        if v.bdim is not None and v.kind == "dt" and v.bdim < len(shape):
            factors[v.bdim] = self.rec.data_size
        return comps_of_shape(shape, factors)

    def local_comps(self, name, attrs, args, shape=None):
        """The parts of a local op's result dims (see Val.comps)."""
        pend = getattr(self, "pending_comps", None)
        if pend is not None:
            self.pending_comps = None
            return pend
        first = next((o for o in self.outs if isinstance(o, torch.Tensor)), None)
        if first is None and shape is None:
            return None
        lshape = list(shape) if shape is not None else list(first.shape)
        ins = [self.comps_val(a) for a in args]
        if any(c is None for c in ins):
            ins = [self.comps_of(t) for a in self.full for t in (a if isinstance(a, (list, tuple)) else [a])
                   if isinstance(t, torch.Tensor)]
        x = ins[0] if ins else []
        n = len(x)

        def fix(d):
            return d % n if n else 0
        if name == "transpose":
            d0, d1 = fix(attrs["dim0"]), fix(attrs["dim1"])
            out = list(x)
            out[d0], out[d1] = x[d1], x[d0]
            return out
        if name == "permute":
            return [x[fix(d)] for d in attrs["dims"]]
        if name == "unsqueeze":
            d = attrs["dim"] % (n + 1)
            return x[:d] + [[(1, 1)]] + x[d:]
        if name == "squeeze":
            d = fix(attrs["dim"])
            return x[:d] + x[d + 1:] if len(lshape) < n else x
        if name in ("narrow", "cat", "stack", "split"):
            d = attrs["dim"] % (len(lshape) if name == "stack" else n)
            if name != "stack" and factor(x[d]) != 1:
                raise Unmapped(f"a local {name} along a sharded dim")
            if name == "stack":
                return x[:d] + [[(lshape[d], 1)]] + x[d:]
            out = list(x)
            out[d] = [(lshape[d], 1)]
            return out
        if name in ("sum", "mean", "amax", "amin") and "dim" in attrs:
            dims = {fix(d) for d in attrs["dim"]}
            return [[(1, 1)] if i in dims else c for i, c in enumerate(x) if attrs.get("keepdim") or i not in dims]
        if name in ("mm", "bmm", "matmul") and len(ins) == 2:
            xs, ys = ins
            batch = len(lshape) - 2
            out = self.broadcast([c[:-2] for c in []] or [xs[:-2], ys[:-2]], lshape[:batch]) if batch > 0 else []
            return out + [xs[-2] if len(xs) >= 2 else [(1, 1)], ys[-1]]
        return self.broadcast(ins, lshape)

    def broadcast(self, ins, lshape):
        out = []
        for i, e in enumerate(lshape):
            pick = [(e, 1)]
            for c in ins:
                j = i - (len(lshape) - len(c))
                if j >= 0 and extent(c[j]) == e:
                    if factor(c[j]) != 1:
                        pick = c[j]
                        break
                    if pick == [(e, 1)]:
                        pick = c[j]
            out.append(pick)
        return out

    def batch_shape(self, shape, pos):
        shape = list(shape)
        vals = [self.val(i) for i, a in enumerate(self.full) if isinstance(a, torch.Tensor)]
        local = any(v is not None and v.kind == "local" for v in vals)
        if pos is not None and self.scaled() and not local and 0 <= pos < len(shape) and shape[pos] != -1:
            shape[pos] *= self.rec.data_size
        return shape

    def pointwise_bdim(self):
        nd = max((t.dim() for t in self.outs if isinstance(t, torch.Tensor)), default=0)
        for i, a in enumerate(self.full):
            if isinstance(a, torch.Tensor):
                v = self.val(i)
                if v is not None and v.bdim is not None:
                    return nd - a.dim() + v.bdim
        return None

    def matmul_bdim(self):
        x = self.bdim_of(0)
        if x is not None and x != self.ndim_of(0) - 1:
            return x
        y = self.bdim_of(1)
        if y is not None and self.ndim_of(1) > 2 and y < self.ndim_of(1) - 2:
            return y
        return None

    def matmul_dpart(self):
        x, y = self.bdim_of(0), self.bdim_of(1)
        if (x is not None and x == self.ndim_of(0) - 1) or (y is not None and y == self.ndim_of(1) - 2):
            return "sum"
        return None

    def reduced_bdim(self, dims, keep, kind):
        bd = self.bdim_of(0)
        if bd is None:
            v = self.val(0)
            return None, v.dpart if v is not None else None
        n = self.ndim_of(0)
        ds = list(range(n)) if not dims else sorted(d % n for d in dims)
        if bd in ds:
            return None, kind
        return (bd if keep else bd - sum(1 for d in ds if d < bd)), None

    def cast(self, v):
        """_to_copy: the same dtype is the value itself; another dtype of a creation op's result is
        that creation op made again in the new dtype (a constant); anything else has no meshsim op."""
        src = self.arg_tensor(0)
        to = dtype_text(self.outs[0].dtype)
        if to == v.dtype:
            return v
        if v.creation is None:
            raise Unmapped(f"a cast from {dtype_text(src.dtype)} to {to}")
        chain = v.creation
        if chain[0].get("dtype", "float") == to or (to == "float" and "dtype" not in chain[0]):
            return v
        out = None
        for i, old in enumerate(chain):
            attrs = {k: x for k, x in old.items() if k not in ("out", "op", "args", "source", "recorded")}
            if i == 0:
                attrs.pop("dtype", None)
                if to != "float":
                    attrs["dtype"] = to
            out, rec = self.rec.emit(old["op"], [out] if out is not None else [], attrs, kind="dt")
            out.dtype, out.creation = to, None
        out.creation = [r for r in self.rec.program[-len(chain):]]
        return out

    def results(self):
        return len(self.outs)

    def constant(self, kind, shape, dtype):
        """A creation op the translation needs (a causal mask), replicated on every axis."""
        attrs = {"shape": list(shape), "placements": ["R"] * len(self.rec.axes)}
        if dtype != "float":
            attrs["dtype"] = dtype
        val, rec = self.rec.emit(kind, [], attrs, kind="dt")
        val.dtype, val.lshape = dtype, list(shape)
        return val

    def pieces_count(self):
        return len([o for o in self.outs if isinstance(o, torch.Tensor)])

    def recorded(self, outs_tensors, args):
        rec = {}
        if not self.dtensor:
            return None
        pls = []
        for t in outs_tensors:
            pls.append(self.rec.full_placements(t.device_mesh, t.placements, null_data=True)
                       if isinstance(t, DTensor) else None)
        rec["placements"] = pls[0] if len(pls) == 1 else pls
        colls = []
        for t, cur, tgt in self.redists:
            v = self.rec.vals.get(id(t))
            for j, a in enumerate(args):
                if a is v:
                    colls.append({"arg": j, "from": self.rec.full_placements(cur.mesh, cur.placements, v),
                                  "to": self.rec.full_placements(tgt.mesh, tgt.placements, v)})
                    break
        if colls:
            rec["collectives"] = colls
        return rec

    def op(self, name, args, attrs, bdim=None, dpart=None, src=None, final=True, list_arg=False, shape=None,
           kind=None):
        """Emits one meshsim op; `shape`: its result's shape as PyTorch would have it, for the parts
        of an op that is not the aten op's last (whose result is the aten op's)."""
        self.check_ids(name, args)
        val, rec = self.rec.emit(name, args, attrs, bdim, dpart, kind=kind)
        first = next((o for o in self.outs if isinstance(o, torch.Tensor)), None)
        if first is not None:
            val.dtype = dtype_text(first.dtype)
        if shape is not None:
            val.lshape = list(shape)
        if val.kind == "local":
            val.comps = self.local_comps(name, attrs, args, None if shape is None and final else shape)
            if os.environ.get("MESHSIM_IMPORT_DEBUG"):
                print(f"  {val.name} = {name}{[a.name for a in args]} {attrs}: {val.comps}", file=sys.stderr)
        if self.dtensor:
            r = self.recorded([o for o in self.outs if isinstance(o, torch.Tensor)][:1] if final else [], args)
            if r is not None and final:
                rec["recorded"] = r
            elif r is not None and r.get("collectives"):
                rec["recorded"] = {"collectives": r["collectives"]}
        rec.pop("_args", None)
        return val

    def multi(self, name, x, attrs, n):
        if self.is_local():  # meshsim's local code has no split: one narrow per piece, as split runs
            pieces, start, out = [o for o in self.outs if isinstance(o, torch.Tensor)], 0, []
            d = attrs["dim"]
            nd = self.ndim_of(0)
            if self.bdim_of(0) is not None and d % nd == self.bdim_of(0):
                raise Unmapped("a split of the batch dim")
            for k, t in enumerate(pieces):
                length = int(t.shape[d])
                val, rec = self.rec.emit("narrow", [x], {"dim": d, "start": start, "length": length},
                                         self.bdim_of(0), None)
                src = self.comps_in(0)
                if factor(src[d % nd]) != 1:
                    raise Unmapped("a local split along a sharded dim")
                val.comps = [c if i != d % nd else [(length, 1)] for i, c in enumerate(src)]
                val.dtype = x.dtype
                start += length
                out.append(val)
            return tuple(out)
        vals, rec = self.rec.emit(name, [x], attrs, self.bdim_of(0), None, outs=n)
        if self.dtensor:
            r = self.recorded([o for o in self.outs if isinstance(o, torch.Tensor)], [x])
            rec["recorded"] = r
        rec.pop("_args", None)
        return tuple(vals)

    def check_ids(self, name, args):
        """An int64 input used as ids or targets gets its bound ({"ids": N})."""
        if name == "embedding":
            ids = args[0]
            bound = self.shape_of(0)[0]
        elif name == "nll_loss":
            ids = args[1]
            bound = self.shape_of(0)[1] if self.ndim_of(0) > 1 else self.shape_of(0)[0]
        else:
            return
        if ids.input is not None and "init" not in ids.input:
            ids.input["init"] = {"ids": int(bound)}

    def create(self, kind, a):
        packet = str(self.func.overloadpacket).split(".")[-1]
        out = self.outs[0]
        attrs = {}
        if kind in ("ones", "zeros", "full"):
            attrs["shape"] = list(out.shape)
        if kind == "full":
            value = a[1] if packet in ("full", "full_like", "new_full") else None
            attrs["value"] = aten_table._num(float(value) if not isinstance(value, bool) else value)
        if kind == "arange":
            n = out.shape[0] if out.dim() else 1
            attrs["shape"] = [int(n)]
        if isinstance(out, DTensor):
            attrs["placements"] = self.rec.full_placements(out.device_mesh, out.placements)
        else:
            attrs["placements"] = ["R"] * len(self.rec.axes)
        dt = dtype_text(out.dtype)
        if dt != "float":
            attrs["dtype"] = dt
        start, step = 0, 1
        if kind == "arange" and packet == "arange":
            schema_names = [x.name for x in self.func._schema.arguments]
            if "start" in schema_names:
                start = a[schema_names.index("start")]
            if "step" in schema_names:
                step = a[schema_names.index("step")]
            if (start != 0 or step != 1) and dt == "int64":
                attrs.pop("dtype")  # meshsim computes on floats: the arange is made float (exact on integers)
                dt = "float"
        val, rec = self.rec.emit(kind, [], attrs, kind="dt")
        chain = [rec]
        if step != 1:
            val, rec = self.rec.emit("scale", [val], {"value": aten_table._num(step)})
            chain.append(rec)
        if start:
            val, rec = self.rec.emit("add", [val], {"value": aten_table._num(start)})
            chain.append(rec)
        val.dtype, val.creation = dt, chain
        return val

    def collective(self, op, a):
        x = a[0]
        group = next((g for g in a if isinstance(g, str) and g in self.rec.group_axes), None)
        if group is None:
            raise Unmapped("a collective over a group that is no axis of the mesh")
        axis = self.rec.group_axes[group]
        attrs = {"axis": axis}
        if op == "all_reduce":
            attrs["reduce"] = a[1]
        elif op == "all_gather":
            attrs["dim"] = 0
        elif op == "reduce_scatter":
            if a[1] != "sum":
                raise Unmapped(f"reduce_scatter with {a[1]}")
            attrs["dim"] = 0
        else:
            if a[1] is not None or a[2] is not None:
                raise Unmapped("all_to_all_single with split sizes")
            attrs.update({"split_dim": 0, "concat_dim": 0})
        val, rec = self.rec.emit(op, [x], attrs, bdim=x.bdim, dpart=x.dpart, kind="local")
        rec.pop("_args", None)
        return val


class _Functions(TorchFunctionMode):
    """torch.matmul on local tensors, recorded as one matmul (its aten decomposition views a sharded
    batch and head dim together, which local code cannot say to the oracle)."""

    def __init__(self, rec):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.rec
        if (func in MATMULS and rec.phase == "forward" and rec.depth == 0 and len(args) == 2 and not kwargs
                and all(isinstance(a, torch.Tensor) and not isinstance(a, DTensor) for a in args)):
            rec.depth += 1
            try:
                out = func(*args)
            finally:
                rec.depth -= 1
            rec.translate(torch.ops.aten.matmul.default, args, {}, out, dtensor=False, redists=[])
            return out
        return func(*args, **kwargs)


MATMULS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__}


def patch(rec: Recorder, model):
    """Installs the recorder's wrappers; returns a function that removes them."""
    undo = []

    def setattr_undo(obj, name, value):
        old = obj.__dict__[name] if isinstance(obj, type) and name in obj.__dict__ else getattr(obj, name)
        setattr(obj, name, value)
        undo.append((obj, name, old))

    orig_from_local = DTensor.from_local
    setattr_undo(DTensor, "from_local", staticmethod(
        lambda local_tensor, device_mesh=None, placements=None, **kw:
        rec.from_local(orig_from_local, local_tensor, device_mesh, placements, **kw)))
    orig_to_local = DTensor.to_local
    setattr_undo(DTensor, "to_local", lambda self, *a, **k: rec.to_local(orig_to_local, self, *a, **k))
    orig_redistribute = DTensor.redistribute
    setattr_undo(DTensor, "redistribute", lambda self, device_mesh=None, placements=None, **k:
                 rec.redistribute(orig_redistribute, self, device_mesh, placements, **k))
    import torch.distributed._functional_collectives as fc
    shapes = {  # name: (kind, index of dim, index of reduce op, index of split sizes, index of group)
        "all_reduce": ("all_reduce", None, 1, None, 2),
        "all_gather_tensor": ("all_gather", 1, None, None, 2),
        "all_gather_tensor_autograd": ("all_gather", 1, None, None, 2),
        "reduce_scatter_tensor": ("reduce_scatter", 2, 1, None, 3),
        "reduce_scatter_tensor_autograd": ("reduce_scatter", 2, 1, None, 3),
        "all_to_all_single": ("all_to_all", None, None, (1, 2), 3),
        "all_to_all_single_autograd": ("all_to_all", None, None, (1, 2), 3),
    }
    for fname, (kind, di, ri, si, gi) in shapes.items():
        orig = getattr(fc, fname, None)
        if orig is None:
            continue

        def collective(*a, _o=orig, _k=kind, _d=di, _r=ri, _s=si, _g=gi, **kw):
            record = rec.phase == "forward" and rec.depth == 0 and isinstance(a[0] if a else None, torch.Tensor) \
                and not isinstance(a[0], DTensor) and len(a) > _g
            rec.depth += 1
            try:
                out = _o(*a, **kw)
            finally:
                rec.depth -= 1
            if record:
                rec.funcol(_k, a[0], out, a[_g], dim=a[_d] if _d is not None else None,
                           reduce=a[_r] if _r is not None else None,
                           splits=[a[i] for i in _s] if _s is not None else None)
            return out
        setattr_undo(fc, fname, collective)
    orig_contiguous = LocalTensor.contiguous

    def contiguous(self, *a, **k):
        record = rec.phase == "forward" and rec.depth == 0
        rec.depth += 1
        try:
            out = orig_contiguous(self, *a, **k)
        finally:
            rec.depth -= 1
        if record and out is not self:
            rec.alias_tree(self, out)
        return out
    setattr_undo(LocalTensor, "contiguous", contiguous)
    # implicit redistributions: redistribute_local_args knows the argument index
    orig_args = _dispatch.OpDispatcher.redistribute_local_args

    def redistribute_local_args(op_info, suggested, use_val):
        if rec.cur is not None and rec.depth == 1 and rec.phase == "forward":
            flat = (tuple(pytree.tree_leaves(suggested.args_schema)) if op_info.args_tree_spec is not None
                    else suggested.args_schema)
            for i, spec in enumerate(op_info.flat_args_schema):
                if hasattr(spec, "placements") and spec != flat[i]:
                    rec.cur["redists"].append((i, spec, flat[i]))
        return orig_args(op_info, suggested, use_val)
    setattr_undo(_dispatch.OpDispatcher, "redistribute_local_args", staticmethod(redistribute_local_args))
    if _fsdp_param is not None:
        orig_unsharded = _fsdp_param.FSDPParam.to_unsharded

        def to_unsharded(fp):
            rec.depth += 1
            try:
                r = orig_unsharded(fp)
            finally:
                rec.depth -= 1
            if rec.phase == "forward" and getattr(fp, "_meshsim_val", None) is not None:
                p = traced(fp._unsharded_param)
                if id(p) not in rec.vals:
                    rec.fsdp_pending[id(p)] = fp
            return r
        setattr_undo(_fsdp_param.FSDPParam, "to_unsharded", to_unsharded)
        try:
            import torch.distributed.fsdp._fully_shard._fsdp_state as _fsdp_state
            state_cls = [(_fsdp_state.FSDPState, n) for n in ("_root_pre_forward", "_pre_forward", "_post_forward",
                                                            "_register_pre_backward_hook", "_pre_backward",
                                                            "_root_post_backward_final_callback", "_lazy_init")]
        except ImportError:
            state_cls = []
        group_cls = [(_fsdp_group.FSDPParamGroup, n) for n in (
            "pre_forward", "post_forward", "pre_backward", "post_backward", "reshard", "unshard", "wait_for_unshard",
            "finalize_backward")]
        for cls, name in state_cls + group_cls:
            orig = cls.__dict__.get(name)
            if orig is None:
                continue

            def wrapped(self, *a, _o=orig, _n=name, **k):
                rec.depth += 1
                if _n in ("unshard", "wait_for_unshard"):
                    rec.in_unshard += 1
                if _n == "post_backward":
                    rec.fsdp_reduce_tensors = len(self.fsdp_params)
                try:
                    out = _o(self, *a, **k)
                finally:
                    rec.depth -= 1
                    if _n in ("unshard", "wait_for_unshard"):
                        rec.in_unshard -= 1
                    if _n == "post_backward":
                        rec.fsdp_reduce_tensors = 0
                if rec.phase == "forward" and a:
                    before = (a[-2], a[-1]) if _n.endswith("pre_forward") and len(a) >= 2 else a[-1]
                    rec.alias_tree(before, out)
                return out
            setattr_undo(cls, name, wrapped)

    def pre(module, args):
        rec.modules.append(rec.module_names.get(id(module), rec.module()))

    def post(module, args, out):
        if rec.modules:
            rec.modules.pop()
    handles = []
    for m in model.modules():  # the module's own hooks (a plan's) run inside its name
        handles.append(m.register_forward_pre_hook(pre, prepend=True))
        handles.append(m.register_forward_hook(post, always_call=True))

    def remove():
        for h in handles:
            h.remove()
        for obj, name, old in reversed(undo):
            setattr(obj, name, old)
    return remove


def finish_inputs(rec: Recorder):
    for inp in rec.inputs:
        t = inp.pop("_tensor", None)
        if inp.pop("_pending", False):
            rec.fix_input(next(v for v in rec.vals.values() if v.input is inp))
        inp.pop("_pending", None)
        inp.pop("_data", None)
        if inp.get("dtype") == "int64" and "init" not in inp:
            bound = 2
            try:
                locs = t._local_tensors.values() if isinstance(t, LocalTensor) else [t]
                bound = max(int(x.max()) for x in locs) + 1
            except Exception:  # noqa: BLE001
                pass
            inp["init"] = {"ids": max(bound, 1)}
        if inp.get("placements") is None:
            inp["placements"] = ["R"] * len(rec.axes)


def run_import(args) -> None:
    global RECORDER
    mesh_arg = common.parse_mesh(args.mesh)
    display_file = args.display_file or args.file
    _, fn = common.load_user_function(args.file, args.func)
    if _fsdp_param is not None:
        _fsdp_param.free_storage = lambda t: None  # LocalTensor storages cannot be resized
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=mesh_arg.world)
    torch.manual_seed(0)
    with LocalTensorMode(mesh_arg.world):
        try:
            mesh = init_device_mesh("cpu", tuple(mesh_arg.shape), mesh_dim_names=tuple(mesh_arg.axes))
        except Exception as e:  # noqa: BLE001
            raise common.UserError(f"--mesh {mesh_arg.text()}: PyTorch cannot make this mesh: {common.last_frame(e)}")
        try:
            ret = fn(mesh)
        except BaseException as e:  # noqa: BLE001
            raise common.UserError(f"{args.func}(mesh) raised: {common.last_frame(e, args.file)}") from None
        if not (isinstance(ret, (tuple, list)) and len(ret) == 3 and isinstance(ret[0], torch.nn.Module)
                and callable(ret[2])):
            raise common.UserError(f"{display_file}: {args.func}(mesh) must return (model, inputs, loss_fn): an "
                                   f"nn.Module, a tuple of its positional inputs and a function of its output that "
                                   f"returns the loss; got {type(ret).__name__}"
                                   + (f" of {len(ret)}" if isinstance(ret, (tuple, list)) else ""))
        model, inputs, loss_fn = ret
        check_fits(model, mesh_arg)
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        if not isinstance(inputs, (tuple, list)):
            raise common.UserError(f"{display_file}: {args.func}(mesh): inputs must be a tuple of tensors, got "
                                   f"{type(inputs).__name__}")
        rec = Recorder(args.file, mesh_arg, mesh, model, inputs, loss_fn)
        RECORDER = rec
        remove = patch(rec, model)
        try:
            with rec, _Functions(rec):
                rec.phase = "forward"
                try:
                    rec.modules = []
                    out = model(*inputs)
                    loss = loss_fn(out)
                except BaseException as e:  # noqa: BLE001
                    if bug_in(e):
                        raise
                    raise common.UserError(f"the forward raised: {common.last_frame(e, args.file)}") from None
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    raise common.UserError(f"{display_file}: loss_fn must return a scalar tensor, got "
                                           f"{type(loss).__name__}")
                if rec.unmapped:
                    raise common.UserError(unmapped_message(rec))
                loss_val = rec.val_of(loss)
                rec.phase = "backward"
                try:
                    if rec.loss_parallel:  # its backward runs under loss_parallel() too (its docstring)
                        from torch.distributed.tensor.parallel import loss_parallel
                        with loss_parallel():
                            loss.backward()
                    else:
                        loss.backward()
                except BaseException as e:  # noqa: BLE001
                    if bug_in(e):
                        raise
                    raise common.UserError(f"the backward raised: {common.last_frame(e, args.file)}") from None
                rec.phase = "done"
        finally:
            remove()
            RECORDER = None
    finish_inputs(rec)
    backward = loss_val.name
    if loss_val.kind == "local":
        # each rank's loss, computed in local code; the oracle reads a local mean over the local batch
        # as the mean over the global batch (P(avg) of the ranks' means), a local sum as the global
        # sum (P(sum)); FSDP averaging the ranks' gradients divides the latter by the data ranks below
        reduce = "P(sum)" if loss_val.dpart == "sum" else "P(avg)"
        v = Val(rec.unique("loss"), "dt", dpart=loss_val.dpart)
        rec.program.append({"out": v.name, "op": "from_local", "args": [loss_val.name],
                            "placements": [reduce if a in rec.data_axes else "R" for a in rec.axes],
                            "source": {"module": f"(loss: each rank's, {reduce} over {', '.join(rec.data_axes)})"
                                       if rec.data_axes else "(loss)"}})
        backward, loss_val = v.name, v
    if loss_val.dpart == "sum" and rec.fsdp_axes:
        n = 1
        for a in rec.fsdp_axes:
            n *= rec.sizes[a]
        v = Val(rec.unique("loss_mean_over_data"), "dt")
        rec.program.append({"out": v.name, "op": "scale", "args": [backward], "value": 1.0 / n,
                            "source": {"module": "(loss: FSDP averages gradients over " + ", ".join(rec.fsdp_axes)
                                       + ")"}})
        backward = v.name
    name = os.path.splitext(os.path.basename(args.out))[0]
    doc = {
        "format": "meshsim.scenario/1",
        "name": "".join(c if c.isalnum() or c in "_-" else "_" for c in name),
        "mesh": {"axes": mesh_arg.axes, "shape": mesh_arg.shape},
        "imported": {
            "system": "pytorch", "version": torch.__version__, "file": display_file, "function": args.func,
            "mesh": mesh_arg.text(),
            "backward_collectives": [{"op": k, "axis": a, "count": n}
                                     for (k, a), n in sorted(rec.backward_counts.items(),
                                                             key=lambda kv: (rec.axes.index(kv[0][1])
                                                                             if kv[0][1] in rec.axes else 99, kv[0][0]))],
        },
        "inputs": rec.inputs,
        "program": rec.program,
        "backward": backward,
    }
    common.write_json_atomic(args.out, doc)


def creation_line(model, fqn: str, file: str) -> int | None:
    """The line of the user's file that made parameter `fqn`: `self.NAME = ...` in the class (the
    user's, in `file`) of the nearest module above it, e.g. `self.wq = nn.Linear(...)` for
    `layers.0.attention.wq.weight`; None when no such line is found."""
    target = os.path.realpath(file)
    parts = fqn.split(".")
    for i in range(len(parts) - 1, -1, -1):
        try:
            holder = model.get_submodule(".".join(parts[:i])) if i else model
        except AttributeError:
            continue
        pattern = re.compile(rf"\bself\.{re.escape(parts[i])}\s*(:[^=]*)?=(?!=)")
        for cls in type(holder).__mro__:
            try:
                src = inspect.getsourcefile(cls)
                if not src or os.path.realpath(src) != target:
                    continue
                lines, start = inspect.getsourcelines(cls)
            except (OSError, TypeError):
                continue
            for k, text in enumerate(lines):
                if pattern.search(text):
                    return start + k
    return None


def check_fits(model, mesh_arg) -> None:
    """Every sharded parameter divides evenly over its mesh axes: an uneven shard gives each rank
    its own local shape, which the one-process simulation (LocalTensorMode) cannot run through."""
    for fqn, p in model.named_parameters():
        if not isinstance(p, DTensor):
            continue
        names = list(p.device_mesh.mesh_dim_names or ())
        sizes = p.device_mesh.shape
        split = [1] * p.dim()
        for i, pl in enumerate(p.placements):
            if isinstance(pl, Shard):
                split[pl.dim % p.dim()] *= sizes[i]
        for d, n in enumerate(split):
            if n > 1 and p.shape[d] % n:
                axes = [names[i] for i, pl in enumerate(p.placements) if isinstance(pl, Shard) and pl.dim % p.dim() == d]
                raise common.UserError(
                    f"--mesh {mesh_arg.text()}: the model does not fit the mesh: parameter {fqn} of shape "
                    f"{list(p.shape)} is sharded on dim {d} ({p.shape[d]}) over {', '.join(axes)} ({n} ranks), "
                    f"which does not divide it")


def unmapped_message(rec: Recorder) -> str:
    lines = [f"{len(rec.unmapped)} aten op(s) have no row in the table (tools/import/aten_table.py); nothing was "
             "written:"]
    for packet, (count, src, why) in sorted(rec.unmapped.items()):
        where = f"{src['file']}:{src['line']}" if "line" in src else f"module {src.get('module')}"
        lines.append(f"  {packet} x{count}, first at {where}" + (f" ({src.get('module')})" if "line" in src else "")
                     + (f": {why}" if why != "no row in the table" else ""))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description="meshsim import pytorch (see docs/import.md)")
    ap.add_argument("--file", required=True)
    ap.add_argument("--func", default="build")
    ap.add_argument("--mesh", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--display-file")
    args = ap.parse_args()
    return common.run_main(lambda: run_import(args))


if __name__ == "__main__":
    sys.exit(main())

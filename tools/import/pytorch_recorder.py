"""meshsim import pytorch: the Recorder, the dispatch mode that records the user's step (DTensor
ops through _Traced, ops on local tensors, inputs and parameters, FSDP2's unshard, from_local,
to_local and redistribute, the backward's collectives). Part of pytorch_importer.py (its docstring
tells the whole)."""

from __future__ import annotations

import inspect
import os
import re
import sys

import aten_table
import common
import torch
import torch.utils._pytree as pytree
from pytorch_builder import Builder
from pytorch_values import (Unmapped, Val, call_user, comps_of_shape, dtype_text, extent, factor, guarded,
                            placement_text)
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.utils._python_dispatch import TorchDispatchMode

METADATA_OPS = {"sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "dim", "is_same_size", "size",
                "stride", "numel", "is_contiguous", "_local_scalar_dense", "device", "equal"}
COLLECTIVE_KINDS = (("all_gather", "all_gather"), ("allgather", "all_gather"), ("reduce_scatter", "reduce_scatter"),
                    ("all_reduce", "all_reduce"), ("allreduce", "all_reduce"), ("all_to_all", "all_to_all"),
                    ("alltoall", "all_to_all"))



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

    def as_local(self, v, grad_placements=None):
        """v's local tensor (one to_local, shared); with `grad_placements` (the scenario's, of an
        explicit to_local(grad_placements=...)): a to_local of its own, whose backward differs."""
        if v.kind == "local":
            return v
        if v.local is None or grad_placements is not None:
            lv = Val(self.unique(v.name + "_local"), "local", v.bdim, v.dpart)
            lv.dtype, lv.lshape = v.dtype, v.lshape
            rec = {"out": lv.name, "op": "to_local", "args": [v.name]}
            if grad_placements is not None:
                rec["grad_placements"] = grad_placements
            rec["source"] = self.source()
            self.program.append(rec)
            if grad_placements is not None:
                return lv
            v.local = lv
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
        grad = k.get("grad_placements")
        if grad is not None:  # the layout of the gradient local code gives it, as the user asserts
            grad = self.full_placements(dt.device_mesh, grad, v)
        lv = self.as_local(v, grad)  # a replicated value's local too is local code, as in PyTorch (its backward too)
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

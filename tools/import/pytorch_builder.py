"""meshsim import pytorch: the Builder, what aten_table's emitters see of one aten op, and the
meshsim ops it emits for it. Part of pytorch_importer.py (its docstring tells the whole)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import aten_table
import torch
from pytorch_values import Unmapped, Val, comps_of_shape, dtype_text, extent, factor, view_comps
from torch.distributed.tensor import DTensor

try:
    from torch.distributed.tensor.placement_types import _MaskPartial
except ImportError:  # an older PyTorch: it lived with the embedding's strategy
    from torch.distributed.tensor._ops._embedding_ops import _MaskPartial

if TYPE_CHECKING:
    from pytorch_recorder import Recorder


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
            if any(isinstance(p, _MaskPartial) for p in tgt.placements):
                continue  # the vocab-parallel embedding masking its ids: its own algorithm (meshsim's embedding too)
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

"""meshsim import pytorch: the recorder's wrappers of PyTorch (DTensor.from_local, .to_local,
.redistribute, functional collectives, DTensor's implicit redistributions, FSDP2, module hooks, and
torch.matmul on local tensors). Part of pytorch_importer.py (its docstring tells the whole)."""

from __future__ import annotations

import torch
import torch.distributed.tensor._dispatch as _dispatch
import torch.utils._pytree as pytree
from pytorch_recorder import Recorder, traced
from torch.distributed._local_tensor import LocalTensor
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

try:
    import torch.distributed.fsdp._fully_shard._fsdp_param as _fsdp_param
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as _fsdp_group
except ImportError:  # an older PyTorch without FSDP2
    _fsdp_param = _fsdp_group = None


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

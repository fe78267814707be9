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
value whose dim 0 value is S(0) over those axes.

The modules (run as a script, this file's directory is on sys.path): this one, the command line,
loading and running the user's step, writing the scenario; pytorch_recorder.py, the Recorder (the
dispatch mode, inputs, parameters, FSDP, from_local/to_local/redistribute); pytorch_hooks.py, its
wrappers of PyTorch; pytorch_builder.py, the Builder that turns one aten op into meshsim ops;
pytorch_values.py, values, placements and the importer's exceptions.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

logging.getLogger("torch.distributed").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import pytorch_recorder  # noqa: E402
from pytorch_hooks import _Functions, _fsdp_param, patch  # noqa: E402
from pytorch_recorder import Recorder  # noqa: E402
from pytorch_values import Val, bug_in  # noqa: E402


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
        pytorch_recorder.RECORDER = rec
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
            pytorch_recorder.RECORDER = None
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

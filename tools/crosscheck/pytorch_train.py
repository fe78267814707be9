"""Training steps (a scenario's `train`) on PyTorch: after the checked run's first forward and
backward, the steps run on DTensors as a user's training loop does, and every parameter, optimizer
state and total gradient norm is compared with meshsim's mesh after every step.

The loop, per step: each microbatch's data inputs are made from meshsim's own per-rank locals of
that microbatch (`meshsim run --values DIR --values-per-rank` writes them under DIR/train), the
program runs forward, `loss.backward()` adds to every parameter's `.grad` (gradient accumulation,
PyTorch's own); then clipping, as the scenario says: `reduce: "dtensor"` is
`torch.nn.utils.get_total_norm` over the DTensor gradients and a multiplication by the clamped
coefficient (`clip_grad_norm_` itself when `eps` is its 1e-6), `{"all_reduce": axes}` is the user's
own code on the local gradients (`to_local()`, the p-th powers summed, `funcol.all_reduce` over each
axis named, in order); then `torch.optim.SGD` or `torch.optim.AdamW` (`foreach=False`, the
single-tensor path meshsim's optimizer follows) steps, with the step's learning rate; then
`zero_grad()`.

Optimizer states with placements of their own (`optimizer.states`: ZeRO's sharded states of a
replicated parameter) are created before the first AdamW step as DTensors laid out that way (a
momentum buffer, which SGD creates from the first gradient, is redistributed to them after the
first step), so DTensor moves the gradient and the parameter to them in the optimizer's own ops.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import DTensor
from torch.distributed.tensor import zeros as dtensor_zeros

import common


def load_train(job: common.Job) -> tuple[dict, dict]:
    """meshsim's files of the steps: (step, microbatch) -> input name -> {rank: entry, "global":
    entry}, and (step, kind, param, state) -> entry of the mesh's value after the step."""
    inputs: dict = {}
    after: dict = {}
    for f in job.index.get("files", []):
        kind = f["kind"]
        if kind in ("train_input_rank", "train_input"):
            key = f["rank"] if kind == "train_input_rank" else "global"
            inputs.setdefault((f["step"], f["microbatch"]), {}).setdefault(f["value"], {})[key] = f
        elif kind in ("train_param", "train_state"):
            after[(f["step"], kind, f["value"], f.get("state", ""))] = f
    return inputs, after


class StepFailed(Exception):
    """PyTorch refused part of a step (clipping or the optimizer's update): where, and the error."""

    def __init__(self, where: str, error: BaseException):
        super().__init__(f"{where}: {error}")
        self.where = where
        self.error = error


class Steps:
    """The steps of one job, run inside its Program (the first microbatch already ran)."""

    def __init__(self, prog, run, device: str, contiguous_stride):
        self.prog = prog
        self.run = run
        self.device = device
        self.stride = contiguous_stride
        self.job = prog.job
        self.spec = prog.job.doc["train"]
        self.params = [i["name"] for i in self.job.doc["inputs"] if i.get("requires_grad")]
        self.inputs, self.after = load_train(self.job)

    # -- the loop --

    def run_all(self) -> None:
        t = self.spec
        steps, mbs = int(t["steps"]), int(t.get("microbatches", 1))
        lr = t.get("lr", 0.01)
        lrs = lr if isinstance(lr, list) else [lr] * steps
        params = [self.prog.inputs[p] for p in self.params]
        opt = self.optimizer(params, lrs[0])
        done = self.meshsim_steps()
        for step in range(1, steps + 1):
            if step > done:
                self.run.notes.append(f"train: meshsim ran {done} of {steps} steps (it stops at the first failing "
                                      "one): the later ones are not compared")
                break
            for mb in range(mbs):
                if step > 1 or mb > 0:
                    self.microbatch(step, mb)
            try:
                norm = self.clip() if t.get("clip_grad_norm") else None
            except Exception as e:  # noqa: BLE001 - PyTorch's refusal is a result
                raise StepFailed(f"/train/clip_grad_norm (step {step})", e) from e
            self.grads_as_params(step)
            for g in opt.param_groups:
                g["lr"] = lrs[step - 1]
            try:
                opt.step()
            except Exception as e:  # noqa: BLE001
                raise StepFailed(f"/train/optimizer (step {step})", e) from e
            if step == 1:
                self.place_momentum(opt)
            opt.zero_grad(set_to_none=True)
            self.compare(step, opt, norm)

    def meshsim_steps(self) -> int:
        per_step = ((self.job.result.get("train") or {}).get("per_step")) or []
        return len(per_step)

    def microbatch(self, step: int, mb: int) -> None:
        """The program once more on microbatch `mb` of `step`'s data and the current parameters."""
        prog = self.prog
        env = {p: prog.inputs[p] for p in self.params}
        data = self.inputs.get((step, mb), {})
        for inp in self.job.doc["inputs"]:
            name = inp["name"]
            if name in env:
                continue
            ranks = data.get(name, {})
            if 0 not in ranks:
                raise ValueError(f"meshsim wrote no locals of input {name} for step {step}, microbatch {mb}")
            # The global shape: the assembled value's, or the declared one (a from_local input's are locals).
            gshape = ranks["global"]["shape"] if "global" in ranks else inp["shape"]
            dtype = prog.elem_type(inp.get("dtype"))
            loc = prog.mode.rank_map(lambda r: torch.from_numpy(np.array(self.job._load(ranks[r]["path"])))
                                     .to(self.device, dtype))
            placements = prog.placements(inp["placements"], len(gshape))
            env[name] = DTensor.from_local(loc, prog.mesh, placements, run_check=False, shape=torch.Size(gshape),
                                           stride=self.stride(gshape))
        prog.run_ops(self.job.doc["program"], env, "/program")
        loss = env[self.job.doc["backward"]]
        if loss.requires_grad:
            loss.backward() if loss.ndim == 0 else loss.backward(torch.ones_like(loss))

    def grads_as_params(self, step: int) -> None:
        """Each gradient laid out as its parameter (a Partial axis reduced, a replicated gradient of
        a shard cut): PyTorch's optimizers update in place, and DTensor refuses an in-place op that
        would change the parameter's placements (`in-place operations that require placement changes
        are not supported`), so a training loop does this before the optimizer (after clipping, which
        takes the gradients as the backward left them, as meshsim does); meshsim's optimizer moves the
        gradient itself (semantics.md, "Training steps")."""
        for name in self.params:
            p = self.prog.inputs[name]
            g = p.grad
            if g is None or not isinstance(g, DTensor) or tuple(g.placements) == tuple(p.placements):
                continue
            if step == 1:
                self.run.notes.append(f"train: grad {name} leaves the backward as {tuple(g.placements)}: "
                                      f"redistributed to its parameter's {tuple(p.placements)} after clipping, before the optimizer "
                                      "(DTensor refuses an in-place update that changes placements)")
            p.grad = g.redistribute(p.device_mesh, p.placements)

    # -- clipping --

    def clip(self) -> float:
        c = self.spec["clip_grad_norm"]
        p = c.get("norm_type", 2)
        p = math.inf if p == "inf" else float(p)
        names = c.get("params") or self.params
        grads = [self.prog.inputs[n].grad for n in names if self.prog.inputs[n].grad is not None]
        eps = float(c.get("eps", 1e-6))
        max_norm = float(c["max_norm"])
        reduce = c.get("reduce", "dtensor")
        if reduce == "dtensor":
            if eps == 1e-6:
                params = [self.prog.inputs[n] for n in names]
                total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=p, foreach=False)
            else:
                total = torch.nn.utils.get_total_norm(grads, norm_type=p, foreach=False)
                coef = torch.clamp(max_norm / (total + eps), max=1.0)
                for g in grads:
                    g.mul_(coef)
            return float((total.full_tensor() if isinstance(total, DTensor) else total).item())
        # The user's own reduction: each rank's local gradients, reduced over the axes named. Local
        # norms depend on the layout: a gradient PyTorch's backward left laid out otherwise than
        # meshsim's (a difference of the first backward, reported with its cause) is laid out as
        # meshsim's first, so that the same code sees the same locals.
        grads = [self.as_meshsim(n, self.prog.inputs[n].grad) for n in names
                 if self.prog.inputs[n].grad is not None]
        locals_ = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        if not locals_:
            return 0.0
        if math.isinf(p):
            # max |g| with 0 beside it: a rank whose shard is empty has the norm's identity, not an error
            total = torch.stack([torch.cat([l.abs().flatten(), l.new_zeros(1)]).max() for l in locals_]).max()
        else:
            total = torch.stack([l.abs().pow(p).sum() for l in locals_]).sum()
        for axis in reduce["all_reduce"]:
            total = funcol.all_reduce(total, "max" if math.isinf(p) else "sum", (self.prog.mesh,
                                                                                 self.job.mesh_axes.index(axis)))
            total = funcol.wait_tensor(total) if hasattr(funcol, "wait_tensor") else total
        norm = total if math.isinf(p) else total.pow(1.0 / p)
        coef = torch.clamp(max_norm / (norm + eps), max=1.0)
        for l in locals_:
            l.mul_(coef)
        return float(self.rank0(norm))

    def as_meshsim(self, name: str, g):
        spec = self.job.grad_placements(name)
        if spec is None or not isinstance(g, DTensor):
            return g
        want = tuple(self.prog.placements(spec, g.ndim))
        if tuple(g.placements) == want:
            return g
        try:
            moved = g.redistribute(g.device_mesh, want)
        except Exception as e:  # noqa: BLE001 - e.g. R -> Partial, which DTensor keeps for internal use
            self.run.notes.append(f"train: grad {name} stays {tuple(g.placements)} for the user's reduction of "
                                  f"local norms (meshsim's is {spec}; DTensor will not move it: {str(e)[:80]})")
            return g
        self.run.notes.append(f"train: grad {name} laid out as meshsim's {spec} (PyTorch's backward left "
                              f"{tuple(g.placements)}) before the user's reduction of local norms")
        self.prog.inputs[name].grad = moved
        return moved

    def rank0(self, t) -> float:
        lt = getattr(t, "_local_tensors", None)
        return float((lt[0] if lt is not None else t).item())

    # -- the optimizer --

    def optimizer(self, params: list, lr: float):
        o = self.spec.get("optimizer") or {"kind": "sgd"}
        if o["kind"] == "sgd":
            opt = torch.optim.SGD(params, lr=lr, momentum=o.get("momentum", 0.0), dampening=o.get("dampening", 0.0),
                                  nesterov=bool(o.get("nesterov", False)), weight_decay=o.get("weight_decay", 0.0),
                                  foreach=False)
        else:
            b = o.get("betas", [0.9, 0.999])
            opt = torch.optim.AdamW(params, lr=lr, betas=(b[0], b[1]), eps=o.get("eps", 1e-8),
                                    weight_decay=o.get("weight_decay", 0.01), foreach=False)
            for name, p in zip(self.params, params):
                spec = (o.get("states") or {}).get(name)
                if spec is None:
                    continue
                # ZeRO: the states laid out as the scenario says before AdamW makes them like p.
                laid = dtensor_zeros(p.shape, dtype=p.dtype, device_mesh=p.device_mesh,
                                     placements=self.prog.placements(spec, p.ndim))
                opt.state[p] = {"step": torch.tensor(0.0, dtype=torch.float32), "exp_avg": laid.clone(),
                                "exp_avg_sq": laid.clone()}
        return opt

    def place_momentum(self, opt) -> None:
        o = self.spec.get("optimizer") or {}
        for name, p in zip(self.params, [self.prog.inputs[n] for n in self.params]):
            spec = (o.get("states") or {}).get(name)
            st = opt.state.get(p, {})
            if spec is not None and st.get("momentum_buffer") is not None:
                st["momentum_buffer"] = st["momentum_buffer"].redistribute(p.device_mesh,
                                                                          self.prog.placements(spec, p.ndim))

    # -- comparing --

    def compare(self, step: int, opt, norm: float | None) -> None:
        run, job = self.run, self.job
        dtype = job.options.get("dtype", "float64")
        for name in self.params:
            p = self.prog.inputs[name]
            self.one(step, f"step {step}, parameter {name}", ("train_param", name, ""), p, dtype)
            for sname, sval in opt.state.get(p, {}).items():
                if sname == "step" or sval is None:
                    continue
                self.one(step, f"step {step}, optimizer state {name}.{sname}", ("train_state", name, sname), sval,
                         dtype)
        if norm is not None:
            per_step = (job.result.get("train") or {}).get("per_step") or []
            entry = per_step[step - 1] if step <= len(per_step) else {}
            ranks = ((entry.get("grad_norm") or {}).get("ranks")) or []
            if ranks and ranks[0] is not None:
                run.train_compared += 1
                d = common.compare(f"step {step}, clip_grad_norm's total norm", np.float64(ranks[0]),
                                   np.float64(norm), False, dtype)
                if d:
                    d["kind"] = "train"
                    run.train_diffs.append(d)

    def one(self, step: int, what: str, key: tuple, value, dtype: str) -> None:
        entry = self.after.get((step,) + key)
        if entry is None:
            return
        with torch.no_grad():
            full = value.full_tensor() if isinstance(value, DTensor) else value
            lt = getattr(full, "_local_tensors", None)
            data = (lt[0] if lt is not None else full).detach().cpu().numpy()
        self.run.train_compared += 1
        d = common.compare(what, self.job._load(entry["path"]), data, False, dtype)
        if d:
            d["kind"] = "train"
            self.run.train_diffs.append(d)


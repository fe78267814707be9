"""Bug: a replicated weight used in local code after `to_local()`, its gradient never all-reduced.

Data parallel over mesh axis "dp" (4 ranks): the weight `w` is a DTensor replicated over dp, the
batch `x` is sharded by rows. The layer multiplies on the local tensors, as code often does to call
a kernel or a library that does not take DTensors:

    y_local = x.to_local() @ self.w.to_local()

`DTensor.to_local()` without `grad_placements` tells autograd that the gradient coming back has
the forward's layout, Replicate: each rank keeps the gradient of its own rows, `x_r^T g_r`, and
calls it the replicated gradient of `w`. Nothing sums it over dp. The forward is right; the four
replicas of `w.grad` disagree and none of them is the gradient of the loss (the sum over the ranks).
The fix: `self.w.to_local(grad_placements=[Partial()])` (the gradient is a partial sum that DTensor
then reduces), or keep the matmul on DTensors.

Real reports of this class: a weight replicated over a data-parallel axis but used in per-rank code
(shard_map / local_map bodies without `pvary`, DDP with a parameter used outside the wrapped
module, custom kernels called on `to_local()` tensors): training runs, losses look plausible, the
replicas drift apart. It is the PyTorch form of examples/bugs/missing_pvary_dp_weight.json (the
same shapes: x [8, 6] S(0), w [6, 3] R, dp=4, loss = sum(x @ w), a local_map with check_variance
false); its hand-written counterpart with the import's data (the parameter first, drawn from randn)
is examples/bugs/missing_grad_reduction_to_local.json. Both fail with

    grad w: 12 of 18 elements differ (up to 1.4e-11 allowed); greatest difference 8 at [0, 0]:
    expected -7, actual 1 (ranks 0, 1, 2, 3); ranks 0 and 1 hold different locals across mesh axis
    "dp" where R says they are equal (and 2 more pairs)

and the import's first divergence names `w_local = to_local(w)`: the gradient it gives `w`.
"""

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

MESHSIM_IMPORTS = [
    {"system": "pytorch", "func": "build", "mesh": "dp=4", "out": "bug_missing_grad_reduction_to_local.json",
     "expect": "fail"},
]


class LocalLinear(nn.Module):
    """A bias-free linear layer for data parallelism whose matmul runs on the ranks' local tensors."""

    def __init__(self, mesh, d_in: int, d_out: int):
        super().__init__()
        self.mesh = mesh
        self.w = nn.Parameter(distribute_tensor(torch.randn(d_in, d_out), mesh, [Replicate()]))

    def forward(self, x: DTensor) -> DTensor:
        w = self.w.to_local()  # BUG: the gradient of w comes back as each rank's own, never summed over dp
        y = x.to_local() @ w
        return DTensor.from_local(y, self.mesh, [Shard(0)])


def build(mesh):
    torch.manual_seed(0)
    dp = mesh["dp"]
    model = LocalLinear(dp, 6, 3)
    x = distribute_tensor(torch.randn(8, 6), dp, [Shard(0)])
    return model, (x,), lambda y: y.sum()

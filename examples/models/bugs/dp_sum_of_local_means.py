"""Bug: each data-parallel rank takes the mean loss of its own rows, and the ranks' means are summed.

Data parallel over mesh axis "dp" (4 ranks): `x` [8, 6] is sharded by rows, the weight `w` [6, 3]
replicated, `y = x @ w` runs on DTensors (its gradient is reduced correctly). The loss is written
in local code, the way a training loop computes a per-batch mean:

    local_loss = y.to_local().mean()                       # the mean of this rank's 2 rows
    loss = DTensor.from_local(local_loss, mesh, [Partial()])

`Partial()` is `Partial("sum")`: the loss is the sum of the four ranks' means, 4 times the mean
over the batch, and so is every gradient (`grad w = 4 x expected`). With uneven shards even
`Partial("avg")` would be wrong (a mean of means weighs a short shard's rows more: the class of
PyTorch issue 162692, examples/bugs/pytorch_162692_uneven_mean.json); the fix is to sum locally
and divide by the global count, or to call `y.mean()` on the DTensor.

Real reports of this class: losses or gradients off by the data-parallel world size (a sum where a
mean was meant: DDP/FSDP gradient averaging combined with a loss already averaged, or the reverse),
"my loss is N times larger on N GPUs", learning rates that must be rescaled with the world size.
The hand-written counterpart is examples/bugs/dp_sum_of_local_means.json (a local_map with
check_variance false that takes the mean and returns P(sum), the same data). Both fail with

    loss: expected 1.82429, actual 7.29715; actual = 4 x expected everywhere: the size of mesh axis dp
    grad w: 12 of 18 elements differ; greatest difference 1.75 at [2, 0]: expected -0.583333,
    actual -2.33333; actual = 4 x expected everywhere: the size of mesh axis dp

(the other 6 elements of grad w are 0 on both sides). The import's first divergence is the `from_local`.
"""

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

MESHSIM_IMPORTS = [
    {"system": "pytorch", "func": "build", "mesh": "dp=4", "out": "bug_dp_sum_of_local_means.json", "expect": "fail"},
]


class Linear(nn.Module):
    def __init__(self, mesh, d_in: int, d_out: int):
        super().__init__()
        self.w = nn.Parameter(distribute_tensor(torch.randn(d_in, d_out), mesh, [Replicate()]))

    def forward(self, x: DTensor) -> DTensor:
        return x @ self.w


def build(mesh):
    torch.manual_seed(0)
    dp = mesh["dp"]
    model = Linear(dp, 6, 3)
    x = distribute_tensor(torch.randn(8, 6), dp, [Shard(0)])

    def loss_fn(y):
        local_loss = y.to_local().mean()  # the mean over this rank's rows only
        return DTensor.from_local(local_loss, dp, [Partial()])  # BUG: the sum of the 4 ranks' means

    return model, (x,), loss_fn

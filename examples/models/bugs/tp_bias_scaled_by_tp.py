"""Bug: the bias of a hand-written row-parallel linear divided by the TP size, its gradient too.

The same layer as tp_bias_every_rank.py, written by someone who saw that the all-reduce adds the
bias once per rank and divided it by the number of ranks:

    y_local = x.to_local() @ self.w.to_local() + self.b.to_local() / tp
    y = DTensor.from_local(y_local, mesh, [Partial()]).redistribute(mesh, [Replicate()])

The forward is now right (`x @ w + b`), but the gradient is not: each rank's bias gradient is
`1/tp` of the true one, `to_local()` calls it the replicated gradient, and nothing sums it over tp:
`grad b = expected / 4` on every rank. The weight's gradient is right.

Real reports of this class: a forward fixed by a scale whose backward is not (a loss scaled by the
world size, a bias or a norm weight divided by the TP degree); the loss curve looks right and the
bias learns tp times too slowly. It is the PyTorch form of the hand-written scenario
examples/bugs/bias_grad_off_by_tp.json (x [4, 8] S(1), w [8, 6] S(0), b [6] R, tp=4, loss = sum(y)),
whose local_map body scales the bias by 0.25 and all-reduces.
"""

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

MESHSIM_IMPORTS = [
    {"system": "pytorch", "func": "build", "mesh": "tp=4", "out": "bug_tp_bias_scaled_by_tp.json", "expect": "fail"},
]


class RowParallelLinear(nn.Module):
    def __init__(self, mesh, d_in: int, d_out: int):
        super().__init__()
        self.mesh = mesh
        self.w = nn.Parameter(distribute_tensor(torch.randn(d_in, d_out), mesh, [Shard(0)]))
        self.b = nn.Parameter(distribute_tensor(torch.randn(d_out), mesh, [Replicate()]))

    def forward(self, x: DTensor) -> DTensor:
        tp = self.mesh.size()
        # BUG: the forward is right, the bias's gradient is 1/tp of the truth on every rank
        y_local = x.to_local() @ self.w.to_local() + self.b.to_local() / tp
        y = DTensor.from_local(y_local, self.mesh, [Partial()])
        return y.redistribute(self.mesh, [Replicate()])


def build(mesh):
    torch.manual_seed(0)
    tp = mesh["tp"]
    model = RowParallelLinear(tp, 8, 6)
    x = distribute_tensor(torch.randn(4, 8), tp, [Shard(1)])
    return model, (x,), lambda y: y.sum()

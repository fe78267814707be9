"""Bug: a row-parallel linear written by hand adds its bias on every tensor-parallel rank.

Tensor parallel over mesh axis "tp" (4 ranks). The input `x` [4, 8] is sharded along its features
(Shard(1)), the weight `w` [8, 6] along its rows (Shard(0)), the bias `b` [6] replicated. Each rank
multiplies its slices, which gives a partial sum of `x @ w`; the layer then adds the bias on the
local tensor and declares the result Partial (a sum over the ranks still to be done):

    y_local = x.to_local() @ self.w.to_local() + self.b.to_local()
    y = DTensor.from_local(y_local, mesh, [Partial()]).redistribute(mesh, [Replicate()])

The all-reduce sums the four ranks' biases with the partial products: `y = x @ w + 4 b`. The
gradients are right (each rank's bias gradient is the whole gradient of y summed over rows, as on
one device); the forward value is wrong by `(tp - 1) b` in every row. PyTorch's RowwiseParallel adds
the bias after the reduction (or on one rank); the fix here is to add `self.b` to the DTensor after
`redistribute`, or to add it on rank 0 only.

Real reports of this class: Megatron-style row-parallel layers written by hand (the bias must be
added once, after the all-reduce; Megatron's RowParallelLinear has `skip_bias_add` for this), and
DTensor users porting a layer to `from_local(..., Partial())`. The hand-written counterpart is
examples/bugs/tp_bias_every_rank.json (a local_map with check_variance false returning P(sum), the
same shapes and data). Both fail in the forward only (gradients agree), with

    24 of 24 elements differ (up to 1.41526e-11 allowed); greatest difference 5.57982 at [1, 1]:
    expected -3.70763, actual 1.87219 (ranks 0, 1, 2, 3)

for the layer's Partial result and for y, and the loss (sum of y) expected 24.9816, actual 72.3509;
no factor: the difference is 3 b in every row. The import's first divergence is the `from_local`.
"""

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

MESHSIM_IMPORTS = [
    {"system": "pytorch", "func": "build", "mesh": "tp=4", "out": "bug_tp_bias_every_rank.json", "expect": "fail"},
]


class RowParallelLinear(nn.Module):
    def __init__(self, mesh, d_in: int, d_out: int):
        super().__init__()
        self.mesh = mesh
        self.w = nn.Parameter(distribute_tensor(torch.randn(d_in, d_out), mesh, [Shard(0)]))
        self.b = nn.Parameter(distribute_tensor(torch.randn(d_out), mesh, [Replicate()]))

    def forward(self, x: DTensor) -> DTensor:
        y_local = x.to_local() @ self.w.to_local() + self.b.to_local()  # BUG: the bias on every rank
        y = DTensor.from_local(y_local, self.mesh, [Partial()])
        return y.redistribute(self.mesh, [Replicate()])


def build(mesh):
    torch.manual_seed(0)
    tp = mesh["tp"]
    model = RowParallelLinear(tp, 8, 6)
    x = distribute_tensor(torch.randn(4, 8), tp, [Shard(1)])
    return model, (x,), lambda y: y.sum()

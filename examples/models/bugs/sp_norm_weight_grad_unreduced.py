"""Bug: a fused RMSNorm kernel called on the local shard under sequence parallelism; its weight's
gradient is never all-reduced over tp.

Sequence parallel over mesh axis "tp" (2 ranks): the activations `x` [2, 4, 8] are sharded along
the sequence (Shard(1)), the norm's weight [8] is replicated. A fused norm kernel takes plain
tensors, so the module calls it on the local tensors and wraps the result again:

    y_local = F.rms_norm(x.to_local(), (dim,), self.weight.to_local(), eps)
    return DTensor.from_local(y_local, mesh, x.placements)

The forward is right (a norm over the last dim does not mix sequence positions). The backward is
not: each rank's weight gradient sums over its own half of the sequence, `to_local()` (without
`grad_placements=[Partial()]`) calls that the replicated gradient, and nothing adds the two halves.
The two replicas of `weight.grad` disagree, and neither is the gradient.

Real reports of this class: Megatron-LM's sequence parallelism must all-reduce the gradients of
LayerNorm/RMSNorm weights (and biases) over the tensor-parallel group itself
(`sequence_parallel` parameters, `_allreduce_layernorm_grads`); fused norm kernels (Apex, Triton,
Transformer Engine) called on local shards lose that reduction. Nothing crashes; the norm weights
drift apart across tp ranks. The hand-written counterpart is
examples/bugs/sp_norm_weight_grad_unreduced.json (a local_map with check_variance false around
rms_norm, the same data). Both fail with

    grad weight: 8 of 8 elements differ (up to 6.20362e-12 allowed); greatest difference 3.90382
    at [7]: expected 5.14443, actual 1.2406 (ranks 0, 1); greatest relative difference 2.33172 at
    [1]; ranks 0 and 1 hold different locals across mesh axis "tp" where R says they are equal

with the forward equal and no backward all_reduce; the import's first divergence is the backward of
`weight_local = to_local(weight)`.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

MESHSIM_IMPORTS = [
    {"system": "pytorch", "func": "build", "mesh": "tp=2", "out": "bug_sp_norm_weight_grad_unreduced.json",
     "expect": "fail"},
]


class FusedRMSNorm(nn.Module):
    def __init__(self, mesh, dim: int, eps: float = 1e-5):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(distribute_tensor(torch.ones(dim), mesh, [Replicate()]))

    def forward(self, x: DTensor) -> DTensor:
        # the "fused kernel" takes plain tensors: each rank normalizes its own sequence positions
        y = F.rms_norm(x.to_local(), (self.dim,), self.weight.to_local(), self.eps)  # BUG: weight's grad not reduced
        return DTensor.from_local(y, x.device_mesh, x.placements)


def build(mesh):
    torch.manual_seed(0)
    tp = mesh["tp"]
    model = FusedRMSNorm(tp, 8)
    x = distribute_tensor(torch.randn(2, 4, 8), tp, [Shard(1)])
    return model, (x,), lambda y: y.sum()

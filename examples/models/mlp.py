"""A small MLP (dim 8, hidden 16, batch 4) and three plans for meshsim import (docs/import.md).

    meshsim import pytorch examples/models/mlp.py:tp --mesh tp=2 -o mlp_tp.json

Each plan function takes the DeviceMesh built from --mesh and returns (model, inputs, loss_fn).
"""

import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

DIM, HIDDEN, BATCH = 8, 16, 4

MESHSIM_IMPORTS = [
    {"system": "pytorch", "func": "tp", "mesh": "tp=2", "out": "mlp_tp.json"},
    {"system": "pytorch", "func": "fsdp", "mesh": "dp=2", "out": "mlp_fsdp.json"},
    {"system": "pytorch", "func": "fsdp_tp", "mesh": "dp=2,tp=2", "out": "mlp_fsdp_tp.json"},
]


class MLP(nn.Module):
    def __init__(self, dim: int = DIM, hidden: int = HIDDEN):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(torch.relu(self.w1(x)))


def make(batch: int = BATCH):
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(batch, DIM)
    target = torch.randn(batch, DIM)

    def loss_fn(y):
        return ((y - target) ** 2).mean()

    return model, x, loss_fn


TP_PLAN = {"w1": ColwiseParallel(), "w2": RowwiseParallel()}


def tp(mesh):
    """Tensor parallel: w1 column-wise, w2 row-wise (Megatron's MLP)."""
    model, x, loss_fn = make()
    parallelize_module(model, mesh, TP_PLAN)
    return model, (x,), loss_fn


def fsdp(mesh):
    """FSDP2: every parameter sharded over dp, each rank a local batch of BATCH."""
    model, x, loss_fn = make()
    fully_shard(model.w1, mesh=mesh)
    fully_shard(model.w2, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, (x,), loss_fn


def fsdp_tp(mesh):
    """FSDP2 over dp and tensor parallel over tp on a 2-D mesh."""
    model, x, loss_fn = make()
    parallelize_module(model, mesh["tp"], TP_PLAN)
    fully_shard(model.w1, mesh=mesh["dp"])
    fully_shard(model.w2, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model, (x,), loss_fn

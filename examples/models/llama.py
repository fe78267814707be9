"""A small Llama-style decoder and the plans that parallelize it, for `meshsim import`.

The model is written the way torchtitan writes Llama 3 (torchtitan/models/llama3/model.py),
at toy size and with no weights or data downloaded: dim 8, 2 layers, 4 attention heads sharing
2 key/value heads (grouped-query attention), head_dim 2, a SwiGLU feed-forward of hidden size 16,
vocabulary 16, sequence 4, batch 2. RMSNorm, rotary embeddings, token embedding and an untied
output projection (`ModelArgs(tied=True)` ties it to the embedding).

Two choices differ from torchtitan, because the ops torchtitan calls cannot run here:

- attention is written out (matmul, scale, causal mask by `masked_fill(-inf)`, softmax, matmul) instead
  of `F.scaled_dot_product_attention`: PyTorch's DTensor cannot run SDPA on the CPU (docs/semantics.md);
- the rotary embedding is the rotate-half form (Hugging Face's `rotate_half`, cos/sin computed
  from `torch.arange` in the forward) instead of torchtitan's complex `freqs_cis`: meshsim has
  no complex tensors.

The plans (each `FUNC(mesh) -> (model, inputs, loss_fn)`, `mesh` the DeviceMesh of `--mesh`):

- `tp`: tensor parallel as in the PyTorch TP tutorial: ColwiseParallel for wq, wk, wv, w1, w3,
  RowwiseParallel for wo, w2, a vocab-parallel embedding and a column-parallel output projection
  gathered to Replicate; the norms and the loss run on every rank on replicated activations.
- `tp_sp`: torchtitan's plan (`apply_tp` in torchtitan/models/llama3/infra/parallelize.py):
  TP plus SequenceParallel for the norms, PrepareModuleInput before attention and feed-forward,
  the output projection left sharded over the vocabulary and the loss under `loss_parallel()`.
- `tp_tied`: `tp` on the model with its output projection tied to the embedding. Both are sharded
  along the vocabulary (RowwiseParallel of an embedding and ColwiseParallel of a linear both shard
  weight dim 0), but parallelize_module replaces each module's parameter with a DTensor of its own,
  which unties them silently (the two halves of the gradient then land on two tensors): the plan
  ties them again afterwards, as a tied model must.
- `build`: FSDP2 + TP + SP with loss parallel on a (dp, tp) mesh: `tp_sp` on mesh["tp"], then
  `fully_shard` of each block and of the root over mesh["dp"], as torchtitan's `apply_fsdp`.
  Each dp rank reads its own slice of the batch.

Run one of them with `meshsim import pytorch examples/models/llama.py:tp --mesh tp=2 -o OUT.json`;
MESHSIM_IMPORTS below lists the bundled imports (examples/imported/).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

MESHSIM_IMPORTS = [
    {"system": "pytorch", "func": "tp", "mesh": "tp=2", "out": "llama_tp.json"},
    {"system": "pytorch", "func": "tp_sp", "mesh": "tp=2", "out": "llama_tp_sp.json"},
    {"system": "pytorch", "func": "build", "mesh": "dp=2,tp=2", "out": "llama_fsdp_tp_sp.json"},
    {"system": "pytorch", "func": "tp_tied", "mesh": "tp=2", "out": "llama_tp_tied.json"},
]


@dataclass
class ModelArgs:
    dim: int = 8
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 16
    hidden_dim: int = 16  # SwiGLU's hidden size
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tied: bool = False  # tie the output projection to the token embedding


def rope_cos_sin(head_dim: int, seqlen: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, [seqlen, head_dim] each (Hugging Face's layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    t = torch.arange(seqlen, device=device).float()
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    # xq, xk: [bs, seqlen, heads, head_dim]; cos, sin: [seqlen, head_dim]
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    xq_out = xq * cos + rotate_half(xq) * sin
    xk_out = xk * cos + rotate_half(xk) * sin
    return xq_out, xk_out


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """torch.repeat_interleave(x, dim=2, repeats=n_rep), written as torchtitan does."""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        torch.unsqueeze(x, dim=3)
        .expand(bs, slen, n_kv_heads, n_rep, head_dim)
        .reshape(bs, slen, n_kv_heads * n_rep, head_dim)
    )


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.n_rep = self.n_heads // self.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)

        # -1 rather than n_heads: under tensor parallelism each rank holds n_heads / tp heads
        xq = xq.view(bs, seqlen, -1, self.head_dim)
        xk = xk.view(bs, seqlen, -1, self.head_dim)
        xv = xv.view(bs, seqlen, -1, self.head_dim)

        xq, xk = apply_rotary_emb(xq, xk, cos, sin)

        keys = repeat_kv(xk, self.n_rep)
        values = repeat_kv(xv, self.n_rep)

        xq = xq.transpose(1, 2)  # [bs, heads, seqlen, head_dim]
        xk = keys.transpose(1, 2)
        xv = values.transpose(1, 2)

        # F.scaled_dot_product_attention(xq, xk, xv, is_causal=True), written out: no DTensor SDPA on the CPU
        scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(self.head_dim)
        mask = torch.ones(seqlen, seqlen, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        scores = F.softmax(scores, dim=-1)
        output = torch.matmul(scores, xv)

        output = output.transpose(1, 2).contiguous()
        output = output.view(bs, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        out = h + self.feed_forward(self.ffn_norm(h))
        return out


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.head_dim = args.dim // args.n_heads
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, args) for i in range(args.n_layers)})
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tied:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        cos, sin = rope_cos_sin(self.head_dim, tokens.shape[1], self.args.rope_theta, device=tokens.device)
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        h = self.norm(h)
        return self.output(h)


BATCH, SEQ = 2, 4


def _model_and_data(args: ModelArgs | None = None):
    """The model and one global batch (tokens, next-token targets), the same on every rank."""
    torch.manual_seed(0)
    args = args or ModelArgs()
    model = Transformer(args)
    tokens = torch.randint(0, args.vocab_size, (BATCH, SEQ + 1))
    return model, tokens[:, :-1], tokens[:, 1:]


def _layer_plan_tp() -> dict:
    return {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
    }


def _apply_tp_sp(model: Transformer, tp_mesh) -> None:
    """torchtitan's apply_tp (loss parallel on, float8 and async TP off)."""
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
        },
    )
    for block in model.layers.values():
        parallelize_module(
            block,
            tp_mesh,
            {
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None, None),
                    desired_input_layouts=(Replicate(), None, None),
                ),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(
                    input_layouts=(Shard(1),),
                    desired_input_layouts=(Replicate(),),
                ),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
                "feed_forward.w3": ColwiseParallel(),
            },
        )


def _parallel_cross_entropy(targets: torch.Tensor):
    def loss_fn(logits):
        # the backward must run under loss_parallel() too (its docstring): the importer runs it there
        with loss_parallel():
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1))

    return loss_fn


def tp(mesh, args: ModelArgs | None = None):
    """Tensor parallel over mesh axis "tp" (the PyTorch TP tutorial's plan, no sequence parallel)."""
    model, tokens, targets = _model_and_data(args)
    tp_mesh = mesh["tp"]
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate()),
        },
    )
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, _layer_plan_tp())
    if model.args.tied:
        model.output.weight = model.tok_embeddings.weight  # parallelize_module untied them

    def loss_fn(logits):
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1))

    return model, (tokens,), loss_fn


def tp_tied(mesh):
    """`tp` with the output projection tied to the token embedding."""
    return tp(mesh, ModelArgs(tied=True))


def tp_sp(mesh):
    """Tensor and sequence parallel over mesh axis "tp" with loss parallel (torchtitan's apply_tp)."""
    model, tokens, targets = _model_and_data()
    tp_mesh = mesh["tp"]
    _apply_tp_sp(model, tp_mesh)
    return model, (tokens,), _parallel_cross_entropy(targets)


def build(mesh):
    """FSDP2 over "dp" + TP and SP over "tp", loss parallel (torchtitan's parallelize_llama)."""
    model, tokens, targets = _model_and_data()
    _apply_tp_sp(model, mesh["tp"])
    for block in model.layers.values():
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])

    # each dp rank trains on its slice of the batch (a DistributedSampler's job in a real loop)
    dp_rank, dp_size = mesh["dp"].get_local_rank(), mesh["dp"].size()
    local = BATCH // dp_size
    tokens = tokens.narrow(0, dp_rank * local, local)
    targets = targets.narrow(0, dp_rank * local, local)
    return model, (tokens,), _parallel_cross_entropy(targets)

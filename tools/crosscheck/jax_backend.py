"""The JAX backend of crosscheck: runs a scenario's local_map regions as `jax.shard_map` with
`check_vma=True` on CPU devices, and compares JAX's values, gradients and body types with meshsim's.

What is compared, and how the scenario is translated:

- **Outside the regions** the program's DTensor ops run as plain `jax.numpy` on global arrays,
  which is what they mean under JAX's global-view semantics: a placement only says how a global
  array is laid out, and `redistribute` leaves its value as it is. Inputs are meshsim's global
  values (`job.value`). The region boundary is where the placements matter: there each argument
  is laid out as its in placement says and each result leaves as its out placement says.
- **A region** becomes one `jax.shard_map` over a mesh of the scenario's axes (Explicit axis
  types) with `check_vma` = the region's `check_variance`. In placements: `S(d)` puts the axis in
  the PartitionSpec at dim `d` (several axes on one dim as a tuple in mesh order: meshsim nests the
  earlier axis outside, as JAX's major-to-minor tuple does); `R` leaves it out; `Rd` is JAX's
  `reduced`; `P(sum)` is JAX's `unreduced`. JAX cannot reshard to unreduced, so a `P(sum)` input
  is passed as meshsim's own rank parts (plain local code may be non-linear in them), and any
  other `P(sum)` argument is made unreduced by a small shard_map that gives each rank `value / n`
  (meshsim's `partial_from_replicate: divide`): checked code cannot tell, as JAX's types forbid
  non-linear ops on unreduced values. Out placements map the same way to out_specs; every result
  (and every gradient) is then resharded to replicated (`P()`: the all_reduce of an unreduced
  one) for the rest of the program.
- **Body ops** translate one to one to `jnp` / `jax.nn` / `jax.lax`, collectives to `psum`
  (`pmean`, `pmax`, `pmin`), `all_gather(tiled=True, to=varying|reduced)`, `psum_scatter(tiled)`,
  `all_to_all(tiled)` and `pcast(to='varying')`. No cast is written by hand: meshsim inserts its
  `mark_varying` and casts where JAX's `check_vma` inserts `pvary` / `reduced_vary_cast` itself
  (`core.auto_insert_reshard`, `lax.parallel.insert_collective_pvary`), so a body meshsim accepts
  should be one JAX accepts as written.
- **Body types**: every named body value's `jax.typeof(x).mat` (varying, unreduced, reduced) is
  compared with meshsim's variant and reduced sets. meshsim's LTensor maps `P(sum)` to variant (it
  cannot tell S from P: semantics.md, "LTensor and local_map"), so JAX's unreduced axes count as
  variant.
- **Refusals**: JAX refusing a body (a type error at trace time) where meshsim ran it, or JAX
  accepting one meshsim refused with a variance error (`exclusivity_violation`,
  `out_spec_mismatch`, `reduced_mismatch`), is a difference of kind `refusal`.
- **Backward**: `jax.value_and_grad` of the sum of the named loss (the all-ones seed) with respect
  to the inputs with `requires_grad`, compared with meshsim's assembled gradients.
- Differences of a known cause carry an `explanation` naming the JAX source (CAUSES).

Not comparable (`NotComparable`, with the reason): no local_map (the PyTorch backend covers plain
DTensor programs); a planted bug (`mutant`); `to_local` / `from_local` local code outside a region
(per-rank code with no global meaning to run it as); strided or uneven shards at a region
boundary and collectives on dims the axis does not divide (JAX requires even tiles); `P(avg)`,
`P(max)`, `P(min)` at a region boundary (JAX has only unreduced = sum); `Rd` or `P(sum)` at a
boundary on a one-device mesh (JAX 0.10.2 fails to lower unreduced arrays there); Functions of one's own
that JAX has no equivalent for (and the built-in `opaque_all_reduce_unregistered`, whose point,
an untracked communicating kernel, does not exist under JAX's types); scenarios meshsim itself
refused for a reason other than variance (invalid input, shapes).
"""

from __future__ import annotations

import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import NotComparable, parse_placement  # noqa: E402


def _device_count() -> int:
    """The largest mesh among the jobs of argv[1] (at least 8): the number of CPU devices XLA must
    make, which is fixed once jax is imported."""
    world = 8
    try:
        with open(sys.argv[1]) as f:
            for j in json.load(f):
                world = max(world, math.prod(j["doc"]["mesh"]["shape"]))
    except (IndexError, OSError, ValueError, KeyError, TypeError):
        pass
    return world


os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           f" --xla_force_host_platform_device_count={_device_count()}").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Full tracebacks, so that a refusal raised inside jax can be told from this translator's failure.
os.environ["JAX_TRACEBACK_FILTERING"] = "off"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

# A value's own float dtype (an input's, a created value's, a `to`'s).
JAX_DTYPES = {"float64": jnp.float64, "float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
from jax._src.core import ShardingTypeError  # noqa: E402  (not exported; raised by JAX's reduced rules)
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

jax.config.update("jax_enable_x64", True)

# meshsim error kinds that are variance-type refusals, which JAX's check_vma should share.
VARIANCE_ERRORS = {"exclusivity_violation", "out_spec_mismatch", "reduced_mismatch"}
# Exceptions by which JAX refuses a program at trace time (its type checks).
JAX_REFUSALS = (ValueError, TypeError, NotImplementedError, ShardingTypeError)
# Ops with several results, named by `outs`.
SPLIT_OPS = {"split", "chunk"}
# Built-in Functions meshsim ships (`local_square`, `opaque_all_reduce`) and those of the example
# plugin (docs/cpp-api.md), as JAX code; `axis` is the call's mesh axis.
FUNCTIONS = {
    "local_square": lambda x, op: x * x,
    "opaque_all_reduce": lambda x, op: jax.lax.psum(x, op["axis"]),
    "all_reduce_keep_local": lambda x, op: [jax.lax.psum(x, op["axis"]), x],
    "scale_by": lambda x, op: x * float(op.get("factor", 1.0)),
    "fused_all_reduce": lambda x, op: jax.lax.psum(x, op["axis"]),
    "fused_all_reduce_mixin": lambda x, op: jax.lax.psum(x, op["axis"]),
    "scatter_rows": lambda x, op: jax.lax.psum_scatter(x, op["axis"], scatter_dimension=0, tiled=True),
}


# ---------------------------------------------------------------------------------------------
# Ops: torch semantics in jnp, on global arrays (the program) or rank-local ones (a body)

def _wrap(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def _dims(op: dict, ndim: int):
    """A reduction's dims: None for every dim (absent or []), else a tuple of wrapped dims."""
    d = op.get("dim")
    if d is None or d == []:
        return None
    d = d if isinstance(d, list) else [d]
    return tuple(_wrap(int(i), ndim) for i in d)


def _view_shape(shape: list[int], n: int) -> tuple[int, ...]:
    """A view's shape with its -1 filled in from the element count `n`."""
    known = math.prod(s for s in shape if s != -1)
    return tuple((n // known if known else 0) if s == -1 else s for s in shape)


def _flatten(x, op):
    if x.ndim == 0:
        return x.reshape(1)
    s, e = _wrap(op.get("start_dim", 0), x.ndim), _wrap(op.get("end_dim", -1), x.ndim)
    return x.reshape(x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


def _unflatten(x, op):
    d = _wrap(op["dim"], x.ndim)
    return x.reshape(x.shape[:d] + _view_shape(op["sizes"], x.shape[d]) + x.shape[d + 1:])


def _squeeze(x, op):
    if "dim" not in op:
        return jnp.squeeze(x)
    d = _wrap(op["dim"], x.ndim)
    return jnp.squeeze(x, d) if x.shape[d] == 1 else x


def _expand(x, op):
    shape = list(op["shape"])
    lead = len(shape) - x.ndim
    return jnp.broadcast_to(x, tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(shape)))


def _narrow(x, op):
    d = _wrap(op["dim"], x.ndim)
    start = op["start"] + x.shape[d] if op["start"] < 0 else op["start"]
    return jax.lax.slice_in_dim(x, start, start + op["length"], axis=d)


def _pieces(x, op):
    """split / chunk: the (start, length) of each piece along the op's dim, as torch cuts them."""
    d = _wrap(op.get("dim", 0), x.ndim)
    n = x.shape[d]
    if op["op"] == "chunk":
        c = -(-n // op["chunks"]) if n else 0
        sizes = [min(c, n - s) for s in range(0, n, c)] if c else [0]
    elif "sizes" in op:
        sizes = list(op["sizes"])
    else:
        sizes = [min(op["size"], n - s) for s in range(0, n, op["size"])] or [0]
    starts = np.cumsum([0] + sizes[:-1])
    return [jax.lax.slice_in_dim(x, int(s), int(s) + int(k), axis=d) for s, k in zip(starts, sizes)]


def _layer_norm(xs, op):
    x = xs[0]
    axes = tuple(range(x.ndim - len(op["normalized_shape"]), x.ndim))
    mean = jnp.mean(x, axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axes, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + op.get("eps", 1e-5))
    if len(xs) > 1:
        y = y * xs[1]
    return y + xs[2] if len(xs) > 2 else y


def _rms_norm(xs, op):
    x = xs[0]
    axes = tuple(range(x.ndim - len(op["normalized_shape"]), x.ndim))
    eps = op.get("eps", float(jnp.finfo(x.dtype).eps))
    y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axes, keepdims=True) + eps)
    return y * xs[1] if len(xs) > 1 else y


def _local_ids(ids, op, rows: int):
    """A vocab- / class-parallel body op: the ids in this rank's torch.chunk of the table's extent
    along `axis`, shifted to local rows (0 elsewhere), and the mask of those in range."""
    extent = op.get("vocab", op.get("classes"))
    n = jax.lax.axis_size(op["axis"])
    c = -(-extent // n)
    lo = jax.lax.axis_index(op["axis"]) * c
    inside = (ids >= lo) & (ids < jnp.minimum(lo + c, extent))
    local = jnp.where(inside, ids - lo, 0)
    return jnp.clip(local, 0, max(rows - 1, 0)), inside


def _embedding(xs, op):
    ids, w = xs
    if "axis" not in op:
        return jnp.take(w, ids, axis=0)
    local, inside = _local_ids(ids, op, w.shape[0])
    return jnp.where(inside[..., None], jnp.take(w, local, axis=0), 0)


def _nll_loss(logp, target, op, weight=None):
    """torch's nll_loss and cross_entropy (on log-probabilities): each kept row's -w[t] logp[n, t],
    with label smoothing (1 - eps) times that plus eps / C times -sum_c w[c] logp[n, c]; the rows
    (reduction none), their sum, or their sum over the kept targets' weights (their count without a
    weight). In a body with {axis, classes}, the pick of the targets in this rank's class range
    (meshsim's local nll_loss)."""
    ignore = op.get("ignore_index", -100)
    eps = float(op.get("label_smoothing", 0.0))
    keep = target != ignore
    index = target
    if "axis" in op:
        index, inside = _local_ids(target, op, logp.shape[1])
        keep = keep & inside
    index = jnp.where(keep, index, 0)
    picked = jnp.take_along_axis(logp, index[:, None], axis=1)[:, 0]
    w_t = jnp.ones_like(picked) if weight is None else jnp.take(weight, index)
    rows = jnp.where(keep, -picked * w_t, 0)
    if eps > 0:
        smooth = -jnp.sum(logp if weight is None else logp * weight[None, :], axis=1)
        rows = (1 - eps) * rows + eps / logp.shape[1] * jnp.where(target != ignore, smooth, 0)
    reduction = op.get("reduction", "mean")
    if reduction == "none":
        return rows
    loss = jnp.sum(rows)
    if reduction == "sum":
        return loss
    if weight is not None:
        return loss / jnp.sum(jnp.where(keep, w_t, 0))
    count = jnp.sum(target != ignore) if "axis" not in op or "ignore_index" in op else target.shape[0]
    return loss / jnp.asarray(count, logp.dtype)


def _linear(xs):
    y = jnp.matmul(xs[0], xs[1].T)
    return y + xs[2] if len(xs) > 2 else y


def _gelu(x, op):
    return jax.nn.gelu(x, approximate=op.get("approximate", "none") == "tanh")


def _fill(op):
    v = op["value"]
    return {"inf": math.inf, "-inf": -math.inf}.get(v, v) if isinstance(v, str) else v


def _binary(fn):
    """add / sub / mul / div: two operands, or one and the number `value` (a whole value against
    integer data as an int, so that integer arithmetic stays integer as meshsim's does)."""
    def run(xs, op):
        if len(xs) > 1:
            return fn(xs[0], xs[1])
        v = op["value"]
        if jnp.issubdtype(xs[0].dtype, jnp.integer) and float(v).is_integer():
            v = int(v)
        return fn(xs[0], v)
    return run


def _order(x, dim, descending):
    """argsort along dim, stable: ties keep their order, descending too (meshsim's kernels)."""
    return jnp.argsort(-x if descending else x, axis=dim, stable=True)


def _gather(x, index, dim):
    """torch.gather: x cut to the index's extent on the other dims, then taken along dim."""
    dim = _wrap(dim, x.ndim)
    cut = tuple(slice(None) if i == dim else slice(0, index.shape[i]) for i in range(x.ndim))
    return jnp.take_along_axis(x[cut], index, axis=dim)


def _scattered(x, index, src, dim, add):
    """torch.scatter / scatter_add: src's entry at position o goes to x at o with its dim replaced
    by the index's entry (src of the index's shape). Repeated positions: scatter_add adds them up;
    scatter keeps one of them (XLA's order; meshsim's kernel keeps the last). torch.scatter's
    gradient gives every src entry g at its position, the overwritten repeats too, and x g where
    nothing was written; .at[].set's gives the overwritten repeats 0, so scatter's value is taken
    from .at[].set and its gradient from the two linear maps torch differentiates."""
    dim = _wrap(dim, x.ndim)
    where = list(jnp.indices(index.shape, sparse=True))
    where[dim] = index
    where = tuple(where)
    if add:
        return x.at[where].add(src)
    kept = 1 - jnp.zeros_like(x).at[where].set(1)  # 0 where src is written
    linear = x * kept + jnp.zeros_like(x).at[where].add(src)
    return jax.lax.stop_gradient(x.at[where].set(src) - linear) + linear


def _index_add(x, index, source, dim):
    """torch.index_add: source's slices added into x at the 1-D index along dim."""
    dim = _wrap(dim, x.ndim)
    return x.at[(slice(None),) * dim + (index,)].add(source)


def _sorted(x, op, descending, k):
    """sort's values along dim; topk's first k (its order, ties at the first positions)."""
    dim = _wrap(op.get("dim", -1), x.ndim)
    order = _order(x, dim, descending)
    if k is not None:
        order = jax.lax.slice_in_dim(order, 0, k, axis=dim)
    return jnp.take_along_axis(x, order, axis=dim)


def _picked(x, op, largest):
    """max / min along dim: the element at argmax / argmin, so that the gradient goes to that one
    position (torch.max(x, dim)'s; jnp.max splits it among ties)."""
    dim = _wrap(op["dim"], x.ndim)
    at = jnp.expand_dims(jnp.argmax(x, axis=dim) if largest else jnp.argmin(x, axis=dim), dim)
    y = jnp.take_along_axis(x, at, axis=dim)
    return y if op.get("keepdim", False) else jnp.squeeze(y, axis=dim)


def _vector_norm(x, op):
    """torch.linalg.vector_norm: (sum |x|^ord)^(1/ord) over the dims; inf/-inf max/min |x|; 0 the
    count of nonzeros (jnp.linalg.norm takes a matrix norm over two axes)."""
    ord_ = op.get("ord", 2)
    ord_ = {"inf": float("inf"), "-inf": float("-inf")}.get(ord_, ord_) if isinstance(ord_, str) else float(ord_)
    axis, keep = _dims(op, x.ndim), bool(op.get("keepdim", False))
    a = jnp.abs(x)
    if ord_ == float("inf"):
        return jnp.max(a, axis=axis, keepdims=keep)
    if ord_ == float("-inf"):
        return jnp.min(a, axis=axis, keepdims=keep)
    if ord_ == 0:
        return jnp.sum((x != 0).astype(x.dtype), axis=axis, keepdims=keep)
    return jnp.sum(a ** ord_, axis=axis, keepdims=keep) ** (1.0 / ord_)


def _reduction(fn):
    return lambda xs, op: fn(xs[0], axis=_dims(op, xs[0].ndim), keepdims=bool(op.get("keepdim", False)))


OPS = {
    "add": _binary(jnp.add), "sub": _binary(jnp.subtract), "mul": _binary(jnp.multiply),
    "floor_divide": _binary(jnp.floor_divide), "remainder": _binary(jnp.remainder),
    "cumsum": lambda xs, op: jnp.cumsum(xs[0], axis=op["dim"]),
    "clamp": lambda xs, op: _clamp(xs[0], op),
    "one_hot": lambda xs, op: jax.nn.one_hot(xs[0], op["num_classes"], dtype=xs[0].dtype),
    "bincount": lambda xs, op: jnp.bincount(xs[0], minlength=op["minlength"], length=op["minlength"]),
    "repeat": lambda xs, op: jnp.tile(xs[0], op["sizes"]),
    "repeat_interleave": lambda xs, op: jnp.repeat(xs[0], op["repeats"], axis=op["dim"]),
    "scaled_dot_product_attention": lambda xs, op: _attention(xs, op),
    "div": _binary(jnp.divide),
    "to": lambda xs, op: xs[0].astype(JAX_DTYPES[op["dtype"]]),
    "detach": lambda xs, op: jax.lax.stop_gradient(xs[0]),
    # item: the one element's number without gradient. A traced JAX value has no item() (a
    # concretization error under jit and shard_map); its 0-d value under stop_gradient is the same
    # number (varying in a shard_map body where its operand is, as meshsim's local item).
    "item": lambda xs, op: jax.lax.stop_gradient(jnp.reshape(xs[0], ())),
    "neg": lambda xs, op: -xs[0], "exp": lambda xs, op: jnp.exp(xs[0]), "tanh": lambda xs, op: jnp.tanh(xs[0]),
    "relu": lambda xs, op: jax.nn.relu(xs[0]), "sin": lambda xs, op: jnp.sin(xs[0]),
    "cos": lambda xs, op: jnp.cos(xs[0]),
    "abs": lambda xs, op: jnp.abs(xs[0]), "log": lambda xs, op: jnp.log(xs[0]),
    "sigmoid": lambda xs, op: jax.nn.sigmoid(xs[0]), "silu": lambda xs, op: jax.nn.silu(xs[0]),
    "sqrt": lambda xs, op: jnp.sqrt(xs[0]), "rsqrt": lambda xs, op: jax.lax.rsqrt(xs[0]),
    "gelu": lambda xs, op: _gelu(xs[0], op), "pow": lambda xs, op: jnp.power(xs[0], op["exponent"]),
    "scale": lambda xs, op: xs[0] * op["value"],
    "where": lambda xs, op: jnp.where(xs[0], xs[1], xs[2]),
    "masked_fill": lambda xs, op: jnp.where(xs[1], jnp.asarray(_fill(op), xs[0].dtype), xs[0]),
    "tril": lambda xs, op: jnp.tril(xs[0], op.get("diagonal", 0)),
    "triu": lambda xs, op: jnp.triu(xs[0], op.get("diagonal", 0)),
    "layer_norm": _layer_norm, "rms_norm": _rms_norm, "embedding": _embedding,
    "log_softmax": lambda xs, op: jax.nn.log_softmax(xs[0], axis=op["dim"]),
    "softmax": lambda xs, op: jax.nn.softmax(xs[0], axis=op["dim"]),
    "nll_loss": lambda xs, op: _nll_loss(xs[0], xs[1], op, xs[2] if len(xs) > 2 else None),
    "cross_entropy": lambda xs, op: _nll_loss(jax.nn.log_softmax(xs[0], axis=1), xs[1], op, xs[2] if len(xs) > 2 else None),
    "mm": lambda xs, op: xs[0] @ xs[1], "bmm": lambda xs, op: xs[0] @ xs[1],
    "matmul": lambda xs, op: jnp.matmul(xs[0], xs[1]),
    "linear": lambda xs, op: _linear(xs),
    "transpose": lambda xs, op: jnp.swapaxes(xs[0], op["dim0"], op["dim1"]),
    "permute": lambda xs, op: jnp.transpose(xs[0], [_wrap(d, xs[0].ndim) for d in op["dims"]]),
    "view": lambda xs, op: xs[0].reshape(_view_shape(op["shape"], xs[0].size)),
    "reshape": lambda xs, op: xs[0].reshape(_view_shape(op["shape"], xs[0].size)),
    "flatten": lambda xs, op: _flatten(xs[0], op), "unflatten": lambda xs, op: _unflatten(xs[0], op),
    "squeeze": lambda xs, op: _squeeze(xs[0], op),
    "unsqueeze": lambda xs, op: jnp.expand_dims(xs[0], op["dim"]),
    "expand": lambda xs, op: _expand(xs[0], op),
    "cat": lambda xs, op: jnp.concatenate(xs, axis=op.get("dim", 0)),
    "stack": lambda xs, op: jnp.stack(xs, axis=op.get("dim", 0)),
    "narrow": lambda xs, op: _narrow(xs[0], op),
    "split": lambda xs, op: _pieces(xs[0], op), "chunk": lambda xs, op: _pieces(xs[0], op),
    "sum": _reduction(jnp.sum), "mean": _reduction(jnp.mean),
    "amax": _reduction(jnp.max), "amin": _reduction(jnp.min),
    "linalg_vector_norm": lambda xs, op: _vector_norm(xs[0], op),
    "max": lambda xs, op: _picked(xs[0], op, True), "min": lambda xs, op: _picked(xs[0], op, False),
    "argmax": lambda xs, op: jnp.argmax(xs[0], axis=op["dim"], keepdims=bool(op.get("keepdim", False))),
    "argmin": lambda xs, op: jnp.argmin(xs[0], axis=op["dim"], keepdims=bool(op.get("keepdim", False))),
    "sort": lambda xs, op: _sorted(xs[0], op, op.get("descending", False), None),
    "argsort": lambda xs, op: _order(xs[0], op.get("dim", -1), op.get("descending", False)),
    "topk": lambda xs, op: _sorted(xs[0], op, op.get("largest", True), op["k"]),
    "gather": lambda xs, op: _gather(xs[0], xs[1], op["dim"]),
    "index_select": lambda xs, op: jnp.take(xs[0], xs[1], axis=op["dim"]),
    "scatter": lambda xs, op: _scattered(xs[0], xs[1], xs[2], op["dim"], False),
    "scatter_add": lambda xs, op: _scattered(xs[0], xs[1], xs[2], op["dim"], True),
    "index_add": lambda xs, op: _index_add(xs[0], xs[1], xs[2], op["dim"]),
    "eq": _binary(jnp.equal), "ne": _binary(jnp.not_equal), "lt": _binary(jnp.less),
    "le": _binary(jnp.less_equal), "gt": _binary(jnp.greater), "ge": _binary(jnp.greater_equal),
    "logical_and": lambda xs, op: jnp.logical_and(xs[0], xs[1]),
    "logical_or": lambda xs, op: jnp.logical_or(xs[0], xs[1]),
    "logical_not": lambda xs, op: jnp.logical_not(xs[0]),
}


def _attention(xs, op: dict):
    """torch's F.scaled_dot_product_attention (its math reference) on [b, h, s, d]: grouped k/v heads
    repeated (enable_gqa), scores times scale (1/sqrt(d)), the causal mask top left, a bool mask
    (true: attend) or a float one added, softmax over the keys (a row with no key: zeros, as torch's
    _safe_softmax), times v. jax.nn.dot_product_attention takes [b, s, h, d] and gives a row with
    no key the mean of the values, so it is written out here."""
    q, k, v = xs[0], xs[1], xs[2]
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    scale = op["scale"] if op.get("scale") is not None else 1.0 / math.sqrt(q.shape[-1])
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * scale
    keep = jnp.ones(s.shape, dtype=bool)
    if op.get("is_causal", False):
        keep = keep & jnp.tril(jnp.ones((q.shape[2], k.shape[2]), dtype=bool))
    if len(xs) > 3:
        if xs[3].dtype == jnp.bool_:
            keep = keep & xs[3]
        else:
            s = s + xs[3]
    s = jnp.where(keep, s, -jnp.inf)
    none = jnp.all(jnp.isneginf(s), axis=-1, keepdims=True)
    p = jnp.where(none, 0.0, jax.nn.softmax(jnp.where(none, 0.0, s), axis=-1))
    return jnp.einsum("bhqk,bhkd->bhqd", p, v)


def _created(op: dict, float_dtype):
    """zeros / ones / full / arange: the program's (global), or a shard_map body's (of its local shape,
    invariant: a constant varies over no mesh axis)."""
    dtype = {"float": float_dtype, "int64": jnp.int64, "bool": jnp.bool_, **JAX_DTYPES}[op.get("dtype", "float")]
    shape = tuple(op["shape"]) if "shape" in op else None  # arange's 1-D form leaves it off
    if op["op"] == "zeros":
        return jnp.zeros(shape, dtype)
    if op["op"] == "ones":
        return jnp.ones(shape, dtype)
    if op["op"] == "full":
        return jnp.full(shape, _fill(op), dtype)
    start, step = op.get("start", 0), op.get("step", 1)
    if "end" in op:  # torch.arange(start, end, step): computed in float64 (as torch), then cast
        return jnp.arange(start, op["end"], step, dtype=jnp.float64).astype(dtype)
    return (jnp.arange(math.prod(shape), dtype=jnp.float64) * step + start).astype(dtype).reshape(shape)


def _clamp(x, op: dict):
    """torch.clamp: max(x, min) then min(., max) (min above max gives max); whole bounds of int64 data
    as ints. Its gradient passes on the bounds, as meshsim's (libtorch 1.13's clamp_backward): jnp.clip's
    (maximum and minimum) splits a tie in half, so the bounds are applied with where."""
    lo, hi = op.get("min"), op.get("max")
    cast = (lambda v: int(v)) if jnp.issubdtype(x.dtype, jnp.integer) else (lambda v: float(v))
    y = x
    if lo is not None:
        y = jnp.where(x < cast(lo), jnp.asarray(cast(lo), x.dtype), y)
    if hi is not None:
        y = jnp.where(y > cast(hi), jnp.asarray(cast(hi), x.dtype), y)
    return y


CREATION_OPS = {"zeros", "ones", "full", "arange"}


# ---------------------------------------------------------------------------------------------
# Body collectives

def _even(x, dim: int, op: dict, n: int) -> int:
    """The wrapped `dim`, which the axis must divide: JAX's tiled collectives need equal tiles,
    where meshsim pads torch.chunk pieces."""
    d = _wrap(dim, x.ndim)
    if x.shape[d] % n:
        raise NotComparable(f"{op['op']} over {op['axis']} (size {n}) of dim {d} with extent {x.shape[d]}: "
                            "JAX's tiled collectives need an extent the axis divides (meshsim pads uneven chunks)")
    return d


def _collective(x, op: dict, n: int):
    """A body collective over op['axis'] (of size n) as JAX's collective of the same meaning."""
    axis, name = op["axis"], op["op"]
    if name == "all_reduce":
        fn = {"sum": jax.lax.psum, "avg": jax.lax.pmean, "max": jax.lax.pmax, "min": jax.lax.pmin}
        return fn[op.get("reduce", "sum")](x, axis)
    if name == "all_gather":
        return jax.lax.all_gather(x, axis, axis=_wrap(op["dim"], x.ndim), tiled=True, to=op.get("to", "varying"))
    if name == "reduce_scatter":
        return jax.lax.psum_scatter(x, axis, scatter_dimension=_even(x, op["dim"], op, n), tiled=True)
    if name == "all_to_all":
        split = _even(x, op.get("split_dim", 0), op, n)
        return jax.lax.all_to_all(x, axis, split, _wrap(op.get("concat_dim", 0), x.ndim), tiled=True)
    return jax.lax.pcast(x, axis, to="varying")  # mark_varying


COLLECTIVES = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "mark_varying"}
# all_to_all with split sizes (all_to_all_single's): each rank gets as many rows as the data say.
SPLIT_SIZES = ("all_to_all with split sizes: a shard_map body has static shapes, one per array on every device, "
               "and the rows a rank receives are data; jax.lax.ragged_all_to_all moves ragged pieces into an "
               "output buffer of a fixed size (padded to a capacity), a different program whose padded rows "
               "meshsim's values do not have")
# Ops translated by name outside OPS (Program.run, Program._body_op).
SPECIAL_OPS = {"local_map", "redistribute", "call"}
LOCAL_CODE = "per-rank local code in DTensor mode has no JAX global program to run as"
# The ops of meshsim's catalog this backend does not translate, each with why (the reason a
# scenario using it is not comparable). `crosscheck --check-ops` (op_coverage.py) fails for an op
# of the catalog that OP_TABLES' tables do not translate and that is not listed here.
RANDOM = ("meshsim draws its own counter-based stream (docs/semantics.md, Randomness), indexed by each "
          "element's global position; jax.random's threefry values are another stream")
NOT_COMPARABLE = {"to_local": LOCAL_CODE, "from_local": LOCAL_CODE, "dropout": RANDOM, "rand": RANDOM, "randn": RANDOM}
OP_TABLES = ("OPS", "CREATION_OPS", "COLLECTIVES", "SPECIAL_OPS")


# ---------------------------------------------------------------------------------------------
# A job's program in JAX

# Known reasons a JAX 0.10.2 run differs from meshsim, each with the JAX source that explains it.
# A difference that matches one carries it as `cause` (the id in known_differences.json and
# docs/findings.md) and `explanation`.
CAUSES = {
    "jax_reduced_meets_invariant":
        "JAX requires the operands of an n-ary op to be reduced on the same axes (jax/_src/lax/lax.py, "
        "default_nary_reduced_rule; a Python scalar counts as replicated); meshsim casts a reduced operand that "
        "meets an invariant one to invariant (semantics.md, 'LTensor and local_map'); its option "
        "reduced_propagation: strict is the JAX-like rule",
    "jax_unreduced_ops_restricted":
        "JAX's unreduced values (P(sum)) admit only add with another unreduced value and mul by a reduced one "
        "(jax/_src/lax/lax.py: unop_ur_rule, nary_ur_rule, the mul and dot_general unreduced rules); meshsim's "
        "LTensor maps P(sum) to variant by default and admits any op; under partial_in_local_map: unreduced it "
        "refuses these as JAX does (unreduced_misuse)",
    "jax_reduced_rule_differs":
        "JAX's result type has other reduced axes than meshsim's: JAX's dot_general never propagates reduced "
        "(jax/_src/lax/lax.py, _dot_general_ur_rule) where meshsim's intersection keeps it, and JAX's where "
        "(select_n) takes its first case's reduced axes (_select_ur_rule) where meshsim intersects all inputs; "
        "the types differ, or the out_specs check that follows from them does",
    "jax_tril_typed_by_zeros":
        "jnp.tril / jnp.triu are lax.select(mask, x, zeros_like(x)), and select_n takes its result's "
        "unreduced and reduced axes from its first case (jax/_src/lax/lax.py, _select_ur_rule), which here is "
        "the zeros (jax/_src/numpy/tensor_creation.py, tril): a tril of an unreduced (P(sum)) or reduced input "
        "is typed invariant, though each device holds its own part; returning it as unreduced then needs a "
        "cast that refuses it (vary_unreduced_cast accepts only varying inputs). meshsim keeps P(sum) "
        "variant and Rd reduced through tril",
    "jax_all_gather_reduced_of_invariant":
        "meshsim makes an invariant input varying before every collective; JAX's all_gather(to='reduced') does "
        "not (jax/_src/lax/parallel.py, all_gather_reduced has no insert_collective_pvary)",
    "jax_pvary_of_reduced":
        "meshsim casts a reduced input of a collective reduced -> varying; JAX's collectives pvary it, and pvary "
        "refuses reduced inputs (jax/_src/lax/parallel.py, insert_collective_pvary and _pvary_abstract_eval)",
    "jax_where_reduced_transpose":
        "JAX's where (select_n) takes its result's reduced axes from its first case alone (jax/_src/lax/lax.py, "
        "_select_ur_rule): a where of a reduced and an invariant case passes the forward and fails in the "
        "transpose (a JAX bug)",
    "jax_unchecked_transpose":
        "a region runs with check_vma=False: JAX's transpose psums each input's cotangent over the axes its "
        "in_spec leaves out and divides each output's by the size of the axes its out_spec leaves out "
        "(jax/_src/shard_map.py, _shard_map_transpose); meshsim, as PyTorch's local_map, does not "
        "(semantics.md, 'Plain local code')",
    "jax_unchecked_reduced_result":
        "under check_vma=False JAX's transpose divides an output's cotangent by the size of the axes its "
        "out_spec leaves out (jax/_src/shard_map.py, _shard_map_transpose); for an Rd result that cotangent "
        "is unreduced, which div does not accept: JAX 0.10.2 cannot differentiate such a region",
}

# JAX's refusal messages, by a phrase, and their cause.
REFUSALS = [
    (("cannot be replicated on the same axes that another input is reduced on",
      "should be reduced across the same mesh axes"), "jax_reduced_meets_invariant"),
    (("unreduced rule for", "should be reduced along the same axes", "dot_general cannot be unreduced",
      "vary_unreduced_cast only accepts inputs that are varying", "there will be implicit communication",
      "pvary cannot accept args which are unreduced", "cannot be unreduced since mul is bilinear"),
     "jax_unreduced_ops_restricted"),
    (("should be equal to the reduced present on the out_aval", "out_specs which require replication"),
     "jax_reduced_rule_differs"),
    (("all_gather_reduced only accepts inputs that are varying",), "jax_all_gather_reduced_of_invariant"),
    (("pvary cannot accept args which are reduced",), "jax_pvary_of_reduced"),
    (("Expected cotangent type",), "jax_where_reduced_transpose"),
]


def with_cause(d: dict, cause: str) -> dict:
    return common.with_cause(d, cause, CAUSES)


def _cause(message: str, unchecked: bool, ops: set[str]) -> str | None:
    """The known cause of a JAX refusal with this message, or None (`ops`: the program's ops)."""
    if unchecked and "unreduced rule for div" in message:
        return "jax_unchecked_reduced_result"
    if "vary_unreduced_cast only accepts inputs that are varying" in message and ops & {"tril", "triu"}:
        return "jax_tril_typed_by_zeros"
    return next((cause for phrases, cause in REFUSALS if any(p in message for p in phrases)), None)


class Translation:
    """One job's program as a JAX function of its inputs (`run`), recording the JAX type of every
    named body value of a checked region while it is traced (`body_types`)."""

    def __init__(self, job: common.Job):
        self.job = job
        self.axes = job.mesh_axes
        self.sizes = dict(zip(self.axes, job.mesh_shape))
        self.mesh = jax.make_mesh(tuple(job.mesh_shape), tuple(self.axes),
                                  axis_types=(AxisType.Explicit,) * len(self.axes),
                                  devices=jax.devices()[:job.world])
        self.float_dtype = JAX_DTYPES.get(job.options.get("dtype", "float64"), jnp.float64)
        # Under `semantics: pytorch` a region is plain local code unless it says otherwise.
        self.check_default = job.options.get("semantics", "meshsim") != "pytorch"
        self.body_types: dict[str, object] = {}
        self.unchecked_regions = 0
        self.body_ops: dict[str, str] = {}  # body value -> the op that made it
        # Inputs passed as meshsim's own parts (see `partial_input`): name -> their spec, and
        # while tracing, name -> the unreduced array.
        self.partial_specs: dict[str, P] = {}
        self.parts: dict[str, object] = {}

    def partial_input(self, spec: dict):
        """A `P(sum)` input as an unreduced array of meshsim's own rank locals, or None (no
        Partial, no locals, or a layout shard_map cannot take). Plain local code
        (`check_variance: false`) may compute non-linear functions of the parts, so only
        meshsim's parts give its values; the program sees their sum, the region the parts."""
        name, placements = spec["name"], spec["placements"]
        value = self.job.value(name)
        if value is None or not any(parse_placement(t).kind == "P" for t in placements):
            return None
        locals_ = [self.job.local(name, r) for r in range(self.job.world)]
        try:
            pspec = self.spec(placements, value.ndim, value.shape, f"input {name}")
        except NotComparable:
            return None
        if any(x is None for x in locals_):
            return None
        self.partial_specs[name] = pspec
        return jax.make_array_from_single_device_arrays(
            value.shape, NamedSharding(self.mesh, pspec),
            [jax.device_put(x, d) for x, d in zip(locals_, self.mesh.devices.flat)])

    def run(self, inputs: dict) -> dict:
        """Every program value (inputs included), global, by name."""
        env = dict(inputs)
        for name in self.partial_specs:
            self.parts[name] = inputs[name]
            env[name] = jax.reshard(inputs[name], P())
        for op in self.job.doc["program"]:
            name = op["op"]
            xs = [env[a] for a in op.get("args", [])]
            if name == "local_map":
                if op.get("in_grad_placements") is not None:
                    raise NotComparable("local_map in_grad_placements: PyTorch's spelling of the local gradients' "
                                        "layout; JAX's shard_map derives them from its types")
                outs = op["out"] if isinstance(op["out"], list) else [op["out"]]
                env.update(zip(outs, self._region(op, xs)))
            elif name == "redistribute":
                env[op["out"]] = xs[0]  # a layout change: the global value stays
            elif name in CREATION_OPS:
                env[op["out"]] = _created(op, self.float_dtype)
            elif name in SPLIT_OPS:
                env.update(zip(op["outs"], OPS[name](xs, op)))
            else:
                env[op["out"]] = OPS[name](xs, op)
        return env

    # -- the region boundary

    def spec(self, placements: list[str], ndim: int, shape=None, what: str = "") -> P:
        """The PartitionSpec of a placement list (one per mesh axis) for a value of `ndim` dims;
        with the global `shape`, checks that every sharded dim splits evenly."""
        parts: list[list[str]] = [[] for _ in range(ndim)]
        unreduced, reduced = set(), set()
        for axis, text in zip(self.axes, placements):
            p = parse_placement(text, ndim)
            if p.kind == "S":
                parts[p.dim].append(axis)
            elif p.kind == "SS":
                raise NotComparable(f"{what}: strided shard {p} at a local_map boundary (not translated to JAX)")
            elif p.kind == "P" and p.reduce != "sum":
                raise NotComparable(f"{what}: {p} at a local_map boundary: JAX's only partial state is "
                                    "unreduced, a sum")
            elif p.kind in ("P", "Rd"):
                if self.job.world == 1:
                    # Rd too: its cotangent is unreduced.
                    raise NotComparable(f"{what}: {p} on a one-device mesh: JAX 0.10.2 fails to lower an unreduced "
                                        "array there (AssertionError 'Expected last op to be "
                                        "sdy.sharding_constraint', jax/_src/interpreters/mlir.py)")
                (reduced if p.kind == "Rd" else unreduced).add(axis)
        if shape is not None:
            for d, axes in enumerate(parts):
                k = math.prod(self.sizes[a] for a in axes)
                if shape[d] % k:
                    raise NotComparable(f"{what}: dim {d} of extent {shape[d]} sharded over {'x'.join(axes)} "
                                        f"({k} ranks) is uneven; shard_map needs even blocks")
        entries = [None if not a else a[0] if len(a) == 1 else tuple(a) for a in parts]
        return P(*entries, unreduced=unreduced, reduced=reduced)

    def _lay_out(self, x, spec: P):
        """A global array laid out as `spec` for shard_map. JAX cannot reshard to unreduced, so an
        unreduced spec gets parts value / n from a shard_map of its own (see the module doc)."""
        if not spec.unreduced:
            return jax.reshard(x, spec)
        axes = tuple(a for a in self.axes if a in spec.unreduced)
        n = math.prod(self.sizes[a] for a in axes)
        plain = P(*spec.partitions, reduced=spec.reduced)

        def parts(v):
            return jax.lax.pcast(jax.lax.pcast(v / n, axes, to="varying"), axes, to="unreduced")
        return jax.shard_map(parts, mesh=self.mesh, in_specs=plain, out_specs=spec,
                             check_vma=True)(jax.reshard(x, plain))

    def _placements(self, name: str) -> list[str]:
        """A region argument's placements without in_placements: meshsim's, or where its run kept
        none (a refusal) the input's as written."""
        found = self.job.placements(name)
        if found is None:
            found = next((i["placements"] for i in self.job.doc["inputs"] if i["name"] == name), None)
        if found is None:
            raise NotComparable(f"local_map arg {name}: meshsim's run kept no placements for it")
        return found

    def _out_ndims(self, op: dict, body, in_specs, laid) -> list[int]:
        """The number of dims of each result: meshsim's shapes, or JAX's shapes of the body."""
        values = self.job.result.get("values") or {}
        outs = op["out"] if isinstance(op["out"], list) else [op["out"]]
        if all(o in values and "shape" in values[o] for o in outs):
            return [len(values[o]["shape"]) for o in outs]
        shapes = jax.eval_shape(jax.shard_map(body, mesh=self.mesh, in_specs=in_specs,
                                              out_specs=P() if len(outs) == 1 else tuple(P() for _ in outs),
                                              check_vma=False), *laid)
        return [len(s.shape) for s in (shapes if len(outs) > 1 else [shapes])]

    def _region(self, op: dict, xs: list) -> list:
        """A local_map as a shard_map: its results, global and replicated."""
        names = op["args"]
        placements = op.get("in_placements") or [self._placements(a) for a in names]
        in_specs = tuple(self.spec(pl, x.ndim, x.shape, f"local_map arg {a}")
                         for a, pl, x in zip(names, placements, xs))
        checked = op.get("check_variance", self.check_default)
        self.unchecked_regions += not checked
        laid = [self.parts[a] if a in self.parts and self.partial_specs[a] == s else self._lay_out(x, s)
                for a, x, s in zip(names, xs, in_specs)]

        def body(*locals_):
            env = dict(zip(names, locals_))
            for bop in op["body"]:
                res = self._body_op(bop, [env[a] for a in bop.get("args", [])])
                outs = bop.get("outs") or (bop["out"] if isinstance(bop["out"], list) else [bop["out"]])
                for name, val in zip(outs, res if isinstance(res, list) else [res]):
                    env[name] = val
                    if checked:
                        self.body_types[name] = jax.typeof(val).mat
                        self.body_ops[name] = bop["op"]
            outs = tuple(env[r] for r in op["returns"])
            return outs[0] if single else outs

        # One result goes as itself, not a 1-tuple: with a tuple of PartitionSpecs (tuples
        # themselves) JAX 0.10.2 fails while formatting its out_specs type error
        # (shard_map.py, _inout_vma_error), which would hide JAX's own message.
        single = len(op["returns"]) == 1

        ndims = self._out_ndims(op, body, in_specs, laid)
        out_specs = tuple(self.spec(pl, nd, None, f"local_map result {i}")
                          for i, (pl, nd) in enumerate(zip(op["out_placements"], ndims)))
        outs = jax.shard_map(body, mesh=self.mesh, in_specs=in_specs,
                             out_specs=out_specs[0] if single else out_specs, check_vma=checked)(*laid)
        return [jax.reshard(o, P()) for o in ((outs,) if single else outs)]

    def _body_op(self, op: dict, xs: list):
        name = op["op"]
        if name in COLLECTIVES:
            return _collective(xs[0], op, self.sizes[op["axis"]])
        if name == "call":
            return FUNCTIONS[op["function"]](xs[0], op)
        if name in CREATION_OPS:
            return _created(op, self.float_dtype)
        return OPS[name](xs, op)


# ---------------------------------------------------------------------------------------------
# The check

def _precheck(job: common.Job) -> None:
    """Raises NotComparable for what this backend does not translate (see the module doc)."""
    program = job.doc.get("program", [])
    if not any(op["op"] == "local_map" for op in program):
        raise NotComparable("no local_map: JAX shard_map has no DTensor program to compare")
    if job.options.get("mutant"):
        raise NotComparable(f"planted bug {job.options['mutant']}: a bug of meshsim's runtime, not a program")
    for op in program:
        if op["op"] in NOT_COMPARABLE or op["op"] in COLLECTIVES:
            raise NotComparable(f"{op['op']} outside a local_map: {NOT_COMPARABLE.get(op['op'], LOCAL_CODE)}")
    for op in job.ops():
        if op["op"] in NOT_COMPARABLE:
            raise NotComparable(f"{op['op']}: {NOT_COMPARABLE[op['op']]}")
        if op["op"] == "all_to_all" and len(op.get("args", [])) == 3:
            raise NotComparable(SPLIT_SIZES)
        if op["op"] == "call" and op["function"] not in FUNCTIONS:
            raise NotComparable(f"call of Function {op['function']!r}: no JAX equivalent translated "
                                f"(known: {', '.join(sorted(FUNCTIONS))})")
    err = job.result.get("error") or {}
    if job.result.get("status") == "error" and err.get("kind") not in VARIANCE_ERRORS:
        raise NotComparable(f"meshsim refused the scenario ({err.get('kind')}: {err.get('message')})")


def _input_array(job: common.Job, spec: dict, float_dtype):
    """An input's global value: meshsim's, or zeros of its global shape where meshsim kept none
    (a run it refused, where only JAX's refusal or acceptance is compared)."""
    value = job.value(spec["name"])
    if value is not None:
        return jnp.asarray(value)
    shape = list(spec["shape"])
    if spec.get("from_local"):
        for axis_size, text in zip(job.mesh_shape, spec["placements"]):
            p = parse_placement(text, len(shape))
            if p.kind in ("S", "SS"):
                shape[p.dim] *= axis_size
    dtype = {"int64": jnp.int64, "bool": jnp.bool_, **JAX_DTYPES}.get(spec.get("dtype"), float_dtype)
    return jnp.zeros(shape, dtype)


def _is_jax_refusal(e: Exception) -> bool:
    """Whether `e` is JAX refusing the program (raised inside jax), not this translator failing."""
    if not isinstance(e, JAX_REFUSALS):
        return False
    frames = []
    tb = e.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    return bool(frames) and f"{os.sep}jax{os.sep}" in frames[-1]


def _first_line(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text[:400] + ("..." if len(text) > 400 else "")


# Ops whose JAX reduced rule is known to differ from meshsim's intersection (jax_reduced_rule_differs).
REDUCED_RULE_OPS = {"mm", "bmm", "matmul", "linear", "where", "masked_fill"}


def _vma_differences(job: common.Job, types: dict, ops: dict) -> tuple[list[dict], int]:
    """Each named body value's JAX type against meshsim's sets: variant = varying | unreduced,
    reduced = reduced. `ops` names the op that made each value, for the explanation."""
    values = job.result.get("values") or {}
    diffs, n = [], 0
    first_apart = None  # the first value whose reduced axes differ by a known rule, and those axes
    for name, mat in types.items():
        entry = values.get(name)
        if entry is None or entry.get("variant") is None or entry.get("untracked"):
            continue
        n += 1
        ms_v, ms_r = sorted(entry["variant"]), sorted(entry.get("reduced") or [])
        jx_v, jx_r = sorted(set(mat.varying) | set(mat.unreduced)), sorted(mat.reduced)
        if (ms_v, ms_r) != (jx_v, jx_r):
            diffs.append({"kind": "vma", "what": name,
                          "meshsim": {"variant": ms_v, "reduced": ms_r},
                          "other": {"varying": sorted(mat.varying), "unreduced": sorted(mat.unreduced),
                                    "reduced": jx_r},
                          "detail": f"{name}: JAX varying {sorted(mat.varying)} unreduced {sorted(mat.unreduced)} "
                                    f"reduced {jx_r}; meshsim variant {ms_v} reduced {ms_r} ({ops[name]})"})
            apart = (set(ms_v) ^ set(jx_v)) | (set(ms_r) ^ set(jx_r))
            if ms_v == jx_v and ops[name] in REDUCED_RULE_OPS:
                with_cause(diffs[-1], "jax_reduced_rule_differs")
                first_apart = first_apart or (name, apart, "jax_reduced_rule_differs")
            elif (ops[name] in ("tril", "triu") and set(jx_v) <= set(ms_v) and set(jx_r) <= set(ms_r)
                  and not mat.reduced and not mat.unreduced):
                with_cause(diffs[-1], "jax_tril_typed_by_zeros")
                first_apart = first_apart or (name, apart, "jax_tril_typed_by_zeros")
            elif first_apart and apart <= first_apart[1]:
                # a value computed after one whose types already differ, on no other axes
                with_cause(diffs[-1], first_apart[2])
                diffs[-1]["detail"] += f"; follows from {first_apart[0]}"
    return diffs, n


def check(job: common.Job) -> dict:
    _precheck(job)
    tr = Translation(job)
    doc = job.doc
    inputs = {}
    for i in doc["inputs"]:
        parts = tr.partial_input(i)
        inputs[i["name"]] = parts if parts is not None else _input_array(job, i, tr.float_dtype)
    loss = doc.get("backward")
    diff_names = [i["name"] for i in doc["inputs"] if i.get("requires_grad")] if loss else []
    err = job.result.get("error") or {}
    meshsim_refused = job.result.get("status") == "error" and err.get("kind") in VARIANCE_ERRORS
    notes = []

    def forward(diff: dict, rest: dict):
        env = tr.run({**rest, **diff})
        return jnp.sum(env[loss]) if loss else jnp.zeros(()), env

    def forward_backward(diff: dict, rest: dict):
        """The values and the input gradients, replicated: a gradient may come back unreduced (the
        cotangent of an `Rd` input), and its value is then the sum of its parts."""
        (_, env), grads = jax.value_and_grad(forward, has_aux=True)(diff, rest)
        return env, {k: jax.reshard(g, P()) for k, g in grads.items()}

    diff_in = {n: inputs[n] for n in diff_names}
    rest_in = {n: v for n, v in inputs.items() if n not in diff_in}
    try:
        with jax.set_mesh(tr.mesh):
            if loss:
                env, grads = jax.jit(forward_backward)(diff_in, rest_in)
            else:
                _, env = jax.jit(forward)(diff_in, rest_in)
                grads = {}
            env = {k: np.asarray(v) for k, v in env.items()}
            grads = {k: np.asarray(v) for k, v in grads.items()}
    except Exception as e:
        if not _is_jax_refusal(e):
            raise
        if meshsim_refused:
            notes.append(f"both refuse: meshsim {err['kind']}: {err.get('message')}; JAX: {_first_line(e)}")
            return common.report(job, "jax", jax.__version__, [], {"refusal": 1}, notes)
        refusal = {"kind": "refusal", "what": "program", "meshsim": f"ran (status {job.result.get('status')})",
                   "other": _first_line(e),
                   "detail": f"JAX refuses what meshsim runs: {type(e).__name__}: {_first_line(e)}"}
        cause = _cause(str(e), tr.unchecked_regions > 0, {op["op"] for op in job.ops()})
        if cause:
            with_cause(refusal, cause)
        return common.report(job, "jax", jax.__version__, [refusal], {"refusal": 1}, notes)

    differences, vma_diffs = [], []
    if meshsim_refused:
        differences.append({"kind": "refusal", "what": "program", "meshsim": f"{err['kind']}: {err.get('message')}",
                            "other": "accepted", "detail": f"JAX accepts what meshsim refuses ({err['kind']}: "
                                                           f"{err.get('message')})"})
    vma_diffs, n_vma = _vma_differences(job, tr.body_types, tr.body_ops)
    differences += vma_diffs
    if any(t.unreduced for t in tr.body_types.values()):
        notes.append("JAX's unreduced axes are compared as meshsim's variant (its LTensor maps P(sum) to variant)")
    exact, dtype = job.exact(), job.least_dtype()
    n_values = n_grads = 0
    if not meshsim_refused:
        for name, actual in env.items():
            expected = job.value(name)
            if expected is None:
                continue
            n_values += 1
            d = common.compare(name, expected, actual, exact, dtype)
            if d:
                differences.append(d)
        for name in diff_names:
            n_grads += 1
            d = common.compare(f"grad {name}", job.grad(name), grads[name], exact, dtype)
            if d:
                if tr.unchecked_regions:
                    with_cause(d, "jax_unchecked_transpose")
                differences.append(d)
    return common.report(job, "jax", jax.__version__, differences,
                         {"values": n_values, "grads": n_grads, "vma": n_vma}, notes)


def version() -> str:
    return jax.__version__


if __name__ == "__main__":
    sys.exit(common.main("jax", version, check))

"""The one table from aten ops to meshsim ops (tools/import; `meshsim import table --markdown`).

Each row names an aten op (its overload packet, e.g. `aten.addmm`: every overload of it), the meshsim
op(s) it becomes, and what the translation assumes. The PyTorch importer looks an op up here by
name; an op with no row is never dropped: the import stops (exit 2) listing every unmapped op with
its count and first source line. An in-place op (`aten.add_`) is its
out-of-place row's op, whose result then stands for the tensor it wrote. `alias` rows make no op: the result is the operand itself (a copy,
a contiguous layout, a detach on the way, a cast to the same type, a wait on a collective).

Standard library only: the entry script prints this table without importing torch. Emitters get a
builder `b` (pytorch_builder.Builder) and the op's arguments in schema order (defaults filled in):
tensor arguments are the importer's values, the others Python numbers, lists or None. An emitter
returns the result value (a tuple for ops with several results; None where a result has no
counterpart and must not be used) or raises b.unmapped(why) when an argument is outside the row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Row:
    aten: str  # overload packet, e.g. "aten.addmm"
    meshsim: str  # the meshsim op(s), as text
    note: str  # what the row assumes or does
    emit: Callable | None  # None: alias (the result is argument 0)


def _num(v):
    """A number as a scenario writes it (infinities as strings)."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, float) and v.is_integer() and abs(v) < 2 ** 53:
        return int(v)
    return v


def unary(op, **fixed):
    def emit(b, a):
        return b.op(op, [a[0]], dict(fixed), bdim=b.bdim_of(0))
    return emit


def gelu(b, a):
    attrs = {} if a[1] in (None, "none") else {"approximate": a[1]}
    return b.op("gelu", [a[0]], attrs, bdim=b.bdim_of(0))


def binary(op):
    """add/sub/mul/div: two tensors, or a tensor and a number (`value`); add/sub's alpha scales y."""
    def emit(b, a):
        x, y = a[0], a[1]
        alpha = a[2] if op in ("add", "sub") and len(a) > 2 and a[2] is not None else 1
        if op == "div" and len(a) > 2 and a[2] is not None:
            raise b.unmapped(f"div with rounding_mode={a[2]!r}")
        if not b.is_value(x):
            if op == "mul" and b.is_value(y):
                return binary("mul")(b, [y, x])
            if op == "add" and b.is_value(y) and alpha == 1:
                return binary("add")(b, [y, x])
            raise b.unmapped(f"{op} of a number and a tensor")
        if not b.is_value(y):
            return b.op(op, [x], {"value": _num(y * alpha if op in ("add", "sub") else y)}, bdim=b.bdim_of(0))
        if alpha != 1:
            y = b.op("scale", [y], {"value": _num(alpha)}, bdim=b.bdim_of(1), src=[1])
        return b.op(op, [x, y], {}, bdim=b.pointwise_bdim(), src=[0, 1])
    return emit


def rsub(b, a):
    x, y, alpha = a[0], a[1], a[2] if len(a) > 2 and a[2] is not None else 1
    if alpha != 1 or b.is_value(y):
        raise b.unmapped("rsub with alpha or a tensor second operand")
    n = b.op("neg", [x], {}, bdim=b.bdim_of(0))
    return b.op("add", [n], {"value": _num(y)}, bdim=b.bdim_of(0))


def pow_(b, a):
    e = a[1]
    if b.is_value(e) and not b.is_value(a[0]):  # number ** x = exp(x * ln(number))
        if not isinstance(a[0], (int, float)) or a[0] <= 0:
            raise b.unmapped("pow of a number that is not positive to a tensor exponent")
        m = b.op("mul", [e], {"value": math.log(a[0])}, bdim=b.bdim_of(1), final=False)
        return b.op("exp", [m], {}, bdim=b.bdim_of(1))
    if b.is_value(e):
        raise b.unmapped("pow with a tensor exponent and a tensor base")
    if e == 1:
        return a[0]
    if e == 2:  # x * x: meshsim's pow takes a positive base
        return b.op("mul", [a[0], a[0]], {}, bdim=b.bdim_of(0), src=[0, 0])
    return b.op("pow", [a[0]], {"exponent": _num(e)}, bdim=b.bdim_of(0))


def reciprocal(b, a):
    return b.op("pow", [a[0]], {"exponent": -1}, bdim=b.bdim_of(0))


def mm(op):
    def emit(b, a):
        return b.op(op, [a[0], a[1]], {}, bdim=b.matmul_bdim(), dpart=b.matmul_dpart(), src=[0, 1])
    return emit


def addmm(b, a):
    bias, x, w, beta, alpha = a[0], a[1], a[2], a[3], a[4]
    if beta != 1 or alpha != 1:
        raise b.unmapped("addmm with beta or alpha other than 1")
    y = b.op("mm", [x, w], {}, bdim=b.bdim_of(1, 0), src=[1, 2], final=False)
    return b.op("add", [y, bias], {}, bdim=b.bdim_of(1, 0), src=[None, 0])


def t(b, a):
    if b.ndim_of(0) < 2:
        return a[0]
    return b.op("transpose", [a[0]], {"dim0": 0, "dim1": 1}, bdim=b.moved_bdim(0, lambda d: 1 - d))


def transpose(b, a):
    n = b.ndim_of(0)
    d0, d1 = a[1] % n, a[2] % n
    swap = {d0: d1, d1: d0}
    return b.op("transpose", [a[0]], {"dim0": a[1], "dim1": a[2]}, bdim=b.moved_bdim(0, lambda d: swap.get(d, d)))


def permute(b, a):
    n = b.ndim_of(0)
    dims = [d % n for d in a[1]]
    return b.op("permute", [a[0]], {"dims": list(a[1])}, bdim=b.moved_bdim(0, lambda d: dims.index(d)))


def view(b, a):
    shape = list(a[1])
    bd = b.bdim_of(0)
    if bd not in (None, 0) and not b.is_local():
        raise b.unmapped("a view of a value whose batch dim is not its first")
    if b.is_local():
        out = b.local_view(a[0])  # two sharded dims: flatten and unflatten
        if out is not None:
            return out
    return b.op("view", [a[0]], {"shape": b.view_shape(shape, bd)}, bdim=bd)


def unsqueeze(b, a):
    n = b.ndim_of(0) + 1
    d = a[1] % n
    return b.op("unsqueeze", [a[0]], {"dim": a[1]}, bdim=b.moved_bdim(0, lambda k: k + 1 if k >= d else k))


def squeeze(b, a):
    shape = b.shape_of(0)
    dims = list(range(len(shape))) if len(a) < 2 or a[1] is None else (
        [a[1]] if isinstance(a[1], int) else list(a[1]))
    dims = sorted({d % max(len(shape), 1) for d in dims if shape and shape[d % len(shape)] == 1})
    out = a[0]
    for d in reversed(dims):
        out = b.op("squeeze", [out], {"dim": d}, bdim=b.moved_bdim(0, lambda k, d=d: k - 1 if k > d else k),
                   final=d == dims[0])
    return out


def expand(b, a):
    shape = list(a[1])
    bd = b.bdim_of(0)
    pos = None if bd is None else bd + len(shape) - b.ndim_of(0)
    return b.op("expand", [a[0]], {"shape": b.expand_shape(shape, pos)}, bdim=pos)


def slice_(b, a):
    x, dim, start, end, step = a[0], a[1], a[2], a[3], a[4]
    extent = b.shape_of(0)[dim]
    if step != 1:
        raise b.unmapped("slice with a step")
    start = 0 if start is None else start
    end = extent if end is None else end
    start = max(0, min(extent, start + extent if start < 0 else start))
    end = max(start, min(extent, end + extent if end < 0 else end))
    if b.bdim_of(0) is not None and dim % b.ndim_of(0) == b.bdim_of(0):
        raise b.unmapped("a slice of the batch dim")
    if start == 0 and end == extent:
        return x
    return b.op("narrow", [x], {"dim": dim, "start": start, "length": end - start}, bdim=b.bdim_of(0))


def select(b, a):
    x, dim, index = a[0], a[1], a[2]
    if b.bdim_of(0) is not None and dim % b.ndim_of(0) == b.bdim_of(0):
        raise b.unmapped("a select of the batch dim")
    n = b.op("narrow", [x], {"dim": dim, "start": index, "length": 1}, bdim=b.bdim_of(0), final=False)
    d = dim % b.ndim_of(0)
    return b.op("squeeze", [n], {"dim": d}, bdim=b.moved_bdim(0, lambda k: k - 1 if k > d else k))


def cat(b, a):
    xs, dim = a[0], a[1]
    return b.op("cat", list(xs), {"dim": dim}, bdim=b.bdim_of(0), src=list(range(len(xs))), list_arg=True)


def stack(b, a):
    xs, dim = a[0], a[1]
    n = b.ndim_of(0) + 1
    d = dim % n
    return b.op("stack", list(xs), {"dim": dim}, bdim=b.moved_bdim(0, lambda k: k + 1 if k >= d else k),
                src=list(range(len(xs))), list_arg=True)


def split(b, a):
    x, size, dim = a[0], a[1], a[2]
    key = "size" if isinstance(size, int) else "sizes"
    return b.multi("split", x, {key: size if isinstance(size, int) else list(size), "dim": dim},
                   b.pieces_count())


def reduction(op):
    def emit(b, a):
        x = a[0]
        dims = a[1] if len(a) > 1 else None
        keep = bool(a[2]) if len(a) > 2 and a[2] is not None else False
        if isinstance(dims, int):
            dims = [dims]
        attrs = {}
        if dims:
            attrs["dim"] = list(dims)
        if keep:
            attrs["keepdim"] = True
        bd, dpart = b.reduced_bdim(dims, keep, {"sum": "sum", "mean": "avg"}.get(op, "max"))
        return b.op(op, [x], attrs, bdim=bd, dpart=dpart)
    return emit


def full_reduction(op):
    def emit(b, a):
        bd, dpart = b.reduced_bdim(None, False, {"sum": "sum", "mean": "avg"}.get(op, "max"))
        return b.op(op, [a[0]], {}, bdim=bd, dpart=dpart)
    return emit


def softmax(op):
    def emit(b, a):
        return b.op(op, [a[0]], {"dim": a[1]}, bdim=b.bdim_of(0))
    return emit


def nll_loss(b, a):
    x, target, weight, reduction_, ignore = a[0], a[1], a[2], a[3], a[4]
    if weight is not None:
        raise b.unmapped("nll_loss with class weights")
    red = {1: "mean", 2: "sum"}.get(reduction_)
    if red is None:
        raise b.unmapped("nll_loss with reduction='none'")
    attrs = {"reduction": red}
    if ignore != -100:
        attrs["ignore_index"] = ignore
    bd, dpart = b.reduced_bdim(None, False, "avg" if red == "mean" else "sum")
    return b.op("nll_loss", [x, target], attrs, bdim=bd, dpart=dpart, src=[0, 1]), None


def embedding(b, a):
    weight, ids = a[0], a[1]
    if a[2] not in (None, -1):
        raise b.unmapped("embedding with padding_idx")
    return b.op("embedding", [ids, weight], {}, bdim=b.bdim_of(1), src=[1, 0])


def masked_fill(b, a):
    if b.is_value(a[2]):
        raise b.unmapped("masked_fill with a tensor value")
    return b.op("masked_fill", [a[0], a[1]], {"value": _num(a[2])}, bdim=b.pointwise_bdim(), src=[0, 1])


def where(b, a):
    for i in (1, 2):
        if not b.is_value(a[i]):
            raise b.unmapped("where with a number operand")
    return b.op("where", [a[0], a[1], a[2]], {}, bdim=b.pointwise_bdim(), src=[0, 1, 2])


def triangle(op):
    def emit(b, a):
        attrs = {"diagonal": a[1]} if a[1] else {}
        return b.op(op, [a[0]], attrs, bdim=b.bdim_of(0))
    return emit


def layer_norm(b, a):
    x, shape, weight, bias, eps = a[0], a[1], a[2], a[3], a[4]
    args, src = [x], [0]
    if weight is not None:
        args.append(weight)
        src.append(2)
    if bias is not None:
        if weight is None:
            raise b.unmapped("layer_norm with a bias and no weight")
        args.append(bias)
        src.append(3)
    out = b.op("layer_norm", args, {"normalized_shape": list(shape), "eps": eps}, bdim=b.bdim_of(0), src=src)
    return out, None, None


def rms_norm(b, a):
    x, shape, weight, eps = a[0], a[1], a[2], a[3]
    args, src = ([x, weight], [0, 2]) if weight is not None else ([x], [0])
    attrs = {"normalized_shape": list(shape)}
    if eps is not None:
        attrs["eps"] = eps
    return b.op("rms_norm", args, attrs, bdim=b.bdim_of(0), src=src), None


def to_copy(b, a):
    return b.cast(a[0])


def sdpa(b, a):
    """softmax(q @ k^T * scale [+ causal mask]) @ v, as meshsim ops (its logsumexp is not mapped)."""
    q, k, v, dropout, causal = a[0], a[1], a[2], a[3], a[4]
    mask, scale = (a[5] if len(a) > 5 else None), (a[6] if len(a) > 6 else None)
    if dropout or mask is not None:
        raise b.unmapped("scaled_dot_product_attention with dropout or an attn_mask")
    qs, ks = b.shape_of(0), b.shape_of(1)
    if qs[-3] != ks[-3]:
        raise b.unmapped("scaled_dot_product_attention with grouped query heads (enable_gqa)")
    scale = scale if scale is not None else 1.0 / math.sqrt(qs[-1])
    bd = b.bdim_of(0)
    kt = b.op("transpose", [k], {"dim0": -2, "dim1": -1}, bdim=bd, final=False, shape=ks[:-2] + [ks[-1], ks[-2]])
    s = b.op("matmul", [q, kt], {}, bdim=bd, final=False, shape=qs[:-1] + [ks[-2]])
    s = b.op("mul", [s], {"value": scale}, bdim=bd, final=False, shape=qs[:-1] + [ks[-2]])
    if causal:
        m = b.constant("ones", [qs[-2], ks[-2]], "bool")
        m = b.op("triu", [m], {"diagonal": 1}, final=False, shape=[qs[-2], ks[-2]], kind="dt")
        s = b.op("masked_fill", [s, m], {"value": "-inf"}, bdim=bd, final=False, shape=qs[:-1] + [ks[-2]])
    p = b.op("softmax", [s], {"dim": -1}, bdim=bd, final=False, shape=qs[:-1] + [ks[-2]])
    out = b.op("matmul", [p, v], {}, bdim=bd)
    return (out,) + (None,) * (b.results() - 1)


def creation(kind):
    """ones/zeros/full/arange and their _like and new_ forms: a creation op, replicated."""
    def emit(b, a):
        return b.create(kind, a)
    return emit


def collective(op):
    def emit(b, a):
        return b.collective(op, a)
    return emit


ROWS: list[Row] = sorted([
    Row("aten._log_softmax", "log_softmax {dim}", "", softmax("log_softmax")),
    Row("aten._scaled_dot_product_flash_attention_for_cpu",
        "transpose, matmul, mul {value: scale}, (causal: ones, triu, masked_fill -inf), softmax, matmul",
        "F.scaled_dot_product_attention on CPU: no dropout, no attn_mask, no grouped heads", sdpa),
    Row("aten._softmax", "softmax {dim}", "", softmax("softmax")),
    Row("aten._to_copy", "alias", "a cast to the same dtype; to another dtype: a creation op made again in that "
        "dtype (a constant), else unmapped", to_copy),
    Row("aten._unsafe_view", "view {shape}", "as aten.view", view),
    Row("aten._fused_rms_norm", "rms_norm {normalized_shape, eps}", "its rstd result is not mapped", rms_norm),
    Row("aten.abs", "abs", "", unary("abs")),
    Row("aten.add", "add (value: add {value}; alpha: scale, add)", "", binary("add")),
    Row("aten.addmm", "mm, add", "bias + x @ w (beta = alpha = 1)", addmm),
    Row("aten.alias", "alias", "", None),
    Row("aten.amax", "amax {dim, keepdim}", "", reduction("amax")),
    Row("aten.amin", "amin {dim, keepdim}", "", reduction("amin")),
    Row("aten.arange", "arange {shape, placements: R}", "start and step: arange, scale, add", creation("arange")),
    Row("aten.bmm", "bmm", "", mm("bmm")),
    Row("aten.cat", "cat {dim}", "", cat),
    Row("aten.clone", "alias", "a copy", None),
    Row("aten.cos", "cos", "", unary("cos")),
    Row("aten.detach", "alias", "", None),
    Row("aten.div", "div (number: div {value})", "rounding_mode: unmapped", binary("div")),
    Row("aten.embedding", "embedding", "operands swapped: (ids, weight); padding_idx: unmapped", embedding),
    Row("aten.exp", "exp", "", unary("exp")),
    Row("aten.expand", "expand {shape}", "", expand),
    Row("aten.full", "full {shape, value, placements: R}", "", creation("full")),
    Row("aten.full_like", "full {shape, value, placements of the operand}", "", creation("full")),
    Row("aten.gelu", "gelu {approximate}", "", gelu),
    Row("aten.lift_fresh", "alias", "", None),
    Row("aten.log", "log", "", unary("log")),
    Row("aten.masked_fill", "masked_fill {value}", "a number value", masked_fill),
    Row("aten.matmul", "matmul", "torch.matmul of local tensors (recorded whole; on DTensors its aten "
        "decomposition: expand, view, bmm, mm)", mm("matmul")),
    Row("aten.mean", "mean {dim?, keepdim?}", "", reduction("mean")),
    Row("aten.mm", "mm", "", mm("mm")),
    Row("aten.mul", "mul (number: mul {value})", "", binary("mul")),
    Row("aten.native_layer_norm", "layer_norm {normalized_shape, eps}", "its mean and rstd results are not mapped",
        layer_norm),
    Row("aten.neg", "neg", "", unary("neg")),
    Row("aten.new_full", "full {shape, value, placements: R}", "", creation("full")),
    Row("aten.new_ones", "ones {shape, placements: R}", "", creation("ones")),
    Row("aten.new_zeros", "zeros {shape, placements: R}", "", creation("zeros")),
    Row("aten.nll_loss_forward", "nll_loss {reduction, ignore_index}",
        "reduction mean or sum, no class weights; its total_weight result is not mapped", nll_loss),
    Row("aten.ones", "ones {shape, placements: R}", "", creation("ones")),
    Row("aten.ones_like", "ones {shape, placements of the operand}", "", creation("ones")),
    Row("aten.permute", "permute {dims}", "", permute),
    Row("aten.pow", "pow {exponent} (2: mul x x; 1: alias)",
        "a number exponent; a positive number to a tensor power: mul {value: ln(number)}, exp", pow_),
    Row("aten.reciprocal", "pow {exponent: -1}", "", reciprocal),
    Row("aten.relu", "relu", "", unary("relu")),
    Row("aten.reshape", "view {shape}", "", view),
    Row("aten.rsqrt", "rsqrt", "", unary("rsqrt")),
    Row("aten.rsub", "neg, add {value}", "number - x", rsub),
    Row("aten.select", "narrow, squeeze", "not of the batch dim", select),
    Row("aten.sigmoid", "sigmoid", "", unary("sigmoid")),
    Row("aten.silu", "silu", "", unary("silu")),
    Row("aten.sin", "sin", "", unary("sin")),
    Row("aten.slice", "narrow {dim, start, length}", "step 1, not of the batch dim; the whole dim: alias", slice_),
    Row("aten.split", "split {size, dim}", "", split),
    Row("aten.split_with_sizes", "split {sizes, dim}", "", split),
    Row("aten.sqrt", "sqrt", "", unary("sqrt")),
    Row("aten.squeeze", "squeeze {dim} (one per size-1 dim)", "", squeeze),
    Row("aten.stack", "stack {dim}", "", stack),
    Row("aten.sub", "sub (number: sub {value}; alpha: scale, sub)", "", binary("sub")),
    Row("aten.sum", "sum {dim?, keepdim?}", "", reduction("sum")),
    Row("aten.t", "transpose {dim0: 0, dim1: 1}", "a 1-D operand: alias", t),
    Row("aten.tanh", "tanh", "", unary("tanh")),
    Row("aten.transpose", "transpose {dim0, dim1}", "", transpose),
    Row("aten.tril", "tril {diagonal}", "", triangle("tril")),
    Row("aten.triu", "triu {diagonal}", "", triangle("triu")),
    Row("aten.unsqueeze", "unsqueeze {dim}", "", unsqueeze),
    Row("aten.view", "view {shape} (local code: -1 on the dim a shard splits; two such dims: flatten, "
        "unflatten)", "the batch dim stays first", view),
    Row("aten.where", "where", "tensor operands", where),
    Row("aten.zeros", "zeros {shape, placements: R}", "", creation("zeros")),
    Row("aten.zeros_like", "zeros {shape, placements of the operand}", "", creation("zeros")),
    Row("_c10d_functional._wrap_tensor_autograd", "alias", "", None),
    Row("_c10d_functional.all_gather_into_tensor", "all_gather {axis, dim: 0}", "in local code", collective("all_gather")),
    Row("_c10d_functional.all_reduce", "all_reduce {axis, reduce}", "in local code", collective("all_reduce")),
    Row("_c10d_functional.all_to_all_single", "all_to_all {axis, split_dim: 0, concat_dim: 0}",
        "equal splits, in local code", collective("all_to_all")),
    Row("_c10d_functional.reduce_scatter_tensor", "reduce_scatter {axis, dim: 0}", "sum, in local code",
        collective("reduce_scatter")),
    Row("_c10d_functional.wait_tensor", "alias", "", None),
], key=lambda r: (r.aten.startswith("_c10d"), r.aten))

TABLE: dict[str, Row] = {r.aten: r for r in ROWS}


def markdown() -> str:
    """The table as markdown (docs/import.md includes it, generated)."""
    out = ["| aten op | meshsim | note |", "|---|---|---|"]
    for r in ROWS:
        note = r.note or ("no op: the operand itself" if r.meshsim == "alias" and not r.note else r.note)
        out.append(f"| `{r.aten}` | {r.meshsim} | {note} |")
    return "\n".join(out) + "\n"

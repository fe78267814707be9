"""meshsim import jax: the primitive table (PRIMITIVES) and the translation of equations to meshsim
ops, equation by equation (the Translator: a shard_map's body, its reference, the program's ops
outside the shard_maps). Part of jax_importer.py (its docstring tells the whole); standard library
only at import (`--markdown-table` runs without jax)."""

from __future__ import annotations

import math

from common import UserError
from jax_jaxpr import Eqn, Val, _is_literal
from jax_names import Sources, _clean


# ---------------------------------------------------------------------------------------------
# The table: jaxpr primitive -> (meshsim op, how, what is translated). `how` names the Translator
# method `t_<how>` that translates the equation, in a body (rank-local, collectives kept) or on
# global values (the program outside shard_maps, and a body's reference: collectives and casts
# are the identity there). `--markdown-table` prints it for docs/import.md.

PRIMITIVES = {
    # elementwise
    "add": ("add", "binary", "x + y; a Python scalar operand becomes `value`"),
    "add_any": ("add", "binary", "x + y (the sum of cotangents in a grad inside shard_map)"),
    "sub": ("sub", "binary", "x - y; `c - x` as neg then add value"),
    "mul": ("mul", "binary", "x * y"),
    "div": ("div", "binary", "x / y"),
    "max": ("relu", "max", "max(x, 0) (jax.nn.relu); max(x, -inf) (jax.nn.softmax's) is x"),
    "stop_gradient": ("(none)", "stop_gradient", "the value itself, only for the max softmax and logsumexp "
                      "subtract (its gradient is zero: they are shift-invariant)"),
    "neg": ("neg", "unary", "-x"),
    "exp": ("exp", "unary", "e^x"),
    "log": ("log", "unary", "log x"),
    "tanh": ("tanh", "unary", "tanh x"),
    "logistic": ("sigmoid", "unary", "jax.nn.sigmoid"),
    "sin": ("sin", "unary", "sin x"),
    "cos": ("cos", "unary", "cos x"),
    "sqrt": ("sqrt", "unary", "sqrt x"),
    "rsqrt": ("rsqrt", "unary", "1 / sqrt x"),
    "abs": ("abs", "unary", "|x|"),
    "square": ("mul", "square", "x * x"),
    "integer_pow": ("mul", "integer_pow", "x^k, k >= 1, as k - 1 muls (exact; meshsim's pow wants x > 0)"),
    "pow": ("pow", "pow", "x^c for a constant c"),
    # structure
    "dot_general": ("mm | matmul", "dot_general", "one contracting dim, batch dims leading; "
                    "transpose / permute to put the contracting dims in place"),
    "transpose": ("permute | transpose", "transpose", "permutation"),
    "reshape": ("reshape", "reshape", "new_sizes (the reference: the global sizes)"),
    "squeeze": ("squeeze", "squeeze", "one squeeze per dim"),
    "broadcast_in_dim": ("unsqueeze | expand", "broadcast", "the new dims as unsqueeze; kept as "
                         "size 1 where every consumer broadcasts, else expand"),
    "concatenate": ("cat", "concatenate", "dimension"),
    "slice": ("narrow", "slice", "unit strides; in a body, of a dim its operand holds whole"),
    "split": ("narrow", "split", "sizes, axis: one narrow per piece; in a body, of a dim its operand holds whole"),
    "reduce_sum": ("sum", "reduce", "axes"),
    "reduce_max": ("amax", "reduce", "axes"),
    "reduce_min": ("amin", "reduce", "axes"),
    "convert_element_type": ("(none)", "convert", "float to float of the same width: the value itself"),
    "copy": ("(none)", "alias", "the value itself"),
    "copy_p": ("(none)", "alias", "the value itself"),
    # layout (outside shard_maps)
    "reshard": ("redistribute", "reshard", "jax.reshard / jax.sharding.reshard: to its spec's placements"),
    "sharding_constraint": ("redistribute", "reshard", "with_sharding_constraint: to its spec's placements"),
    # collectives (body only; the reference reads them as the identity)
    "psum": ("all_reduce", "psum", "reduce sum over each axis (check_vma=False)"),
    "psum_invariant": ("all_reduce", "psum", "reduce sum over each axis (jax.lax.psum, check_vma=True)"),
    "unreduced_psum": ("all_reduce", "psum", "reduce sum of an unreduced value over each axis"),
    "pmax": ("all_reduce", "pmax", "reduce max over each axis"),
    "pmin": ("all_reduce", "pmin", "reduce min over each axis"),
    "all_gather": ("all_gather", "all_gather", "tiled only: to varying"),
    "all_gather_reduced": ("all_gather", "all_gather", "jax.lax.all_gather(..., to='reduced')"),
    "reduce_scatter": ("reduce_scatter", "reduce_scatter", "jax.lax.psum_scatter, tiled only"),
    "unreduced_reduce_scatter": ("reduce_scatter", "reduce_scatter", "psum_scatter of an unreduced value, tiled only"),
    "all_to_all": ("all_to_all", "all_to_all", "tiled only"),
    "pvary": ("mark_varying", "pvary", "one per axis (jax.lax.pvary / pcast(to='varying'), and "
              "those check_vma inserts)"),
    "reduced_vary_cast_p": ("(meshsim's cast)", "alias", "reduced -> varying: meshsim casts a reduced "
                            "operand that meets a varying one itself"),
    "vary_unreduced_cast_p": ("(none)", "alias", "varying -> unreduced: meshsim's LTensor reads "
                              "P(sum) as variant"),
}
# Not inlined: a jax.custom_vjp's backward is its own rule, which meshsim cannot run (it would
# differentiate the primal instead, a gradient JAX does not compute).
REFUSED = {"custom_vjp_call": "a jax.custom_vjp function: its backward rule has no meshsim counterpart",
           "custom_vjp_call_jaxpr": "a jax.custom_vjp function: its backward rule has no meshsim counterpart"}
# Ops whose operands broadcast (numpy-style, aligned from the last dim).
BROADCASTING = {"add", "add_any", "sub", "mul", "div", "max"}


def live(eqns: list[Eqn], outvars) -> list[Eqn]:
    """The equations whose results reach `outvars` (a jaxpr traced with jax.grad inside keeps the
    forward's loss, which nothing reads). jaxpr primitives have no side effects but the effectful
    ones, which the table has no rows for, so they are kept to be reported."""
    need = {id(v) for v in outvars if not _is_literal(v) and not isinstance(v, tuple)}
    kept = []
    for e in reversed(eqns):
        if any(id(o) in need for o in e.outvars) or e.prim not in PRIMITIVES and e.prim != "shard_map":
            kept.append(e)
            need.update(id(v) for v in e.invars if not _is_literal(v) and not isinstance(v, tuple))
    return kept[::-1]



# ---------------------------------------------------------------------------------------------
# Placements


def spec_placements(spec, ndim: int, axes: list[str], what: str) -> list[str]:
    """A PartitionSpec as one meshsim placement per mesh axis."""
    out = {a: "R" for a in axes}
    entries = list(getattr(spec, "partitions", spec) or ())
    for d, entry in enumerate(entries):
        if entry is None:
            continue
        names = list(entry) if isinstance(entry, tuple) else [entry]
        order = [a for a in axes if a in names]
        if names != order:
            raise UserError(f"{what}: dim {d} sharded over {tuple(names)}, not in mesh order {tuple(axes)}: "
                            "a strided shard, not supported by the importer")
        for a in names:
            if a not in out:
                raise UserError(f"{what}: axis {a!r} is not a mesh axis ({', '.join(axes)})")
            out[a] = f"S({d})"
    for a in getattr(spec, "reduced", None) or ():
        out[a] = "Rd"
    for a in getattr(spec, "unreduced", None) or ():
        out[a] = "P(sum)"
    return [out[a] for a in axes]


def _dtype(dt) -> str | None:
    """meshsim's dtype of a jax dtype: None for a float (the run's), int64, bool; else UserError."""
    import numpy as np
    dt = np.dtype(dt)
    if np.issubdtype(dt, np.floating):
        return None
    if np.issubdtype(dt, np.integer):
        return "int64"
    if dt == np.bool_:
        return "bool"
    raise UserError(f"dtype {dt} has no meshsim counterpart")


# ---------------------------------------------------------------------------------------------
# The translation


class Translator:
    """Translates equations to meshsim ops: body ops (rank-local, collectives kept) or global ops
    (the program, a reference: collectives read as the identity)."""

    def __init__(self, sources: Sources, axes: list[str], sizes: dict[str, int], with_source: bool):
        self.sources = sources
        self.axes, self.sizes = axes, sizes
        self.with_source = with_source
        self.used: set[str] = set()
        self.unmapped: dict[str, list] = {}  # primitive -> [count, first source]
        self.counters: dict[str, int] = {}
        self.names_by_eqn: dict[int, list[str]] = {}  # id(eqn) -> names chosen (shared with the reference)
        self.out_ndims: dict[str, list[int]] = {}  # a local_map's first result -> its results' ranks

    # -- names

    def fresh(self, base: str) -> str:
        base = _clean(base)
        if base not in self.used:
            self.used.add(base)
            return base
        k = self.counters.get(base, 1)
        while f"{base}_{k}" in self.used:
            k += 1
        self.counters[base] = k + 1
        self.used.add(f"{base}_{k}")
        return f"{base}_{k}"

    def note_unmapped(self, eqn: Eqn, why: str = ""):
        key = eqn.prim + (f" ({why})" if why else "")
        entry = self.unmapped.setdefault(key, [0, self.sources.source(eqn.source_info)])
        entry[0] += 1

    # -- one region

    def region(self, eqns: list[Eqn], env: dict, mode: str, names: dict | None = None) -> list[dict]:
        """Translates `eqns` with `env` (jaxpr var id -> Val) in mode "body" or "global"; returns
        the ops. `names` (eqn id -> list of names) reuses the body's names in its reference."""
        self.mode = mode
        self.ops: list[dict] = []
        self.env = env
        self.consumers: dict[int, list[Eqn]] = {}
        self.pending: list[tuple[str, str]] = []
        for e in eqns:
            for v in e.invars:
                if not _is_literal(v) and not isinstance(v, tuple):
                    self.consumers.setdefault(id(v), []).append(e)
        for e in eqns:
            self.eqn = e
            self.base = self.sources.target(e.source_info)
            self.src = self.sources.source(e.source_info) if self.with_source else None
            self.name_queue = list(names.get(id(e), [])) if names is not None else None
            self.chosen: list[str] = []
            row = PRIMITIVES.get(e.prim)
            if row is None:
                if names is None:  # a reference's equations are the body's, counted there
                    self.note_unmapped(e, REFUSED.get(e.prim, ""))
                for o in e.outvars:
                    env[id(o)] = Val(name="?", shape=o.aval.shape, gshape=o.aval.shape)
                continue
            ins = [self.val(v) for v in e.invars]
            if any(x is None for x in ins):
                if names is None:
                    self.note_unmapped(e, "an array constant operand")
                continue
            try:
                outs = getattr(self, "t_" + row[1])(e, ins)
            except _Unmapped as u:
                if names is None:
                    self.note_unmapped(e, str(u))
                outs = [Val(name="?", shape=o.aval.shape, gshape=o.aval.shape) for o in e.outvars]
            for o, val in zip(e.outvars, outs):
                env[id(o)] = val
            if mode == "body":
                self.names_by_eqn[id(e)] = self.chosen
        self.finish_names()
        return self.ops

    def finish_names(self):
        """Names the ops of an assignment `h = ...` (which may be several equations and ops): the
        last one `h`, those before it `h_1`, `h_2`, ... (each unique in the scenario)."""
        if not self.pending:
            return
        final: dict[str, str] = {}
        groups: dict[str, list[str]] = {}
        for base, ph in self.pending:
            groups.setdefault(base, []).append(ph)
        for base, phs in groups.items():
            final[phs[-1]] = self.fresh(base)
            for ph in phs[:-1]:
                final[ph] = self.fresh(base)
        for op in self.ops:
            op["out"] = final.get(op["out"], op["out"])
            op["args"] = [final.get(a, a) for a in op["args"]]
        for v in self.env.values():
            if v.name in final:
                v.name = final[v.name]
        for names in self.names_by_eqn.values():
            names[:] = [final.get(n, n) for n in names]
        self.pending = []

    def val(self, v) -> Val | None:
        if _is_literal(v):
            return Val(const=float(v.val), dtype=str(v.aval.dtype))
        if isinstance(v, tuple):  # a closed-over constant
            import numpy as np
            arr = np.asarray(v[1])
            return Val(const=float(arr)) if arr.ndim == 0 else None
        return self.env[id(v)]

    def emit(self, op: str, args: list[str], out_shape, out_gshape, dtype: str, hint: str | None = None,
             **attrs) -> Val:
        if self.name_queue:
            name = self.name_queue.pop(0)
            self.used.add(name)
        elif hint:
            name = self.fresh(hint)
        elif self.base:
            # named after the assignment on its line once the region is done (`finish_names`)
            name = f"\x00{len(self.pending)}"
            self.pending.append((self.base, name))
        else:
            name = self.fresh(_default_base(op, self.eqn.prim))
        self.chosen.append(name)
        d = {"out": name, "op": op, "args": list(args)}
        d.update(attrs)
        if self.src:
            d["source"] = self.src
        self.ops.append(d)
        v = Val(name=name, shape=out_shape, gshape=out_gshape, dtype=dtype)
        v.origin = self.eqn.prim
        return v

    # -- rows

    def _gshape_elementwise(self, ins: list[Val], e) -> tuple:
        shapes = [x.gshape for x in ins if x.const is None]
        if not shapes:
            return tuple(e.outvars[0].aval.shape)
        n = max(len(s) for s in shapes)
        out = [1] * n
        for s in shapes:
            for i, ext in enumerate((1,) * (n - len(s)) + tuple(s)):
                out[i] = max(out[i], ext)
        return tuple(out)

    def t_unary(self, e, ins):
        x = ins[0]
        row = PRIMITIVES[e.prim]
        if x.const is not None:
            return [Val(const=_fold(e.prim, [x.const]))]
        return [self.emit(row[0], [x.name], e.outvars[0].aval.shape, x.gshape, x.dtype)]

    def t_alias(self, e, ins):
        return [ins[0]]

    def t_convert(self, e, ins):
        import numpy as np
        x = ins[0]
        new = np.dtype(e.params["new_dtype"])
        if x.const is not None:
            return [Val(const=x.const)]
        old = np.dtype(e.invars[0].aval.dtype)
        if np.issubdtype(new, np.floating) and np.issubdtype(old, np.floating) and new.itemsize == old.itemsize:
            return [x]
        raise _Unmapped(f"{old} to {new}")

    def t_binary(self, e, ins):
        x, y = ins
        g = self._gshape_elementwise(ins, e)
        shape = e.outvars[0].aval.shape
        op = {"add_any": "add"}.get(e.prim, e.prim)
        if x.const is not None and y.const is not None:
            return [Val(const=_fold(e.prim, [x.const, y.const]))]
        other = y if x.const is not None else x
        if (x.const is not None or y.const is not None) and tuple(shape) != tuple(other.shape):
            raise _Unmapped("a constant array that broadcasts the other operand")
        if y.const is not None and tuple(shape) == tuple(x.shape) and (
                (op in ("mul", "div") and y.const == 1.0) or (op in ("add", "sub") and y.const == 0.0)):
            return [x]  # x * 1, x + 0: the value itself (JAX's grad writes them)
        if x.const is not None and tuple(shape) == tuple(y.shape) and (
                (op == "mul" and x.const == 1.0) or (op == "add" and x.const == 0.0)):
            return [y]
        if y.const is not None:
            return [self.emit(op, [x.name], shape, g, x.dtype, value=_num(y.const))]
        if x.const is not None:
            if op in ("add", "mul"):
                return [self.emit(op, [y.name], shape, g, y.dtype, value=_num(x.const))]
            if op == "sub":
                n = self.emit("neg", [y.name], y.shape, y.gshape, y.dtype)
                return [self.emit("add", [n.name], shape, g, y.dtype, value=_num(x.const))]
            raise _Unmapped("a constant divided by an array")
        return [self.emit(op, [x.name, y.name], shape, g, x.dtype)]

    def t_max(self, e, ins):
        x, y = ins
        if x.const == -math.inf or y.const == -math.inf:  # softmax's max(-inf, amax(x)): the value itself
            return [y if x.const is not None else x]
        if y.const == 0.0 and x.const is None:
            x, y = y, x
        if x.const == 0.0 and y.const is None:
            return [self.emit("relu", [y.name], y.shape, y.gshape, y.dtype)]
        raise _Unmapped("max other than max(x, 0)")

    def t_stop_gradient(self, e, ins):
        x = ins[0]
        if x.const is not None or x.origin in ("reduce_max", "reduce_min"):
            return [x]
        raise _Unmapped("other than of the max that softmax and logsumexp subtract (meshsim has no detach)")

    def t_square(self, e, ins):
        x = ins[0]
        if x.const is not None:
            return [Val(const=x.const * x.const)]
        return [self.emit("mul", [x.name, x.name], x.shape, x.gshape, x.dtype)]

    def t_integer_pow(self, e, ins):
        x, k = ins[0], int(e.params["y"])
        if x.const is not None:
            return [Val(const=x.const ** k)]
        if k < 1:
            raise _Unmapped(f"exponent {k}")
        acc = x
        for _ in range(k - 1):
            acc = self.emit("mul", [acc.name, x.name], x.shape, x.gshape, x.dtype)
        return [acc]

    def t_pow(self, e, ins):
        x, c = ins
        if c.const is None or x.const is not None:
            raise _Unmapped("a non-constant exponent")
        return [self.emit("pow", [x.name], x.shape, x.gshape, x.dtype, exponent=_num(c.const))]

    def _perm(self, x: Val, perm: list[int]) -> Val:
        if perm == list(range(len(perm))):
            return x
        shape = tuple(x.shape[p] for p in perm)
        gshape = tuple(x.gshape[p] for p in perm)
        swapped = [i for i, p in enumerate(perm) if p != i]
        if len(swapped) == 2 and perm[swapped[0]] == swapped[1]:
            return self.emit("transpose", [x.name], shape, gshape, x.dtype, dim0=swapped[0], dim1=swapped[1])
        return self.emit("permute", [x.name], shape, gshape, x.dtype, dims=list(perm))

    def t_transpose(self, e, ins):
        return [self._perm(ins[0], list(e.params["permutation"]))]

    def t_dot_general(self, e, ins):
        x, y = ins
        if x.const is not None or y.const is not None:
            raise _Unmapped("a constant operand")
        (lc, rc), (lb, rb) = e.params["dimension_numbers"]
        lc, rc, lb, rb = list(lc), list(rc), list(lb), list(rb)
        if len(lc) != 1:
            raise _Unmapped(f"{len(lc)} contracting dims")
        lfree = [d for d in range(len(x.shape)) if d not in lc + lb]
        rfree = [d for d in range(len(y.shape)) if d not in rc + rb]
        if lb and (len(lfree) != 1 or len(rfree) != 1):
            raise _Unmapped("batch dims with other than one free dim on each side")
        if not lb and len(rfree) > 1:
            raise _Unmapped("a right operand with more than one free dim")
        xp = self._perm(x, lb + lfree + lc)
        yp = self._perm(y, rb + rc + rfree)
        shape = tuple(e.outvars[0].aval.shape)
        gshape = tuple(xp.gshape[:len(lb) + len(lfree)]) + tuple(yp.gshape[len(rb) + 1:])
        op = "mm" if len(xp.shape) == 2 and len(yp.shape) == 2 and not lb else "matmul"
        return [self.emit(op, [xp.name, yp.name], shape, gshape, x.dtype)]

    def t_reduce(self, e, ins):
        x = ins[0]
        axes = sorted(int(a) for a in e.params["axes"])
        if x.const is not None:
            raise _Unmapped("a constant operand")
        op = PRIMITIVES[e.prim][0]
        gshape = tuple(s for i, s in enumerate(x.gshape) if i not in axes)
        if not axes:
            return [x]
        dim = axes if len(axes) != len(x.shape) else None
        attrs = {"dim": dim} if dim is not None else {}
        return [self.emit(op, [x.name], e.outvars[0].aval.shape, gshape, x.dtype, **attrs)]

    def t_squeeze(self, e, ins):
        x = ins[0]
        for d in sorted((int(d) % max(len(x.shape), 1) for d in e.params["dimensions"]), reverse=True):
            shape = x.shape[:d] + x.shape[d + 1:]
            gshape = x.gshape[:d] + x.gshape[d + 1:]
            x = self.emit("squeeze", [x.name], shape, gshape, x.dtype, dim=d)
        return [x]

    def t_concatenate(self, e, ins):
        if any(x.const is not None for x in ins):
            raise _Unmapped("a constant operand")
        d = int(e.params["dimension"])
        g = list(ins[0].gshape)
        g[d] = sum(x.gshape[d] for x in ins)
        return [self.emit("cat", [x.name for x in ins], e.outvars[0].aval.shape, tuple(g), ins[0].dtype, dim=d)]

    def _whole(self, x: Val, d: int, what: str):
        """A slice or split of dim d reads the same elements on the ranks and globally only where
        the dim is not sharded (its local extent is its global one)."""
        if x.shape[d] != x.gshape[d]:
            raise _Unmapped(f"{what} of dim {d}, which is sharded ({x.shape[d]} of {x.gshape[d]} on a rank)")

    def t_slice(self, e, ins):
        x = ins[0]
        if x.const is not None:
            return [Val(const=x.const)]
        if any(s not in (None, 1) for s in (e.params.get("strides") or ())):
            raise _Unmapped("strides")
        starts, limits = e.params["start_indices"], e.params["limit_indices"]
        cut = [d for d in range(len(x.shape)) if starts[d] != 0 or limits[d] != x.shape[d]]
        for d in cut:
            self._whole(x, d, "a slice")
            shape = x.shape[:d] + (limits[d] - starts[d],) + x.shape[d + 1:]
            gshape = x.gshape[:d] + (limits[d] - starts[d],) + x.gshape[d + 1:]
            x = self.emit("narrow", [x.name], shape, gshape, x.dtype, dim=d, start=int(starts[d]),
                          length=int(limits[d] - starts[d]))
        return [x]

    def t_split(self, e, ins):
        x = ins[0]
        if x.const is not None:
            raise _Unmapped("a constant operand")
        d, sizes = int(e.params["axis"]), [int(k) for k in e.params["sizes"]]
        self._whole(x, d, "a split")
        outs = []
        start = 0
        for k in sizes:  # one narrow per piece: names stay one per value, as the jaxpr's
            outs.append(self.emit("narrow", [x.name], x.shape[:d] + (k,) + x.shape[d + 1:],
                                  x.gshape[:d] + (k,) + x.gshape[d + 1:], x.dtype, dim=d, start=start, length=k))
            start += k
        return outs

    def t_reshape(self, e, ins):
        x = ins[0]
        if x.const is not None:
            return [Val(const=x.const)]
        new = [int(s) for s in e.params["new_sizes"]]
        target = _global_reshape(x.shape, x.gshape, new)
        if self.mode == "body":
            return [self.emit("reshape", [x.name], tuple(new), target or tuple(new), x.dtype, shape=new)]
        if target is None:
            raise _Unmapped(f"a reshape that merges a sharded dim into the dims before it, where the ranks' "
                            f"pieces interleave (local {list(x.shape)} of global {list(x.gshape)} -> {new})")
        return [self.emit("reshape", [x.name], tuple(new), target, x.dtype, shape=list(target))]

    def _broadcasts_only(self, var) -> bool:
        """Whether every reader of `var` broadcasts its operands (through the value-preserving
        pvary, casts and converts), so that a broadcast may keep its size-1 dims."""
        readers = self.consumers.get(id(var), [])
        passthrough = ("pvary", "convert_element_type", "reduced_vary_cast_p", "vary_unreduced_cast_p", "copy",
                       "copy_p")
        return bool(readers) and all(c.prim in BROADCASTING or c.prim in passthrough and
                                     self._broadcasts_only(c.outvars[0]) for c in readers)

    def t_broadcast(self, e, ins):
        outs = self._broadcast(e, ins)
        outs[0].origin = ins[0].origin  # a broadcast max is still the max (t_stop_gradient)
        return outs

    def _broadcast(self, e, ins):
        x = ins[0]
        shape = tuple(int(s) for s in e.params["shape"])
        bdims = [int(d) for d in e.params["broadcast_dimensions"]]
        if x.const is not None:
            return [Val(const=x.const)]
        broadcasts_only = self._broadcasts_only(e.outvars[0])
        r, n = len(x.shape), len(shape)
        gout = [1] * n
        for i, d in enumerate(bdims):
            gout[d] = x.gshape[i] if x.shape[i] == shape[d] else shape[d]
        for d in range(n):
            if d not in bdims:
                gout[d] = shape[d]
        # keep size-1 dims where every consumer broadcasts: numpy alignment needs only the new dims
        # that are not leading
        if broadcasts_only and bdims == list(range(n - r, n)):
            return [x]
        cur = x
        for d in range(n):
            if d not in bdims:
                cur = self.emit("unsqueeze", [cur.name], cur.shape[:d] + (1,) + cur.shape[d:],
                                cur.gshape[:d] + (1,) + cur.gshape[d:], x.dtype, dim=d)
        if broadcasts_only:
            return [cur]
        if cur.shape == shape:
            return [cur]
        local = [(-1 if cur.shape[d] == shape[d] else shape[d]) for d in range(n)]
        glob = [(-1 if cur.gshape[d] == gout[d] else gout[d]) for d in range(n)]
        return [self.emit("expand", [cur.name], shape, tuple(gout), x.dtype,
                          shape=local if self.mode == "body" else glob)]

    def t_reshard(self, e, ins):
        x = ins[0]
        sharding = e.params.get("dst_sharding", e.params.get("sharding"))
        spec = getattr(sharding, "spec", None)
        if self.mode == "body" or x.const is not None or spec is None:
            raise _Unmapped("in a shard_map body" if self.mode == "body" else "without a NamedSharding")
        placements = spec_placements(spec, len(x.shape), self.axes, "reshard")
        return [self.emit("redistribute", [x.name], x.shape, x.gshape, x.dtype, placements=placements)]

    # -- collectives

    def _axes(self, e, key) -> list[str]:
        if e.params.get("axis_index_groups") is not None:
            raise _Unmapped("over axis_index_groups")
        a = e.params[key]
        names = list(a) if isinstance(a, (tuple, list)) else [a]
        for n in names:
            if not isinstance(n, str) or n not in self.sizes:
                raise _Unmapped(f"axis {n!r}")
        return names

    def _identity_in_reference(self, x: Val, e) -> list[Val] | None:
        """A collective's result in the reference (the identity), or None in a body."""
        if not e.params.get("tiled", True):
            raise _Unmapped("untiled: its stacked dim has no global reading; use tiled=True")
        if self.mode != "body":
            return [x]
        if x.const is not None:
            raise _Unmapped("a constant operand")
        return None

    def t_psum(self, e, ins, reduce="sum"):
        x = ins[0]
        if self.mode != "body":
            return [x]
        if x.const is not None:
            raise _Unmapped("a constant operand")
        for a in self._axes(e, "axes"):
            x = self.emit("all_reduce", [x.name], x.shape, x.gshape, x.dtype, axis=a, reduce=reduce)
        return [x]

    def t_pmax(self, e, ins):
        return self.t_psum(e, ins, "max")

    def t_pmin(self, e, ins):
        return self.t_psum(e, ins, "min")

    def t_pvary(self, e, ins):
        x = ins[0]
        if x.const is not None or self.mode != "body":
            return [x]
        for a in self._axes(e, "axes"):
            # named after its operand (x_varying_dp): JAX inserts most of them, not the line's code
            x = self.emit("mark_varying", [x.name], x.shape, x.gshape, x.dtype, hint=f"{x.name}_varying_{a}", axis=a)
        return [x]

    def t_all_gather(self, e, ins):
        x = ins[0]
        done = self._identity_in_reference(x, e)
        if done is not None:
            return done
        d = int(e.params["all_gather_dimension"])
        to = "reduced" if e.prim == "all_gather_reduced" else "varying"
        # major-to-minor: the last axis's pieces are adjacent, so it is gathered first
        for a in reversed(self._axes(e, "axis_name")):
            shape = list(x.shape)
            shape[d] *= self.sizes[a]
            x = self.emit("all_gather", [x.name], tuple(shape), x.gshape, x.dtype, axis=a, dim=d, to=to)
        return [x]

    def t_reduce_scatter(self, e, ins):
        x = ins[0]
        done = self._identity_in_reference(x, e)
        if done is not None:
            return done
        d = int(e.params["scatter_dimension"])
        for a in self._axes(e, "axis_name"):
            shape = list(x.shape)
            shape[d] //= self.sizes[a]
            x = self.emit("reduce_scatter", [x.name], tuple(shape), x.gshape, x.dtype, axis=a, dim=d)
        return [x]

    def t_all_to_all(self, e, ins):
        x = ins[0]
        done = self._identity_in_reference(x, e)
        if done is not None:
            return done
        axes = self._axes(e, "axis_name")
        if len(axes) != 1:
            raise _Unmapped("over several axes")
        return [self.emit("all_to_all", [x.name], tuple(e.outvars[0].aval.shape), x.gshape, x.dtype, axis=axes[0],
                          split_dim=int(e.params["split_axis"]), concat_dim=int(e.params["concat_axis"]))]


class _Unmapped(Exception):
    """A primitive whose row does not cover this use (the reason is its message)."""


def _num(c: float):
    return int(c) if float(c).is_integer() and abs(c) < 2 ** 53 else float(c)


def _fold(prim: str, xs: list[float]) -> float:
    import numpy as np
    fns = {"neg": lambda a: -a, "exp": np.exp, "log": np.log, "tanh": np.tanh, "sin": np.sin, "cos": np.cos,
           "sqrt": np.sqrt, "rsqrt": lambda a: 1 / np.sqrt(a), "abs": abs, "logistic": lambda a: 1 / (1 + np.exp(-a)),
           "add": lambda a, b: a + b, "add_any": lambda a, b: a + b, "sub": lambda a, b: a - b,
           "mul": lambda a, b: a * b, "div": lambda a, b: a / b}
    return float(fns[prim](*xs))


def _default_base(op: str, prim: str) -> str:
    return {"all_reduce": "psum", "mark_varying": "pvary", "reduce_scatter": "psum_scatter"}.get(op, op)


def _global_reshape(local: tuple, glob: tuple, new: list[int]) -> tuple | None:
    """The global sizes of a reshape of a value whose dims are `local` (global `glob`) to the local
    `new`. The dims fall into groups of equal products (merged or split dims); a dim larger
    globally (sharded) must lead its group, and the group's first output dim is then larger by the
    same factor (a block of rows of the merged or split dims). None where that does not hold (a
    merge with an inner sharded dim interleaves the ranks' pieces)."""
    if tuple(local) == tuple(glob):
        return tuple(new)
    if any(l <= 0 for l in local) or any(n <= 0 for n in new):
        return None
    out = list(new)
    i = j = 0
    while i < len(local) and j < len(new):
        ins, outs, pi, pj = [i], [j], local[i], new[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj and i < len(local):
                pi, i = pi * local[i], i + 1
                ins.append(i - 1)
            elif pj < pi and j < len(new):
                pj, j = pj * new[j], j + 1
                outs.append(j - 1)
            else:
                return None
        scaled = [d for d in ins if local[d] != glob[d]]
        if not scaled:
            continue
        lead = next(d for d in ins if local[d] != 1)
        if scaled != [lead] or glob[lead] % local[lead]:
            return None
        first = next(d for d in outs if new[d] != 1)
        out[first] *= glob[lead] // local[lead]
    if any(local[d] != glob[d] for d in range(i, len(local))):
        return None
    return tuple(out)

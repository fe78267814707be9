#!/usr/bin/env python3
"""meshsim import jax: a `jax.shard_map` program as a meshsim scenario (issue #30, item 3).

    python jax_importer.py --file FILE.py --func FUNC --mesh dp=2,tp=2 --out OUT.json [--no-source]

The file contract: `FUNC(mesh)` gets the `jax.sharding.Mesh` built from --mesh (its axis names and
sizes, Explicit axis types, on as many CPU devices as the mesh has) and returns

    (loss_fn, args)            or    (loss_fn, args, argnums)

as one would pass them to `jax.grad(loss_fn, argnums)(*args)`: `loss_fn` is a plain or jitted
function whose body calls `jax.shard_map(...)` (once or more), `args` its example arguments (pytrees
of `jax.ShapeDtypeStruct` with a `NamedSharding`, or arrays), `argnums` which arguments are
differentiated (an int or a tuple; default 0, as `jax.grad`). The importer traces
`jax.make_jaxpr(loss_fn)(*args)` and writes:

- `inputs`: the leaves of `args`, named after `loss_fn`'s parameters and the pytree keys
  (`params["w1"]` -> `w1`), with their global shapes and the placements of their sharding
  (`P('dp', None)` -> `S(0)` on dp, `R` elsewhere; `reduced` -> `Rd`, `unreduced` -> `P(sum)`);
  the float leaves of the `argnums` arguments have `requires_grad`;
- `program`: each `shard_map` as one `local_map` (its `in_specs` / `out_specs` as
  `in_placements` / `out_placements`, `check_variance` = `check_vma`), whose `body` is the
  shard_map's jaxpr translated equation by equation by the table PRIMITIVES below (collectives
  included, and the `pvary`s JAX inserted itself as `mark_varying`), and whose `reference` is the
  same equations on global arrays with the collectives and casts read as the identity (the global
  meaning of a shard_map body whose collectives complete its local pieces); the equations outside
  the shard_maps (the loss's mean, say) as program ops;
- `backward`: the (first) result of `loss_fn` when it is a scalar;
- `source` on every input and op: the user's file:line and code of the equation, from the jaxpr's
  source_info; `imported`: the system, JAX's version, the file, the function, the mesh and
  `backward_collectives`, what JAX's own backward communicates (jax.grad's jaxpr less the
  forward's), for meshsim to compare with its own.

A primitive with no row in the table is never dropped: exit 2 listing each with its count and
first source line. Before writing, the importer runs the scenario's program (its bodies as
shard_maps, not its references) in JAX on the same small integers as the user's loss_fn: a
different result is an importer bug (exit 7), never a wrong scenario. Exit codes and the one-line
errors: common.py. Same file, same mesh: the same bytes.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import UserError  # noqa: E402

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
# Call-like primitives whose inner jaxpr is inlined (their own parameters hold it).
INLINED = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
           "custom_jvp_call": "call_jaxpr", "remat": "jaxpr", "remat2": "jaxpr", "checkpoint": "jaxpr"}
# Not inlined: a jax.custom_vjp's backward is its own rule, which meshsim cannot run (it would
# differentiate the primal instead, a gradient JAX does not compute).
REFUSED = {"custom_vjp_call": "a jax.custom_vjp function: its backward rule has no meshsim counterpart",
           "custom_vjp_call_jaxpr": "a jax.custom_vjp function: its backward rule has no meshsim counterpart"}
# Ops whose operands broadcast (numpy-style, aligned from the last dim).
BROADCASTING = {"add", "add_any", "sub", "mul", "div", "max"}

ME = os.path.realpath(__file__)
COMMON = os.path.realpath(common.__file__)


# ---------------------------------------------------------------------------------------------
# Values and equations, after inlining


class Val:
    """One jaxpr value: a name (or a constant scalar), its local shape (inside a body) and global
    shape, its dtype."""

    __slots__ = ("name", "const", "shape", "gshape", "dtype", "origin")

    def __init__(self, name=None, const=None, shape=(), gshape=(), dtype="float32"):
        self.name, self.const, self.shape, self.gshape, self.dtype = name, const, tuple(shape), tuple(gshape), dtype
        self.origin = None  # the primitive that made it


class Eqn:
    """A jaxpr equation with call-like primitives inlined: primitive name, params, in and out
    jaxpr variables (objects of jax.core, compared by identity), source info."""

    __slots__ = ("prim", "params", "invars", "outvars", "source_info")

    def __init__(self, prim, params, invars, outvars, source_info):
        self.prim, self.params, self.invars, self.outvars, self.source_info = prim, params, invars, outvars, source_info


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


def _is_literal(v) -> bool:
    return type(v).__name__ == "Literal"


class Ref:
    """A value made by an equation of an inlined call: a fresh one per call, since JAX reuses one
    traced jaxpr (one set of variables) for every call of a jitted function of the same shapes."""

    __slots__ = ("aval",)

    def __init__(self, aval):
        self.aval = aval


class Flattener:
    """Inlines call-like primitives (jit, custom_jvp_call, ...) into one list of equations."""

    def run(self, jaxpr, consts=(), parents: tuple = (), bind: dict | None = None):
        """The equations of `jaxpr`, its calls inlined, and the function that gives what a
        variable of `jaxpr` stands for (a jaxpr var, a Ref, a Literal, or ("const", value)).
        `parents`: the source infos of the calls being inlined, innermost first (an equation of a
        jitted function such as jnp.cumsum has no user frame of its own); `bind`: what the
        jaxpr's invars stand for (id -> value)."""
        local = dict(bind or {})
        for var, c in zip(jaxpr.constvars, consts):
            local[id(var)] = ("const", c)

        def get(v):
            return v if _is_literal(v) else local.get(id(v), v)

        out = []
        for e in jaxpr.eqns:
            name = e.primitive.name
            key = INLINED.get(name, "")
            inner = e.params.get(key) if key else None
            if inner is not None:
                closed = inner if hasattr(inner, "jaxpr") else None
                jx = closed.jaxpr if closed is not None else inner
                cs = closed.consts if closed is not None else ()
                sub, sub_get = self.run(jx, cs, (e.source_info,) + parents,
                                        {id(iv): get(ov) for iv, ov in zip(jx.invars, e.invars)})
                out += sub
                for ov, iv in zip(e.outvars, jx.outvars):
                    local[id(ov)] = sub_get(iv)
                continue
            outs = list(e.outvars)
            if parents:
                outs = [Ref(o.aval) for o in e.outvars]
                for o, r in zip(e.outvars, outs):
                    local[id(o)] = r
            out.append(Eqn(name, e.params, [get(v) for v in e.invars], outs, (e.source_info,) + parents))
        return out, get


# ---------------------------------------------------------------------------------------------
# Sources and names


class Sources:
    """Where the user's code made an equation: the innermost frame in the user's file, else the
    innermost frame jax calls a user's (not this importer's)."""

    def __init__(self, user_file: str, display_file: str | None):
        from jax._src import source_info_util as siu
        self.siu = siu
        self.user = os.path.realpath(user_file)
        self.display = display_file
        self.lines: dict[str, list[str]] = {}

    def frame(self, infos):
        """`infos`: an equation's source info and those of the calls it was inlined from."""
        for info in infos if isinstance(infos, tuple) else (infos,):
            tb = getattr(info, "traceback", None)
            if tb is None:
                continue
            frames = [f for f in self.siu.user_frames(tb) if os.path.realpath(f.file_name) not in (ME, COMMON)]
            mine = [f for f in frames if os.path.realpath(f.file_name) == self.user]
            if mine or frames:
                return (mine or frames)[0]
        return None

    def source(self, source_info) -> dict | None:
        f = self.frame(source_info)
        if f is None:
            return None
        s = common.source_of(f.file_name, f.start_line)
        if self.display and os.path.realpath(f.file_name) == self.user:
            s["file"] = self.display
        return s

    def target(self, source_info) -> str | None:
        """The name a simple assignment on the equation's line binds (`h = ...` -> h), or None."""
        f = self.frame(source_info)
        if f is None:
            return None
        if f.file_name not in self.lines:
            try:
                with open(f.file_name) as fh:
                    self.lines[f.file_name] = fh.read().splitlines()
            except OSError:
                self.lines[f.file_name] = []
        text = self.lines[f.file_name]
        if not 0 < f.start_line <= len(text):
            return None
        line = text[f.start_line - 1]
        m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?::[^=]*)?=(?!=)", line)
        if m:
            return m.group(1)
        # `return jax.lax.pmean(loss, "dp")`: the function called
        m = re.match(r"\s*return\s+(?:[A-Za-z_][A-Za-z0-9_]*\.)*([A-Za-z_][A-Za-z0-9_]*)\(", line)
        return m.group(1) if m else None


def _clean(name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")
    return name or "v"


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


# ---------------------------------------------------------------------------------------------
# The import


def _arg_names(fn, args, paths) -> list[str]:
    """One name per leaf: the function's parameter name, or the pytree key of the leaf (the last
    key when that is unique, else the whole path)."""
    try:
        params = list(inspect.signature(inspect.unwrap(fn)).parameters)
    except (TypeError, ValueError):
        params = []
    base = [params[i] if i < len(params) else f"arg{i}" for i in range(len(args))]
    full, last = [], []
    for i, leaf_paths in enumerate(paths):
        for p in leaf_paths:
            keys = [_key_text(k) for k in p]
            full.append("_".join([base[i]] + keys) if keys else base[i])
            last.append(keys[-1] if keys and not keys[-1].isdigit() else full[-1])
    names = [l if last.count(l) == 1 else f for l, f in zip(last, full)]
    out, seen = [], set()
    for n in names:
        n = _clean(n)
        k, m = 1, n
        while m in seen:
            m = f"{n}_{k}"
            k += 1
        seen.add(m)
        out.append(m)
    return out


def _key_text(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def import_jax(file: str, func: str, mesh_arg: common.MeshArg, out: str, with_source: bool,
               display_file: str | None) -> dict:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={mesh_arg.world}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        import jax
        from jax.sharding import AxisType, NamedSharding
    except ImportError as e:
        raise UserError(f"JAX does not import with this interpreter ({sys.executable}): {e}") from None
    if len(jax.devices()) < mesh_arg.world:
        raise UserError(f"--mesh {mesh_arg.text()} needs {mesh_arg.world} devices; JAX has {len(jax.devices())} "
                        "(jax was imported before XLA_FLAGS could be set?)")
    axes, sizes = mesh_arg.axes, dict(zip(mesh_arg.axes, mesh_arg.shape))
    mesh = jax.make_mesh(tuple(mesh_arg.shape), tuple(axes), axis_types=(AxisType.Explicit,) * len(axes),
                         devices=jax.devices()[:mesh_arg.world])
    _module, build = common.load_user_function(file, func)
    try:
        got = build(mesh)
    except BaseException as e:  # noqa: BLE001 - the user's function may raise anything
        raise UserError(f"{func}(mesh) raised: {common.last_frame(e, file)}") from None
    if not isinstance(got, tuple) or len(got) not in (2, 3) or not callable(got[0]):
        raise UserError(f"{func}(mesh) must return (loss_fn, args) or (loss_fn, args, argnums), "
                        f"got {type(got).__name__}")
    loss_fn, args = got[0], got[1]
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    argnums = got[2] if len(got) == 3 else 0
    argnums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if any(not isinstance(a, int) or not 0 <= a < len(args) for a in argnums):
        raise UserError(f"argnums {argnums} out of range for {len(args)} arguments")

    try:
        with jax.set_mesh(mesh):
            closed = jax.make_jaxpr(loss_fn)(*args)
    except BaseException as e:  # noqa: BLE001 - JAX refusing the program is the user's error
        raise UserError(f"tracing {func}'s loss_fn raised: {_error_line(e, file)}") from None

    paths = []
    for a in args:
        leaves = jax.tree_util.tree_flatten_with_path(a)[0]
        paths.append([p for p, _ in leaves])
    flat_args = jax.tree_util.tree_leaves(args)
    names = _arg_names(loss_fn, args, paths)
    arg_of_leaf = [i for i, ps in enumerate(paths) for _ in ps]
    jaxpr = closed.jaxpr
    if len(jaxpr.invars) != len(flat_args):
        raise RuntimeError(f"{len(jaxpr.invars)} jaxpr inputs for {len(flat_args)} argument leaves")

    sources = Sources(file, display_file)
    tr = Translator(sources, axes, sizes, with_source)
    flat = Flattener()
    all_eqns, get = flat.run(jaxpr, closed.consts)
    eqns = live(all_eqns, [get(v) for v in jaxpr.outvars])
    if not any(e.prim == "shard_map" for e in eqns):
        raise UserError(f"{func}: its loss_fn calls no jax.shard_map (the importer reads shard_map programs; "
                        f"primitives found: {', '.join(sorted({e.prim for e in eqns})) or 'none'})")

    # inputs: differentiated when loss_fn's (first) result is a scalar, as jax.grad needs
    outs_aval = [v.aval for v in jaxpr.outvars]
    scalar_loss = bool(outs_aval) and tuple(outs_aval[0].shape) == () and _dtype(outs_aval[0].dtype) is None
    env: dict[int, Val] = {}
    inputs = []
    first_use: dict[int, object] = {}
    for e in eqns:
        for v in e.invars:
            if not _is_literal(v) and not isinstance(v, tuple):
                first_use.setdefault(id(v), e)
    for k, (var, leaf, name) in enumerate(zip(jaxpr.invars, flat_args, names)):
        shape = tuple(var.aval.shape)
        sharding = getattr(leaf, "sharding", None)
        spec = sharding.spec if isinstance(sharding, NamedSharding) else None
        placements = spec_placements(spec, len(shape), axes, f"input {name}") if spec is not None else ["R"] * len(axes)
        entry = {"name": name, "shape": list(shape), "placements": placements}
        dt = _dtype(var.aval.dtype)
        if dt:
            entry["dtype"] = dt
        elif arg_of_leaf[k] in argnums and scalar_loss:
            entry["requires_grad"] = True
        use = first_use.get(id(var))
        if with_source and use is not None:
            s = sources.source(use.source_info)
            if s:
                entry["source"] = s
        tr.used.add(name)
        env[id(var)] = Val(name=name, shape=shape, gshape=shape, dtype=str(var.aval.dtype))
        inputs.append(entry)
    float_dtypes = {str(v.aval.dtype) for v in jaxpr.invars if _dtype(v.aval.dtype) is None}
    if len(float_dtypes) > 1:
        raise UserError(f"float arguments of several dtypes ({', '.join(sorted(float_dtypes))}): a meshsim run has one")

    # the program: global equations and shard_maps
    needed = {id(v) for e in eqns for v in e.invars} | {id(get(v)) for v in jaxpr.outvars}
    program: list[dict] = []
    segment: list[Eqn] = []

    def flush():
        if segment:
            program.extend(tr.region(list(segment), env, "global"))
            segment.clear()

    for e in eqns:
        if e.prim != "shard_map":
            segment.append(e)
            continue
        flush()
        program.append(_local_map(tr, flat, e, env, axes, sources, with_source, needed))
    flush()

    if tr.unmapped:
        lines = [f"{func}: {sum(c for c, _ in tr.unmapped.values())} equation(s) the importer cannot translate "
                 "(no row in its table, tools/import/jax_importer.py PRIMITIVES, or a use the row does not cover; "
                 "nothing was written):"]
        for prim, (count, src) in sorted(tr.unmapped.items()):
            where = f"{src['file']}:{src['line']}: {src.get('code', '')}" if src else "(no source line)"
            lines.append(f"  {prim}: {count}x, first at {where}")
        raise UserError("\n".join(lines))

    outs = [get(v) for v in jaxpr.outvars]
    tr.env = env
    out_vals = []
    for v in outs:
        x = tr.val(v) if not _is_literal(v) else None
        if x is None or x.const is not None or x.name == "?":
            raise UserError(f"{func}: loss_fn returns a constant, which meshsim cannot run")
        out_vals.append(x)
    loss = out_vals[0]
    any_grad = any(i.get("requires_grad") for i in inputs)
    region_unchecked = any(op["op"] == "local_map" and op.get("check_variance") is False for op in program)
    if loss.shape == () and any_grad and region_unchecked:
        raise UserError(f"{func}: a shard_map with check_vma=False whose result is differentiated: JAX's "
                        "transpose then psums each input's cotangent over the axes its in_specs leave out and "
                        "divides each output's by the axes its out_specs leave out (jax/_src/shard_map.py, "
                        "_shard_map_transpose), which a meshsim local_map with check_variance false does not; "
                        "import it with check_vma=True")
    if loss.name in [i["name"] for i in inputs]:
        raise UserError(f"{func}: loss_fn returns one of its arguments unchanged")
    made = {n for o in program for n in (o["out"] if isinstance(o["out"], list) else [o["out"]])}
    if loss.name not in made:
        raise RuntimeError(f"the loss value {loss.name} is made by no op")

    doc = {"format": "meshsim.scenario/1",
           "name": _clean(os.path.splitext(os.path.basename(out))[0]) if out else func,
           "imported": {"system": "jax", "version": jax.__version__, "file": display_file or common.display_path(file),
                        "function": func, "mesh": mesh_arg.text()},
           "mesh": {"axes": axes, "shape": list(mesh_arg.shape)}}
    if float_dtypes == {"float32"}:
        doc["options"] = {"dtype": "float32"}
    doc["inputs"] = inputs
    doc["program"] = program
    if with_source:
        _input_sources(inputs, program)
    if loss.shape == () and any_grad:
        doc["backward"] = loss.name
        recorded = backward_collectives(jax, loss_fn, args, argnums, mesh, jaxpr, axes, file, func)
        # Only the shard_maps' collectives are in a jaxpr: where the code around them works on
        # sharded values, XLA's own (which no jaxpr shows) would be missing from the count.
        if not global_ops_communicate(eqns):
            doc["imported"]["backward_collectives"] = recorded
    self_check(jax, doc, loss.name, tr.out_ndims, loss_fn, args, argnums if len(argnums) > 1 else argnums[0], mesh,
               flat_args, axes, sizes)
    if not with_source:
        doc.pop("imported")
    return doc


def _input_sources(inputs: list[dict], program: list[dict]) -> None:
    """An input without a source of its own (passed straight to a shard_map, whose call has no
    user frame under jit) gets the source of its first use in a body, else of the region."""
    first: dict[str, dict] = {}

    def walk(ops):
        for op in ops:
            walk(op.get("body", []))  # where the body reads an argument, before the region's own line
            for a in op.get("args", []):
                if "source" in op and a not in first:
                    first[a] = op["source"]
    walk(program)
    for i in inputs:
        if "source" not in i and i["name"] in first:
            i["source"] = first[i["name"]]


def _local_map(tr: Translator, flat: Flattener, e: Eqn, env: dict, axes: list[str], sources: Sources,
               with_source: bool, needed: set) -> dict:
    """One shard_map equation as a local_map op (body and reference), returning the results
    something reads (`needed`: ids of the variables read after it; a grad's transposed region also
    returns zeros for the arguments not differentiated)."""
    p = e.params
    inner = p["jaxpr"]
    jx = inner.jaxpr if hasattr(inner, "jaxpr") else inner
    consts = inner.consts if hasattr(inner, "jaxpr") else ()
    if set(p["mesh"].axis_names) != set(axes) or any(tr.sizes[a] != s for a, s in
                                                        zip(p["mesh"].axis_names, p["mesh"].axis_sizes)):
        raise UserError(f"shard_map over mesh {dict(zip(p['mesh'].axis_names, p['mesh'].axis_sizes))}, not the "
                        f"--mesh {tr.sizes} the importer built (use the mesh FUNC is given)")
    manual = set(p.get("newly_manual_axes") or p.get("manual_axes") or axes)
    if manual != set(axes):
        raise UserError(f"shard_map manual over {sorted(manual)} only (axis_names=...): the importer reads regions "
                        f"manual over every mesh axis ({', '.join(axes)})")
    args = []
    tr.env = env
    for v in e.invars:
        x = tr.val(v)
        if x is None or x.const is not None:
            raise UserError("a constant passed to shard_map: pass arrays (inputs of loss_fn or values computed from them)")
        args.append(x)
    in_pl = [spec_placements(s, len(x.shape), axes, f"shard_map in_specs[{i}]") for i, (s, x) in
             enumerate(zip(p["in_specs"], args))]
    keep = [k for k, o in enumerate(e.outvars) if id(o) in needed]
    out_pl = [spec_placements(p["out_specs"][k], len(e.outvars[k].aval.shape), axes, f"shard_map out_specs[{k}]")
              for k in keep]
    jx_outs = [jx.outvars[k] for k in keep]
    all_body, bget = flat.run(jx, consts)
    body_eqns = live(all_body, [bget(v) for v in jx_outs])
    src = sources.source(e.source_info) if with_source else None
    fname, where = _func_src(jx)
    if src is None and with_source and where:
        src = common.source_of(where[0], where[1])
        if sources.display and os.path.realpath(where[0]) == sources.user:
            src["file"] = sources.display

    def local_shape(x: Val, pl: list[str]) -> tuple:
        shape = list(x.gshape)
        for a, t in zip(axes, pl):
            if t.startswith("S("):
                d = int(t[2:-1])
                if shape[d] % tr.sizes[a]:
                    raise UserError(f"shard_map: dim {d} of extent {shape[d]} does not split evenly over {a}")
                shape[d] //= tr.sizes[a]
        return tuple(shape)

    def bind_args(benv):
        for iv, x, pl in zip(jx.invars, args, in_pl):
            benv[id(iv)] = Val(name=x.name, shape=local_shape(x, pl), gshape=x.gshape, dtype=x.dtype)

    benv: dict[int, Val] = {}
    bind_args(benv)
    body = tr.region(body_eqns, benv, "body")
    body_rets = [tr.val(bget(v)) for v in jx_outs]
    renv: dict[int, Val] = {}
    bind_args(renv)
    used_before = set(tr.used)
    reference = tr.region(body_eqns, renv, "global", names=tr.names_by_eqn)
    tr.used = used_before | {o.get("out") for o in reference}
    ref_rets = [tr.val(bget(v)) for v in jx_outs]
    returns = []
    for k, b, r in zip(keep, body_rets, ref_rets):
        if b is None or b.const is not None or r is None or r.const is not None:
            raise UserError(f"shard_map result {k} is a constant, which a local_map cannot return (is loss_fn "
                            "jax.grad of the loss? FUNC returns the loss itself, and meshsim differentiates it: the "
                            "jaxpr of a jax.grad passes per-rank residuals between two shard_maps)")
        returns.append(b.name)
        if r.name != b.name:
            # the reference must define what the body returns: the global value under the body's name
            reference.append({"out": b.name, "op": "view", "args": [r.name], "shape": list(r.gshape)})
    outs = []
    for k, b in zip(keep, body_rets):
        o = e.outvars[k]
        name = tr.fresh((fname or "shard_map") + (f"_{k}" if len(e.outvars) > 1 else ""))
        outs.append(name)
        env[id(o)] = Val(name=name, shape=tuple(o.aval.shape), gshape=tuple(o.aval.shape), dtype=str(o.aval.dtype))
    tr.out_ndims[outs[0]] = [len(e.outvars[k].aval.shape) for k in keep]
    op = {"out": outs[0] if len(outs) == 1 else outs, "op": "local_map", "args": [x.name for x in args],
          "in_placements": in_pl, "out_placements": out_pl}
    if not p.get("check_vma", True):
        op["check_variance"] = False
    op.update({"body": body, "returns": returns, "reference": reference})
    if src:
        op["source"] = src
    return op


COLLECTIVE_OPS = {"psum": "all_reduce", "psum_invariant": "all_reduce", "unreduced_psum": "all_reduce",
                  "pmax": "all_reduce", "pmin": "all_reduce",
                  "all_gather": "all_gather", "all_gather_reduced": "all_gather", "all_gather_invariant": "all_gather",
                  "reduce_scatter": "reduce_scatter", "unreduced_reduce_scatter": "reduce_scatter",
                  "all_to_all": "all_to_all", "ppermute": "ppermute"}


def global_ops_communicate(eqns: list[Eqn]) -> bool:
    """Whether an equation outside the shard_maps reads or makes a value that is not replicated:
    XLA's partitioner then communicates for it (a mean over a sharded dim, a reshard), with no
    collective in the jaxpr to count."""
    for e in eqns:
        if e.prim == "shard_map":
            continue
        for v in list(e.invars) + list(e.outvars):
            spec = getattr(getattr(getattr(v, "aval", None), "sharding", None), "spec", None)
            if spec is None or _is_literal(v):
                continue
            if any(p is not None for p in getattr(spec, "partitions", spec)) or getattr(spec, "unreduced", None) \
                    or getattr(spec, "reduced", None):
                return True
    return False


def count_collectives(jaxpr, counts: dict | None = None) -> dict:
    """(meshsim collective, axis) -> how many a jaxpr holds, its inner jaxprs included (a
    collective over two axes counts once on each)."""
    counts = {} if counts is None else counts
    for e in jaxpr.eqns:
        op = COLLECTIVE_OPS.get(e.primitive.name)
        if op:
            names = e.params.get("axes", e.params.get("axis_name"))
            for a in names if isinstance(names, (tuple, list)) else [names]:
                counts[(op, str(a))] = counts.get((op, str(a)), 0) + 1
        for v in e.params.values():
            for inner in v if isinstance(v, (tuple, list)) else [v]:
                j = getattr(inner, "jaxpr", inner)
                if hasattr(j, "eqns") and hasattr(j, "invars"):
                    count_collectives(j, counts)
    return counts


def backward_collectives(jax, loss_fn, args, argnums, mesh, forward_jaxpr, axes, file: str, func: str) -> list:
    """The collectives JAX's own backward runs: those of the jaxpr of `jax.grad(loss_fn,
    argnums)` less the forward's, per op and axis (recorded in `imported.backward_collectives`, for
    meshsim's run to compare with its own)."""
    try:
        with jax.set_mesh(mesh):
            grad = jax.make_jaxpr(jax.grad(loss_fn, argnums=argnums if len(argnums) > 1 else argnums[0]))(*args)
    except BaseException as e:  # noqa: BLE001 - JAX refusing to differentiate is the user's error
        raise UserError(f"jax.grad of {func}'s loss_fn raised: {_error_line(e, file)}") from None
    total, fwd = count_collectives(grad.jaxpr), count_collectives(forward_jaxpr)
    rows = [{"op": op, "axis": a, "count": n - fwd.get((op, a), 0)} for (op, a), n in total.items()
            if n > fwd.get((op, a), 0)]
    return sorted(rows, key=lambda r: (axes.index(r["axis"]) if r["axis"] in axes else len(axes), r["op"]))


# ---------------------------------------------------------------------------------------------
# The self-check: the scenario's program (its bodies, not its references) run by JAX itself on
# the same data as the user's loss_fn must give the same result, else the importer mistranslated
# (exit 7, nothing written). The references are the intent and may differ from what JAX computes:
# that difference is what meshsim reports as a bug.


def _pspec(P, placements: list[str], ndim: int, axes: list[str]):
    parts: list[list[str]] = [[] for _ in range(ndim)]
    reduced, unreduced = set(), set()
    for a, t in zip(axes, placements):
        if t.startswith("S("):
            parts[int(t[2:-1]) % max(ndim, 1)].append(a)
        elif t == "Rd":
            reduced.add(a)
        elif t.startswith("P("):
            unreduced.add(a)
    entries = [None if not p else p[0] if len(p) == 1 else tuple(p) for p in parts]
    return P(*entries, reduced=frozenset(reduced), unreduced=frozenset(unreduced))


def _run_ops(jax, ops: list[dict], env: dict, sizes: dict, body: bool) -> None:
    """meshsim ops (those the importer writes) as JAX calls, into `env`."""
    jnp, lax = jax.numpy, jax.lax
    for op in ops:
        name, xs = op["op"], [env[a] for a in op.get("args", [])]
        x = xs[0] if xs else None
        other = xs[1] if len(xs) > 1 else op.get("value")
        dim = op.get("dim")
        if name in ("add", "sub", "mul", "div"):
            y = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide}[name](x, other)
        elif name in ("neg", "exp", "log", "tanh", "sin", "cos", "sqrt", "abs"):
            y = getattr(jnp, {"neg": "negative"}.get(name, name))(x)
        elif name in ("sigmoid", "relu"):
            y = getattr(jax.nn, name)(x)
        elif name == "rsqrt":
            y = lax.rsqrt(x)
        elif name == "pow":
            y = x ** op["exponent"]
        elif name in ("mm", "matmul"):
            y = jnp.matmul(x, xs[1])
        elif name == "transpose":
            y = jnp.swapaxes(x, op["dim0"], op["dim1"])
        elif name == "permute":
            y = jnp.transpose(x, op["dims"])
        elif name in ("reshape", "view"):
            y = x.reshape(op["shape"])
        elif name == "squeeze":
            y = jnp.squeeze(x, dim)
        elif name == "unsqueeze":
            y = jnp.expand_dims(x, dim)
        elif name == "expand":
            lead = len(op["shape"]) - x.ndim
            y = jnp.broadcast_to(x, tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(op["shape"])))
        elif name == "cat":
            y = jnp.concatenate(xs, axis=dim)
        elif name == "narrow":
            y = lax.slice_in_dim(x, op["start"], op["start"] + op["length"], axis=dim)
        elif name in ("sum", "amax", "amin"):
            y = {"sum": jnp.sum, "amax": jnp.max, "amin": jnp.min}[name](x, axis=None if dim is None else tuple(dim))
        elif name == "redistribute":
            y = jax.reshard(x, _pspec(jax.sharding.PartitionSpec, op["placements"], x.ndim, list(sizes)))
        elif body and name == "all_reduce":
            y = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}[op["reduce"]](x, op["axis"])
        elif body and name == "mark_varying":
            y = lax.pcast(x, op["axis"], to="varying")
        elif body and name == "all_gather":
            y = lax.all_gather(x, op["axis"], axis=dim, tiled=True, to=op["to"])
        elif body and name == "reduce_scatter":
            y = lax.psum_scatter(x, op["axis"], scatter_dimension=dim, tiled=True)
        elif body and name == "all_to_all":
            y = lax.all_to_all(x, op["axis"], op["split_dim"], op["concat_dim"], tiled=True)
        else:
            raise RuntimeError(f"self-check: no JAX counterpart written for op {name!r}")
        env[op["out"]] = y


def self_check(jax, doc: dict, result: str, out_ndims: dict, loss_fn, args, argnums, mesh, flat_args,
               axes: list[str], sizes: dict) -> None:
    """Runs the user's loss_fn and the scenario's program (bodies as shard_maps) on the same
    small integers; RuntimeError (an importer bug) where the (first) results differ, or with a
    backward the gradients. `result`: the program value of loss_fn's first result; `out_ndims`:
    each local_map's results' ranks."""
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    rng = np.random.default_rng(0)
    values = []
    for leaf, entry in zip(flat_args, doc["inputs"]):
        v = rng.integers(-3, 4, size=tuple(entry["shape"])).astype(np.dtype(leaf.dtype))
        sharding = getattr(leaf, "sharding", None)
        values.append(jax.device_put(v, sharding) if isinstance(sharding, NamedSharding) else jax.numpy.asarray(v))
    treedef = jax.tree_util.tree_structure(args)
    with jax.set_mesh(mesh):
        expected = jax.jit(loss_fn)(*jax.tree_util.tree_unflatten(treedef, values))
        expected = np.asarray(jax.tree_util.tree_leaves(expected)[0], dtype=np.float64)

        def program(*xs):
            env = {i["name"]: x for i, x in zip(doc["inputs"], xs)}
            for op in doc["program"]:
                if op["op"] != "local_map":
                    _run_ops(jax, [op], env, sizes, body=False)
                    continue
                outs = op["out"] if isinstance(op["out"], list) else [op["out"]]
                in_specs = tuple(_pspec(P, pl, env[a].ndim, axes) for a, pl in zip(op["args"], op["in_placements"]))

                def body(*locals_, op=op):
                    benv = dict(zip(op["args"], locals_))
                    _run_ops(jax, op["body"], benv, sizes, body=True)
                    return tuple(benv[r] for r in op["returns"])
                out_specs = tuple(_pspec(P, pl, nd, axes) for pl, nd in zip(op["out_placements"], out_ndims[outs[0]]))
                res = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                    check_vma=op.get("check_variance", True))(*[env[a] for a in op["args"]])
                env.update(zip(outs, res))
            return env[result]
        got = np.asarray(jax.jit(program)(*values), dtype=np.float64)
        pairs = [("the result", got, expected)]
        if doc.get("backward"):
            # the gradients too, as JAX takes them of either: the translation must keep them
            diff = [k for k, entry in enumerate(doc["inputs"]) if entry.get("requires_grad")]

            def of_diff(*ds):
                xs = list(values)
                for k, d in zip(diff, ds):
                    xs[k] = d
                return program(*xs)
            def replicated(fn):  # the gradient of an Rd input is unreduced: its value is the sum
                return jax.jit(lambda *a: [jax.reshard(g, P()) for g in jax.tree_util.tree_leaves(fn(*a))])
            mine = replicated(jax.grad(of_diff, argnums=tuple(range(len(diff)))))(*[values[k] for k in diff])
            theirs = replicated(jax.grad(loss_fn, argnums=argnums))(*jax.tree_util.tree_unflatten(treedef, values))
            if len(theirs) != len(diff):
                raise RuntimeError(f"self-check: {len(theirs)} gradients of loss_fn for {len(diff)} inputs with grad")
            pairs += [(f"the gradient of {doc['inputs'][k]['name']}", np.asarray(m, dtype=np.float64),
                       np.asarray(t, dtype=np.float64)) for k, m, t in zip(diff, mine, theirs)]
    tol = 1e-4 if doc.get("options", {}).get("dtype") == "float32" else 1e-9
    for what, a, b in pairs:
        scale = max(1.0, float(np.abs(b).max(initial=0)))
        if a.shape != b.shape or not np.allclose(a, b, rtol=tol, atol=tol * scale):
            raise RuntimeError(f"self-check: {what} of the imported program is {a.ravel()[:4]} where the user's "
                               f"loss_fn gives {b.ravel()[:4]} on the same data (a translation the importer got wrong)")


def _error_line(e: BaseException, file: str) -> str:
    """The error in one line at its last frame in the user's file; JAX raises its type errors
    from inside jax, called by the importer's make_jaxpr, so without such a frame the file is
    named alone (JAX's message names the function)."""
    import traceback
    target = os.path.realpath(file)
    if any(os.path.realpath(f.filename) == target for f in traceback.extract_tb(e.__traceback__)):
        return common.last_frame(e, file)
    return f"{common.display_path(file)}: {type(e).__name__}: {' '.join(str(e).split()) or '(no message)'}"


def _func_src(jx) -> tuple[str | None, tuple[str, int] | None]:
    """The name of the function a shard_map body was traced from, and its file and line (from
    the jaxpr's debug info: `local_loss at /path/model.py:29`)."""
    info = getattr(getattr(jx, "debug_info", None), "func_src_info", None) or ""
    m = re.match(r"(\S+) at (.+):(\d+)$", info)
    if not m:
        return None, None
    name = m.group(1).split(".")[-1]
    name = None if name.startswith("<") else name
    return name, (m.group(2), int(m.group(3)))


def markdown_table() -> str:
    """PRIMITIVES as the Markdown table of docs/import.md (generated, not kept by hand)."""
    rows = ["| jaxpr primitive | meshsim op | what is translated |", "|---|---|---|"]
    bar = "\\|"
    for prim, (op, _how, what) in sorted(PRIMITIVES.items()):
        ops = op if op.startswith("(") else f" {bar} ".join(f"`{o}`" for o in op.split(" | "))
        rows.append(f"| `{prim}` | {ops} | {what.replace('|', bar)} |")
    rows.append(f"| {', '.join(f'`{p}`' for p in sorted(INLINED))} | (inlined) | "
                "their inner jaxpr, equation by equation |")
    rows.append("| `shard_map` | `local_map` | in_specs, out_specs, check_vma; its body by this table |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    if argv is None and sys.argv[1:] == ["--markdown-table"]:
        sys.stdout.write(markdown_table())
        return 0
    ap = argparse.ArgumentParser(description="meshsim import jax: a jax.shard_map program as a meshsim scenario "
                                 "(--markdown-table alone: the primitive table)")
    ap.add_argument("--file", required=True)
    ap.add_argument("--func", required=True)
    ap.add_argument("--mesh", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--display-file", default=None, help="the file's name as the scenario shows it")
    ap.add_argument("--no-source", action="store_true",
                    help="leave out `source` and `imported` (for a meshsim that does not read them)")
    a = ap.parse_args(argv)

    def run():
        mesh = common.parse_mesh(a.mesh)
        doc = import_jax(a.file, a.func, mesh, a.out, not a.no_source, a.display_file)
        common.write_json_atomic(a.out, doc)

    return common.run_main(run)


if __name__ == "__main__":
    sys.exit(main())

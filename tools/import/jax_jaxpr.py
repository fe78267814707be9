"""meshsim import jax: a jaxpr's values and equations, its call-like primitives inlined (the
Flattener). Part of jax_importer.py (its docstring tells the whole); standard library only."""

from __future__ import annotations


# Call-like primitives whose inner jaxpr is inlined (their own parameters hold it).
INLINED = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
           "custom_jvp_call": "call_jaxpr", "remat": "jaxpr", "remat2": "jaxpr", "checkpoint": "jaxpr"}


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

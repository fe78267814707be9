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
  shard_map's jaxpr translated equation by equation by the table PRIMITIVES (jax_translate.py;
  collectives included, and the `pvary`s JAX inserted itself as `mark_varying`), and whose
  `reference` is the same equations on global arrays with the collectives and casts read as the
  identity (the global meaning of a shard_map body whose collectives complete its local pieces);
  the equations outside the shard_maps (the loss's mean, say) as program ops;
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

The modules (run as a script, this file's directory is on sys.path): this one, the command line,
the import (loading FUNC, the inputs, each shard_map as a local_map), what JAX's backward
communicates, the self-check and `--markdown-table`; jax_translate.py, the table and the
Translator (equations to body, reference and program ops); jax_jaxpr.py, the values and equations
with call-like primitives inlined; jax_names.py, source lines and names.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import UserError  # noqa: E402
from jax_jaxpr import INLINED, Eqn, Flattener, Val, _is_literal  # noqa: E402
from jax_names import Sources, _arg_names, _clean, _func_src, _input_sources  # noqa: E402
from jax_translate import PRIMITIVES, Translator, _dtype, live, spec_placements  # noqa: E402


# ---------------------------------------------------------------------------------------------
# The import


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

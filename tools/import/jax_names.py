"""meshsim import jax: sources and names (where the user's code made an equation, the name an
assignment on its line binds, the inputs' names). Part of jax_importer.py (its docstring tells the
whole); standard library only until a Sources is made."""

from __future__ import annotations

import inspect
import os
import re

import common

# The importer's own files and common.py: a frame there is never the user's code.
_HERE = os.path.dirname(os.path.abspath(__file__))
ME = {os.path.realpath(os.path.join(_HERE, f)) for f in
      ("jax_importer.py", "jax_translate.py", "jax_jaxpr.py", "jax_names.py")}
COMMON = os.path.realpath(common.__file__)



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
            frames = [f for f in self.siu.user_frames(tb) if os.path.realpath(f.file_name) not in ME | {COMMON}]
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

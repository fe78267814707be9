"""meshsim import pytorch: the scenario's values (Val, the parts of a local value's dims),
placements and dtypes as the scenario writes them, and the importer's exceptions. Part of
pytorch_importer.py (its docstring tells the whole)."""

from __future__ import annotations

import common
import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard


def placement_text(p) -> str:
    if isinstance(p, _StridedShard):
        return f"SS({p.dim},{p.split_factor})"
    if isinstance(p, Shard):
        return f"S({p.dim})"
    if isinstance(p, Partial):
        return f"P({p.reduce_op})"
    if isinstance(p, Replicate):
        return "R"
    return type(p).__name__


def dtype_text(dt) -> str:
    if dt in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        return "int64"
    if dt == torch.bool:
        return "bool"
    return "float"


class Unmapped(Exception):
    pass


class ImporterBug(Exception):
    """An exception of the recorder's own code (exit 7 with its traceback), never the user's."""


def guarded(method):
    """The recorder's own code: what it raises is an importer bug, kept apart from the user's errors."""
    def run(*a, **k):
        try:
            return method(*a, **k)
        except (ImporterBug, common.UserError):
            raise
        except UserSide as e:
            raise e.original.with_traceback(e.original.__traceback__) from None
        except Exception as e:  # noqa: BLE001
            raise ImporterBug(f"{type(e).__name__}: {e}") from e
    return run


class UserSide(Exception):
    """PyTorch's own exception inside a wrapped call: the user's, passed on as it is."""

    def __init__(self, original):
        super().__init__(str(original))
        self.original = original


def call_user(fn, *a, **k):
    try:
        return fn(*a, **k)
    except Exception as e:  # noqa: BLE001
        raise UserSide(e) from None


def bug_in(e: BaseException):
    while e is not None:
        if isinstance(e, ImporterBug):
            return e
        e = e.__cause__ or e.__context__
    return None


class Val:
    """A scenario value: `dt` (a DTensor of the scenario's mesh) or `local` (local code)."""

    def __init__(self, name, kind, bdim=None, dpart=None):
        self.name, self.kind, self.bdim, self.dpart = name, kind, bdim, dpart
        self.local = None  # its to_local value, once made
        self.input = None  # its input record, for inputs
        self.dtype = "float"  # its element type in the scenario
        # local code: per dim, its parts [(local extent, factor)], outer first; the global extent the
        # oracle sees is the product of extent * factor (a factor: the ranks a shard splits it over)
        self.comps = None
        self.creation = None  # the program records that made it from a creation op alone (a constant)
        self.lshape = None  # its shape as PyTorch has it, where no tensor of the program holds it


def comps_of_shape(shape, factors=None):
    factors = factors or [1] * len(shape)
    return [[(int(e), int(f))] for e, f in zip(shape, factors)]


def factor(dim_comps):
    f = 1
    for _, x in dim_comps:
        f *= x
    return f


def extent(dim_comps):
    e = 1
    for x, _ in dim_comps:
        e *= x
    return e


def view_comps(comps, out_shape):
    """The parts of a local view's result dims, or None when a sharded part would be cut across."""
    parts = [c for d in comps for c in d if c[0] != 1 or c[1] != 1]
    out = []
    for n in out_shape:
        mine, got = [], 1
        if n == 1 and parts and parts[0][1] != 1:  # a shard of one piece per rank: its dim is 1 here
            e, f = parts.pop(0)
            mine.append((1, f))
            if e != 1:
                parts.insert(0, (e, 1))
        while got < n:
            if not parts:
                return None
            e, f = parts.pop(0)
            if got * e <= n:
                mine.append((e, f))
                got *= e
            elif n % got == 0 and e % (n // got) == 0:
                need = n // got
                mine.append((need, f))  # the outer part keeps the shard factor
                parts.insert(0, (e // need, 1))
                got *= need
            else:
                return None
        out.append(mine or [(1, 1)])
    if parts:
        return None
    return out

"""What meshsim's importers share (tools/import: pytorch_importer.py, jax_importer.py).

An importer runs under its system's virtual environment (tools/crosscheck's, under the build
directory) or the user's own interpreter (`--python`), as

    python IMPORTER.py --file FILE.py --func FUNC --mesh dp=2,tp=2 --out OUT.json [--display-file NAME]

and writes one meshsim scenario (`meshsim.scenario/1`, docs/scenario-format.md, "Imported
programs"). Exit codes (docs/import.md):

- 0: written;
- 2: the user's program is unusable (does not import, the function raises, the plan is refused,
  the mesh does not fit, an op has no row in the table): one line per problem on stderr, the
  Python error's last frame in one line; nothing written;
- 7: the importer itself failed (a bug of meshsim import): its traceback on stderr; nothing
  written. Never a wrong scenario.

Only Python's standard library here: both environments load it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass

EXIT_OK = 0
EXIT_USER = 2
EXIT_IMPORTER_BUG = 7


class UserError(Exception):
    """The user's program or command is unusable: exit 2 with this one-line message."""


@dataclass
class MeshArg:
    axes: list[str]
    shape: list[int]

    @property
    def world(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def text(self) -> str:
        return ",".join(f"{a}={s}" for a, s in zip(self.axes, self.shape))


def parse_mesh(text: str) -> MeshArg:
    """`dp=2,tp=2` -> axes [dp, tp], shape [2, 2]; UserError naming --mesh otherwise."""
    axes, shape = [], []
    for part in (text or "").split(","):
        name, eq, size = part.strip().partition("=")
        name = name.strip()
        if not eq or not name.isidentifier() or not size.strip().isdigit() or int(size) < 1:
            raise UserError(f"--mesh: expected AXIS=SIZE[,AXIS=SIZE...] (e.g. dp=2,tp=2), got {text!r}")
        if name in axes:
            raise UserError(f"--mesh: axis {name!r} named twice in {text!r}")
        axes.append(name)
        shape.append(int(size))
    return MeshArg(axes, shape)


def last_frame(exc: BaseException, prefer_file: str | None = None) -> str:
    """The error in one line: `FILE:LINE: in FUNC: Type: message`, at the last frame in
    `prefer_file` (the user's file) when the traceback passes through it, else the last frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    frame = None
    if prefer_file:
        target = os.path.realpath(prefer_file)
        mine = [f for f in frames if os.path.realpath(f.filename) == target]
        frame = mine[-1] if mine else None
    if frame is None and frames:
        frame = frames[-1]
    message = " ".join(str(exc).split()) or "(no message)"
    where = f"{display_path(frame.filename)}:{frame.lineno}: in {frame.name}: " if frame else ""
    return f"{where}{type(exc).__name__}: {message}"


def display_path(path: str) -> str:
    """A file's path as scenarios and messages show it: relative to the working directory when it
    is under it, else as given."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def load_user_function(file: str, func: str):
    """The function `func` of the Python file `file`, imported as a module of its own; UserError
    (with the last frame) when the file does not import or has no such function."""
    if not os.path.isfile(file):
        raise UserError(f"{file}: no such file")
    name = "meshsim_user_" + os.path.splitext(os.path.basename(file))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise UserError(f"{file}: not a Python file that can be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(file)))
    try:
        spec.loader.exec_module(module)
    except BaseException as e:  # noqa: BLE001 - the user's module may raise anything, SystemExit included
        raise UserError(f"{file}: does not import: {last_frame(e, file)}") from None
    fn = getattr(module, func, None)
    if not callable(fn):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                        and getattr(v, "__module__", None) == name)
        raise UserError(f"{file}: no function {func!r} (functions defined there: {', '.join(public) or 'none'})")
    return module, fn


def write_json_atomic(path: str, doc: dict) -> None:
    """Writes `doc` through a temporary file in the same directory and a rename."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".meshsim-import-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def source_of(file: str, line: int, module: str | None = None) -> dict:
    """A scenario's `source` object: where the user's code made a value."""
    out: dict = {}
    if module:
        out["module"] = module
    out["file"] = display_path(file)
    out["line"] = int(line)
    try:
        with open(file) as f:
            text = f.read().splitlines()
        if 0 < line <= len(text) and text[line - 1].strip():
            out["code"] = text[line - 1].strip()[:160]
    except OSError:
        pass
    return out


def user_frame(file: str, skip: int = 1):
    """The innermost frame of the running stack that is in the user's `file` (its line is where
    the user's code made the op being recorded), or None."""
    target = os.path.realpath(file)
    f = sys._getframe(skip)
    while f is not None:
        if os.path.realpath(f.f_code.co_filename) == target:
            return f
        f = f.f_back
    return None


def run_main(run) -> int:
    """Runs `run()` (which writes the scenario) and maps what it raises to the exit codes above."""
    try:
        run()
        return EXIT_OK
    except UserError as e:
        for line in str(e).splitlines():
            print(f"meshsim import: {line}", file=sys.stderr)
        return EXIT_USER
    except BaseException:  # noqa: BLE001 - an importer bug: its traceback, its own exit code
        print("meshsim import: internal error of the importer (a bug of meshsim import, not of your "
              "program; nothing was written):", file=sys.stderr)
        traceback.print_exc()
        return EXIT_IMPORTER_BUG

"""The kit's reference is not a submission: a graded submission's use of the kit's own code, caught in the child.

Grading believes a submission's code is the student's.  A submission that
imports ``pytest_cbatch.reference`` (or any module of the kit but the bare
``pytest_cbatch`` package, which defines nothing) would be graded on the
kit's code, so:

* Containment: in bubblewrap the reference's folder is not in the sandbox at
  all (the child never needs it; ``bwrap.confine``'s ``hidden``).
* Detection: the child installs ``install``'s audit hook (``sys.addaudithook``,
  which no code of the process can remove) before it imports the submission.
  It judges an ``import`` of a kit module, an ``open`` of a file under the
  kit's folders, a ``compile`` or ``exec`` of code named after a kit file,
  and a function given such code, when the innermost frame on the stack that
  belongs to the submission or the kit is the submission's (its files, and
  code it compiled itself).  So computed names, ``importlib``,
  ``__import__``, ``runpy`` and reading a kit file to ``exec`` it are caught
  alike, and the kit's own imports (a lifecycle search, say) are not.  Each
  use is written to the parent at once as a ``{"kit": {...}}`` line naming the
  submission's file and line; when ``refuse`` is set, the hook also raises
  (``ImportError``, ``PermissionError``), so the use fails in the child too.

Detection runs inside the process it watches: code set on forging it can
still hide from it (by ctypes, say).  What no code of the submission can
undo is the containment, and the parent's refusal of any use it was told of.

Standard library only: the child loads this file by path before the kit.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["ALLOWED_MODULES", "KitGuard", "describe_use", "install"]

ALLOWED_MODULES = ("pytest_cbatch",)  # the bare package: a docstring, nothing a scheduler could use
_KIT = "pytest_cbatch"
_EVENTS = frozenset({"import", "open", "compile", "exec", "object.__setattr__"})


@dataclass
class KitGuard:
    """The parent's side: whether uses of the kit are refused, and each use the child reported (``found``).

    ``refuse``: the child raises on a use and bubblewrap leaves the reference out; else uses are only
    reported (the rubric's ``kit_imports = "allow"``); either way each one is in ``found``.
    """

    refuse: bool = True
    found: list[dict[str, Any]] = field(default_factory=list)

    def config(self, kit_roots: list[str]) -> dict[str, Any]:
        """What the child's ``install`` is given."""
        return {"refuse": self.refuse, "kit_roots": kit_roots, "allowed": list(ALLOWED_MODULES)}

    def take(self, record: Any) -> None:
        """Keep one ``{"kit": record}`` line of the child's (bounded: a few are enough to say what it did)."""
        if isinstance(record, dict) and len(self.found) < 20:
            self.found.append({k: str(record.get(k, ""))[:300] for k in ("use", "file", "line")})

    def uses(self) -> list[str]:
        """Each distinct use, as one line for a person."""
        return list(dict.fromkeys(describe_use(r) for r in self.found))


def describe_use(record: dict[str, Any]) -> str:
    return f"{record.get('file', '?')} line {record.get('line', '?')} {record.get('use', '')}"


def install(config: dict[str, Any], submission_roots: list[str], report: Callable[[dict[str, Any]], None]) -> None:
    """Install the audit hook (see the module docstring); ``report(record)`` sends one use to the parent."""
    kit_roots = tuple(_norm(p) + os.sep for p in config["kit_roots"])
    mine = [_norm(p) + os.sep for p in submission_roots]
    compiled: set[str] = set()          # file names of code the submission compiled itself
    allowed = frozenset(config["allowed"])
    allowed_files = _module_files(allowed, config["kit_roots"])
    refuse = bool(config["refuse"])
    busy: list[bool] = []

    def kit_file(path: str) -> str | None:
        """``path`` relative to the kit when it is a kit file no allowed module owns, else None."""
        full = _norm(path)
        if not full.startswith(kit_roots) or full in allowed_files:
            return None
        return full

    def caller(depth: int = 3) -> tuple[str, int] | None:
        """The submission's innermost frame, if it is innermost of the submission's and the kit's frames."""
        frame = sys._getframe(depth)  # past this function, ``judge`` and ``hook``: the code that raised the event
        while frame is not None:
            name = frame.f_code.co_filename
            real = os.path.isabs(name) and _norm(name)  # not "<frozen ...>", which is no file of anyone's
            if name in compiled or (real and real.startswith(tuple(mine))):
                return _relative(name, mine), frame.f_lineno
            if real and real.startswith(kit_roots):
                return None
            frame = frame.f_back
        return None

    def found(use: str, where: tuple[str, int], error: type[Exception]) -> None:
        record = {"use": use, "file": where[0], "line": where[1]}
        report(record)
        if refuse:
            raise error(f"{describe_use(record)}: a graded submission may not use the kit's code (the kit is what "
                        f"judges it; the reference is not a submission)")

    class Watch:
        """First on ``sys.meta_path``: sees the imports the ``import`` event misses (``importlib.import_module``
        runs the import system in Python, which raises no such event)."""

        @staticmethod
        def find_spec(name: str, path: Any = None, target: Any = None) -> None:
            if not busy:
                busy.append(True)
                try:
                    judge("import", (name,), depth=4)
                finally:
                    busy.pop()

    watch = Watch()
    removed: list[bool] = []

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event not in _EVENTS or busy:
            return
        busy.append(True)
        try:
            if not removed and watch not in sys.meta_path:  # taken out: say so at the next file opened or import
                removed.append(True)
                where = caller(2)
                found("removed the kit's import watch from sys.meta_path", where or ("?", 0), ImportError)
            judge(event, args)
        finally:
            busy.pop()

    def judge(event: str, args: tuple[Any, ...], depth: int = 3) -> None:
        if event == "import":
            name = args[0]
            if isinstance(name, str) and (name == _KIT or name.startswith(_KIT + ".")) and name not in allowed:
                where = caller(depth)
                if where is not None:
                    found(f"imports {name}", where, ImportError)
        elif event == "open":
            path = args[0]
            if isinstance(path, (str, bytes)) and kit_file(os.fsdecode(path)) is not None:
                where = caller()
                if where is not None:
                    found(f"reads the kit's file {_relative(os.fsdecode(path), list(kit_roots), True)}", where,
                          PermissionError)
        elif event == "compile":
            name = args[1] if len(args) > 1 else None
            where = caller() if isinstance(name, (str, bytes)) else None
            if where is not None:
                assert isinstance(name, (str, bytes))
                if kit_file(os.fsdecode(name)) is not None:
                    found(f"compiles code under the kit's file name {os.fsdecode(name)}", where, PermissionError)
                if len(compiled) < 10_000:  # bounded: a loop of exec() under fresh names must not grow it forever
                    compiled.add(os.fsdecode(name))
        elif event == "exec":
            code = args[0]
            name = getattr(code, "co_filename", None)
            if isinstance(name, str) and kit_file(name) is not None:
                where = caller()
                if where is not None:
                    found(f"runs code of the kit's file {_relative(name, list(kit_roots), True)}", where, PermissionError)
        elif event == "object.__setattr__" and len(args) > 2 and args[1] == "__code__":
            name = getattr(args[2], "co_filename", None)
            if isinstance(name, str) and kit_file(name) is not None:
                where = caller()
                if where is not None:
                    found(f"gives a function code of the kit's file {name}", where, PermissionError)

    sys.meta_path.insert(0, watch)  # type: ignore[arg-type]
    sys.addaudithook(hook)


def _norm(path: str) -> str:
    return os.path.normpath(os.path.abspath(path))


def _relative(path: str, roots: list[str], keep_root: bool = False) -> str:
    """``path`` relative to the first of ``roots`` (each ending in a separator) that holds it, or to that
    root's parent with ``keep_root`` (``reference/scheduler_sim.py``)."""
    full = _norm(path)
    for root in roots:
        if full.startswith(root):
            return full[len(os.path.dirname(root.rstrip(os.sep))) + 1:] if keep_root else full[len(root):]
    return path


def _module_files(modules: frozenset[str], kit_roots: list[str]) -> frozenset[str]:
    """The source and cached files of ``modules`` (packages of the kit), which importing them opens."""
    out: set[str] = set()
    for root in kit_roots:
        if os.path.basename(_norm(root)) != _KIT:
            continue
        for module in modules:
            folder = os.path.join(_norm(root), *module.split(".")[1:])
            out.add(os.path.join(folder, "__init__.py"))
            cache = os.path.join(folder, "__pycache__")
            try:
                out.update(os.path.join(cache, n) for n in os.listdir(cache) if n.startswith("__init__."))
            except OSError:
                pass
    return frozenset(out)

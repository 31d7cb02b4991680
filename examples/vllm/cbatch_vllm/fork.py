"""Running the adapter against an edited copy of vLLM's scheduler source, as a fork would change it.

An ``Edit`` is a named change of one vLLM module's source: text replacements, each of which
must match exactly once, so an edit that no longer applies (vLLM moved on) is refused instead of
silently testing the unedited engine.  Two ways to run an edited engine:

* in this process, ``load_module(module, source)`` compiles the edited source into a fresh
  module (optionally with ``assert`` statements stripped, as ``python -O`` does) without
  touching the imported vLLM, so a test can hand its ``Scheduler`` to the adapter;
* in a child process, ``write_overlay(dir, {module: source})`` lays the edited files out under
  ``dir`` and the environment variable ``CBATCH_VLLM_OVERLAY=dir`` makes the adapter load those
  modules from there instead of the installed vLLM (``install_overlay``, called by
  ``cbatch_vllm.engine`` before it imports vLLM).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Mapping, Sequence

__all__ = ["Edit", "EditNotApplied", "OVERLAY_ENV", "apply", "module_file", "load_module", "write_overlay",
           "install_overlay"]

OVERLAY_ENV = "CBATCH_VLLM_OVERLAY"


class EditNotApplied(ValueError):
    """An edit's text was not found exactly once in the source it was meant for."""


@dataclass(frozen=True)
class Edit:
    """One change a fork might make: ``replacements`` of (old, new) text in ``module``'s source.

    ``kind`` is "bug" (the gate must fail on it) or "policy" (a legitimate change: the gate must
    stay green); ``what`` says in a few words what the change does."""

    name: str
    kind: str
    what: str
    module: str
    replacements: Sequence[tuple[str, str]] = field(default_factory=tuple)


def apply(source: str, edit: Edit) -> str:
    """``source`` with ``edit``'s replacements made in order; EditNotApplied names the first
    replacement whose old text does not occur exactly once."""
    for k, (old, new) in enumerate(edit.replacements, 1):
        found = source.count(old)
        if found != 1:
            raise EditNotApplied(f"edit {edit.name!r}, replacement {k} of {len(edit.replacements)}: its text occurs "
                                 f"{found} times in {edit.module} (expected once): {old.strip()[:80]!r}")
        source = source.replace(old, new)
    return source


def module_file(module: str, engine_src: str | os.PathLike[str] | None = None) -> Path:
    """The source file of ``module`` (a dotted vllm module name) in the tree ``engine_src`` (the
    directory holding the ``vllm`` package), or in the installed vLLM when None."""
    relative = Path(*module.split(".")).with_suffix(".py")
    if engine_src is not None:
        return Path(engine_src) / relative
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"{module} is not installed here")
    return Path(spec.origin)


def load_module(module: str, source: str, *, strip_asserts: bool = False) -> ModuleType:
    """A fresh module built from ``source`` in place of ``module``'s, registered under a private
    name (the imported vLLM is untouched); ``strip_asserts`` compiles it as ``python -O`` would."""
    name = f"cbatch_vllm_fork.{module}"
    mod = ModuleType(name)
    mod.__file__ = f"<edited {module}>"
    mod.__package__ = module.rpartition(".")[0]
    sys.modules[name] = mod  # dataclasses and typing look their module up by name
    exec(compile(source, mod.__file__, "exec", optimize=1 if strip_asserts else 0), mod.__dict__)
    return mod


def write_overlay(directory: str | os.PathLike[str], sources: Mapping[str, str]) -> Path:
    """Lay out ``sources`` (dotted module name -> source) as files under ``directory``, for
    ``CBATCH_VLLM_OVERLAY``; returns the directory."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for module, source in sources.items():
        path = root / Path(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return root


class _OverlayFinder(importlib.abc.MetaPathFinder):
    """Finds the modules that have a file under the overlay root there, every other one as usual."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        candidate = self.root / Path(*fullname.split(".")).with_suffix(".py")
        if not candidate.is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, candidate)


def install_overlay(environ: Mapping[str, str] = os.environ) -> Path | None:
    """When ``CBATCH_VLLM_OVERLAY`` names a directory, load the vllm modules found under it from
    there from now on (it must run before they are first imported); returns that directory."""
    value = environ.get(OVERLAY_ENV)
    if not value:
        return None
    root = Path(value)
    if not root.is_dir():
        raise FileNotFoundError(f"{OVERLAY_ENV}={value}: no such directory")
    if not any(isinstance(f, _OverlayFinder) and f.root == root for f in sys.meta_path):
        sys.meta_path.insert(0, _OverlayFinder(root))
    return root

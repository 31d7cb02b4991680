"""The in-process kinds: Python files, ``module:attr`` objects, folders, entry-point names, modules.

Each builds a :class:`~pytest_cbatch.impls.PythonImplementation`.  Asked in this
order (their ``Kind.order``):

* ``file`` (300) — ``path/to/file.py`` as a module, ``path/to/file.py:attr`` an
  object in it.  The file's folder is first on sys.path while it is imported,
  so ``from scheduler_sim import PagedKV`` beside it finds the sibling file.
* ``object`` (400) — ``package.module:attr``, an importable object.
* ``folder`` (500) — a SPEC holding a slash: a submission folder in the
  course's layout (its ``scheduler_sim.py`` and/or ``scheduler_faults.py``, merged).
* ``name`` (600) — an entry point in ``pytest_cbatch.impls`` (engines register
  themselves; ``reference`` is built in).
* ``folder-name`` (700) — a bare name that is a folder.
* ``module`` (800) — ``package.module``, that module.

A file or folder is loaded under its own module names and sys.modules is
restored afterwards, so two submissions never see each other's modules.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from typing import Any, Sequence

from ..contract import CLAIMS
from ..impls import Implementation, ImplementationError, Kind, PythonImplementation, SpecRequest, available_impls

__all__ = ["FILE", "FOLDER", "FOLDER_NAME", "MODULE", "NAME", "OBJECT", "STUDENT_FILES"]


def _python(request: SpecRequest, target: Any, source: str) -> PythonImplementation:
    return PythonImplementation(request.spec, target, source, request.bounds)


def _file_claims(request: SpecRequest) -> bool:
    spec = request.spec
    return spec.endswith(".py") or (":" in spec and spec.rpartition(":")[0].endswith(".py"))


def _file_build(request: SpecRequest) -> Implementation:
    spec, rootdir = request.spec, request.rootdir
    if spec.endswith(".py"):
        return _with_replay(_python(request, _load_file(spec, spec, rootdir), f"file {spec}"), spec, rootdir)
    where, _, attr = spec.rpartition(":")
    impl = _python(request, _load_file_attr(spec, where, attr, rootdir), f"file {where}")
    return _with_replay(impl, where, rootdir, ":" + attr)


def _object_build(request: SpecRequest) -> Implementation:
    where, _, attr = request.spec.rpartition(":")
    return _python(request, _import_attr(request.spec, where, attr), f"module {where}")


def _folder_claims(request: SpecRequest) -> bool:
    return "/" in request.spec or os.sep in request.spec  # no module or entry-point name holds a slash


def _folder_build(request: SpecRequest) -> Implementation:
    spec, rootdir = request.spec, request.rootdir
    full = _resolve_path(spec, spec, rootdir)
    if os.path.isfile(full):
        raise ImplementationError(f"{spec!r} is a file but not a .py file; give a Python file, a submission "
                                  f"folder, or exec:COMMAND to run a program")
    if not os.path.isdir(full):
        raise ImplementationError(f"no such folder {spec!r}" + (
            f" (looked in {rootdir})" if rootdir and not os.path.isabs(spec) else ""))
    return _with_replay(_python(request, _load_folder(spec, spec, rootdir), f"folder {spec}"), spec, rootdir)


def _name_build(request: SpecRequest) -> Implementation:
    spec = request.spec
    target = available_impls()[spec]
    module, _, attr = target.partition(":")
    obj = _import_attr(spec, module, attr) if attr else _import_module(spec, module)
    impl = _python(request, obj, f"entry point {spec} = {target}")
    impl.claims = CLAIMS  # registered with the kit: an engine adapter may report what it cannot observe
    return impl


def _module_claims(request: SpecRequest) -> bool:
    spec = request.spec
    if not all(part.isidentifier() for part in spec.split(".")):
        return False
    try:
        return importlib.util.find_spec(spec.split(".")[0]) is not None
    except (ImportError, ValueError):  # e.g. __main__, which has no spec when run as a script
        return False


FILE = Kind(order=300, form="path/to/file.py[:attr]", claims=_file_claims, build=_file_build)
OBJECT = Kind(order=400, form="package.module[:attr]", claims=lambda request: ":" in request.spec,
              build=_object_build)
FOLDER = Kind(order=500, form="path/to/folder/", claims=_folder_claims, build=_folder_build)
NAME = Kind(order=600, form="", claims=lambda request: request.spec in available_impls(), build=_name_build)
FOLDER_NAME = Kind(order=700, form="", build=_folder_build,
                   claims=lambda request: os.path.isdir(_resolve_path(request.spec, request.spec, request.rootdir)))
MODULE = Kind(order=800, form="", claims=_module_claims,
              build=lambda request: _python(request, _import_module(request.spec, request.spec),
                                            f"module {request.spec}"))


def _with_replay(impl: Implementation, path: str, rootdir: str | None, suffix: str = "") -> Implementation:
    impl.replay_spec = os.path.abspath(_resolve_path(impl.spec, path, rootdir)) + suffix
    return impl


def _import_module(spec: str, name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImplementationError(f"cannot import {name!r}: {exc}{_not_found_hint(name, exc)}") from exc
    except Exception as exc:  # the module itself is broken: still one clear usage error
        raise ImplementationError(f"importing {name!r} failed: "
                                  f"{type(exc).__name__}: {exc}") from exc


def _not_found_hint(name: str, exc: ImportError) -> str:
    """Where a module's own package was not found (the usual cause: a project that is not installed), what
    to do and the sys.path searched; nothing for any other import error."""
    missing = getattr(exc, "name", None)
    if not isinstance(exc, ModuleNotFoundError) or not missing or name.split(".")[0] != missing.split(".")[0]:
        return ""
    shown = [entry or "(the current folder)" for entry in sys.path[:6]]
    more = f", ... {len(sys.path) - 6} more" if len(sys.path) > 6 else ""
    return (f"\n  is the project installed? pip install -e . in its checkout (or, for pytest, pythonpath = . in "
            f"its ini)\n  sys.path: {', '.join(shown)}{more}")


def _import_attr(spec: str, module: str, attr: str) -> Any:
    obj = _import_module(spec, module)
    return _get_attr(spec, obj, attr, f"module {module!r}")


def _get_attr(spec: str, obj: Any, attr: str, where: str) -> Any:
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImplementationError(f"{where} has no attribute {part!r}")
        obj = getattr(obj, part)
    return obj


STUDENT_FILES = ("scheduler_sim", "scheduler_faults")
_LOADED: dict[tuple[str, tuple[str, ...]], list[Any]] = {}


def _load_from_folder(spec: str, folder: str, stems: Sequence[str]) -> list[Any]:
    """Import ``folder/<stem>.py`` for each stem, under its own name, with the folder first on sys.path.

    So ``from scheduler_sim import PagedKV`` in a sibling file finds the file beside
    it (the very module loaded here), whatever else this process has imported under
    that name.  Afterwards sys.modules is as it was: two submissions loaded into one
    process never see each other's modules.
    """
    key = (os.path.abspath(folder), tuple(stems))
    if key in _LOADED:
        return _LOADED[key]
    folder = key[0]
    before = dict(sys.modules)
    for stem in stems:
        sys.modules.pop(stem, None)
    sys.path.insert(0, folder)
    modules = []
    try:
        for stem in stems:
            module = sys.modules.get(stem)  # a sibling may already have imported it
            if module is None:
                loader_spec = importlib.util.spec_from_file_location(stem, os.path.join(folder, stem + ".py"))
                if loader_spec is None or loader_spec.loader is None:
                    raise ImplementationError(f"cannot load {stem}.py as Python")
                module = importlib.util.module_from_spec(loader_spec)
                sys.modules[stem] = module
                loader_spec.loader.exec_module(module)
            modules.append(module)
    except ImplementationError:
        raise
    except (Exception, SystemExit) as exc:  # a broken or exiting file: still one clear usage error
        raise ImplementationError(f"importing {os.path.join(folder, stem + '.py')!r} "
                                  f"failed: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(folder)
        for name in [n for n in sys.modules if n not in before or sys.modules[n] is not before[n]]:
            origin = getattr(sys.modules[name], "__file__", None)
            if name in stems or (origin and os.path.abspath(origin).startswith(folder + os.sep)):
                del sys.modules[name]
        sys.modules.update({name: mod for name, mod in before.items() if name in stems})
    _LOADED[key] = modules
    return modules


def _resolve_path(spec: str, path: str, rootdir: str | None) -> str:
    return path if os.path.isabs(path) or rootdir is None else os.path.join(rootdir, path)


def _load_file(spec: str, path: str, rootdir: str | None) -> Any:
    full = _resolve_path(spec, path, rootdir)
    if not os.path.isfile(full):
        raise ImplementationError(f"no such file {path!r}")
    stem = os.path.splitext(os.path.basename(full))[0]
    return _load_from_folder(spec, os.path.dirname(os.path.abspath(full)), [stem])[0]


def _load_file_attr(spec: str, path: str, attr: str, rootdir: str | None) -> Any:
    return _get_attr(spec, _load_file(spec, path, rootdir), attr, f"file {path!r}")


def _load_folder(spec: str, path: str, rootdir: str | None) -> Any:
    """A submission folder in the course's layout: scheduler_sim.py and/or scheduler_faults.py."""
    folder = _resolve_path(spec, path, rootdir)
    stems = [stem for stem in STUDENT_FILES if os.path.isfile(os.path.join(folder, stem + ".py"))]
    if not stems:
        raise ImplementationError(f"the folder holds neither "
                                  f"{' nor '.join(s + '.py' for s in STUDENT_FILES)}")
    merged = types.SimpleNamespace()
    for module in _load_from_folder(spec, folder, stems):  # scheduler_faults last: its names win
        merged.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
    merged.__name__ = f"folder {path}"
    return merged

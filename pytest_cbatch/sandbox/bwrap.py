"""Containment of the sandbox child with bubblewrap (``bwrap``), and the choice of sandbox mode.

``--sandbox=auto`` (the default) confines the child with bubblewrap when it is
installed and works here, and otherwise falls back to plain process isolation
with a one-time notice (``not_contained_notice``); ``bwrap`` requires it;
``process`` never uses it.  Inside bubblewrap the child has its own user, PID,
IPC, UTS, cgroup and network namespaces (a loopback of its own and no other
interface: the host's 127.0.0.1 and the network are out of reach), sees only the system's ``/usr`` (and the ``/lib``-style
links to it), the Python installation and the kit's own code, read-only, its
submission's copy read-only at ``/sandbox/submission``, and a private tmpfs at
``/sandbox`` for its working directory, ``HOME`` and ``/tmp``; ``/proc`` shows
only its own processes.  A grader running as root starts bubblewrap as the
unprivileged user ``nobody`` (uid 65534), so the process limit binds: the
kernel never applies RLIMIT_NPROC to uid 0, not even inside a user namespace.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import shutil
import site
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

__all__ = ["INSIDE", "SANDBOX_MODES", "Confinement", "bwrap_problem", "confine", "kit_folders",
           "not_contained_notice", "resolve_mode"]

SANDBOX_MODES = ("auto", "bwrap", "process")
INSIDE = "/sandbox"                 # the child's private tmpfs: work/, home/, and submission/ (read-only)
UNPRIVILEGED_UID = 65534            # nobody: what a root grader's sandbox runs as
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_KIT_PACKAGES = ("pytest_cbatch", "pytest_cbatch.schemas")
_REFERENCE = "pytest_cbatch.reference"  # bound unless left out (``confine``'s ``reference``)
_CLONE_NEWNS, _MS_REC, _MS_PRIVATE, _MS_BIND = 0x00020000, 1 << 14, 1 << 18, 1 << 12


@dataclass(frozen=True)
class Confinement:
    """How a child is started: ``argv`` prefix, an optional pre-exec hook, and the paths as the child sees them."""

    prefix: tuple[str, ...]
    preexec: Callable[[], None] | None
    work: str                       # the child's working directory (its submission copy goes here)
    home: str
    copy_from: str | None           # where the child copies its submission from, or None (already in ``work``)


def confine(host_dir: str, work: str, has_folder: bool, tmpfs_mb: int, modules: Sequence[str],
            runtimes: Sequence[str] = (), reference: bool = True) -> Confinement:
    """The bubblewrap prefix for a child whose host-side folder is ``host_dir`` (submission copy at ``work``).

    ``runtimes``: folders of language runtimes outside ``/usr`` (a rubric's ``[grading] runtimes``),
    bound read-only at their own paths like the Python installation.
    ``reference``: whether the kit's reference is in the sandbox (grading leaves it out: the child never
    needs it; see ``guard``): else it is not bound, and an empty tmpfs lies over its folder where a bound
    folder holds it.

    As root, ``host_dir`` is handed to the unprivileged user and aliases of the
    bind sources are made under it in a private mount namespace of the
    launching process (an unprivileged bwrap cannot reach a Python installed
    under a 0700 home such as /root).
    """
    binary = shutil.which("bwrap")
    if binary is None:
        raise FileNotFoundError("bwrap is not installed")
    as_root = os.geteuid() == 0
    argv = [binary, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for link in _SYSTEM_LINKS:
        if os.path.islink(link):
            argv += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            argv += ["--ro-bind", link, link]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache", "--proc", "/proc", "--dev", "/dev"]
    roots = _python_roots([*modules, _REFERENCE] if reference else modules)
    roots += [r for r in runtimes if not any(_inside(r, o) for o in (*roots, "/usr"))]
    # /tmp is the private home, unless the Python installation lives under it (a virtual environment in
    # /tmp): then /tmp is a tmpfs of its own, made first, and that installation is bound into it.
    tmp_roots = any(_inside(root, "/tmp") for root in roots)
    if tmp_roots:
        argv += ["--size", str(tmpfs_mb << 20), "--tmpfs", "/tmp"]
    aliases: list[tuple[str, str]] = []
    for index, root in enumerate(roots):
        source = root
        if as_root:
            source = os.path.join(host_dir, "roots", str(index))
            if os.path.isdir(root):
                os.makedirs(source)
            else:  # a file (the interpreter) is bound onto a file
                os.makedirs(os.path.dirname(source), exist_ok=True)
                open(source, "wb").close()
            aliases.append((root, source))
        argv += ["--ro-bind", source, root]
    for folder in [] if reference else _package_folders([_REFERENCE]):
        if any(_inside(folder, root) for root in (*roots, "/usr")):
            argv += ["--size", "4096", "--tmpfs", folder]
    argv += ["--size", str(tmpfs_mb << 20), "--tmpfs", INSIDE]
    if not tmp_roots:
        argv += ["--symlink", f"{INSIDE}/home", "/tmp"]
    inside_submission = f"{INSIDE}/submission"
    if has_folder:
        argv += ["--ro-bind", work, inside_submission]
    argv += ["--chdir", INSIDE, "--"]
    preexec = None
    if as_root:
        _hand_to_sandbox_user(host_dir)
        preexec = _drop_root(aliases)
    return Confinement(tuple(argv), preexec, f"{INSIDE}/work", f"{INSIDE}/home",
                       inside_submission if has_folder else None)


def _python_roots(modules: Sequence[str]) -> list[str]:
    """The Python installation (its prefixes and site packages), the kit's code and the named modules' folders.

    Outermost only, and none under /usr (bound whole anyway).
    """
    found = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    found.update(p for p in site.getsitepackages() if os.path.isdir(p))
    found.update(_package_folders((*_KIT_PACKAGES, *_module_prefixes(modules))))
    roots = {os.path.abspath(p) for p in found if os.path.isdir(p)}
    binary = os.path.realpath(sys.executable)  # the interpreter, should it live outside its prefixes
    if not any(_inside(binary, r) for r in roots):
        roots.add(binary)
    outer = sorted(r for r in roots if not any(r != o and _inside(r, o) for o in roots))
    return [r for r in outer if not _inside(r, "/usr")]


def kit_folders() -> list[str]:
    """The folders of the kit's packages, outermost only (an editable install maps some apart)."""
    names = (*_KIT_PACKAGES, _REFERENCE, "pytest_cbatch.gpu_checks", "pytest_cbatch.examples")
    found = sorted({os.path.normpath(os.path.abspath(p)) for p in _package_folders(names)})
    return [f for f in found if not any(f != o and _inside(f, o) for o in found)]


def _package_folders(names: Iterable[str]) -> list[str]:
    """The folders of the packages (or of the modules' files) ``names``, those that exist."""
    found: list[str] = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            found += [p for p in spec.submodule_search_locations if os.path.isdir(p)]
        elif spec is not None and spec.origin and os.path.isfile(spec.origin):
            found.append(os.path.dirname(spec.origin))
    return found


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _module_prefixes(modules: Sequence[str]) -> list[str]:
    return [".".join(name.split(".")[: i + 1]) for name in modules for i in range(len(name.split(".")))]


def _hand_to_sandbox_user(host_dir: str) -> None:
    """Make ``host_dir`` (the submission copy, the alias mount points) the unprivileged sandbox user's own.

    Owned rather than opened to everyone, so no other local user can read the copy.
    """
    os.chown(host_dir, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
    for root, dirs, files in os.walk(host_dir):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), UNPRIVILEGED_UID, UNPRIVILEGED_UID)


def _drop_root(aliases: list[tuple[str, str]]) -> Callable[[], None]:
    """A pre-exec hook: in a private mount namespace, bind each root to its alias, then become ``nobody``."""
    # Everything is looked up and encoded here, before the fork: the hook itself only makes system calls.
    libc = ctypes.CDLL(None, use_errno=True)
    unshare, mount = libc.unshare, libc.mount
    unshare.argtypes = [ctypes.c_int]
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    binds = [(root.encode(), alias.encode()) for root, alias in aliases]
    private, bind = _MS_REC | _MS_PRIVATE, _MS_BIND | _MS_REC

    def hook() -> None:
        if unshare(_CLONE_NEWNS) != 0 or mount(None, b"/", None, private, None) != 0:
            raise OSError(ctypes.get_errno(), "cannot make a private mount namespace for the sandbox")
        for root, alias in binds:
            if mount(root, alias, None, bind, None) != 0:
                raise OSError(ctypes.get_errno(), f"cannot bind {root.decode()} for the sandbox")
        os.setgroups([])
        os.setgid(UNPRIVILEGED_UID)
        os.setuid(UNPRIVILEGED_UID)

    return hook


@functools.lru_cache(maxsize=None)
def bwrap_problem() -> str | None:
    """None when a bubblewrap-confined Python starts here; else why not (missing, or bwrap's own error)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    folder = tempfile.mkdtemp(prefix="cbatch-bwrap-probe-")
    try:
        confinement = confine(folder, os.path.join(folder, "work"), False, 8, ())
        argv = [*confinement.prefix, sys.executable, "-I", "-c", "import os; os.mkdir('/sandbox/home')"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, preexec_fn=confinement.preexec,
                              env={"PATH": os.defpath}, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not start ({type(exc).__name__}: {exc})"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if done.returncode != 0:
        return f"bwrap fails here (exit status {done.returncode}): {(done.stderr or done.stdout).strip()[:500]}"
    return None


def resolve_mode(requested: str) -> tuple[str, str | None]:
    """``(mode, notice)`` for a requested sandbox mode: ``mode`` is ``bwrap`` or ``process``.

    ``notice`` is the not-contained warning when ``auto`` falls back to
    ``process``; ValueError when ``bwrap`` is required but cannot run.
    """
    if requested not in SANDBOX_MODES:
        raise ValueError(f"sandbox must be one of {', '.join(SANDBOX_MODES)}, got {requested!r}")
    if requested == "process":
        return "process", None
    problem = bwrap_problem()
    if problem is None:
        return "bwrap", None
    if requested == "bwrap":
        raise ValueError(f"sandbox = bwrap is required, but {problem}. Install it (Debian/Ubuntu: "
                         f"apt-get install bubblewrap) or choose --sandbox=process")
    return "process", not_contained_notice(problem)


def not_contained_notice(problem: str) -> str:
    """What plain process isolation leaves open, and how to close it."""
    return (f"NOTICE: submissions are NOT contained: {problem}, so each runs as a plain child process of "
            f"the grader's user. It can read every file that user can read (other submissions, the hidden "
            f"traces, /proc/<grader pid>/environ and cmdline), write wherever that user can, use the network, "
            f"and, as root, fork without limit. To contain it: apt-get install bubblewrap (then --sandbox=bwrap "
            f"makes it required), or grade inside a container with no network as an unprivileged user "
            f"(docker run --network none --read-only --user 1000 ...). --sandbox=process silences this notice.")

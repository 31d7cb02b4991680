"""A submission in any language: its folder's manifest, ``cbatch.toml``, names the command that runs it.

    [submission]
    exec = "node scheduler_sim.js"

The command speaks the kit's ``exec:`` protocol (see ``sandbox.program``) and
runs inside the same sandbox as a Python submission, in its working copy of
the folder.  The manifest is the student's, so it is untrusted input: it is
read only when it is a plain file (never through a link, never a FIFO or a
device: ``untrusted.read_file``) of at most 16 KiB of UTF-8 TOML, with one
table ``[submission]`` holding the key ``exec``, a command line of at most
1000 characters, and maybe ``unsupported``, the settings the program does not
support (``support``: at most 64 strings ``"key"`` or ``"key=value"``, e.g.
``unsupported = ["admission=optimistic"]``); anything else is refused with a
message that names the problem, and the submission's results say so.  The command is a file of the
submission (a name with a slash: ``./scheduler``, ``bin/run``) or a program
the sandbox shows on its PATH (``sandbox.limits.sandbox_path``: the system's
under ``/usr``, and the rubric's ``[grading] runtimes``).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import untrusted
from ..sandbox.limits import sandbox_path
from ..sandbox.program import find_command
from ..support import parse_settings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["MANIFEST", "Manifest", "ManifestError", "command_problem", "read_manifest"]

MANIFEST = "cbatch.toml"
_MAX_BYTES = 16 * 1024
_MAX_COMMAND = 1000
_EXAMPLE = '[submission]\nexec = "node scheduler_sim.js"'


class ManifestError(ValueError):
    """A manifest that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class Manifest:
    """What a valid manifest says: the command (argv) and the settings it declares it does not support."""

    command: tuple[str, ...]
    unsupported: tuple[str, ...] = ()


def read_manifest(folder: str | Path) -> Manifest:
    """What ``folder``'s manifest says; ManifestError when it is not a valid manifest."""
    try:
        raw = untrusted.read_file(Path(folder) / MANIFEST, _MAX_BYTES)
    except untrusted.UntrustedFile as exc:
        raise ManifestError(f"{MANIFEST} {exc}; it must be a plain file of the submission, holding "
                            f"only:\n{_EXAMPLE}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ManifestError(f"{MANIFEST} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{MANIFEST} is not valid TOML ({untrusted.line(str(exc), 200)}); it should "
                            f"read:\n{_EXAMPLE}") from None
    except RecursionError:  # arrays or tables nested thousands deep: the parser's recursion bounds them
        raise ManifestError(f"{MANIFEST} nests arrays or tables too deep to be a manifest; it holds only:\n"
                            f"{_EXAMPLE}") from None
    _only(data, "submission", "unknown key(s) or table(s)", f"it holds only:\n{_EXAMPLE}")
    table = data.get("submission")
    if not isinstance(table, dict):
        raise ManifestError(f"{MANIFEST} needs a [submission] table naming the command:\n{_EXAMPLE}")
    _only(table, ("exec", "unsupported"), "[submission] has unknown key(s)",
          "its keys are exec, the command line, and unsupported, the settings it does not support")
    command = table.get("exec")
    if not isinstance(command, str):
        got = "nothing" if command is None else f"a value of type {type(command).__name__}"
        raise ManifestError(f"{MANIFEST}: [submission].exec must be a string, the command line that runs the "
                            f"scheduler (e.g. \"node scheduler_sim.js\"); got {got}")
    if len(command) > _MAX_COMMAND or any(ch in command for ch in "\0\n\r"):
        raise ManifestError(f"{MANIFEST}: [submission].exec must be one line of at most {_MAX_COMMAND} "
                            f"characters")
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ManifestError(f"{MANIFEST}: [submission].exec is not a command line ({exc}): "
                            f"{untrusted.line(command, 200)}") from None
    if not argv:
        raise ManifestError(f"{MANIFEST}: [submission].exec is empty; name the command, e.g. "
                            f"\"node scheduler_sim.js\"")
    try:
        unsupported = parse_settings(table.get("unsupported", []), f"{MANIFEST}: [submission].unsupported")
    except ValueError as exc:
        raise ManifestError(str(exc)) from None
    return Manifest(tuple(argv), unsupported)


def _only(table: dict, known: str | tuple[str, ...], what: str, hint: str) -> None:
    unknown = sorted(set(table) - ({known} if isinstance(known, str) else set(known)))
    if unknown:
        shown = ", ".join(repr(untrusted.line(key, 60)) for key in unknown[:5])
        raise ManifestError(f"{MANIFEST}: {what} {shown}{' ...' if len(unknown) > 5 else ''}; {hint}")


def command_problem(argv: tuple[str, ...], folder: str | Path, runtimes: tuple[str, ...] = ()) -> str | None:
    """Why the sandbox cannot run ``argv[0]`` for the submission in ``folder``, or None when it can."""
    name, path = argv[0], sandbox_path(runtimes)
    if find_command(name, str(folder), path) is not None:
        return None
    if "/" in name:
        target = os.path.join(folder, name)
        if os.path.isfile(target) and not os.access(target, os.X_OK):
            return (f"{MANIFEST}: the command {name!r} is a file of the submission but not executable "
                    f"(chmod +x it, or name its interpreter: exec = \"sh {name}\")")
        return f"{MANIFEST}: the command {name!r} is not a file of the submission (paths are relative to its folder)"
    return (f"{MANIFEST}: the command {name!r} is not found: the sandbox shows programs on PATH={path} (the "
            f"system's under /usr, and the folders the rubric's [grading] runtimes adds)")

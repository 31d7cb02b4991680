"""A submission as bytes: packed where it lives, unpacked on a grading machine that shares no file system.

``pack(submission)`` reads a one-file or folder submission into a ``Bundle``
(the folder's regular files, empty folders and links, links kept as links and
never followed; what the sandbox never copies, such as ``__pycache__`` and
``.git``, left out).  ``unpack(bundle, root)`` recreates it under ``root`` on
the receiving machine, where ``discover(root)`` finds it as it found the
original.  The
receiving side treats a bundle as untrusted input: every path must be a plain
relative path inside ``root``, nothing may lie beneath a link, names and kinds
are checked, and counts and sizes are bounded, so a crafted bundle cannot write
outside ``root`` however it was made.  ``digest`` fingerprints the contents, so
two runs (or shards) can tell whether they graded the same files.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .evaluate import Submission

__all__ = ["Bundle", "BundleError", "Entry", "MAX_BUNDLE_BYTES", "pack", "plain_name", "unpack"]

MAX_BUNDLE_BYTES = 64 << 20       # the sandbox copies no more of a submission folder than this
MAX_ENTRIES = 10_000
_MAX_PATH = 1024
# Never packed, so never in a submission's digest: what tools write into a folder (a student's own pytest run
# writes .cbatch-failures, .hypothesis, .pytest_cache and, with pytest-benchmark, .benchmarks there), which must
# not make merge see another folder.
_SKIPPED = (".git", "__pycache__", ".hypothesis", ".pytest_cache", ".benchmarks", ".cbatch-failures", "*.pyc",
            ".venv")
_KINDS = ("file", "dir", "link")


class BundleError(ValueError):
    """A submission that cannot be packed, or a bundle refused on arrival; the message says which entry and why."""


@dataclass(frozen=True)
class Entry:
    """One item of a submission: ``path`` relative to it (POSIX), ``kind`` file, dir or link."""

    path: str
    kind: str
    data: bytes = b""          # a file's contents
    executable: bool = False   # a file's executable bit, which the sandbox's copy keeps
    target: str = ""           # a link's target, recreated as text and never resolved here


@dataclass(frozen=True)
class Bundle:
    """A submission in transit: its ``name``, whether it is one ``.py`` file or a folder, and its entries."""

    name: str
    single_file: bool
    entries: tuple[Entry, ...]

    @property
    def size(self) -> int:
        return sum(len(e.data) for e in self.entries)

    def digest(self) -> str:
        """SHA-256 over the entries' paths, kinds, bits and contents: equal bundles, equal digests."""
        h = hashlib.sha256()
        for e in sorted(self.entries, key=lambda e: e.path):
            # os.fsencode: a name or link target of any bytes (a Latin-1 file name is a lone surrogate here)
            h.update(os.fsencode(f"{e.kind}\0{e.path}\0{int(e.executable)}\0{e.target}\0{len(e.data)}\0"))
            h.update(e.data)
        return h.hexdigest()


def pack(submission: Submission) -> Bundle:
    """Read ``submission`` (as ``discover`` found it) into a bundle; BundleError when it exceeds the bounds.

    A submission that is itself a symbolic link is never read: BundleError (``discover`` refuses it anyway).
    """
    path = Path(submission.path)
    if path.is_symlink():
        raise BundleError(f"submission {submission.name} is a symbolic link, which is never followed")
    if path.is_file():
        return Bundle(submission.name, True, (_file_entry(path, path.name),))
    entries: list[Entry] = []
    total = 0
    for root, dirs, files in os.walk(path, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not _skipped(d))
        here = Path(root)
        for name in [*dirs, *sorted(f for f in files if not _skipped(f))]:
            full = here / name
            rel = full.relative_to(path).as_posix()
            info = full.lstat()
            if stat.S_ISLNK(info.st_mode):
                entries.append(Entry(rel, "link", target=os.readlink(full)))
            elif stat.S_ISDIR(info.st_mode):
                entries.append(Entry(rel, "dir"))
            elif stat.S_ISREG(info.st_mode):
                entries.append(_file_entry(full, rel))
                total += len(entries[-1].data)
            # sockets, fifos and devices are not part of a submission and would not be copied to the sandbox
            if total > MAX_BUNDLE_BYTES or len(entries) > MAX_ENTRIES:
                raise BundleError(f"submission {submission.name}: more than {MAX_BUNDLE_BYTES >> 20} MiB or "
                                  f"{MAX_ENTRIES} entries")
        dirs[:] = [d for d in dirs if not (here / d).is_symlink()]
    return Bundle(submission.name, False, tuple(entries))


def _file_entry(path: Path, rel: str) -> Entry:
    with open(path, "rb") as fh:
        data = fh.read(MAX_BUNDLE_BYTES + 1)
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError(f"{rel}: more than {MAX_BUNDLE_BYTES >> 20} MiB")
    return Entry(rel, "file", data, executable=bool(os.stat(path).st_mode & 0o100))


def _skipped(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in _SKIPPED)


def unpack(bundle: object, root: Path) -> Path:
    """Recreate ``bundle`` under the empty folder ``root``; the path of the file or folder made.

    Everything is checked before anything is written: BundleError names the
    first entry refused.  Files are created exclusively and without following
    links; links are made last, so nothing is ever written through one.
    """
    checked = _checked(bundle)
    if checked.single_file:
        _write(root / checked.entries[0].path, checked.entries[0])
        return root / checked.entries[0].path
    base = root / checked.name
    base.mkdir()
    for entry in checked.entries:
        if entry.kind == "dir":
            (base / entry.path).mkdir(parents=True, exist_ok=True)
    for entry in checked.entries:
        if entry.kind == "file":
            (base / entry.path).parent.mkdir(parents=True, exist_ok=True)
            _write(base / entry.path, entry)
    for entry in checked.entries:
        if entry.kind == "link":
            (base / entry.path).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(entry.target, base / entry.path)
    return base


def _write(path: Path, entry: Entry) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if entry.executable else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(entry.data)


def _checked(bundle: object) -> Bundle:
    if not isinstance(bundle, Bundle) or not isinstance(bundle.entries, tuple):
        raise BundleError(f"not a submission bundle: {type(bundle).__name__}")
    name = bundle.name
    if not isinstance(name, str) or not plain_name(name) or name.startswith((".", "_")):
        raise BundleError(f"bundle name {name!r}: not a submission name (one plain path component)")
    if not bundle.entries or len(bundle.entries) > MAX_ENTRIES:
        raise BundleError(f"bundle {name}: {len(bundle.entries)} entries (1 to {MAX_ENTRIES} expected)")
    seen: dict[str, str] = {}
    total = 0
    for entry in bundle.entries:
        if not isinstance(entry, Entry) or entry.kind not in _KINDS:
            raise BundleError(f"bundle {name}: an entry of unknown kind: {entry!r:.200}")
        where = f"bundle {name}: entry {entry.path!r:.200}"
        if not isinstance(entry.path, str) or not isinstance(entry.data, bytes) or not isinstance(entry.target, str):
            raise BundleError(f"{where}: fields of the wrong type")
        parts = entry.path.split("/")
        if len(entry.path) > _MAX_PATH or not all(_component(p) for p in parts):
            raise BundleError(f"{where}: not a plain relative path (empty, '.', '..', absolute or odd characters)")
        if entry.path in seen:
            raise BundleError(f"{where}: appears twice")
        if entry.kind != "file" and entry.data:
            raise BundleError(f"{where}: a {entry.kind} with contents")
        if entry.kind == "link" and (not 0 < len(entry.target) <= _MAX_PATH or "\0" in entry.target):
            raise BundleError(f"{where}: a link target that is empty, too long or holds NUL")
        seen[entry.path] = entry.kind
        total += len(entry.data)
        if total > MAX_BUNDLE_BYTES:
            raise BundleError(f"bundle {name}: more than {MAX_BUNDLE_BYTES >> 20} MiB")
    for path in seen:  # beneath a link, a write would land wherever the link points
        parts = path.split("/")
        for depth in range(1, len(parts)):
            parent = seen.get("/".join(parts[:depth]))
            if parent is not None and parent != "dir":
                raise BundleError(f"bundle {name}: entry {path!r} lies beneath a {parent}, which would let it "
                                  f"be written elsewhere")
    if bundle.single_file:
        only = bundle.entries[0]
        if len(bundle.entries) != 1 or only.kind != "file" or only.path != f"{name}.py":
            raise BundleError(f"bundle {name}: a one-file submission must be the single file {name}.py")
    return bundle


def _component(part: str) -> bool:
    """One path component of a file inside a submission: any bytes a file system allows (a name of
    invalid UTF-8 arrives as lone surrogates), but not empty, ``.``, ``..``, nor holding ``/`` or NUL."""
    try:
        size = len(os.fsencode(part))
    except UnicodeEncodeError:  # a surrogate no file name decodes to: not a name from a file system
        return False
    return 0 < size <= 255 and part not in (".", "..") and "/" not in part and "\0" not in part


def plain_name(part: str) -> bool:
    """One path component that names something inside its folder: not empty, ``.``, ``..``, nor holding ``/``."""
    return (0 < len(part) <= 255 and part not in (".", "..") and "/" not in part and "\0" not in part
            and part.isprintable())

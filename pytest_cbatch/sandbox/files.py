"""A submission is files, not links: its copy is made without ever following a link.

``copy_submission(source, target, required)`` copies a one-file submission or
a submission folder into ``target`` (a folder it creates).  Every path is
opened relative to its already opened parent with ``O_NOFOLLOW``, so the
grader (root, on a grading server) reads nothing through a link, whatever the
submission holds: a link to a file or folder outside it, a chain of links, a
link that points back inside it.  Links are left out of the copy, each named
in the returned list; so are FIFOs, sockets and devices.  A submission that
is itself a link, or whose module file (``required``) is one, is refused with
``SubmissionRefused``, which says so.  The copy is bounded in bytes, entries
and depth.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["MAX_COPY_BYTES", "SubmissionRefused", "copy_submission", "is_link", "link_refusal"]

MAX_COPY_BYTES = 64 << 20
MAX_ENTRIES = 10_000
MAX_DEPTH = 32
_IGNORED = frozenset({".git", "__pycache__", ".hypothesis", ".pytest_cache", ".venv"})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class SubmissionRefused(ValueError):
    """The submission cannot be copied as it stands (a link, too large, not a file or folder): the message says why."""


def is_link(path: str) -> bool:
    """Whether ``path`` itself is a symbolic link (never follows it)."""
    return os.path.islink(path)


def link_refusal(name: str) -> str:
    """The message for a submission (or its module file ``name``) that is a symbolic link."""
    return (f"{name} is a symbolic link; a submission is files, not links: hand in the file itself "
            f"(the grader follows no link)")


def copy_submission(source: str, target: str, required: tuple[str, ...] = ()) -> list[str]:
    """Copy ``source`` (one file, or a folder) into the new folder ``target``; return what was left out.

    ``required``: file names inside a folder ``source`` that must be copied (the
    modules to import); SubmissionRefused when one is a link, or when
    ``source`` itself is a link, or the copy would exceed its bounds.
    """
    info = os.lstat(source)
    name = os.path.basename(source.rstrip("/")) or source
    if stat.S_ISLNK(info.st_mode):
        raise SubmissionRefused(link_refusal(name))
    os.mkdir(target)
    budget = _Budget()
    if stat.S_ISREG(info.st_mode):
        parent = os.open(os.path.dirname(os.path.abspath(source)), _DIR_FLAGS)
        try:
            _copy_file(parent, name, os.path.join(target, name), budget)
        finally:
            os.close(parent)
        return []
    if not stat.S_ISDIR(info.st_mode):
        raise SubmissionRefused(f"{name} is neither a file nor a folder")
    for module in required:
        if os.path.islink(os.path.join(source, module)):
            raise SubmissionRefused(link_refusal(module))
    left_out: list[str] = []
    top = os.open(source, _DIR_FLAGS)
    try:
        _copy_dir(top, target, "", budget, left_out, 0)
    finally:
        os.close(top)
    return left_out


class _Budget:
    def __init__(self) -> None:
        self.bytes = 0
        self.entries = 0

    def entry(self) -> None:
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            raise SubmissionRefused(f"the submission holds more than {MAX_ENTRIES} files and folders")

    def add(self, size: int) -> None:
        self.bytes += size
        if self.bytes > MAX_COPY_BYTES:
            raise SubmissionRefused(f"the submission holds more than {MAX_COPY_BYTES >> 20} MiB")


def _copy_dir(fd: int, target: str, rel: str, budget: _Budget, left_out: list[str], depth: int) -> None:
    for entry in sorted(os.scandir(fd), key=lambda e: e.name):
        name, shown = entry.name, rel + entry.name
        if name in _IGNORED or name.endswith(".pyc"):
            continue
        budget.entry()
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            left_out.append(f"{shown} (a symbolic link)")
        elif stat.S_ISDIR(mode):
            if depth >= MAX_DEPTH:
                left_out.append(f"{shown}/ (nested more than {MAX_DEPTH} folders deep)")
                continue
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:  # swapped for a link since it was listed
                left_out.append(f"{shown} (not a folder when opened)")
                continue
            try:
                os.mkdir(os.path.join(target, name))
                _copy_dir(child, os.path.join(target, name), shown + "/", budget, left_out, depth + 1)
            finally:
                os.close(child)
        elif stat.S_ISREG(mode):
            _copy_file(fd, name, os.path.join(target, name), budget, left_out, shown)
        else:
            left_out.append(f"{shown} (not a regular file)")


def _copy_file(parent: int, name: str, target: str, budget: _Budget, left_out: list[str] | None = None,
               shown: str = "") -> None:
    """Copy ``name`` of the open folder ``parent`` to ``target``, refusing a link or anything not a regular file."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
    except OSError as exc:  # ELOOP: it is a link (or became one since it was listed)
        if left_out is None:
            raise SubmissionRefused(link_refusal(name) if exc.errno == errno.ELOOP
                                    else f"{name} cannot be read: {exc.strerror}") from None
        left_out.append(f"{shown} (cannot be opened without following a link)")
        return
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            if left_out is None:
                raise SubmissionRefused(f"{name} is not a regular file")
            left_out.append(f"{shown} (not a regular file)")
            return
        mode = 0o755 if info.st_mode & stat.S_IXUSR else 0o644
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            while chunk := os.read(fd, 1 << 20):
                budget.add(len(chunk))
                os.write(out, chunk)
        finally:
            os.close(out)
    finally:
        os.close(fd)

"""Build the sample submissions of the grading example: ``python make_samples.py DEST``.

Each sample is a student folder in the published layout (``scheduler_sim.py``
and ``scheduler_faults.py``) made from the kit's reference, so the correct one
is the reference itself laid out as a student would hand it in.  The others
append a few lines to ``scheduler_sim.py`` that replace ``simulate``:

* ``correct``         the reference, unchanged: full marks
* ``buggy_ttft``      reports TTFT 0 instead of null for requests cancelled before a token
* ``buggy_itl``       reports ITL ``[0]`` instead of ``[]`` for one-token outputs
* ``loops_forever``   ``simulate`` never returns
* ``calls_os_exit``   ``simulate`` calls ``os._exit(3)``
* ``prints_50mb``     ``simulate`` prints 50 MB before returning a correct report
* ``deletes_files``   ``simulate`` deletes every file in its working directory, then answers correctly

Any module of the reference folder that the two files import (by plain or
relative import) is copied beside them, so the folder is self-contained.

``make_hostile(dest, targets)`` builds the hostile samples (``HOSTILE``): each
answers correctly, but first (once per process) tries one attack on the
grader; what it gets hold of, it raises as an exception message, which lands
in its own results.json.  Contained (bubblewrap), every attack finds nothing,
so each scores full marks and its results.json holds nothing of the grader:

* ``reads_secrets``     lists and reads the hidden traces' folder and another submission's files by absolute path
* ``phones_home``       connects to a server on 127.0.0.1 and sends it a line
* ``writes_outside``    writes files outside its own folder (another submission's, a shared folder)
* ``fork_bomb``         forks until it cannot (up to ``fork_cap`` children, then kills them): past the cap,
                        the process limit did not bind
* ``reads_grader_proc`` reads ``/proc/<parent>/environ`` and ``cmdline`` (and every other process's)

``targets`` holds the absolute paths and numbers the attacks aim at:
``read`` (folders), ``write`` (file paths), ``port``, ``fork_cap``.

    python make_samples.py DEST [--hostile PORT READ_DIR,... WRITE_PATH,... FORK_CAP]
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest_cbatch.reference as reference

__all__ = ["HOSTILE", "OVERLAYS", "make_hostile", "make_samples"]

_WRAP = "\n\n# ---- sample submission: {name} ----\n_published_simulate = simulate\n\n\n"

OVERLAYS: dict[str, str] = {
    "correct": "",
    "buggy_ttft": '''def simulate(events, **config):
    report = _published_simulate(events, **config)
    for row in report["requests"].values():
        if row["status"] == "cancelled" and row["ttft_ticks"] is None:
            row["ttft_ticks"] = 0
    return report
''',
    "buggy_itl": '''def simulate(events, **config):
    report = _published_simulate(events, **config)
    for row in report["requests"].values():
        if row["output_tokens"] == 1:
            row["itl_ticks"] = [0]
    return report
''',
    "loops_forever": '''def simulate(events, **config):
    while True:
        pass
''',
    "calls_os_exit": '''def simulate(events, **config):
    import os
    os._exit(3)
''',
    "prints_50mb": '''def simulate(events, **config):
    import sys
    chunk = "x" * (1 << 20)
    for _ in range(50):
        sys.stdout.write(chunk)
    return _published_simulate(events, **config)
''',
    "deletes_files": '''def simulate(events, **config):
    import os
    for root, _dirs, files in os.walk("."):
        for name in files:
            os.remove(os.path.join(root, name))
    return _published_simulate(events, **config)
''',
}

_ATTACK = """def _leak(found):
    # An attack that worked: raise what it found, so it shows in this submission's results.json.
    if found:
        raise ValueError("LEAKED " + " | ".join(found)[:3000])


_tried = []


def simulate(events, **config):
    if not _tried:
        _tried.append(True)
        _leak(_attack())
    return _published_simulate(events, **config)


TARGETS = {targets!r}


"""

HOSTILE: dict[str, str] = {
    "reads_secrets": """def _attack():
    import os
    found = []
    for folder in TARGETS["read"]:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    found.append(path + ": " + fh.read(400))
            except OSError:
                found.append(path + " (listed)")
    return found
""",
    "phones_home": """def _attack():
    import socket
    sock = socket.socket()
    sock.settimeout(5)
    try:
        sock.connect(("127.0.0.1", TARGETS["port"]))
        sock.sendall(b"hello from a submission\\n")
        return ["connected to 127.0.0.1:%d" % TARGETS["port"]]
    except OSError:
        return []
    finally:
        sock.close()
""",
    "writes_outside": """def _attack():
    found = []
    for path in TARGETS["write"]:
        try:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write("written by a submission")
            found.append("wrote " + path)
        except OSError:
            pass
    return found
""",
    "fork_bomb": """def _attack():
    import os, signal, time
    children = []
    try:
        while len(children) < TARGETS["fork_cap"]:
            pid = os.fork()
            if pid == 0:
                try:
                    time.sleep(60)
                finally:
                    os._exit(0)
            children.append(pid)
    except OSError:
        pass
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    if len(children) >= TARGETS["fork_cap"]:
        return ["forked %d processes: the process limit did not bind" % len(children)]
    return []
""",
    "reads_grader_proc": """def _attack():
    import os
    found = []
    mine = set(os.environ)
    pids = {str(os.getppid())}
    try:
        pids.update(p for p in os.listdir("/proc") if p.isdigit())
    except OSError:
        pass
    pids.discard(str(os.getpid()))
    for pid in sorted(pids):
        try:
            with open("/proc/%s/environ" % pid, "rb") as fh:
                env = fh.read().decode("utf-8", "replace").split("\\0")
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                argv = fh.read().decode("utf-8", "replace").split("\\0")
        except OSError:
            continue
        news = [v for v in env if v and v.split("=", 1)[0] not in mine]
        if news:
            found.append("pid %s environ: %s" % (pid, " ".join(news)))
        if "--traces" in argv or "grade" in argv:
            found.append("pid %s cmdline: %s" % (pid, " ".join(argv)))
    return found
""",
}

_ENTRY_FILES = ("scheduler_sim.py", "scheduler_faults.py")


def _local_imports(path: Path, folder: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
    return {f"{n}.py" for n in names if (folder / f"{n}.py").is_file()}


def _published_files() -> list[Path]:
    folder = Path(reference.__file__).parent
    wanted, todo = set(), list(_ENTRY_FILES)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += sorted(_local_imports(folder / name, folder))
    return [folder / name for name in sorted(wanted)]


def make_samples(dest: Path, only: tuple[str, ...] | None = None) -> list[Path]:
    """Write one folder per entry of OVERLAYS (or of ``only``) under ``dest``, replacing old ones; return them."""
    return [_write(dest / name, name, overlay) for name, overlay in OVERLAYS.items()
            if only is None or name in only]


def make_hostile(dest: Path, targets: dict, only: tuple[str, ...] | None = None) -> list[Path]:
    """Write one folder per entry of HOSTILE (or of ``only``) under ``dest``, aimed at ``targets``; return them."""
    head = _ATTACK.format(targets=targets)
    return [_write(dest / name, name, head + attack) for name, attack in HOSTILE.items()
            if only is None or name in only]


def _write(target: Path, name: str, overlay: str) -> Path:
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for path in _published_files():
        shutil.copyfile(path, target / path.name)
    if overlay:
        with open(target / "scheduler_sim.py", "a", encoding="utf-8") as fh:
            fh.write(_WRAP.format(name=name) + overlay)
    return target


if __name__ == "__main__":
    if len(sys.argv) not in (2, 7) or (len(sys.argv) == 7 and sys.argv[2] != "--hostile"):
        sys.exit("usage: python make_samples.py DEST [--hostile PORT READ_DIR,... WRITE_PATH,... FORK_CAP]")
    for folder in make_samples(Path(sys.argv[1])):
        print(folder)
    if len(sys.argv) == 7:
        aims = {"port": int(sys.argv[3]), "read": sys.argv[4].split(","), "write": sys.argv[5].split(","),
                "fork_cap": int(sys.argv[6])}
        for folder in make_hostile(Path(sys.argv[1]), aims):
            print(folder)

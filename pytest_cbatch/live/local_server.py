"""An engine's server run on 127.0.0.1 for a test or a job, offline, and always stopped.

Standard library only.  :func:`running` starts ``python ARGS... --port PORT`` in its own session, waits
for ``/health`` (bounded), yields the URL and stops the whole process group at the end (SIGTERM, then
SIGKILL), whatever happened; :func:`post_json` sends one JSON request and returns the status and body,
an HTTP error included.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Mapping

__all__ = ["ServerStartError", "free_port", "running", "post_json"]


class ServerStartError(RuntimeError):
    """The server exited or did not answer ``/health`` in time (the message has its log's tail)."""


def free_port() -> int:
    """A port on 127.0.0.1 free at the time of the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running(args: list[str], work: Path, *, startup_seconds: float = 240,
            env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Run ``python ARGS... --port PORT`` (a server on 127.0.0.1) offline with ``HF_HOME=work/hf-home``
    and one OpenMP thread, ``env`` on top, its output in ``work/server.log``; yield its URL once
    ``/health`` answers; stop its process group (SIGTERM, then SIGKILL) on exit.  ServerStartError when it
    exits or is not ready within ``startup_seconds``."""
    full_env = {**os.environ, "HF_HOME": str(work / "hf-home"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "HF_HUB_DISABLE_UPDATE_CHECK": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    full_env.pop("HF_HUB_CACHE", None)
    port = free_port()
    log_path = work / "server.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, *args, "--port", str(port)], env=full_env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + startup_seconds
    try:
        while True:
            if proc.poll() is not None:
                raise ServerStartError(f"the server exited {proc.returncode}:\n{log_path.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(url + "/health", timeout=5).close()
                break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(f"the server did not answer /health in {startup_seconds:g} s:\n"
                                       f"{log_path.read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def _signal_group(pgid: int, sig: int) -> None:
    # A server that exited (and its whole group with it) leaves nothing to signal; the caller's error
    # (ServerStartError with the log) must not be replaced by ProcessLookupError.
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def post_json(url: str, body: Mapping[str, Any], *, timeout: float = 60) -> tuple[int, str]:
    """POST ``body`` as JSON; the HTTP status and the response body as text (an error status included)."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()

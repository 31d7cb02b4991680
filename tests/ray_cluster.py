"""Test helper: run a command against a real two-node Ray cluster, in a network namespace of loopback only.

``run_on_cluster(command, ...)`` starts, in new network, PID and mount
namespaces (``unshare``; root), a head (``ray start --head``) and a second
node (``ray start --address``), each its own processes bound to 127.0.0.1,
then runs ``command`` with ``{address}`` replaced by the head's address.
Outside such a namespace Ray finds the host's address by a routing probe
toward a public resolver and connects to it; tests here talk to loopback only.
When the command ends, the namespace's first process exits and the kernel ends
every process left in it, so no Ray process outlives the test.  With
``kill_one_task``, the first worker seen running ``grade_remote`` is killed
(SIGKILL) mid-task, as a lost worker would be, and ``killed`` is written.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_PORT = 6379
_NODE = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--memory", str(4 << 30),
         "--object-store-memory", str(100 << 20), "--disable-usage-stats"]
_UNSHARE = ["unshare", "--net", "--pid", "--fork", "--mount-proc"]


def namespace_problem() -> str | None:
    """Why a loopback-only namespace cannot be made here (not root, no unshare), or None."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is not installed"
    probe = subprocess.run([*_UNSHARE, "ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if probe.returncode:
        return f"cannot make a network namespace here (root needed): {probe.stderr.strip()[:200]}"
    return None


def run_on_cluster(command: list[str], workdir: Path, kill_one_task: bool = False,
                   timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``command`` against a fresh two-node cluster; its output, with Ray's start-up logs under ``workdir``."""
    temp = Path(tempfile.mkdtemp(prefix="cbray-"))  # short: Ray's socket paths under it must fit 107 bytes
    try:
        inside = [sys.executable, __file__, str(workdir), str(temp), "kill" if kill_one_task else "-", *command]
        return subprocess.run([*_UNSHARE, *inside], capture_output=True, text=True, timeout=timeout, cwd=workdir)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _inside(workdir: Path, temp: Path, kill: bool, command: list[str]) -> int:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    # HOME holds Ray's token, TMPDIR the workers' folders (a worker killed mid-task leaves its own): both go with temp.
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(temp / "home"), "TMPDIR": str(temp / "tmp")}
    (temp / "home").mkdir()
    (temp / "tmp").mkdir()
    ray = str(Path(sys.executable).with_name("ray"))
    head = [ray, "start", "--head", "--port", str(_PORT), "--include-dashboard=false", "--temp-dir", str(temp), *_NODE]
    for argv, log in ((head, "ray-head.log"), ([ray, "start", "--address", f"127.0.0.1:{_PORT}", *_NODE],
                                                "ray-node.log")):
        with open(workdir / log, "w") as fh:
            subprocess.run(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, check=True, timeout=120)
    address = f"127.0.0.1:{_PORT}"
    proc = subprocess.Popen([part.replace("{address}", address) for part in command], env=env)
    if kill:
        threading.Thread(target=_kill_one_task, args=(proc, workdir / "killed"), daemon=True).start()
    return proc.wait()


def _kill_one_task(proc: subprocess.Popen, marker: Path) -> None:
    """SIGKILL the first Ray worker seen running a submission's task (bounded: gives up when the command ends)."""
    seen: set[str] = set()
    while proc.poll() is None:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if _title(pid).startswith(b"ray::grade_remote"):
                if pid in seen:  # still at a task half a second later: a task under way
                    os.kill(int(pid), signal.SIGKILL)
                    marker.write_text(pid)
                    return
                seen.add(pid)
        time.sleep(0.5)
        seen = {pid for pid in seen if _title(pid).startswith(b"ray::grade_remote")}


def _title(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return b""


if __name__ == "__main__":
    sys.exit(_inside(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "kill", sys.argv[4:]))

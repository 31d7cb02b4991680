"""pytest_cbatch.live.local_server: an engine's server started for a test, ready on /health, always stopped."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pytest_cbatch.live.local_server import ServerStartError, post_json, running

# A server that answers /health, echoes a POSTed JSON body with status 201 (418 for {"fail": true}), and
# starts a child in its own process group that must die with it.
SERVER = r"""
import json, subprocess, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(str(child.pid))
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(418 if body.get("fail") else 201); self.end_headers()
        self.wfile.write(json.dumps(body).encode())
HTTPServer(("127.0.0.1", int(sys.argv[3])), H).serve_forever()
"""


def _alive(pid: int) -> bool:
    """Running or sleeping; a zombie (killed, not yet reaped by whoever adopted it) is not alive."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_server_is_ready_on_health_and_its_whole_group_is_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    with running(["-c", SERVER, str(pid_file)], tmp_path, startup_seconds=60) as url:
        assert url.startswith("http://127.0.0.1:")
        assert post_json(url + "/echo", {"a": 1}) == (201, json.dumps({"a": 1}))
        assert post_json(url + "/echo", {"fail": True})[0] == 418  # an error status is returned, not raised
        child = int(pid_file.read_text())
        assert _alive(child)
    for _ in range(600):  # SIGTERM was sent to the group; its delivery is not instant (bounded wait)
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child), "the server's child outlived it"


def test_a_server_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(ServerStartError, match=r"exited 3:\n.*no model here"):
        with running(["-c", "import sys; print('no model here', flush=True); sys.exit(3)"], tmp_path,
                     startup_seconds=60):
            pass


def test_a_server_that_never_answers_is_stopped_after_its_start_limit(tmp_path: Path) -> None:
    with pytest.raises(ServerStartError, match=r"did not answer /health in 1 s"):
        with running(["-c", "import time; time.sleep(600)"], tmp_path, startup_seconds=1):
            pass

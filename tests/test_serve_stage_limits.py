"""The serve stage script against a hostile server: one that answers health, then trickles a
stream forever (each part well inside the socket timeout). The script must stop at its own
deadline, kill the server, leave no process and remove the tiny model folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import transplant.remote as remote

SCRIPT = Path(remote.__file__).parent / "stage_serve.py"

TRICKLER = textwrap.dedent('''\
    import http.server, os, sys, time
    open(sys.argv[2], "w").write(str(os.getpid()))

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            while True:
                self.wfile.write(b": still thinking\\n")
                self.wfile.flush()
                time.sleep(0.2)

    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    ''')


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] if Path(f"/proc/{pid}").exists() else "X"
    return state not in ("Z", "X")


def test_a_server_trickling_a_stream_forever_is_stopped_at_the_deadline(tmp_path):
    server = tmp_path / "trickle.py"
    server.write_text(TRICKLER)
    pidfile = tmp_path / "pid"
    request = {"command": ["{python}", str(server), "{port}", str(pidfile)], "deadline": 4}
    began = time.monotonic()
    try:
        out = subprocess.run([sys.executable, str(SCRIPT)], input=json.dumps(request), capture_output=True,
                             text=True, timeout=40, check=True)
    finally:  # if the script failed to stop it, this test does, so no process outlives it
        if pidfile.exists() and _alive(int(pidfile.read_text())):
            os.kill(int(pidfile.read_text()), 9)
    took = time.monotonic() - began
    report = json.loads(out.stdout)
    assert report["started"] is True
    assert "still coming at the deadline" in report["error"]
    assert took < 20, took  # the deadline (4 s), the stop (SIGTERM), not the controller's backstop
    assert report["stopped"].startswith("stopped by SIGTERM")
    assert not _alive(int(pidfile.read_text()))
    assert not Path(report["model"]).parent.exists()

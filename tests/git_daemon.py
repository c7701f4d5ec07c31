"""A git daemon on 127.0.0.1 serving the bare repositories of a folder (git://127.0.0.1:PORT/NAME),
for Docker builds with host networking that clone from it."""
from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(srv: Path, port: int, probe: str) -> subprocess.Popen:
    """The daemon on 127.0.0.1:port serving srv, once `git ls-remote` of the repository `probe`
    answers."""
    daemon = subprocess.Popen(["git", "daemon", "--reuseaddr", "--export-all", "--listen=127.0.0.1", f"--port={port}",
                               f"--base-path={srv}", str(srv)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(50):
        if subprocess.run(["git", "ls-remote", f"git://127.0.0.1:{port}/{probe}"], capture_output=True).returncode == 0:
            return daemon
        time.sleep(0.2)
    daemon.kill()
    pytest.fail("git daemon did not start")


def stop(daemon: subprocess.Popen) -> None:
    daemon.terminate()
    daemon.wait(10)

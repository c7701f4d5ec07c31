"""A stand-in of PyPI's simple index: PEP 691 JSON pages with upload times (PEP 700), which uv's
--exclude-newer needs (a file:// index has none, and uv leaves out every file without one), served
on 127.0.0.1 from a folder of wheels (therock_standin.wheel makes them). HEAD answers too (uv asks
for a wheel's size first)."""
from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
from pathlib import Path

UPLOADED = "2026-01-01T00:00:00Z"


def _project(filename: str) -> str:
    return re.sub(r"[-_.]+", "-", filename.split("-")[0]).lower()


def serve(folder: Path, late: tuple[str, ...] = (), late_time: str = "2099-01-01T00:00:00Z"):
    """A running server of folder's wheels (stop it with .shutdown()); its index is
    http://127.0.0.1:<server_port>/simple. late: file names uploaded at late_time (after any
    exclude_newer), the others at UPLOADED."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self.do_GET(head=True)

        def do_GET(self, head: bool = False):
            page = re.fullmatch(r"/simple/([^/]+)/?", self.path)
            wanted = self.path.removeprefix("/files/")
            if page:
                name = _project(page.group(1))
                files = [{"filename": p.name, "url": f"/files/{p.name}",
                          "hashes": {"sha256": hashlib.sha256(p.read_bytes()).hexdigest()},
                          "upload-time": late_time if p.name in late else UPLOADED}
                         for p in sorted(folder.glob("*.whl")) if _project(p.name) == name]
                body = json.dumps({"meta": {"api-version": "1.1"}, "name": name, "files": files}).encode()
                ctype = "application/vnd.pypi.simple.v1+json"
                if not files:
                    self.send_error(404)
                    return
            elif self.path.startswith("/files/") and "/" not in wanted and (folder / wanted).is_file():
                body, ctype = (folder / wanted).read_bytes(), "application/octet-stream"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def file_index(folder: Path, root: Path) -> str:
    """A PEP 503 copy of the same wheels (the same bytes: the same sha256s) at root/simple, as a
    local mirror a build installs from (file://); returns its URL."""
    for wheel in sorted(folder.glob("*.whl")):
        page = root / "simple" / _project(wheel.name)
        page.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        with open(page / "index.html", "a") as out:
            out.write(f'<a href="{wheel.resolve().as_uri()}#sha256={digest}">{wheel.name}</a>\n')
    return (root / "simple").as_uri()

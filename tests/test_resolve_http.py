"""The pin tool's one HTTP client (tools/pins/resolve.py _pool/_http) with proxies and redirects as pip
and curl take them: a proxy URL it cannot use is one line with its password masked; an
authenticating proxy (user:password@ in the setting) gets Proxy-Authorization; a mirror answering
302 is followed within REDIRECTS, and a redirect's empty body is never taken as the answer (it would
be hashed: a false "sha256 differs" alarm). A fake proxy and a fake mirror on 127.0.0.1."""
from __future__ import annotations

import base64
import http.server
import threading

import pytest

from tools.pins import resolve
from tools.pins.model import PinError

PROXIES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY", "all_proxy",
           "ALL_PROXY")


class Server:
    """A server on 127.0.0.1: answer(handler) -> (status, headers, body); what it was asked, kept."""

    def __init__(self, answer) -> None:
        self.asked: list[tuple[str, dict]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                outer.asked.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                status, headers, body = answer(self)
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def serve(monkeypatch):
    for name in PROXIES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PINS_TIMEOUT", "10")
    made = []

    def start(answer) -> Server:
        made.append(Server(answer))
        return made[-1]
    yield start
    for server in made:
        server.close()


@pytest.mark.parametrize("proxy", ["http://user:S3CRET@host:99x", "http://user:S3CRET@[::1", "socks5://u:S3CRET@h:1",
                                   "user:S3CRET@proxy:port"])
def test_a_proxy_url_urllib3_cannot_use_is_one_line_never_showing_its_password(proxy, serve, monkeypatch):
    monkeypatch.setenv("https_proxy", proxy)
    with pytest.raises(PinError) as err:
        resolve._http("https://files.example/vllm.tar.gz")
    message = str(err.value)
    assert "S3CRET" not in message and "\n" not in message and "***@" in message, message
    assert message.startswith("the proxy setting ") or "https://files.example" in message, message


def test_an_authenticating_proxy_gets_proxy_authorization(serve, monkeypatch):
    """user:p@ss% written percent-escaped in the setting, sent decoded as Basic credentials."""
    expected = "Basic " + base64.b64encode(b"bot:p@ss%").decode()

    def proxy_answer(handler):
        if handler.headers.get("Proxy-Authorization") != expected:
            return 407, {"Proxy-Authenticate": 'Basic realm="proxy"'}, b""
        return 200, {}, b"through the proxy"
    proxy = serve(proxy_answer)
    monkeypatch.setenv("http_proxy", proxy.base.replace("http://", "http://bot:p%40ss%25@"))
    assert resolve._http("http://files.example/vllm.tar.gz") == b"through the proxy"
    path, headers = proxy.asked[-1]
    assert path == "http://files.example/vllm.tar.gz" and headers["proxy-authorization"] == expected


def test_a_mirror_that_redirects_is_followed_within_the_limit(serve):
    def mirror_answer(handler):
        if handler.path.startswith("/hop"):
            left = int(handler.path[4:])
            return 302, {"Location": f"/hop{left - 1}" if left > 1 else "/file"}, b""
        if handler.path == "/loop":
            return 302, {"Location": "/loop"}, b""
        if handler.path == "/nowhere":
            return 302, {}, b""
        return 200, {}, b"the sdist"
    mirror = serve(mirror_answer)
    assert resolve._http(f"{mirror.base}/hop{resolve.REDIRECTS}") == b"the sdist"
    for path, words in (("/loop", f"more than {resolve.REDIRECTS} redirects"),
                        (f"/hop{resolve.REDIRECTS + 1}", "redirects"), ("/nowhere", "HTTP 302")):
        with pytest.raises(PinError) as err:
            resolve._http(f"{mirror.base}{path}")
        assert words in str(err.value) and "\n" not in str(err.value), str(err.value)

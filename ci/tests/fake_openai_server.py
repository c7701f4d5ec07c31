"""A tiny fake of vLLM's streaming OpenAI completions API, for CPU tests of the bench client.

Serves GET /health, GET /v1/models and POST /v1/completions (stream=true: one
SSE event per output token with `token_ids`, then a usage event, then [DONE]).
It stops itself after `max_requests` completions. Run as a script for tests
that start servers as processes:  python3 fake_openai_server.py --port N
"""
from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int = 0, max_requests: int = 100, model: str = "tiny-mla",
                 fail_every: int = 0) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.max_requests = max_requests
        self.model = model
        self.fail_every = fail_every
        self.lock = threading.Lock()
        self.bodies: list[dict] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def count(self, body: dict) -> int:
        with self.lock:
            self.bodies.append(body)
            n = len(self.bodies)
        if n >= self.max_requests:
            threading.Thread(target=self.shutdown, daemon=True).start()
        return n


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeServer

    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass

    def _json(self, status: int, doc: object) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.server.model}]})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        n = self.server.count(body)
        if self.path != "/v1/completions" or body.get("model") != self.server.model:
            self._json(404, {"error": "unknown path or model"})
            return
        if self.server.fail_every and n % self.server.fail_every == 0:
            self._json(500, {"error": "injected failure"})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        prompt = body["prompt"]
        for i in range(int(body["max_tokens"])):
            choice = {"index": 0, "text": "", "token_ids": [(prompt[i % len(prompt)] + i) % 1000],
                      "finish_reason": "length" if i == body["max_tokens"] - 1 else None}
            self._event({"object": "text_completion", "model": self.server.model,
                         "choices": [choice]})
        usage = {"prompt_tokens": len(prompt), "completion_tokens": int(body["max_tokens"]),
                 "total_tokens": len(prompt) + int(body["max_tokens"])}
        self._event({"object": "text_completion", "choices": [], "usage": usage})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _event(self, doc: object) -> None:
        self._chunk(b"data: " + json.dumps(doc).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-requests", type=int, default=1000)
    parser.add_argument("--model", default="tiny-mla")
    args, _ = parser.parse_known_args()
    server = FakeServer(args.port, args.max_requests, args.model)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()

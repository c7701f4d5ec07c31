"""Health of a running server, for container health checks and probes.

    python3 -m rocm_vllm_runtime.health [--generate] [--url URL] [--timeout SECONDS]

vLLM's GET /health answers 200 until its engine has failed. In a deployment across nodes it
does not see a lost node until a request reaches the engine: the head's workers are alive, the
peer is gone. `--generate` therefore also asks the served model for one token, so a lost node
shows without other traffic (the request fails or does not answer within the timeout).

URL: default http://127.0.0.1:$SERVE_PORT (8000). The API key, when the server has one, comes
from VLLM_API_KEY, as the server's own. Exit status 0 healthy, 1 not (one line saying why).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

DEFAULT_TIMEOUT_S = 10.0


def _request(url: str, payload: Mapping | None, api_key: str, timeout: float) -> tuple[int, bytes]:
    data = json.dumps(payload).encode() if payload is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def problem(base: str, generate: bool, api_key: str = "", timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """'' when the server at base is healthy, else why not (one line)."""
    base = base.rstrip("/")
    try:
        status, _ = _request(f"{base}/health", None, api_key, timeout)
        if status != 200:
            return f"{base}/health answered HTTP {status}: the engine has failed (see the server log)"
        if not generate:
            return ""
        status, body = _request(f"{base}/v1/models", None, api_key, timeout)
        if status == 401:
            return f"{base}/v1/models answered HTTP 401: set VLLM_API_KEY to the server's API key"
        if status != 200:
            return f"{base}/v1/models answered HTTP {status}"
        models = json.loads(body).get("data") or []
        if not models:
            return f"{base}/v1/models lists no model"
        model = models[0]["id"]
        status, body = _request(f"{base}/v1/completions", {"model": model, "prompt": [1], "max_tokens": 1,
                                                           "temperature": 0.0}, api_key, timeout)
        if status != 200:
            return (f"{base}/v1/completions answered HTTP {status} for one token of {model}: the engine cannot "
                    "serve (a lost node of a multi-node deployment shows here first; see the server log)")
        choices = json.loads(body).get("choices") or []
        if not choices:
            return f"{base}/v1/completions gave no choice for one token of {model}"
        return ""
    except (TimeoutError, urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{base}: no answer within {timeout:g}s ({reason}): the server is down or hangs"
    except (ValueError, KeyError, TypeError) as exc:
        return f"{base}: not an OpenAI-compatible answer ({exc.__class__.__name__}: {exc})"


def default_url(env: Mapping[str, str]) -> str:
    return f"http://127.0.0.1:{env.get('SERVE_PORT') or '8000'}"


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rocm_vllm_runtime.health",
                                     description="Exit 0 when the server is healthy, 1 (one line) when not.")
    parser.add_argument("--url", default=None, help="server base URL (default http://127.0.0.1:$SERVE_PORT)")
    parser.add_argument("--generate", action="store_true",
                        help="also ask the served model for one token (sees a lost node of a multi-node deployment)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per request (default 10)")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    why = problem(args.url or default_url(env), args.generate, env.get("VLLM_API_KEY", ""), args.timeout)
    if why:
        print(f"unhealthy: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

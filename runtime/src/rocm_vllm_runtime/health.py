"""Health of a running server, for container health checks and probes.

    python3 -m rocm_vllm_runtime.health [--generate] [--url URL] [--timeout SECONDS]

vLLM's GET /health answers 200 until its engine has failed. In a deployment across nodes it
does not see a lost node until a request reaches the engine: the head's workers are alive, the
peer is gone. `--generate` therefore also asks the served model for one token, so a lost node
shows without other traffic (the request fails or does not answer within the timeout).

URL: default http://127.0.0.1:$SERVE_PORT (8000). The API key, when the server has one, comes
from VLLM_API_KEY, as the server's own (never shown). --timeout bounds the whole check, every
request together: a server that answers one byte at a time is cut off at the deadline as well.
--url's port and --timeout (at most a day) are read by rocm_vllm_runtime.numeric; credentials in --url
are refused (the probe sends none) and never shown. Requests go through rocm_vllm_runtime.web.
Exit status 0 healthy, 1 not (one line saying why); 2 for a bad --timeout, --url or SERVE_PORT.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import urllib.error
from collections.abc import Mapping, Sequence

from rocm_vllm_runtime import files, numeric, web
from rocm_vllm_runtime.secret_values import api_key_problem, masked_url

DEFAULT_TIMEOUT_S = 10.0
# The most bytes read of one answer (a model list, a one-token completion): an answer that never ends is
# cut off here, not held whole.
BODY_LIMIT = 4 << 20


def _request(url: str, payload: Mapping | None, api_key: str, timeout: float) -> tuple[int, bytes]:
    data = json.dumps(payload).encode() if payload is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        with web.request(url, data, headers, "POST" if data is not None else "GET", timeout) as resp:
            return resp.status, files.read_bounded(resp, masked_url(url), BODY_LIMIT)
    except urllib.error.HTTPError as exc:
        return exc.code, files.read_bounded(exc, masked_url(url), BODY_LIMIT)


def _object(body: bytes, where: str, key: str) -> tuple[list, str]:
    """(the list under key in a JSON object answer, '') or ([], why the answer is not one)."""
    try:
        doc = files.json_value(body, where)
    except files.DataError as exc:
        if exc.kind == "duplicate":
            return [], f"{exc}: not an OpenAI-compatible server"
        return [], f"{where} answered no JSON: not an OpenAI-compatible server"
    if not isinstance(doc, dict):
        return [], (f"{where} answered a JSON {type(doc).__name__} where an object with {key!r} belongs: "
                    "not an OpenAI-compatible server")
    value = doc.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        return [], f"{where} answered {key!r} that is not a list of objects: not an OpenAI-compatible server"
    return value, ""


def problem(base: str, generate: bool, api_key: str = "", timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """'' when the server at base is healthy, else why not (one line; credentials in base masked)."""
    base = base.rstrip("/")
    return masked_url(_problem(base, generate, api_key, timeout).replace(base, masked_url(base)))


def _problem(base: str, generate: bool, api_key: str, timeout: float) -> str:
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
        models, why = _object(body, f"{base}/v1/models", "data")
        if why:
            return why
        if not models:
            return f"{base}/v1/models lists no model"
        model = models[0].get("id")
        if not isinstance(model, str) or not model:
            return f"{base}/v1/models lists a model without an \"id\": not an OpenAI-compatible server"
        status, body = _request(f"{base}/v1/completions", {"model": model, "prompt": [1], "max_tokens": 1,
                                                           "temperature": 0.0}, api_key, timeout)
        if status != 200:
            return (f"{base}/v1/completions answered HTTP {status} for one token of {model}: the engine cannot "
                    "serve (a lost node of a multi-node deployment shows here first; see the server log)")
        choices, why = _object(body, f"{base}/v1/completions", "choices")
        if why:
            return why
        if not choices:
            return f"{base}/v1/completions gave no choice for one token of {model}"
        return ""
    except (TimeoutError, urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{base}: no answer within {timeout:g}s ({reason}): the server is down or hangs"
    except (ValueError, KeyError, TypeError) as exc:
        return f"{base}: not an OpenAI-compatible answer ({exc.__class__.__name__}: {exc})"


def default_url(env: Mapping[str, str]) -> str:
    try:
        port = numeric.port("SERVE_PORT", env.get("SERVE_PORT") or "8000")
    except numeric.SettingError as exc:
        raise ValueError(f"{exc}: set it to the server's port") from None
    return f"http://127.0.0.1:{port}"


def read_url(url: str) -> tuple[str, str]:
    """(the base URL the probe asks, '') or ('', why url is no server base URL: one line, its
    credentials masked). The port is read as every port setting is: 65536 or more never wraps."""
    shown = masked_url(url)
    try:
        parts = numeric.url("--url", url)
    except numeric.SettingError as exc:
        return "", f"{exc}: give the server's base URL with its scheme, e.g. http://127.0.0.1:8000"
    if parts.path.strip("/") or parts.query or parts.fragment:
        return "", f"--url {shown!r}: give the server's base URL without a path (the probe adds /health)"
    if parts.username is not None:
        return "", (f"--url {shown!r}: give the server's base URL without credentials (the probe sends none; "
                    "the API key comes from VLLM_API_KEY)")
    host = f"[{parts.host}]" if ":" in parts.host else parts.host
    return f"{parts.scheme}://{host}:{parts.port or {'http': 80, 'https': 443}[parts.scheme]}", ""


def within(deadline: float, check, *args) -> str:
    """check(*args), or the line saying it did not finish within deadline seconds (it runs in a
    thread of its own: a server that trickles bytes cannot hold the caller past the deadline)."""
    result: list[str] = []

    def run() -> None:
        try:
            result.append(check(*args))
        except Exception as exc:  # noqa: BLE001  (one line, never a thread's traceback)
            result.append(f"{masked_url(str(args[0]))}: {exc.__class__.__name__}: {masked_url(str(exc))}")

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(deadline)
    if not result:
        return f"{masked_url(str(args[0]))}: no complete answer within {deadline:g}s: the server is down or hangs"
    return result[0]


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rocm_vllm_runtime.health",
                                     description="Exit 0 when the server is healthy, 1 (one line) when not.")
    parser.add_argument("--url", default=None, help="server base URL (default http://127.0.0.1:$SERVE_PORT)")
    parser.add_argument("--generate", action="store_true",
                        help="also ask the served model for one token (sees a lost node of a multi-node deployment)")
    parser.add_argument("--timeout", default=str(DEFAULT_TIMEOUT_S),
                        help="seconds for the whole check, every request together (default 10)")
    args = parser.parse_args(argv)
    try:  # numeric.SettingError is a ValueError
        args.timeout = numeric.duration("--timeout", args.timeout)
        url = args.url or default_url(env)
    except ValueError as exc:
        parser.error(str(exc))
    url, bad_url = read_url(url)
    if bad_url:
        parser.error(bad_url)
    key = env.get("VLLM_API_KEY", "")
    bad_key = api_key_problem(key) if key else ""
    if bad_key:
        print(f"unhealthy: VLLM_API_KEY: {bad_key}", file=sys.stderr)
        return 1
    why = within(args.timeout, problem, url, args.generate, key, args.timeout)
    if why:
        print(f"unhealthy: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

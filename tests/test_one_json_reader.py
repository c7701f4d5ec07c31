"""One reader of JSON (DESIGN: one owner per kind of risky operation): rocm_vllm_runtime.files.json_value
(and read_json / read_bounded around it). json.loads keeps the last of a key given twice, so a hand
merge of versions.json that kept both sides was reported as "not canonical" and `tools.pins format` then
silently dropped one; a body read whole from an HTTP answer that never ends grew until the process
died. So the product's Python (runtime/src, backend/src, ci/, docker/, tools/ and deploy/, without tests; the in-image
suites of runtime/suites included) is read as syntax trees, and these fail outside files.py:

* json.load, json.loads, json.JSONDecoder (however imported);
* .read() with no size of an HTTP answer: a name bound by `with urlopen(...) as name` (or
  `opener.open(...)`), or an HTTPError caught `as name`.

Uses that cannot go through the owner are counted in KNOWN, one entry per file with the reason, so
that a further one fails as well. The scanner is checked against planted uses of each form."""
from __future__ import annotations

import ast

from owner_scan import outside_owner

import pytest

from rocm_vllm_runtime import files

OWNER = "runtime/src/rocm_vllm_runtime/files.py"
JSON_READS = {"load", "loads", "JSONDecoder"}

# (file, form) -> (how many, why)
KNOWN = {
    ("docker/pinned_dists.py", "json"): (1, "its own snapshot file, in a build stage that holds this script alone "
                                               "(no runtime package)"),
}


def _http_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                call = item.context_expr
                if isinstance(call, ast.Call) and isinstance(item.optional_vars, ast.Name):
                    func = ast.unparse(call.func)
                    if func.endswith(("urlopen", ".open")) and "open(" not in func:
                        names.add(item.optional_vars.id)
        if isinstance(node, ast.ExceptHandler) and node.name and node.type is not None \
                and "HTTPError" in ast.unparse(node.type):
            names.add(node.name)
    return names


def uses(source: str) -> list[tuple[str, int, str]]:
    """(form, line, code) of each JSON parse or unbounded HTTP read that is not the owner's."""
    tree = ast.parse(source)
    imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "json" for alias in node.names if alias.name in JSON_READS}
    http = _http_names(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in JSON_READS and ast.unparse(func.value) == "json" \
                or isinstance(func, ast.Name) and func.id in imported:
            found.append(("json", node.lineno, ast.unparse(node)[:80]))
        elif isinstance(func, ast.Attribute) and func.attr == "read" and not node.args and not node.keywords \
                and isinstance(func.value, ast.Name) and func.value.id in http:
            found.append(("http body", node.lineno, ast.unparse(node)))
    return sorted(found, key=lambda use: use[1])


def test_json_and_http_bodies_are_read_only_by_their_owner() -> None:
    wrong, stale = outside_owner(OWNER, uses, KNOWN)
    assert not wrong, ("read JSON through rocm_vllm_runtime.files (json_value, read_json) and HTTP answers through "
                       "files.read_bounded instead:\n" + "\n".join(wrong))
    assert not stale, f"KNOWN entries that no longer match the code: {stale}"


def test_the_scanner_catches_each_form() -> None:
    planted = '''
import json, urllib.request
from json import loads as parse
a = json.loads(text)
with open(p) as f:
    b = json.load(f)
c = parse(text)
with urllib.request.urlopen(url) as resp:
    d = resp.read()
    e = resp.read(100)
try:
    pass
except urllib.error.HTTPError as exc:
    f = exc.read()
with open(p, "rb") as g:
    h = g.read()
i = json.dumps(x)
'''
    found = [(form, line) for form, line, _ in uses(planted)]
    assert found == [("json", 4), ("json", 6), ("json", 7), ("http body", 9), ("http body", 14)], found


# ------------------------------------------------------------------ the owner

@pytest.mark.parametrize("text, key", [
    ('{"a": 1, "a": 2}', "a"),
    ('{"tracks": {"0.32": {}, "0.32": {"x": 1}}}', "0.32"),
    ('[{"b": 1}, {"c": 1, "c": 1}]', "c"),
    ('{"\\u0061": 1, "a": 2}', "a"),  # the same key, written two ways
])
def test_a_key_given_twice_is_refused_naming_it(text, key):
    with pytest.raises(files.DataError) as err:
        files.json_value(text, "versions.json")
    assert str(err.value) == (f"versions.json: the key {key!r} appears twice in one object (a merge that kept both "
                              "sides?): keep one")
    assert err.value.kind == "duplicate"


@pytest.mark.parametrize("text, kind", [("[" * 100000 + "]" * 100000, "depth"), ("[" * 65 + "]" * 65, "depth"),
                                        (b"\xff{}", "utf8"), ("{", "json"), ("", "json"), ("{} x", "json")])
def test_text_that_is_no_json_value_is_one_line(text, kind):
    with pytest.raises(files.DataError) as err:
        files.json_value(text, "f.json")
    assert err.value.kind == kind and str(err.value).startswith("f.json: ") and "\n" not in str(err.value)


@pytest.mark.parametrize("text", ["1" * 4301, "-" + "9" * 4301, '{"source_date_epoch": ' + "1" * 100000 + "}",
                                  "[" + "7" * 5000 + "]"])
def test_an_integer_past_ints_digit_limit_is_one_line(text):
    """int() refuses more than 4,300 digits with a bare ValueError inside json.loads: refused here in
    the owner's one line instead."""
    with pytest.raises(files.DataError) as err:
        files.json_value(text, "f.json")
    assert err.value.kind == "number" and str(err.value).startswith("f.json: an integer of ") \
        and "\n" not in str(err.value), str(err.value)
    assert files.json_value("9" * 4300, "f.json") == int("9" * 4300)


@pytest.mark.parametrize("text", ['"\\ud800"', '{"a": ["x\\udfff"]}', '{"\\udc00": 1}', '"\\ude00\\ud83d"'])
def test_a_lone_surrogate_is_one_line(text):
    """A \\ud800 escape is no character: it cannot be printed or written as UTF-8 later."""
    with pytest.raises(files.DataError) as err:
        files.json_value(text, "versions.json")
    assert err.value.kind == "utf8" and "lone surrogate" in str(err.value) and "\n" not in str(err.value)
    assert files.json_value('"\\ud83d\\ude00"', "f") == "\U0001f600"  # a pair is one character


@pytest.mark.parametrize("text", ['{"tracks": {"\\ud800": {}}}', '{"default_track": "' + "\\udfff" + '"}',
                                  '{"source_date_epoch": ' + "1" * 5000 + "}"])
def test_the_pin_tool_names_a_lone_surrogate_or_a_long_integer_in_one_line(text, tmp_path, capsys):
    from tools.pins.__main__ import main
    path = tmp_path / "versions.json"
    path.write_text(text)
    assert main(["--file", str(path), "verify"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(path) in err, err
    assert "lone surrogate" in err or "an integer of 5000 digits" in err, err


def test_depth_up_to_the_bound_is_read():
    assert files.json_value("[" * files.JSON_DEPTH + "]" * files.JSON_DEPTH, "f") is not None


class Endless:
    """An HTTP answer that never ends."""
    def __init__(self) -> None:
        self.given = 0

    def read(self, n: int = -1) -> bytes:
        assert n > 0, "an unbounded read"
        self.given += n
        return b"x" * n


def test_an_endless_stream_is_cut_off_at_the_limit():
    stream = Endless()
    with pytest.raises(files.DataError) as err:
        files.read_bounded(stream, "http://127.0.0.1:8000/v1/models", limit=1 << 20)
    assert err.value.kind == "size" and "more than 1048576 bytes" in str(err.value)
    assert stream.given <= (1 << 20) + 1


def test_a_file_over_its_limit_or_not_regular_is_refused(tmp_path):
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 1000 + "0]")
    with pytest.raises(files.DataError, match="more than 100 bytes"):
        files.read_json(big, limit=100)
    assert len(files.read_json(big)) == 1001
    fifo = tmp_path / "fifo"
    import os
    os.mkfifo(fifo)
    with pytest.raises(files.DataError, match="FIFO"):
        files.read_json(fifo)


# ------------------------------------------------------------------ answers from outside, at the boundary

class Answers:
    """A server on 127.0.0.1 answering each path with the body given in `bodies` (bytes), or without end
    (None: chunks as fast as they are taken, no length)."""

    def __init__(self, bodies: dict) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                body = bodies.get(self.path.split("?")[0], b"{}")
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if body is None:
                    self.end_headers()
                    try:
                        while True:
                            self.wfile.write(b"[" + b"0," * 32768)
                    except OSError:
                        return
                self.send_header("Content-Length", str(len(body)))
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
def answers():
    made = []

    def start(bodies: dict) -> Answers:
        made.append(Answers(bodies))
        return made[-1]
    yield start
    for server in made:
        server.close()


def test_health_cuts_off_an_answer_that_never_ends(answers):
    from rocm_vllm_runtime import health
    server = answers({"/health": b"", "/v1/models": None})
    why = health.problem(server.base, generate=True, timeout=60)
    assert "more than 4194304 bytes" in why and "/v1/models" in why and "\n" not in why, why


def test_health_refuses_a_models_answer_with_a_key_twice(answers):
    from rocm_vllm_runtime import health
    server = answers({"/health": b"", "/v1/models": b'{"data": [{"id": "a"}], "data": []}'})
    why = health.problem(server.base, generate=True, timeout=10)
    assert "the key 'data' appears twice" in why and "\n" not in why, why


def test_the_accuracy_gate_reads_the_served_model_by_its_schema(answers):
    from rocm_vllm_runtime import accuracy
    server = answers({"/v1/models": b'{"data": [{"id": "/models/tiny"}]}'})
    assert accuracy.served_model(server.base) == "/models/tiny"
    for body, field in ((b'{"data": []}', "data: holds fewer than 1 entries"), (b'{"data": [{"id": 3}]}', "data[0].id"),
                        (b"[]", "the whole: must be an object"), (None, "more than 1048576 bytes")):
        bad = answers({"/v1/models": body})
        with pytest.raises(files.DataError) as err:
            accuracy.served_model(bad.base)
        assert field in str(err.value) and f"{bad.base}/v1/models" in str(err.value), str(err.value)


def _release(**changes) -> dict:
    file = {"packagetype": "sdist", "url": "https://files.example/vllm-0.40.0.tar.gz",
            "filename": "vllm-0.40.0.tar.gz", "yanked": False, "digests": {"sha256": "a" * 64}}
    file.update(changes)
    return file


PYPI_ANSWERS = {
    "no releases": ({"info": {}}, "releases: is missing"),
    "releases a list": ({"releases": []}, "releases: must be an object, not a list"),
    "files a number": ({"releases": {"0.40.0": 3}}, "releases.0.40.0: must be a list, not a number"),
    "a file a string": ({"releases": {"0.40.0": ["vllm.tar.gz"]}}, "releases.0.40.0[0]: must be an object"),
    "no digests": ({"releases": {"0.40.0": [_release(digests=None)]}}, "releases.0.40.0[0].digests: must be an object"),
    "no sha256": ({"releases": {"0.40.0": [_release(digests={"md5": "x"})]}},
                  "releases.0.40.0[0].digests.sha256: is missing"),
    "sha256 a number": ({"releases": {"0.40.0": [_release(digests={"sha256": 5})]}},
                        "releases.0.40.0[0].digests.sha256: must be a string"),
    "url missing": ({"releases": {"0.40.0": [{k: v for k, v in _release().items() if k != "url"}]}},
                    "releases.0.40.0[0].url: is missing"),
    "yanked a string": ({"releases": {"0.40.0": [_release(yanked="no")]}},
                        "releases.0.40.0[0].yanked: must be true or false"),
}


@pytest.mark.parametrize("case", PYPI_ANSWERS)
def test_a_pypi_answer_of_the_wrong_shape_is_one_line_naming_the_field(case, answers, monkeypatch):
    from tools.pins import discover
    from tools.pins.model import PinError
    answer, field = PYPI_ANSWERS[case]
    server = answers({"/vllm/json": json_bytes(answer)})
    with pytest.raises(PinError) as err:
        discover.pypi_sdists(server.base)
    message = str(err.value)
    assert message.startswith(f"{server.base}/vllm/json: {field}") and "\n" not in message, message


def test_a_pypi_answer_that_never_ends_or_holds_a_key_twice_is_one_line(answers):
    from tools.pins import discover
    from tools.pins.model import PinError
    twice = b'{"releases": {}, "releases": {}}'
    for body, words in ((None, "longer than"), (twice, "the key 'releases' appears twice")):
        server = answers({"/vllm/json": body})
        with pytest.raises(PinError) as err:
            discover.pypi_sdists(server.base)
        assert words in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_good_pypi_answer_gives_its_sdists(answers):
    from tools.pins import discover
    answer = {"releases": {"0.40.0": [_release(), _release(packagetype="bdist_wheel")], "0.39.0": [],
                           "0.38.0": [_release(yanked=True)]}}
    server = answers({"/vllm/json": json_bytes(answer)})
    sdists = discover.pypi_sdists(server.base)
    assert list(sdists) == ["0.40.0"] and sdists["0.40.0"].sha256 == "a" * 64


def json_bytes(value) -> bytes:
    import json
    return json.dumps(value).encode()

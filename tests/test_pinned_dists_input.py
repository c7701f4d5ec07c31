"""docker/pinned_dists.py compare reads the snapshot an earlier step wrote: whatever that file
holds, the step gets its comparison or one error line, never a traceback."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.build_scripts import load

pinned_dists = load("pinned_dists")


def compare(tmp_path: Path, content: bytes) -> tuple[int | None, str, BaseException | None]:
    before = tmp_path / "before.json"
    before.write_bytes(content)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return pinned_dists.main(["compare", str(before), "--step", "s"]), err.getvalue(), None
        except BaseException as exc:  # noqa: BLE001 - what the test is about
            return None, err.getvalue(), exc


@pytest.mark.parametrize("content, named", [
    (b"[]", "is not a snapshot of pinned distributions"),
    (b'{"torch": 2}', "is not a snapshot of pinned distributions"),
    (b"[" * 100000, "is not JSON (RecursionError)"),
    (b"\xff{}", "is not JSON (UnicodeDecodeError)"),
    (b'{"torch": "2.13', "is not JSON (JSONDecodeError)"),
], ids=["a list", "a number as version", "nested too deeply", "not UTF-8", "cut"])
def test_a_snapshot_it_did_not_write_is_one_line(content, named, tmp_path):
    rc, err, escaped = compare(tmp_path, content)
    lines = err.strip().splitlines()
    assert escaped is None and rc == 1 and len(lines) == 1 and named in lines[0], (escaped, err)
    assert "pinned_dists.py snapshot again" in lines[0]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10)


@settings(derandomize=True, max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_JSON)
def test_any_snapshot_is_compared_or_refused_in_one_line(value, tmp_path_factory):
    rc, err, escaped = compare(tmp_path_factory.mktemp("snap"), json.dumps(value).encode())
    assert escaped is None, f"{type(escaped).__name__}: {escaped}"
    assert rc in (0, 1) and all(line.startswith("pinned-dists: ERROR: ") for line in err.strip().splitlines()), err

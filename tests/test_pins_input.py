"""The pin tool's reading of the versions file (the schema check every command runs first, then
verify and args) on values the schema lets through, and on arbitrary JSON anywhere: a result,
or error lines naming the field, never a traceback and never "None" as a build argument."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.pins import model
from tools.pins.__main__ import main
from json_cases import JSON, paths, replaced

ROOT = Path(__file__).resolve().parents[1]
DATA = model.load(ROOT / "versions.json")


def pins(tmp_path: Path, data, *command: str) -> tuple[int, str, str, object]:
    """(exit status, stdout, stderr, what escaped main) of the pin tool on data, written canonically
    when it is an object."""
    path = tmp_path / "versions.json"
    path.write_text(model.canonical(data) if isinstance(data, dict) else json.dumps(data))
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    escaped = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["--file", str(path), *command])
        except BaseException as exc:  # noqa: BLE001 - what the test is about
            rc, escaped = None, exc
    return rc, out.getvalue(), err.getvalue(), escaped


@pytest.mark.parametrize("key", ["\x85", "a\nb", "\u2028", "x\ry"])
def test_a_key_holding_a_line_break_is_shown_escaped_in_its_one_line(key, tmp_path):
    """An unknown key with a character that breaks lines (NEL, LINE SEPARATOR, CR, LF) is named
    escaped, so that every problem stays one line."""
    data = copy.deepcopy(DATA)
    data[key] = None
    rc, out, err, escaped = pins(tmp_path, data, "verify")
    assert escaped is None and rc == 1
    lines = err.splitlines()
    assert all(line.startswith("error: ") for line in lines[:-1]) and lines[-1].endswith("error(s)"), err
    assert any(ascii(key)[1:-1] in line for line in lines), err


@pytest.mark.parametrize("epoch", [2**63, 2**40, 0, 315532799, 4102444801])
def test_verify_bounds_source_date_epoch(epoch, tmp_path):
    """The build sets every mtime with `touch -d @N` and builds wheels (zip entries from 1980):
    an epoch outside 1980..2100 is refused by verify, naming the field, not by the build."""
    data = copy.deepcopy(DATA)
    data["source_date_epoch"] = epoch
    rc, out, err, escaped = pins(tmp_path, data, "verify")
    assert escaped is None and rc == 1, (out, err)
    assert ("error: source_date_epoch: must be at least 315532800" if epoch < 315532800 else
            "error: source_date_epoch: must be at most 4102444800") in err, err


def test_verify_refuses_an_epoch_written_as_a_decimal(tmp_path):
    """1787222487.0 is an integer to JSON Schema but "1787222487.0" to both Dockerfiles' ARG and
    refused only after AITER's compile: the schema's "integer" is an integer as JSON writes one."""
    data = copy.deepcopy(DATA)
    data["source_date_epoch"] = float(DATA["source_date_epoch"])
    rc, out, err, escaped = pins(tmp_path, data, "verify")
    assert escaped is None and rc == 1, (out, err)
    assert "error: source_date_epoch: must be an integer, not a decimal number" in err, err


@pytest.mark.parametrize("epoch", [315532800, DATA["source_date_epoch"], 4102444800])
def test_verify_takes_an_epoch_in_range(epoch, tmp_path):
    data = copy.deepcopy(DATA)
    data["source_date_epoch"] = epoch
    rc, out, err, escaped = pins(tmp_path, data, "verify")
    assert escaped is None and "source_date_epoch" not in err, err


def test_args_print_an_unresolved_rocm_version_as_unresolved(tmp_path):
    """Like every other unresolved pin (rocm.version listed in rocm.unresolved), not as None."""
    data = copy.deepcopy(DATA)
    data["rocm"]["version"] = None
    data["rocm"]["unresolved"] = ["version"]
    track = next(n for n in model.track_names(data) if "rocm" not in data["tracks"][n])  # one on the shared rocm
    rc, out, err, escaped = pins(tmp_path, data, "args", "--allow-unresolved", "--track", track)
    assert escaped is None and rc == 0, err
    assert f"ROCM_VERSION={model.UNRESOLVED}" in out.splitlines(), out
    assert "None" not in out


_PATHS = list(paths(DATA))


@settings(derandomize=True, max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(path=st.sampled_from(_PATHS), value=JSON | st.sampled_from([2**63, -1, 0, "²", "", "UNRESOLVED"]),
       command=st.sampled_from([["verify"], ["args"], ["args", "--allow-unresolved"], ["tracks"]]))
def test_any_versions_file_is_read_or_refused_in_error_lines(path, value, command, tmp_path_factory):
    """Arbitrary JSON at any key of versions.json (or as all of it): exit 0, or exit 1 with every
    line of stderr an error line; nothing escapes; args never prints None."""
    data = replaced(DATA, path, value)
    rc, out, err, escaped = pins(tmp_path_factory.mktemp("pins"), data, *command)
    assert escaped is None, f"{type(escaped).__name__}: {escaped}"
    assert rc in (0, 1), (rc, err)
    if rc == 1:
        lines = err.strip().splitlines()
        assert lines and all(line.startswith("error: ") or line.endswith("error(s)") for line in lines), err
    if command[0] == "args":
        assert "None" not in out, out

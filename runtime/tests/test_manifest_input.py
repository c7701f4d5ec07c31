"""The image manifest's readers on bad input: `manifest base` (its --aiter-pins file and build
args), `manifest show` (a manifest holding anything). Each gives its result or one line naming
what to change, never a traceback."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from json_cases import JSON, paths, replaced
from rocm_vllm_runtime import manifest as mf

COMMIT, CK = "a" * 40, "b" * 40
VERIFIED_AITER = {"repository": "https://github.com/ROCm/aiter.git", "tag": "v0.1.24.post1", "commit": COMMIT,
              "ck_commit": CK, "pinned": True}
BUILD_ARGS = {"ROCM_VERSION": "7.2.3", "PYTHON_VERSION": "3.12", "GPU_ARCHS": "gfx942;gfx950",
              "SOURCE_DATE_EPOCH": "1700000000", "VLLM_TRACK": "0.33", "VLLM_VERSION": "0.33.0"}


def base(tmp_path, capsys, pins, **env) -> tuple[int, str, str]:
    text = pins if isinstance(pins, str) else json.dumps(pins)
    (tmp_path / "pins.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    (tmp_path / "modules.txt").write_text("module_mla_asm\n")
    rc = mf.main(["base", "--aiter-pins", str(tmp_path / "pins.json"), "--modules", str(tmp_path / "modules.txt"),
                  "--out", str(tmp_path / "manifest.json")], env={**BUILD_ARGS, **env})
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_pins_aiter_source_writes_make_a_manifest(tmp_path, capsys):
    rc, out, err = base(tmp_path, capsys, VERIFIED_AITER)
    assert rc == 0, err
    assert mf.read_manifest(tmp_path / "manifest.json").aiter_commit == COMMIT


@pytest.mark.parametrize("pins, env, named", [
    ([VERIFIED_AITER], {}, "--aiter-pins: a JSON object of repository, tag, commit, ck_commit, pinned is expected, "
                       "not a list"),
    ({**{k: v for k, v in VERIFIED_AITER.items() if k != "commit"}, "comit": COMMIT}, {},
     "--aiter-pins: unknown key 'comit'"),
    ({k: v for k, v in VERIFIED_AITER.items() if k != "ck_commit"}, {}, "--aiter-pins: no 'ck_commit'"),
    ({**VERIFIED_AITER, "commit": 7}, {}, "--aiter-pins: 'commit' must be a string or null"),
    ({**VERIFIED_AITER, "pinned": "yes"}, {}, "--aiter-pins: 'pinned' must be true or false"),
    ({**VERIFIED_AITER, "commit": None}, {}, "--aiter-pins: 'pinned' is true but 'commit' is null"),
    (VERIFIED_AITER, {"SOURCE_DATE_EPOCH": "²"},
     "SOURCE_DATE_EPOCH='²' is not a whole number: give 315532800 to 4102444800 in decimal digits: set the build arg"),
    (VERIFIED_AITER, {"SOURCE_DATE_EPOCH": "١٧٠٠"}, "SOURCE_DATE_EPOCH='١٧٠٠' is not a whole number"),
    (VERIFIED_AITER, {"SOURCE_DATE_EPOCH": str(2**63)},
     f"SOURCE_DATE_EPOCH='{2**63}' is out of range: give 315532800 to 4102444800: set the build arg"),
    (VERIFIED_AITER, {"SOURCE_DATE_EPOCH": "0"}, "SOURCE_DATE_EPOCH='0' is out of range: give 315532800 to 4102444800"),
    (VERIFIED_AITER, {"SOURCE_DATE_EPOCH": "9" * 5000},
     f"SOURCE_DATE_EPOCH='{'9' * 40}'... (5000 characters) is out of range: give 315532800 to 4102444800"),
    ("[" * 100000, {}, "pins.json is nested too deeply to be one: build the aiter-verified stage"),
    ("\udcff", {}, "pins.json is not UTF-8 text (byte 0)"),
], ids=["a list", "misspelt commit", "no ck_commit", "commit a number", "pinned a string", "pinned without a commit",
        "superscript epoch", "arabic-indic epoch", "epoch 2**63", "epoch 0", "epoch of 5000 digits",
        "nested too deeply", "not UTF-8"])
def test_bad_base_inputs_are_one_line_naming_what_to_change(pins, env, named, tmp_path, capsys):
    rc, out, err = base(tmp_path, capsys, pins, **env)
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1 and named in lines[0], err
    assert not (tmp_path / "manifest.json").exists()


_SETTINGS = settings(derandomize=True, max_examples=150, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@_SETTINGS
@given(key=st.sampled_from([None, *VERIFIED_AITER, "comit"]), value=JSON,
       epoch=st.sampled_from(["", "0", "1700000000", "²", "-1", "1e9", " 1", "٣"]))
def test_any_aiter_pins_is_a_manifest_or_one_line(key, value, epoch, tmp_path_factory, capsys):
    """Arbitrary JSON as --aiter-pins (or as one of its keys), with odd SOURCE_DATE_EPOCHs: exit 0
    with a manifest whose aiter.pinned is true only with both commits, or one line and exit 1."""
    pins = value if key is None else {**VERIFIED_AITER, key: value}
    tmp_path = tmp_path_factory.mktemp("base")
    rc, out, err = base(tmp_path, capsys, pins, SOURCE_DATE_EPOCH=epoch)
    if rc == 0:
        written = mf.read_manifest(tmp_path / "manifest.json")
        assert not written.aiter.pinned or (written.aiter.commit and written.aiter.ck_commit), written.aiter
    else:
        assert rc == 1 and len(err.strip().splitlines()) == 1 and err.startswith("manifest: ERROR: "), err


def _manifest() -> dict:
    m = mf.base_part(BUILD_ARGS, VERIFIED_AITER, ["module_mla_asm"], lookup=lambda *names: None,
                     torch_requires=lambda name: [])
    return json.loads(mf.dumps(m))


_MANIFEST = _manifest()


@_SETTINGS
@given(path=st.sampled_from(list(paths(_MANIFEST))), value=JSON)
def test_any_manifest_is_read_or_refused_in_one_line(path, value):
    """parse_manifest (what `manifest show`, the guard and the self-tests read through) on a
    manifest with arbitrary JSON at any key: a Manifest, or ManifestError in one line."""
    doc = replaced(_MANIFEST, path, value)
    try:
        mf.parse_manifest(doc)
    except mf.ManifestError as exc:
        assert "\n" not in str(exc), str(exc)


@pytest.mark.parametrize("kind", ["fifo", "device", "big", "long integer", "lone surrogate"])
def test_a_manifest_that_is_no_bounded_regular_file_is_one_line(kind, tmp_path):
    """The manifest is read by the one JSON reader (files.read_json): a FIFO there (which would hang
    every container start), a device (/dev/zero: a MemoryError), a file past MANIFEST_LIMIT, an
    integer past int()'s digits, a lone surrogate: ManifestError in one line, at once."""
    import os
    path = tmp_path / "manifest.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = "/dev/zero"
    elif kind == "big":
        path.write_text(" " * (mf.MANIFEST_LIMIT + 1) + "{}")
    elif kind == "long integer":
        path.write_text('{"schema": ' + "1" * 4301 + "}")
    else:
        path.write_text('{"schema": 1, "origin": "\\udc00"}')
    with pytest.raises(mf.ManifestError) as err:
        mf.read_manifest(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value), str(err.value)
    assert str(err.value).endswith(f"set {mf.MANIFEST_ENV} to the image's manifest"), str(err.value)

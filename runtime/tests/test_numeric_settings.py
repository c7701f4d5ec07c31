"""Numbers from settings: one reading (rocm_vllm_runtime.numeric) for every number, port,
duration and tolerance the serving benchmark, the accuracy gate and the health probe take. Each
entry point is driven with each bad value: it stops with status 2 in one line naming the setting,
never a traceback, never starting anything (a gate that cannot fail, nan, is refused). Only plain
decimal forms are read ("++8011", "1e3", "1_000", non-ASCII digits are refused) and every setting
is bounded (ports 1-65535, durations at most a day, counts at most what each names): a value of
5000 digits or 1e10 seconds is one line, never an int() or overflow traceback. The reading's
properties: test_numbers_properties.py."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rocm_vllm_runtime import accuracy, bench, numeric

LONG = "9" * 5000  # past int()'s 4300-digit limit
BAD_WHOLE = ["abc", "nan", "1.5", "-3", " 8", "1e3", "++8", "1_000", "\u0663", LONG]  # (empty: the default)
BAD_PORT = [*BAD_WHOLE, "0", "65536", "99999999999999999999"]
BAD_DURATION = ["abc", "nan", "inf", "-inf", "0", "-5", " 3", "1e10", "99999999", "86401", "1_0", LONG]
BAD_TOLERANCE = ["nan,nan", "inf,0", "-1,0", "0.5,-0.1", "0.5", "0.5,0.1,1", "a,b"]
BAD_FRACTION = ["0", "1", "nan", "-0.5", "2", "x"]

# entry point (module, how a setting is given) -> [(setting, bad values)]
ENTRY_POINTS = {
    "bench": [("BENCH_PORT", BAD_PORT), ("BENCH_START_TIMEOUT", BAD_DURATION), ("BENCH_NUM_PROMPTS", BAD_WHOLE),
              ("BENCH_INPUT_LEN", BAD_WHOLE), ("BENCH_OUTPUT_LEN", BAD_WHOLE),
              ("BENCH_CONCURRENCY", [*BAD_WHOLE, "0"]), ("BENCH_SEED", BAD_WHOLE),
              ("BENCH_WARMUPS", BAD_WHOLE)],
    "accuracy": [("ACCURACY_PORT", BAD_PORT), ("ACCURACY_START_TIMEOUT", BAD_DURATION),
                 ("ACCURACY_LL_TOLERANCE", BAD_TOLERANCE), ("ACCURACY_ALPHA", BAD_FRACTION),
                 ("ACCURACY_LIMIT", BAD_WHOLE), ("ACCURACY_NUM_FEWSHOT", BAD_WHOLE),
                 ("ACCURACY_CONCURRENCY", [*BAD_WHOLE, "0"])],
    "health": [("SERVE_PORT", BAD_PORT)],
}


def _run(module: str, env: dict[str, str], *args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("BENCH_", "ACCURACY_", "SERVE_"))}
    return subprocess.run([sys.executable, "-m", f"rocm_vllm_runtime.{module}", *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("module", list(ENTRY_POINTS))
def test_every_number_setting_of_every_entry_point_refuses_bad_values(module, tmp_path):
    for setting, bad_values in ENTRY_POINTS[module]:
        for bad in bad_values:
            env = {setting: bad}
            if module == "accuracy":  # data present: the settings are what fails
                env["ACCURACY_DATA"] = str(tmp_path)
            proc = _run(module, env, cwd=tmp_path)
            assert proc.returncode == 2, (setting, bad, proc.returncode, proc.stdout[-500:], proc.stderr[-500:])
            assert setting in proc.stderr and "Traceback" not in proc.stderr, (setting, bad, proc.stderr)
            assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr  # argparse: usage + one line
            assert "== " not in proc.stdout, (setting, bad, "a server was started")


@pytest.mark.parametrize("option,bad", [("--port", "abc"), ("--port", "0"), ("--start-timeout", "nan"),
                                        ("--start-timeout", "-1"), ("--port", "++8011"), ("--port", LONG),
                                        ("--start-timeout", "1e10"), ("--start-timeout", "99999999")])
def test_the_options_are_read_as_their_settings(option, bad, tmp_path):
    for module in ("bench", "accuracy"):
        proc = _run(module, {"ACCURACY_DATA": str(tmp_path)}, option, bad, cwd=tmp_path)
        assert proc.returncode == 2 and option in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("bad", BAD_DURATION)
def test_health_timeout(bad, tmp_path):
    proc = _run("health", {}, f"--timeout={bad}", cwd=tmp_path)
    assert proc.returncode == 2 and "--timeout" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_accuracy_backends_names_its_own_setting(tmp_path):
    proc = _run("accuracy", {"ACCURACY_BACKENDS": "foo", "ACCURACY_DATA": str(tmp_path)}, cwd=tmp_path)
    assert proc.returncode == 2 and "ACCURACY_BACKENDS" in proc.stderr and "BENCH_BACKENDS" not in proc.stderr


def test_the_readings():
    assert numeric.whole("N", "8", 1, 10) == 8 and numeric.port("P", "65535") == 65535
    assert numeric.duration("T", "0.5") == 0.5 and numeric.pair("L", "0.5,0.02") == (0.5, 0.02)
    assert numeric.real("A", "0.01", 0, 1, open_low=True, open_high=True) == 0.01
    with pytest.raises(numeric.SettingError, match=r"^L='nan,nan' is not A,B: two numbers from 0 to"):
        numeric.pair("L", "nan,nan")


@pytest.mark.parametrize("setting,too_many", [("BENCH_NUM_PROMPTS", "1000001"), ("BENCH_CONCURRENCY", "65537"),
                                              ("BENCH_INPUT_LEN", "1048577"), ("BENCH_SEED", "4294967296"),
                                              ("BENCH_WARMUPS", "1001")])
def test_every_count_has_a_stated_maximum(setting, too_many):
    with pytest.raises(bench.BenchError, match=rf"^{setting}='{too_many}' is out of range: give \d+ to \d+$"):
        bench.Load.from_env({setting: too_many})


@pytest.mark.parametrize("setting,too_many", [("ACCURACY_LIMIT", "1000001"), ("ACCURACY_NUM_FEWSHOT", "101"),
                                              ("ACCURACY_CONCURRENCY", "4097")])
def test_every_accuracy_count_has_a_stated_maximum(setting, too_many):
    with pytest.raises(accuracy.AccuracyError, match=rf"^{setting}='{too_many}' is out of range"):
        accuracy.Settings.from_env({setting: too_many})

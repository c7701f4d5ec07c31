"""Secrets never reach what is printed: one masking (rocm_vllm_runtime.secret_values.masked) of every
secret-bearing option and variable, used by every command line the runtime prints (the serve
launcher, the serving benchmark's and the accuracy gate's servers, the selftest suites)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from rocm_vllm_runtime import accuracy, bench, secret_values, selftest, serve

SRC = Path(secret_values.__file__).parent
SECRET = "sk-very-secret-value-123"

# every form a secret takes on a command line -> what is printed instead
FORMS = [
    (["--api-key", SECRET], ["--api-key", "***"]),
    (["--api-key", SECRET, "second-key-456", "--port", "1"], ["--api-key", "***", "***", "--port", "1"]),
    ([f"--api-key={SECRET}"], ["--api-key=***"]),
    (["--hf-token", SECRET, "--model", "m"], ["--hf-token", "***", "--model", "m"]),
    ([f"--hf_token={SECRET}"], ["--hf_token=***"]),
    (["--token", SECRET], ["--token", "***"]),
    (["--s3-secret", SECRET], ["--s3-secret", "***"]),
    (["--db-password", SECRET], ["--db-password", "***"]),
    (["--aws-access-key", SECRET], ["--aws-access-key", "***"]),
    ([f"HF_TOKEN={SECRET}", "vllm"], ["HF_TOKEN=***", "vllm"]),
    (["-e", f"VLLM_API_KEY={SECRET}"], ["-e", "VLLM_API_KEY=***"]),
    ([f"MY_SECRET={SECRET}"], ["MY_SECRET=***"]),
    # not secrets: left as they are
    (["--max-num-batched-tokens", "8192", "--kv-cache-dtype", "fp8", "--tokenizer", "t", "--ssl-keyfile", "k.pem"],
     ["--max-num-batched-tokens", "8192", "--kv-cache-dtype", "fp8", "--tokenizer", "t", "--ssl-keyfile", "k.pem"]),
    (["--hf-token", "--model", "m"], ["--hf-token", "--model", "m"]),
]


@pytest.mark.parametrize("args,printed", FORMS)
def test_every_secret_form_is_masked(args, printed):
    assert secret_values.masked(args) == printed
    assert SECRET not in secret_values.shown(args)


def test_secret_values_and_mask_text():
    args = ["--model", "m", "--hf-token", SECRET, "--api-key=other-secret-789"]
    found = secret_values.secret_values(args, {"HF_TOKEN": "env-token-000", "PATH": "/usr/bin"})
    assert set(found) == {SECRET, "other-secret-789", "env-token-000"}
    text = f"args: {{'hf_token': '{SECRET}', 'api_key': ['other-secret-789']}} HF=env-token-000"
    assert secret_values.mask_text(text, found) == "args: {'hf_token': '***', 'api_key': ['***']} HF=***"


def test_no_module_prints_a_command_line_but_through_the_masking():
    """Every command line printed by the runtime goes through secret_values.shown: no other module joins
    a command for printing."""
    for path in SRC.glob("*.py"):
        if path.name == "secret_values.py":
            continue
        text = path.read_text()
        joined = r"shlex\.join\(|' '\.join\((?:command|cmd|argv)|\" \"\.join\((?:command|cmd|argv)"
        assert not re.search(joined, text), path.name


class Stop(Exception):
    pass


def test_every_entry_point_that_starts_a_process_prints_it_masked(monkeypatch, capsys, tmp_path):
    args = ["--model", "m", "--host", "0.0.0.0", "--api-key", SECRET, "--hf-token", SECRET]

    # the serve launcher's start-up line (then execv)
    monkeypatch.setattr(serve.os, "execv", lambda *a: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        serve.main(args)
    # the benchmark's and the accuracy gate's server lines (then Popen)
    def no_process(*a, **kw):
        raise Stop()

    monkeypatch.setattr(subprocess, "Popen", no_process)
    backend = bench.Backend("plugin", "ROCM_AITER_MLA", bench.OURS)
    with pytest.raises(Stop):
        bench.run_backend(backend, args, bench.Load(), 1, tmp_path, 1.0)
    with pytest.raises(Stop):
        accuracy.run_backend(backend, args, [], accuracy.Settings(), 1, tmp_path, 1.0)
    # a selftest suite's pytest line (arguments after -- reach it)
    monkeypatch.setattr(subprocess, "call", lambda *a, **kw: (_ for _ in ()).throw(Stop()))
    (tmp_path / "test_selector.py").write_text("")
    with pytest.raises(Stop):
        selftest.run_suite("selector", tmp_path, ["--api-key", SECRET], tmp_path)
    out = capsys.readouterr()
    printed = out.out + out.err
    assert printed.count("***") >= 7, printed
    assert SECRET not in printed, printed

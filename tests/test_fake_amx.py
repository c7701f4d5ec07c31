"""tests/fake_amx/sitecustomize.py, the AMX hook every engine, server and container of the tests runs
with: it patches torch only as vLLM's CPU platform module loads. A process that never loads it (the
entrypoint guard, a health probe, the self-test command line) does not import torch; one that loads
it sees the fake answer from the platform's file only. That the platform then picks AMX_MLA unless
CPU_MLA is named is held in a real engine by backend/tests/engine/test_cpu_selection.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HOOK = Path(__file__).resolve().parent / "fake_amx"


def run(code: str, fake: str = "1") -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")])),
           "ROCM_VLLM_FAKE_AMX": fake}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_a_process_that_never_loads_the_platform_does_not_import_torch():
    assert run("import sys, sitecustomize, json, rocm_vllm_runtime.health\n"
               "print(sitecustomize.__file__, 'torch' in sys.modules)") == f"{HOOK / 'sitecustomize.py'} False"


# the platform's file as vLLM's loader runs it: a module of that name whose code names that file (a
# stand-in vllm package, found before the installed one, so that the test does not import vLLM)
PLATFORM_CALL = """
import importlib.abc, importlib.machinery, sys, torch
real = torch.cpu._is_amx_tile_supported()
class Loader(importlib.abc.Loader):
    def create_module(self, spec): return None
    def exec_module(self, module):
        if module.__name__ == "vllm.platforms.cpu":
            exec(compile("import torch\\nanswer = torch.cpu._is_amx_tile_supported()", "/x/vllm/platforms/cpu.py",
                         "exec"), module.__dict__)
class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "vllm":
            return importlib.machinery.ModuleSpec(name, Loader(), is_package=name != "vllm.platforms.cpu")
sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder), Finder())
import vllm.platforms.cpu as cpu
fake = torch.cpu._is_amx_tile_supported.__qualname__.startswith("_fake_amx.")
print(cpu.answer, torch.cpu._is_amx_tile_supported() == real, fake)
"""


def test_the_platforms_file_sees_amx_tiles_and_every_other_caller_the_real_cpu():
    assert run(PLATFORM_CALL) == "True True True"


def test_off_the_platform_sees_the_real_cpu():
    real = run("import torch; print(torch.cpu._is_amx_tile_supported())", fake="0")
    assert run(PLATFORM_CALL, fake="0") == f"{real} True False"

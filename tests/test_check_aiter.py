"""ci/docker/check_aiter.py on fake wheels (no GPU, no ROCm)."""
import importlib.util
import zipfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "ci" / "docker" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = load("check_aiter")
MODULES = ["module_mla_asm", "module_mla_metadata", "module_mla_reduce"]


def wheel(tmp_path, sos, archs):
    path = tmp_path / "aiter-0.1.20.post1-cp312-cp312-linux_x86_64.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("aiter/__init__.py", "")
        for so in sos:
            zf.writestr(f"aiter/jit/{so}.so", b"\x7fELF")
        for arch in archs:
            zf.writestr(f"aiter_meta/hsa/{arch}/mla/mla_a16w16_qh16.co", b"")
    return path


def test_complete_wheel_passes(tmp_path):
    w = wheel(tmp_path, MODULES + ["module_cache"], ["gfx942", "gfx950"])
    assert check.check_wheel(w, MODULES, ["gfx942", "gfx950"]) == []
    assert check.main(["wheel", str(w), "--modules", " ".join(MODULES), "--archs", "gfx942;gfx950"]) == 0


def test_missing_mla_module_fails_and_names_it(tmp_path, capsys):
    w = wheel(tmp_path, MODULES[:1], ["gfx942"])
    assert check.main(["wheel", str(w), "--modules", " ".join(MODULES), "--archs", "gfx942"]) == 1
    err = capsys.readouterr().err
    assert "module_mla_metadata.so" in err and "module_mla_reduce.so" in err and "PREBUILD_KERNELS=1" in err


def test_missing_arch_kernels_fail(tmp_path):
    w = wheel(tmp_path, MODULES, ["gfx942"])
    problems = check.check_wheel(w, MODULES, ["gfx942", "gfx950"])
    assert len(problems) == 1 and "gfx950" in problems[0] and "gpu_archs" in problems[0]


def test_libs_check_finds_unresolved_library(tmp_path):
    site = tmp_path / "site"
    (site / "aiter" / "jit").mkdir(parents=True)
    assert check.check_libs(site, []), "an empty jit directory must fail"
    real = next(p for p in ("/usr/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1")
                if Path(p).exists())
    good = site / "aiter" / "jit" / "module_ok.so"
    good.write_bytes(Path(real).read_bytes())
    assert check.check_libs(site, []) == []
    bad = site / "aiter" / "jit" / "module_bad.so"
    bad.write_bytes(b"not an elf file")
    problems = check.check_libs(site, [])
    assert len(problems) == 1 and "module_bad.so" in problems[0]

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


def test_kernels_check_wiring(tmp_path, capsys):
    """`check_aiter.py kernels` runs aiter_kernel_table.check: a pin without a table and an AITER
    whose dispatch code differs from the encoded rules both stop in one line (the table rows
    themselves are tested in backend/tests/test_kernel_table.py and test_aiter_src_docker.py)."""
    src = tmp_path / "aiter"
    csv = src / "hsa" / "gfx942" / "mla" / "mla_asm.csv"
    csv.parent.mkdir(parents=True)
    csv.write_text("qType,kvType,Gqa,ps,qSeqLen,prefill,causal,lse,knl_name,co_name\n"
                   "bf16,bf16,16,1,4,0,1,0,_ZN5aiter1kE,k.co\n")
    tables = ROOT / "backend" / "src" / "vllm_aiter_mla" / "kernel_tables"
    assert check.main(["kernels", str(src), "--tag", "v9.9.9", "--tables", str(tables)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no MLA kernel table for AITER v9.9.9" in err
    assert "aiter_kernel_table.py derive AITER_CHECKOUT --tag v9.9.9" in err
    assert check.main(["kernels", str(src), "--tag", "v0.1.20.post1", "--tables", str(tables)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "dispatch code differs" in err and "aiter/mla.py: mla_decode_fwd" in err

"""docker/check_aiter.py on fake wheels (no GPU, no ROCm)."""
import zipfile
from pathlib import Path

from tools.build_scripts import load

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


HEADER = "qType,kvType,Gqa,ps,qSeqLen,prefill,causal,lse,knl_name,co_name"
ROWS = {"gfx942": ["bf16,bf16,16,1,4,0,1,0,_ZN5aiter2psE,mla_a16w16_ps.co",
                   "bf16,bf16,128,0,0,0,1,0,_ZN5aiter3anyE,MLA_A16W16_QH128.co"],
        "gfx950": ["fp8,fp8,32,1,4,0,1,0,_ZN5aiter3h32E,mla_a8w8_qh32_ps.co"]}


def kernel_tree(root, rows=None, header=HEADER, co=True, name="mla_asm.csv"):
    """ROOT/hsa/<arch>/mla/NAME per arch with the code objects its rows name (co=False: none)."""
    for arch, lines in (ROWS if rows is None else rows).items():
        folder = root / "hsa" / arch / "mla"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("\n".join(([header] if header else []) + lines) + "\n")
        if co:
            for line in lines:
                (folder / line.split(",")[-1]).write_bytes(b"\x7fELF")
    return root


def only_problem(root, archs=("gfx942", "gfx950")):
    problems = check.check_kernel_lists(root, list(archs))
    assert len(problems) == 1, problems
    return problems[0]


def test_kernel_lists_with_their_code_objects_pass(tmp_path, capsys):
    root = kernel_tree(tmp_path / "aiter")
    assert check.check_kernel_lists(root, ["gfx942", "gfx950"]) == []
    assert check.main(["kernel-lists", str(root), "--archs", "gfx942;gfx950"]) == 0
    assert "aiter-check: OK (kernel-lists)" in capsys.readouterr().out


def test_a_missing_kernel_list_fails(tmp_path, capsys):
    root = kernel_tree(tmp_path / "aiter")
    (root / "hsa" / "gfx950" / "mla" / "mla_asm.csv").unlink()
    assert check.main(["kernel-lists", str(root), "--archs", "gfx942;gfx950"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("aiter-check: ERROR: ") and "no MLA kernel list (*.csv) for gfx950" in line
    assert "remove gfx950 from gpu_archs in versions.json" in line


def test_an_empty_kernel_list_fails(tmp_path):
    root = kernel_tree(tmp_path / "aiter", rows={**ROWS, "gfx942": []})
    line = only_problem(root)
    assert "gfx942/mla/mla_asm.csv (gfx942): MLA kernel list without rows" in line and "gpu_archs" in line
    (root / "hsa" / "gfx942" / "mla" / "mla_asm.csv").write_text("")
    assert "without a header and rows" in only_problem(root)


def test_a_listed_code_object_that_is_absent_fails(tmp_path):
    root = kernel_tree(tmp_path / "aiter")
    (root / "hsa" / "gfx942" / "mla" / "MLA_A16W16_QH128.co").unlink()
    line = only_problem(root)
    assert "(gfx942): 1 code object(s) it lists are missing beside it (MLA_A16W16_QH128.co)" in line
    assert "mla_a16w16_ps.co" not in line and "gpu_archs" in line


def test_an_arch_without_a_folder_fails(tmp_path):
    root = kernel_tree(tmp_path / "aiter")
    line = only_problem(root, ("gfx942", "gfx950", "gfx1250"))
    assert "hsa/gfx1250/mla: no MLA kernel folder for gfx1250" in line
    assert "remove gfx1250 from gpu_archs in versions.json" in line
    assert check.main(["kernel-lists", str(root), "--archs", ";"]) == 1  # no arch at all is no pass either


def test_code_objects_are_found_by_their_values_when_no_column_is_named_co_name(tmp_path):
    """Another header: the column whose values end in .co names the code objects; with none, the
    folder holding a code object is enough."""
    root = kernel_tree(tmp_path / "aiter", header="q,kv,heads,ps,qlen,prefill,causal,lse,symbol,object")
    assert check.check_kernel_lists(root, ["gfx942", "gfx950"]) == []
    (root / "hsa" / "gfx950" / "mla" / "mla_a8w8_qh32_ps.co").unlink()
    assert "missing beside it (mla_a8w8_qh32_ps.co)" in only_problem(root)
    bare = {"gfx942": ["bf16,bf16,16"]}
    other = kernel_tree(tmp_path / "other", rows=bare, header="q,kv,heads", co=False)
    assert "no code objects (*.co) beside this MLA kernel list" in only_problem(other, ["gfx942"])
    (other / "hsa" / "gfx942" / "mla" / "any.co").write_bytes(b"")
    assert check.check_kernel_lists(other, ["gfx942"]) == []


def test_every_kernel_list_of_the_folder_is_read(tmp_path):
    root = kernel_tree(tmp_path / "aiter")
    kernel_tree(root, rows={"gfx950": ["fp8,fp8,64,1,1,0,1,0,_ZN5aiter2v4E,mla_v4.co"]}, co=False,
                name="mla_v4_asm.csv")
    assert "mla_v4_asm.csv (gfx950): 1 code object(s) it lists are missing beside it (mla_v4.co)" in only_problem(root)


def test_names_leaving_the_folder_are_refused(tmp_path):
    root = kernel_tree(tmp_path / "aiter", rows={"gfx942": ["bf16,bf16,16,1,4,0,1,0,k,../../gfx950/mla/x.co"]},
                       co=False)
    (root / "hsa" / "gfx950" / "mla").mkdir(parents=True)
    (root / "hsa" / "gfx950" / "mla" / "x.co").write_bytes(b"")
    assert "names code objects outside its folder (../../gfx950/mla/x.co)" in only_problem(root, ["gfx942"])
    good = kernel_tree(tmp_path / "good")
    assert "is not a plain name" in only_problem(good, ["gfx942", "../gfx942"])
    empty = kernel_tree(tmp_path / "empty", rows={"gfx942": ["bf16,bf16,16,1,4,0,1,0,k,"]}, co=False)
    assert "1 row(s) name no code object (co_name empty)" in only_problem(empty, ["gfx942"])

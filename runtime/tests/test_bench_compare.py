"""The benchmark's orchestration on data: selection read from server logs (rocm_vllm_runtime.selection,
through bench), run verdicts, ratios, settings, and the `vllm bench serve` arguments as vLLM's own parser reads them."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from rocm_vllm_runtime import bench
from rocm_vllm_runtime.bench import OURS, VLLMS, Backend, Load

ROCM_AUTO = ("INFO 11-30 [rocm.py:850] Using ROCM_AITER_MLA backend out of potential backends: "
             "['ROCM_AITER_MLA', 'TRITON_MLA'].")
ROCM_CHOSEN = "INFO [rocm.py:750] Using TRITON_MLA backend (selected via --attention-backend)."
ROCM_OVERRIDE = ("INFO [rocm.py:842] Found incompatible backend(s) [ROCM_AITER_MLA] with decoder. "
                 "Overriding with TRITON_MLA out of potential backends: ['TRITON_MLA'].")
CPU = "(EngineCore pid=7) INFO [cpu.py:175] Using CPU_MLA backend."
OUR_ROCM_IMPL = ("INFO [backend.py:144] ROCM_AITER_MLA (vllm-aiter-mla 0.1.0): decode=aiter mla_decode_fwd "
                 "persistent, 16 heads per GPU run as 16, query length <= 1 (KV as pages of 1 slot, block size 1)")
OUR_CPU_IMPL = "INFO [cpu_dev.py:49] vllm-aiter-mla CPU development mode: reference kernels in place of CPU_MLA decode"
DECOYS = "\n".join([
    "INFO Using TritonExperts MoE backend",
    "INFO Using FLASH_ATTN MLA prefill backend.",
    "INFO Using AITER Flash Attention backend for ViT model.",
    "INFO Cannot use TRITON_MLA backend on CPU.",
    # logged by the plugin in every process whatever backend runs: not the implementation running
    "WARNING vllm-aiter-mla: AITER_MLA_KERNELS=reference: pure-PyTorch reference kernels (development only, slow)",
])
PLUGIN = Backend("plugin", "ROCM_AITER_MLA", OURS)
TRITON = Backend("triton", "TRITON_MLA", VLLMS, {}, ("--attention-backend", "TRITON_MLA"))


@pytest.mark.parametrize("log, backends, implementation", [
    (ROCM_AUTO + "\n" + OUR_ROCM_IMPL, ("ROCM_AITER_MLA",), OURS),
    (ROCM_AUTO, ("ROCM_AITER_MLA",), VLLMS),
    (ROCM_CHOSEN, ("TRITON_MLA",), VLLMS),
    (ROCM_OVERRIDE, ("TRITON_MLA",), VLLMS),
    (CPU + "\n" + OUR_CPU_IMPL, ("CPU_MLA",), OURS),
    (f"{CPU}\n{CPU}\nINFO Using AMX_MLA backend.", ("CPU_MLA", "AMX_MLA"), VLLMS),
    (DECOYS, (), VLLMS),
])
def test_selection_read_from_the_log(log: str, backends: tuple[str, ...], implementation: str) -> None:
    assert bench.selection(DECOYS + "\n" + log) == bench.Selection(backends, implementation)


def test_a_wrong_backend_fails_as_soon_as_it_is_logged() -> None:
    early = bench.mismatch(PLUGIN, bench.selection(ROCM_CHOSEN), complete=False)
    assert early == "plugin: the server selected TRITON_MLA, not ROCM_AITER_MLA"
    assert bench.mismatch(PLUGIN, bench.selection(""), complete=False) == ""  # not selected yet
    assert bench.mismatch(PLUGIN, bench.selection(ROCM_AUTO), complete=False) == ""  # implementation not built yet


def test_once_up_the_server_must_have_selected_the_backend_and_implementation_asked() -> None:
    assert "logged no attention backend" in bench.mismatch(PLUGIN, bench.selection(""), complete=True)
    assert bench.mismatch(PLUGIN, bench.selection(ROCM_AUTO), complete=True) == (
        "plugin: ROCM_AITER_MLA ran vllm's implementation, not vllm-aiter-mla's")
    assert bench.mismatch(PLUGIN, bench.selection(ROCM_AUTO + "\n" + OUR_ROCM_IMPL), complete=True) == ""
    vllm_aiter = Backend("vllm-aiter", "ROCM_AITER_MLA", VLLMS)
    assert "ran vllm-aiter-mla's implementation, not vllm's" in bench.mismatch(
        vllm_aiter, bench.selection(ROCM_AUTO + "\n" + OUR_ROCM_IMPL), complete=True)
    assert bench.mismatch(TRITON, bench.selection(ROCM_CHOSEN), complete=True) == ""


def test_known_backends() -> None:
    known = bench.backends(["other_plugin"])
    assert list(known) == ["plugin", "vllm-aiter", "triton", "cpu-plugin", "cpu-vllm"]
    assert known["plugin"].env == {} and known["plugin"].args == () and known["plugin"].implementation == OURS
    assert known["vllm-aiter"].env == {"VLLM_PLUGINS": "other_plugin"} and known["vllm-aiter"].implementation == VLLMS
    assert known["triton"].args == ("--attention-backend", "TRITON_MLA")
    assert known["cpu-plugin"].env == {"AITER_MLA_KERNELS": "reference"} and not known["cpu-plugin"].needs_gpu
    assert known["cpu-vllm"].args == ("--attention-backend", "CPU_MLA")
    assert "aiter_mla" not in bench.plugin_names()  # the backend's own entry point is left out


def test_choose_names_what_is_wrong() -> None:
    known = bench.backends([])
    assert [b.name for b in bench.choose(["triton", "plugin"], known)] == ["triton", "plugin"]
    with pytest.raises(bench.BenchError, match=r"^BENCH_BACKENDS / --backends: unknown .*\['nope'\].*choose from"):
        bench.choose(["plugin", "nope"], known)
    with pytest.raises(bench.BenchError, match="twice"):
        bench.choose(["plugin", "plugin"], known)
    with pytest.raises(bench.BenchError, match="unknown or no backend"):
        bench.choose([], known)


def test_a_gpu_backend_without_the_device_node_is_named(tmp_path: Path) -> None:
    """The suites skip a GPU backend where the container has no compute device node (the guard's
    ROCM_VLLM_KFD_PATH, default /dev/kfd): the node's path is named; CPU backends need none."""
    known = bench.backends([])
    absent, present = str(tmp_path / "no-kfd"), str(tmp_path)
    gpu, cpu = [known["plugin"], known["cpu-vllm"]], [known["cpu-plugin"], known["cpu-vllm"]]
    assert bench.missing_device(gpu, {"ROCM_VLLM_KFD_PATH": absent}) == absent
    assert bench.missing_device(gpu, {"ROCM_VLLM_KFD_PATH": present}) is None
    assert bench.missing_device(cpu, {"ROCM_VLLM_KFD_PATH": absent}) is None
    assert bench.missing_device(gpu, {"ROCM_VLLM_KFD_PATH": ""}) in (None, "/dev/kfd")  # empty: the default
    assert (bench.missing_device(gpu, {}) is None) == Path("/dev/kfd").exists()



def test_the_device_node_path_is_read_by_the_guard_alone() -> None:
    """Every check of the compute device node (the suites' skips, their conftest, bench, accuracy) asks
    guard.kfd_path: a copy of the rule read an empty ROCM_VLLM_KFD_PATH as the working folder, which exists."""
    root = Path(__file__).resolve().parents[2]
    shipped = [*root.glob("runtime/src/rocm_vllm_runtime/*.py"), *root.glob("runtime/suites/*.py"),
               *root.glob("backend/src/vllm_aiter_mla/*.py")]
    readers = sorted(p.relative_to(root).as_posix() for p in shipped if "ROCM_VLLM_KFD_PATH" in p.read_text()
                     and "KFD_ENV = " not in p.read_text())
    assert len(shipped) > 40 and readers == [], readers

def test_load_settings() -> None:
    assert Load.from_env({}) == Load(1000, 1024, 128, 64, 0, 4, ())
    load = Load.from_env({"BENCH_NUM_PROMPTS": "4", "BENCH_WARMUPS": "0", "BENCH_ARGS": "--dataset-name 'sharegpt'"})
    assert (load.num_prompts, load.warmups, load.extra) == (4, 0, ("--dataset-name", "sharegpt"))
    with pytest.raises(bench.BenchError, match=r"^BENCH_INPUT_LEN='1k' is not a whole number: give 1 to 1048576 in "
                                               r"decimal digits$"):
        Load.from_env({"BENCH_INPUT_LEN": "1k"})
    with pytest.raises(bench.BenchError, match=r"^BENCH_CONCURRENCY='0' is out of range: give 1 to 65536$"):
        Load.from_env({"BENCH_CONCURRENCY": "0"})
    with pytest.raises(bench.BenchError, match="^BENCH_ARGS cannot be split"):
        Load.from_env({"BENCH_ARGS": "--label 'x"})
    with pytest.raises(bench.BenchError, match="^BENCH_SERVE_ARGS cannot be split"):
        bench.split_setting({"BENCH_SERVE_ARGS": "--model 'x"}, "BENCH_SERVE_ARGS")
    assert bench.split_setting({}, "BENCH_SERVE_ARGS") == []


def test_vllm_bench_serve_reads_the_arguments_as_meant(tmp_path: Path) -> None:
    from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand  # noqa: PLC0415
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: PLC0415

    parser = FlexibleArgumentParser()
    BenchmarkServingSubcommand.add_cli_args(parser)
    load = Load(12, 34, 5, 6, 7, 2, ("--label", "x"))
    args = parser.parse_args(bench.bench_argv(load, "http://127.0.0.1:9", tmp_path, "r.json"))
    assert (args.num_prompts, args.random_input_len, args.random_output_len) == (12, 34, 5)
    assert (args.max_concurrency, args.seed, args.num_warmups) == (6, 7, 2)
    assert args.dataset_name == "random" and args.ignore_eos and args.temperature == 0
    assert args.base_url == "http://127.0.0.1:9" and args.backend == "vllm" and args.label == "x"
    assert args.save_result and args.result_dir == str(tmp_path) and args.result_filename == "r.json"


def test_servers_run_with_the_tokenizer_on_loopback_without_the_callers_api_key() -> None:
    command = bench.server_command(["--model", "m"], TRITON, 8123)
    assert command[1:3] == ["-m", "rocm_vllm_runtime.serve"]
    assert command[3:] == ["--model", "m", "--attention-backend", "TRITON_MLA", "--no-skip-tokenizer-init",
                           "--host", "127.0.0.1", "--port", "8123"]
    vllm_aiter = bench.backends(["x"])["vllm-aiter"]
    assert bench.server_env(vllm_aiter, {"VLLM_API_KEY": "k", "A": "1"}) == {"A": "1", "VLLM_PLUGINS": "x"}



@pytest.mark.parametrize("name", ["cpu-plugin", "cpu-vllm"])
def test_cpu_servers_get_a_kv_cache_size_unless_the_environment_sets_one(name) -> None:
    """The documented CPU bench (BENCH_BACKENDS=cpu-plugin,cpu-vllm) with no memory setting: vLLM's
    CPU worker would ask for 0.9 of the machine's memory and stop; each CPU server gets compose.cpu.yaml's
    1 GiB KV cache instead, and a value the caller set wins."""
    cpu = bench.backends([])[name]
    assert bench.server_env(cpu, {"A": "1"})["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert bench.server_env(cpu, {"VLLM_CPU_KVCACHE_SPACE": ""})["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert bench.server_env(cpu, {"VLLM_CPU_KVCACHE_SPACE": "6"})["VLLM_CPU_KVCACHE_SPACE"] == "6"
    assert "VLLM_CPU_KVCACHE_SPACE" not in bench.server_env(TRITON, {"A": "1"})

def test_vllm_result_file_to_metrics_and_errors() -> None:
    result = {"completed": 3, "failed": 1, "total_token_throughput": 12.5, "date": "20261130",
              "ttfts": [0.1, 0.2], "errors": ["", "HTTP 500", "HTTP 500", "timeout"], "request_goodput": None}
    metrics, errors = bench.summarize(result)
    assert metrics == {"completed": 3.0, "failed": 1.0, "total_token_throughput": 12.5}
    assert errors == ["HTTP 500", "timeout"]


def test_a_load_passes_only_with_every_request_and_token() -> None:
    load = Load(num_prompts=4, output_len=8)
    assert bench.load_problems("a", {"completed": 4, "failed": 0, "total_output_tokens": 32}, load) == []
    assert bench.load_problems("a", {"completed": 3, "failed": 1, "total_output_tokens": 24}, load) == [
        "a: 1 of 4 requests failed", "a: 3 of 4 requests completed"]
    assert bench.load_problems("a", {"completed": 4, "failed": 0, "total_output_tokens": 31}, load) == [
        "a: 31 output tokens, expected 4 x 8"]


def test_ratios_are_oriented_so_more_is_better_for_the_reference() -> None:
    columns = {"plugin": {"total_token_throughput": 10171.83, "mean_tpot_ms": 20.0},
               "triton": {"total_token_throughput": 8777.14, "mean_tpot_ms": 25.0},
               "failed": {}}
    factors = bench.ratios(columns, "plugin")
    assert list(factors) == ["triton", "failed"]
    assert factors["triton"]["total_token_throughput"] == pytest.approx(10171.83 / 8777.14)
    assert factors["triton"]["mean_tpot_ms"] == pytest.approx(1.25)
    assert math.isnan(factors["triton"]["mean_itl_ms"]) and math.isnan(factors["failed"]["total_token_throughput"])


def _run(ok: bool, selected: str, throughput: float) -> dict:
    return {"asked": {"attention_backend": "CPU_MLA", "implementation": OURS}, "ok": ok,
            "selected": {"attention_backends": [selected], "implementation": OURS},
            "problems": [] if ok else [f"x: the server selected {selected}, not CPU_MLA"],
            "errors": [], "metrics": {"completed": 4, "total_token_throughput": throughput} if ok else {}}


def test_document_and_printed_comparison() -> None:
    load = Load(num_prompts=4)
    doc = bench.document({"a": _run(True, "CPU_MLA", 30.0), "b": _run(True, "CPU_MLA", 20.0)}, load)
    assert doc["ok"] and doc["reference"] == "a" and doc["load"]["num_prompts"] == 4
    assert doc["ratios"]["b"]["total_token_throughput"] == pytest.approx(1.5)
    text = bench.render(doc)
    assert "a: asked CPU_MLA (vllm-aiter-mla), selected CPU_MLA (vllm-aiter-mla) -> ok" in text
    assert "a vs b: request_throughput nanx" in text and "total_token_throughput 1.50x" in text
    failed = bench.document({"a": _run(True, "CPU_MLA", 30.0), "x": _run(False, "AMX_MLA", 0.0)}, load)
    assert not failed["ok"]
    text = bench.render(failed)
    assert "x: asked CPU_MLA (vllm-aiter-mla), selected AMX_MLA (vllm-aiter-mla) -> FAILED" in text
    assert "problem: x: the server selected AMX_MLA, not CPU_MLA" in text
    assert "ratios" not in bench.document({"a": _run(True, "CPU_MLA", 1.0)}, load)

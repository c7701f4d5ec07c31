"""`serve` fills in defaults only where the user's arguments leave them out."""
from __future__ import annotations

from selftest.serve import build_argv

TINY = "/opt/rocm-vllm/models/tiny-mla"


def test_defaults_serve_the_tiny_model() -> None:
    assert build_argv([], {}) == ["--model", TINY, "--load-format", "dummy",
                                  "--skip-tokenizer-init", "--host", "0.0.0.0", "--port", "8000"]


def test_positional_model_like_vllm_serve() -> None:
    argv = build_argv(["deepseek-ai/DeepSeek-R1", "-tp", "8"], {})
    assert argv[-4:] == ["--model", "deepseek-ai/DeepSeek-R1", "-tp", "8"]
    assert "--load-format" not in argv and argv.count("--model") == 1


def test_settings_fill_options_user_wins() -> None:
    env = {"SERVE_MODEL": "m", "SERVE_PORT": "9000", "SERVE_TENSOR_PARALLEL_SIZE": "8",
           "SERVE_BLOCK_SIZE": "1", "SERVE_MAX_MODEL_LEN": "32768",
           "SERVE_EXTRA_ARGS": "--max-num-seqs 64 --served-model-name 'my model'"}
    argv = build_argv(["--port=9100"], env)
    assert argv[:2] == ["--model", "m"]
    assert "9000" not in argv and argv[-1] == "--port=9100"
    for pair in (["--tensor-parallel-size", "8"], ["--block-size", "1"],
                 ["--max-model-len", "32768"], ["--served-model-name", "my model"]):
        i = argv.index(pair[0])
        assert argv[i:i + 2] == pair


def test_attention_backend_setting_user_wins() -> None:
    argv = build_argv([], {"SERVE_ATTENTION_BACKEND": "CPU_MLA"})
    i = argv.index("--attention-backend")
    assert argv[i + 1] == "CPU_MLA"
    argv = build_argv(["--attention-backend", "TRITON_MLA"], {"SERVE_ATTENTION_BACKEND": "CPU_MLA"})
    assert argv.count("--attention-backend") == 1 and "CPU_MLA" not in argv
    assert "--attention-backend" not in build_argv([], {})


def test_tiny_model_path_setting() -> None:
    argv = build_argv(["--model", "/m/tiny/"], {"TINY_MLA_MODEL": "/m/tiny"})
    assert "--load-format" in argv and "--skip-tokenizer-init" in argv
    argv = build_argv(["--model", "/m/tiny", "--load-format", "auto"], {"TINY_MLA_MODEL": "/m/tiny"})
    assert argv.count("--load-format") == 1

"""`serve` fills in defaults only where the user's arguments leave them out."""
from __future__ import annotations

import pytest

from rocm_vllm_runtime.secret_values import masked
from rocm_vllm_runtime.serve import ServeError, build_argv, exposure

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


def test_tiny_model_with_its_tokenizer() -> None:
    argv = build_argv(["--no-skip-tokenizer-init"], {})
    assert "--skip-tokenizer-init" not in argv and argv[-1] == "--no-skip-tokenizer-init"


def test_unclosed_quote_names_the_setting() -> None:
    with pytest.raises(ServeError, match=r"^SERVE_EXTRA_ARGS .*fix its quoting$"):
        build_argv([], {"SERVE_EXTRA_ARGS": "--served-model-name 'my model"})


@pytest.mark.parametrize("host, published, reachable", [
    ("0.0.0.0", "", True), ("", "", True), ("10.0.0.5", "", True), ("my-host", "", True),
    ("127.0.0.1", "", False), ("localhost", "", False), ("::1", "", False), ("[::1]", "", False),
    ("0.0.0.0", "127.0.0.1", False), ("0.0.0.0", "0.0.0.0", True), ("0.0.0.0", "::", True),
    ("127.0.0.1", "0.0.0.0", False),  # a loopback-bound server is not reachable through the port
])
def test_reachable_addresses_need_a_key(host: str, published: str, reachable: bool) -> None:
    env = {"ROCM_VLLM_PUBLISHED_ADDRESS": published}
    args = ["--host", host]
    if reachable:
        with pytest.raises(ServeError, match="VLLM_API_KEY.*ROCM_VLLM_ALLOW_NO_API_KEY=1"):
            exposure(args, env)
        assert exposure(args, {**env, "VLLM_API_KEY": "k"}) == ""
        assert exposure([*args, "--api-key", "k"], env) == ""
        assert exposure([*args, "--api-key=k"], env) == ""
        assert exposure(args, {**env, "ROCM_VLLM_ALLOW_NO_API_KEY": "1"}).startswith("warning:")
        with pytest.raises(ServeError):
            exposure([*args, "--api-key="], env)  # an empty key is no key
    else:
        assert exposure(args, env) == ""


def test_masked_hides_every_key_form() -> None:
    assert masked(["--api-key", "a", "b", "--port", "1", "--api-key=c", "m"]) == \
        ["--api-key", "***", "***", "--port", "1", "--api-key=***", "m"]


def test_the_host_vllm_uses_is_the_last_one_given() -> None:
    """vLLM's argument parser takes the last --host: a loopback --host in SERVE_EXTRA_ARGS followed
    by a reachable one on the command line is a reachable server, and needs a key."""
    env = {"SERVE_EXTRA_ARGS": "--host 127.0.0.1"}
    args = build_argv(["--host", "0.0.0.0"], env)
    with pytest.raises(ServeError, match="refusing to serve without an API key on 0.0.0.0"):
        exposure(args, {})
    assert exposure(build_argv(["--host=0.0.0.0", "--host=127.0.0.1"], {}), {}) == ""


@pytest.mark.parametrize("key", ["k3y\n", "k3y\r\n", " k3y", "k\x00y", '"k3y"', "'k3y'"])
def test_an_api_key_no_client_could_send_stops_in_one_line_never_shown(key: str) -> None:
    from rocm_vllm_runtime.serve import check_api_keys

    for args, env in (([], {"VLLM_API_KEY": key}), (["--api-key", key], {}), ([f"--api-key={key}"], {})):
        with pytest.raises(ServeError) as err:
            check_api_keys(build_argv(args, env), env)
        message = str(err.value)
        assert "\n" not in message and "k3y" not in message and "not shown" in message
    check_api_keys(build_argv(["--api-key", "k3y"], {}), {"VLLM_API_KEY": "k3y"})


@pytest.mark.parametrize("token", ['"hf_k3y"', "'hf_k3y'", "hf_k3y\n", "hf k3y"])
def test_a_hugging_face_token_that_could_never_be_sent_stops_in_one_line_never_shown(token: str) -> None:
    """The same rule for every secret serve passes on: HF_TOKEN, HUGGING_FACE_HUB_TOKEN, --hf-token."""
    from rocm_vllm_runtime.serve import check_api_keys

    for args, env, named in (([], {"HF_TOKEN": token}, "HF_TOKEN"),
                             ([], {"HUGGING_FACE_HUB_TOKEN": token}, "HUGGING_FACE_HUB_TOKEN"),
                             (["--hf-token", token], {}, "--hf-token"), ([f"--hf-token={token}"], {}, "--hf-token")):
        with pytest.raises(ServeError) as err:
            check_api_keys(build_argv(args, env), env)
        message = str(err.value)
        assert message.startswith(named + ":") and "Hugging Face token" in message, message
        assert "\n" not in message and "k3y" not in message and "not shown" in message
    check_api_keys(build_argv(["--hf-token", "hf_k3y"], {}), {"HF_TOKEN": "hf_k3y", "VLLM_API_KEY": "a'b\"c"})

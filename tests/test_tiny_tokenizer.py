"""The tiny model's tokenizer: the committed files are the generator's, vLLM loads them, ids round-trip."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import tiny_mla_tokenizer as gen  # runtime/models, on pytest.ini's pythonpath

CONFIG = json.loads((gen.MODEL_DIR / "config.json").read_text())


def test_committed_files_are_what_the_generator_writes(tmp_path: Path) -> None:
    gen.write(tmp_path, CONFIG["vocab_size"])
    for name in gen.FILES:
        assert (tmp_path / name).read_bytes() == (gen.MODEL_DIR / name).read_bytes(), (
            f"{name}: run python runtime/models/tiny_mla_tokenizer.py and commit the result")
    assert gen.main(["--check"]) == 0


def test_check_names_a_stale_file(tmp_path: Path, capsys) -> None:
    model = tmp_path / "tiny-mla"
    shutil.copytree(gen.MODEL_DIR, model)
    (model / "tokenizer.json").write_text((model / "tokenizer.json").read_text().replace('"baba"', '"bab"'))
    assert gen.main(["--check", str(model)]) == 1
    assert "tokenizer.json" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tokenizer():
    from vllm.tokenizers import get_tokenizer  # noqa: PLC0415

    return get_tokenizer(str(gen.MODEL_DIR))


def test_vllm_loads_it_with_the_models_vocabulary(tokenizer) -> None:
    assert tokenizer.vocab_size == len(tokenizer) == CONFIG["vocab_size"]
    assert tokenizer.bos_token_id == CONFIG["bos_token_id"] and tokenizer.eos_token_id == CONFIG["eos_token_id"]
    assert sorted(tokenizer.all_special_ids) == [0, 1, 2]
    assert tokenizer.num_special_tokens_to_add() == 0


def test_every_word_id_round_trips(tokenizer) -> None:
    ids = list(range(len(gen.SPECIAL), CONFIG["vocab_size"]))
    text = tokenizer.decode(ids)
    assert tokenizer(text, add_special_tokens=False).input_ids == ids
    assert tokenizer("babi nonsense-word", add_special_tokens=False).input_ids == [5, 2]  # unknown -> <unk>


def test_vllm_random_dataset_prompts_have_the_asked_length(tokenizer) -> None:
    from vllm.benchmarks.datasets import RandomDataset  # noqa: PLC0415

    requests = RandomDataset(random_seed=0).sample(tokenizer, num_requests=5, input_len=48, output_len=4)
    assert [r.prompt_len for r in requests] == [48] * 5
    assert [len(tokenizer(r.prompt, add_special_tokens=False).input_ids) for r in requests] == [48] * 5

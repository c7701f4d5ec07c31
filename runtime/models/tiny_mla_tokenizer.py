"""Write the tiny-mla model's tokenizer: a word-level tokenizer whose ids fill the model's vocabulary.

The tiny model has random weights, so its tokenizer only has to be valid and exact: every id
of the vocabulary (1024, from config.json) is one whitespace-separated word, and decoding
then encoding any sequence of non-special ids gives the same ids back. With it, vLLM serves the
model with its tokenizer (text prompts, /tokenize) and `vllm bench serve` can build prompts of
exact token lengths for it.

    ids 0, 1, 2   <s> (bos), </s> (eos), <unk>: the special tokens config.json names
    ids 3 ...     two-syllable words, consonant-vowel syllables in a fixed order

    python runtime/models/tiny_mla_tokenizer.py [OUT_DIR]      (default: runtime/models/tiny-mla)
    python runtime/models/tiny_mla_tokenizer.py --check        exit 1 if the committed files differ

Writes tokenizer.json and tokenizer_config.json. Same bytes on every run for a given
`tokenizers` release (the test of this file compares them with the committed ones).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

MODEL_DIR = Path(__file__).resolve().parent / "tiny-mla"
SPECIAL = ("<s>", "</s>", "<unk>")  # ids 0, 1, 2: bos_token_id 0 and eos_token_id 1 of config.json
CONSONANTS = "bdfghklmnprstvz"
VOWELS = "aeiou"
FILES = ("tokenizer.json", "tokenizer_config.json")


def words(count: int) -> list[str]:
    syllables = [c + v for c, v in itertools.product(CONSONANTS, VOWELS)]
    pairs = (a + b for a, b in itertools.product(syllables, repeat=2))
    out = list(itertools.islice(pairs, count))
    if len(out) < count:
        raise ValueError(f"{count} words asked, {len(out)} possible: add consonants or vowels")
    return out


def vocab_size(model_dir: Path = MODEL_DIR) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def build(size: int) -> Tokenizer:
    vocab = {token: i for i, token in enumerate([*SPECIAL, *words(size - len(SPECIAL))])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    return tokenizer


def config(size: int) -> dict[str, object]:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL[0], "eos_token": SPECIAL[1],
            "unk_token": SPECIAL[2], "add_bos_token": False, "add_eos_token": False,
            "clean_up_tokenization_spaces": False, "model_max_length": 4096}


def render(size: int) -> dict[str, bytes]:
    """File name -> bytes of the tokenizer files for a vocabulary of `size` ids."""
    return {"tokenizer.json": (build(size).to_str(pretty=True) + "\n").encode(),
            "tokenizer_config.json": (json.dumps(config(size), indent=2) + "\n").encode()}


def write(out_dir: Path, size: int) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in render(size).items():
        (out_dir / name).write_bytes(data)
    return [out_dir / name for name in FILES]


def differing(model_dir: Path = MODEL_DIR) -> list[str]:
    """Names of the tokenizer files in `model_dir` that regeneration would change."""
    expected = render(vocab_size(model_dir))
    return [name for name, data in expected.items()
            if not (model_dir / name).is_file() or (model_dir / name).read_bytes() != data]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", nargs="?", type=Path, default=MODEL_DIR)
    parser.add_argument("--check", action="store_true", help="compare with the files in OUT_DIR, write nothing")
    args = parser.parse_args(argv)
    if args.check:
        stale = differing(args.out_dir)
        if stale:
            print(f"{', '.join(stale)} in {args.out_dir} differ from what this script writes: "
                  f"run python {Path(__file__).name} {args.out_dir}", file=sys.stderr)
            return 1
        return 0
    for path in write(args.out_dir, vocab_size(MODEL_DIR)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write the tiny-mla accuracy task's data: a few dozen questions the seeded tiny model answers.

The tiny model has random weights (runtime/models/tiny_mla_weights.py, seed 0), so no real benchmark
means anything to it. This task stands in for one: each question is a run of words of the tiny
tokenizer, its answer is the model's greedy continuation of ANSWER_TOKENS words, computed here by
vLLM's own CPU_MLA backend in fp32 (the plugin left out), one question at a time (vLLM 0.32's CPU
engine gives this model other greedy answers when questions share a batch: the accuracy suite
sends the CPU servers one request at a time, ACCURACY_CONCURRENCY=1). Only questions whose every answer token
wins by at least MIN_MARGIN nats over the runner-up are kept, so a different CPU (other rounding)
gives the same answers, while a decode that reads a wrong key changes them. Every WRONG_EVERY-th
question gets another answer than the model's (a question "the model gets wrong"), so a correct
backend scores (1 - 1/WRONG_EVERY) and not 1. Each question also carries a fixed continuation of
random words whose log-likelihood the loglikelihood task asks for.

    python runtime/models/tiny_mla_accuracy.py [OUT_DIR]    (default: runtime/models/tiny-mla-accuracy)

Writes OUT_DIR/tiny_mla/test.jsonl (one question per line: id, question, answer, continuation),
the layout `selftest accuracy` reads from ACCURACY_DATA; the lm-eval tasks that use it are
runtime/suites/accuracy_tasks/tiny_mla_gen.yaml and tiny_mla_loglik.yaml. Needs vLLM (CPU build) and
about a minute.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE / "tiny-mla"
OUT_DIR = HERE / "tiny-mla-accuracy"
WEIGHTS_SCRIPT = HERE / "tiny_mla_weights.py"
QUESTIONS = 40
CANDIDATES = 400
ANSWER_TOKENS = 3
CONTINUATION_TOKENS = 6
MIN_MARGIN = 0.5
WRONG_EVERY = 4
SEED = 2024


def candidates(words: list[str], count: int, seed: int = SEED) -> list[tuple[str, str]]:
    """(question, continuation) pairs of random words; questions of 6 to 60 words."""
    rng = random.Random(seed)
    return [(" ".join(rng.choice(words) for _ in range(rng.randint(6, 60))),
             " ".join(rng.choice(words) for _ in range(CONTINUATION_TOKENS))) for _ in range(count)]


def answers(model: Path, questions: list[str]) -> list[tuple[list[int], list[float], str]]:
    """Greedy ANSWER_TOKENS tokens, their margins over the runner-up, and the text, per question."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_PLUGINS"] = ""  # vLLM's own CPU_MLA, not this project's backend
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model), dtype="float32", max_model_len=256, max_num_seqs=1,
              gpu_memory_utilization=0.5, enforce_eager=True, seed=0, attention_config={"backend": "CPU_MLA"})
    params = SamplingParams(temperature=0.0, max_tokens=ANSWER_TOKENS, logprobs=2)
    out = []
    for result in llm.generate(questions, params):
        comp = result.outputs[0]
        margins = []
        for token, top in zip(comp.token_ids, comp.logprobs):
            others = [lp.logprob for t, lp in top.items() if t != token]
            margins.append(top[token].logprob - max(others) if others else float("inf"))
        out.append((list(comp.token_ids), margins, comp.text))
    return out


def build(model: Path) -> list[dict[str, object]]:
    vocab = json.loads((MODEL_DIR / "tokenizer.json").read_text())["model"]["vocab"]
    words = [w for w, i in sorted(vocab.items(), key=lambda kv: kv[1]) if i >= 3]  # no special tokens
    pairs = candidates(words, CANDIDATES)
    rows: list[dict[str, object]] = []
    rng = random.Random(SEED + 1)
    for (question, continuation), (ids, margins, text) in zip(pairs, answers(model, [q for q, _ in pairs])):
        if len(ids) != ANSWER_TOKENS or 1 in ids or min(margins) < MIN_MARGIN:
            continue  # ended early (eos) or a near tie: the answer could differ on another CPU
        answer = text.strip()
        if len(rows) % WRONG_EVERY == WRONG_EVERY - 1:
            while (wrong := " ".join(rng.choice(words) for _ in range(ANSWER_TOKENS))) == answer:
                pass
            answer = wrong
        rows.append({"id": len(rows), "question": question, "answer": answer, "continuation": continuation})
        if len(rows) == QUESTIONS:
            return rows
    raise SystemExit(f"only {len(rows)} of {QUESTIONS} candidate questions have clear answers: raise CANDIDATES")


def weights_module() -> ModuleType:
    """runtime/models/tiny_mla_weights.py, this file's sibling, loaded from its file: the same module
    however this script is started, with no edit of the import path."""
    spec = importlib.util.spec_from_file_location("tiny_mla_weights", WEIGHTS_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", nargs="?", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tiny-mla-") as tmp:
        model = weights_module().write_tiny_mla(Path(tmp), seed=0)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(MODEL_DIR / name, model / name)
        rows = build(model)
    target = args.out_dir / "tiny_mla" / "test.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{target}: {len(rows)} questions")
    return 0


if __name__ == "__main__":
    sys.exit(main())

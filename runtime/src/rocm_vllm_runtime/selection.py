"""Which attention backend a vLLM server selected, and whose implementation of it runs, as its
log says. One reading for everything that checks it: the serving benchmark (each run's
`selected`), the smoke suite, and through the benchmark's JSON the pipeline summary."""
from __future__ import annotations

import re
from dataclasses import dataclass

OURS, VLLMS = "vllm-aiter-mla", "vllm"  # which implementation of the attention backend ran
# vLLM's selection lines: "Using X backend." (CPU), "Using X backend (selected via
# --attention-backend)." / "Using X backend out of potential backends: [...]." /
# "Overriding with X out of potential backends: [...]." (ROCm), "Using X attention backend
# out of potential backends" (CUDA).
SELECTED_LINE = re.compile(r"Using (\w+) (?:attention )?backend\b|Overriding with (\w+) out of potential backends")
# What this project's implementation logs when a server builds it (ROCm backend, CPU development mode).
OURS_LINE = re.compile(r"vllm-aiter-mla (?:CPU development mode|[^)\n]*\): decode=)")


@dataclass(frozen=True)
class Selection:
    """What a server's log says it selected."""
    attention_backends: tuple[str, ...]  # every distinct backend named, in order
    implementation: str  # OURS when this project's implementation logged its start-up, else VLLMS


def selection(log_text: str) -> Selection:
    names = dict.fromkeys(a or b for a, b in SELECTED_LINE.findall(log_text))
    return Selection(tuple(names), OURS if OURS_LINE.search(log_text) else VLLMS)

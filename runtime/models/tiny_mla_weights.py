"""Write seeded random weights for the tiny-mla model as safetensors (a few MB).

vLLM's ``--load-format dummy`` weights are so small that attention barely moves the
output; these are scaled so that it does, which makes token-by-token comparisons of
attention backends meaningful.

    python runtime/models/tiny_mla_weights.py OUT_DIR [--seed 0] [--gain 2.0]

OUT_DIR receives config.json (copied from runtime/models/tiny-mla) and model.safetensors.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

CONFIG_DIR = Path(__file__).resolve().parent / "tiny-mla"


def tiny_mla_weights(cfg: dict, seed: int = 0, gain: float = 2.0) -> dict[str, torch.Tensor]:
    """Checkpoint tensors in the DeepSeek-V2 Hugging Face layout (per-expert names)."""
    g = torch.Generator().manual_seed(seed)
    hidden, heads, vocab = cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"]
    nope, rope, v_dim, rank = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]

    def linear(out_f: int, in_f: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=g) * (scale / math.sqrt(in_f))

    def mlp(prefix: str, inter: int) -> dict[str, torch.Tensor]:
        return {f"{prefix}.gate_proj.weight": linear(inter, hidden), f"{prefix}.up_proj.weight": linear(inter, hidden),
                f"{prefix}.down_proj.weight": linear(hidden, inter)}

    w = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = torch.ones(hidden)
        w[f"{p}.post_attention_layernorm.weight"] = torch.ones(hidden)
        # Queries and keys scaled up (gain) so attention scores spread well beyond
        # uniform: the attention backend then decides the next token.
        w[f"{p}.self_attn.q_proj.weight"] = linear(heads * (nope + rope), hidden, gain)
        w[f"{p}.self_attn.kv_a_proj_with_mqa.weight"] = linear(rank + rope, hidden, gain)
        w[f"{p}.self_attn.kv_a_layernorm.weight"] = torch.ones(rank)
        w[f"{p}.self_attn.kv_b_proj.weight"] = linear(heads * (nope + v_dim), rank, gain)
        w[f"{p}.self_attn.o_proj.weight"] = linear(hidden, heads * v_dim)
        if i < cfg["first_k_dense_replace"]:
            w.update(mlp(f"{p}.mlp", cfg["intermediate_size"]))
        else:
            w[f"{p}.mlp.gate.weight"] = linear(cfg["n_routed_experts"], hidden)
            for e in range(cfg["n_routed_experts"]):
                w.update(mlp(f"{p}.mlp.experts.{e}", cfg["moe_intermediate_size"]))
            w.update(mlp(f"{p}.mlp.shared_experts", cfg["moe_intermediate_size"] * cfg["n_shared_experts"]))
    w["model.norm.weight"] = torch.ones(hidden)
    w["lm_head.weight"] = linear(vocab, hidden, 4.0)
    return {k: v.contiguous() for k, v in w.items()}


def write_tiny_mla(out_dir: Path, seed: int = 0, gain: float = 2.0) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(CONFIG_DIR / "config.json", out_dir / "config.json")
    cfg = json.loads((out_dir / "config.json").read_text())
    save_file(tiny_mla_weights(cfg, seed, gain), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gain", type=float, default=2.0)
    args = parser.parse_args()
    print(f"wrote {write_tiny_mla(args.out_dir, args.seed, args.gain)}")


if __name__ == "__main__":
    main()

"""A randomly initialised Qwen3 of a published shape (1.7B, 4B or 8B), saved as a Hugging
Face folder with the embedded tiny model's tokenizer, for GPU memory and speed checks
without weights from the hub (scripts/gpu_check.sh).

The vocabulary is the tokenizer's (a few thousand tokens), not Qwen3's 151,936: a model
can only be sampled in a vocabulary its tokenizer decodes. The embedding and LM head are
therefore smaller than the real model's (8B: 2 x 151,936 x 4,096 = 1.24B parameters fewer);
the script prints both counts. Everything else (layers, widths, heads, tying) is the
published configuration's, as scripts/memory_plan.py lists it.

    python scripts/random_qwen3.py --size 8B --out /tmp/qwen3-8b-random [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_plan import QWEN3, VOCAB, counts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=[m.name.removeprefix("Qwen3-") for m in QWEN3], default="8B")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where to initialise (a GPU makes 8B in seconds)")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, Qwen3Config

    from hp_agent.policies import load_policy

    shape = next(m for m in QWEN3 if m.name == f"Qwen3-{args.size}")
    tokenizer = load_policy("tiny").tokenizer
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, tie_word_embeddings=shape.tied,
                         max_position_embeddings=shape.max_positions, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype))
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    ours = sum(p.numel() for p in model.parameters())
    print(f"{shape.name} random init, vocabulary {len(tokenizer)}: {ours:,} parameters "
          f"(the real model, vocabulary {VOCAB:,}: {counts(shape)['total']:,}) -> {args.out}")


if __name__ == "__main__":
    main()

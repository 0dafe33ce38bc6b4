"""What a larger embedded model would cost: parameters, an SFT step and sampling speed.

    .venv/bin/python bench/model_size.py            # the tiny model and two larger Qwen3 shapes

Each shape is a randomly initialized Qwen3 with the tiny-alfworld tokenizer, timed on
ALFWorld-sized work: one supervised step (forward, backward, AdamW) on 16 sequences of
``--prompt-tokens`` + 24 tokens, and sampling 24 new tokens for 8 such prompts with
transformers' ``generate`` (KV cache). Token ids are random: the cost does not depend on
them. Times are medians of ``--repeats``; ratios are to the first (the shipped) shape,
measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from hp_agent.policies.tiny import tiny_config, tiny_model_path

# (name, hidden, intermediate, layers, heads): the shipped tiny model first.
SHAPES = (("tiny (shipped)", 256, 512, 4, 4), ("6 x 384", 384, 1024, 6, 6), ("8 x 512", 512, 1536, 8, 8))


def build(tokenizer, hidden: int, intermediate: int, layers: int, heads: int) -> Qwen3ForCausalLM:
    fields = tiny_config(tokenizer).to_dict()
    fields.pop("layer_types", None)  # derived from the layer count
    fields.update(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                  num_attention_heads=heads, max_window_layers=layers)
    config = Qwen3Config(**fields)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).to(torch.float32)


def sft_step_s(model: Qwen3ForCausalLM, batch: torch.Tensor, repeats: int) -> float:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def sampled_tokens_per_s(model: Qwen3ForCausalLM, prompts: torch.Tensor, new_tokens: int, repeats: int) -> float:
    times = []
    with torch.no_grad():
        for _ in range(repeats + 1):
            start = time.perf_counter()
            model.generate(prompts, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True,
                           attention_mask=torch.ones_like(prompts))
            times.append(time.perf_counter() - start)
    return prompts.shape[0] * new_tokens / statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=486, help="ALFWorld prompt length with tiny-alfworld")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path("tiny-alfworld"))
    generator = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    batch = torch.randint(10, vocab, (16, args.prompt_tokens + 24), generator=generator)
    prompts = torch.randint(10, vocab, (8, args.prompt_tokens), generator=generator)
    print(f"{'shape':16} {'parameters':>11} {'SFT step (16)':>14} {'x':>6} {'sampled tok/s':>14} {'x':>6}")
    first: tuple[float, float] | None = None
    for name, *shape in SHAPES:
        model = build(tokenizer, *shape)
        params = sum(p.numel() for p in model.parameters())
        step, speed = sft_step_s(model, batch, args.repeats), sampled_tokens_per_s(model, prompts, 24, args.repeats)
        first = first or (step, speed)
        print(f"{name:16} {params / 1e6:10.1f}M {step:13.2f}s {step / first[0]:5.1f}x {speed:14.1f} {speed / first[1]:5.2f}x")


if __name__ == "__main__":
    main()

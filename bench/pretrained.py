"""The pretrained chat model (``--model smollm2-135m``) beside the embedded tiny one, on this CPU.

    .venv/bin/python bench/pretrained.py                  # tiny and smollm2-135m, one thread
    .venv/bin/python bench/pretrained.py --threads 2 --models smollm2-135m

Each model is loaded as every command loads it (``load_policy``; smollm2-135m from its
cached folder, converted first if it is not there, which is timed apart). Measured:

- prefill: the decoder over ``--batch`` x ``--tokens`` token ids without gradients (the
  policy's ``hidden_states``, as hindsight scoring and a prompt's first pass run it);
- one training step: forward, next-token loss, backward and AdamW over the same batch, as
  tokens per second and seconds per step;
- ``--new-tokens`` greedy tokens for one chat prompt, through ``Policy.generate`` (the
  sampler rollouts use).

Token ids for prefill and training are random: the cost does not depend on them. Each
measure runs once untimed on a short batch (first-call allocations), then ``--repeats``
times; medians are printed, with each model's ratio to the first model's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from hp_agent.policies import Policy, SamplingParams, load_policy
from hp_agent.policies.resolve import resolve_model

PROMPT = [{"role": "user", "content": "Write a long story about a cat who learns to cook."}]


def median_s(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def prefill(policy: Policy, ids: torch.Tensor) -> None:
    with torch.no_grad():
        policy.hidden_states(ids, torch.ones_like(ids))


def train_step(policy: Policy, optimizer: torch.optim.Optimizer, ids: torch.Tensor) -> None:
    loss = policy.model(input_ids=ids, labels=ids).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def measure(name: str, args: argparse.Namespace) -> dict[str, float]:
    start = time.perf_counter()
    resolve_model(name)  # converts on first use; timed apart from loading
    prepare_s = time.perf_counter() - start
    start = time.perf_counter()
    policy = load_policy(name)
    load_s = time.perf_counter() - start
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(10, len(policy.tokenizer), (args.batch, args.tokens), generator=generator)
    prompt = policy.render(PROMPT)
    sampling = SamplingParams(max_new_tokens=args.new_tokens, greedy=True)
    generations = []

    def sample() -> None:
        policy.prefix_cache.clear()  # each run samples the whole prompt, as a new episode does
        generations.append(policy.generate([prompt], sampling)[0])

    policy.generate([prompt], SamplingParams(max_new_tokens=2, greedy=True))
    decode_s = median_s(sample, args.repeats)
    warm = ids[:1, :32]
    prefill(policy, warm)
    prefill_s = median_s(lambda: prefill(policy, ids), args.repeats)
    # Last: the steps change the weights.
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-6)
    train_step(policy, optimizer, warm)
    step_s = median_s(lambda: train_step(policy, optimizer, ids), args.repeats)
    return {
        "parameters": sum(p.numel() for p in policy.model.parameters()),
        "prepare_s": prepare_s,
        "load_s": load_s,
        "prefill_tokens_per_s": ids.numel() / prefill_s,
        "train_tokens_per_s": ids.numel() / step_s,
        "step_s": step_s,
        "decode_s": decode_s,
        "decoded": len(generations[-1].token_ids),
    }


def main() -> None:
    from transformers.utils import logging

    logging.disable_progress_bar()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2-135m", help="comma-separated --model values")
    parser.add_argument("--batch", type=int, default=8, help="sequences per prefill and training step")
    parser.add_argument("--tokens", type=int, default=512, help="tokens per sequence")
    parser.add_argument("--new-tokens", type=int, default=24, help="greedy tokens sampled for one prompt")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads={args.threads} batch={args.batch} x {args.tokens} tokens, {args.new_tokens} greedy tokens, "
          f"repeats={args.repeats}")
    print(f"{'model':14} {'params':>8} {'first use s':>12} {'load s':>7} {'prefill tok/s':>14} {'train tok/s':>12} "
          f"{'step s':>7} {'x':>6} {'greedy s (tokens)':>18}")
    first: dict[str, float] | None = None
    for name in args.models.split(","):
        row = measure(name, args)
        first = first or row
        print(f"{name:14} {row['parameters'] / 1e6:7.1f}M {row['prepare_s']:12.1f} {row['load_s']:7.1f} "
              f"{row['prefill_tokens_per_s']:14.0f} {row['train_tokens_per_s']:12.0f} {row['step_s']:7.2f} "
              f"{row['step_s'] / first['step_s']:5.1f}x {row['decode_s']:13.2f} ({row['decoded']})")


if __name__ == "__main__":
    main()

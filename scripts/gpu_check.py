"""The sampling half of scripts/gpu_check.sh: on each backend, restricted episodes of the
box-and-key game, their tokens/s and peak memory, and the mean per-token |delta log-prob|
between what the sampler recorded and what the learner computes for the same tokens
under the same restriction (the ratio's denominator: it must be ~0, or every PPO ratio
is off by it).

    python scripts/gpu_check.py --model DIR [--device cuda] [--dtype bfloat16] [--backends hf,vllm]

Prints one line per backend and ``gpu_check-sampling: ok`` or exits non-zero. It runs
on a CPU too (``--device cpu --model tiny``, as tests/test_gpu_check.py does).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from hp_agent.devices import resolve_device, resolve_dtype
from hp_agent.envs import make
from hp_agent.parallel import ActionLogprobs
from hp_agent.policies import LoadOptions, SamplingParams
from hp_agent.rollout import Episode, collect

# bf16 logits differ between two kernels by a few 1e-3 nats a token; more is a mismatch.
MAX_MEAN_ABS_DELTA = {"float32": 1e-4, "bfloat16": 0.05, "float16": 0.02}


def probe(model: str, load: LoadOptions, episodes: int, max_new_tokens: int) -> dict:
    """Play ``episodes`` restricted keys episodes with ``load``'s backend; measure them."""
    if load.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    policy = load.load(model)
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    envs = [make("keys", split="train") for _ in range(episodes)]
    tasks = [Episode(task_id, group=k) for k, task_id in enumerate(envs[0].task_ids()[:episodes])]
    started = time.perf_counter()
    trajectories = collect(policy, envs, "keys", tasks, sampling, seed=0, constrain=True)
    seconds = time.perf_counter() - started
    turns = [turn for t in trajectories for turn in t.turns if turn.allowed is not None]
    spans = [(len(t.prompt_ids), len(t.prompt_ids) + len(t.action_ids)) for t in turns]
    with torch.no_grad():
        learned = ActionLogprobs(policy.model, sampling.temperature, True, policy.pad_token_id)(
            [t.prompt_ids + t.action_ids for t in turns], spans, [tokens for t in turns for tokens in t.allowed])
    sampled = torch.cat([torch.tensor(t.sample_logprobs) for t in turns])
    delta = (sampled - torch.cat(learned).float().cpu()).abs()
    peak = torch.cuda.max_memory_allocated() / 2**30 if load.device.startswith("cuda") else float("nan")
    return {"backend": load.backend, "turns": len(turns), "tokens": int(delta.numel()),
            "tokens_per_s": round(sum(len(t.action_ids) for t in turns) / seconds, 1),
            "mean_abs_dlogp": float(delta.mean()), "max_abs_dlogp": float(delta.max()), "peak_gib": round(peak, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--backends", default="hf,vllm")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=12)
    args = parser.parse_args()
    failed = []
    dtype = resolve_dtype(args.dtype, resolve_device(args.device))
    for backend in args.backends.split(","):
        load = LoadOptions(args.device, args.dtype, backend)
        try:
            found = probe(args.model, load, args.episodes, args.max_new_tokens)
        except Exception as error:  # noqa: BLE001 - reported, and the exit code says it failed
            print(f"gpu_check-sampling {backend}: FAILED {type(error).__name__}: {error}")
            failed.append(backend)
            continue
        ok = found["turns"] > 0 and found["mean_abs_dlogp"] <= MAX_MEAN_ABS_DELTA[dtype]
        print(f"gpu_check-sampling {backend}: {'ok' if ok else 'FAILED'} {json.dumps(found)}")
        if not ok:
            failed.append(backend)
    print(f"gpu_check-sampling: {'FAILED ' + ','.join(failed) if failed else 'ok'}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()

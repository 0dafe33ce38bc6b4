"""Prefix (KV-cache) reuse across turns in the transformers backend, on ALFWorld-like rollouts.

    OMP_NUM_THREADS=1 .venv/bin/python bench/prefix_reuse.py
    OMP_NUM_THREADS=1 .venv/bin/python bench/prefix_reuse.py --mode verl-agent --turns 20

Three ways to sample the same turns, greedily (so that all three must give the same
tokens, which is checked): ``transformers-generate`` (``model.generate``, every prompt run
whole), ``no-reuse`` (HFPolicy's sampler with ``prefix_cache_tokens=0``) and ``reuse``
(HFPolicy as shipped: each prompt runs only what no recent sequence began with).

Workloads: ``--mode chat`` (default) is bench/generation.py's chat-history rollout, every
prompt extending the episode's previous one (``rollout.chat_history`` with ALFWorld's
``prompt_mode="chat"``); ``--mode verl-agent`` is bench/hindsight_scoring.py's
observation-only prompts (task, last two steps, admissible actions), which share only
their opening with the previous turn's. Variants are measured in turns, ``--repeats``
times each after a warm-up; the median generate wall time of each is printed, with the
share of prompt tokens that reuse skipped and the speed-up of ``reuse`` over the others.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

import torch
from generate_baseline import GeneratePolicy
from generation import rollout_prompts
from hindsight_scoring import synth_trajectory
from hp_agent.policies import SamplingParams
from hp_agent.policies.hf import HFPolicy
from hp_agent.policies.resolve import resolve_model


def verl_agent_prompts(policy: HFPolicy, episodes: int, turns: int, seed: int) -> list[list[list[int]]]:
    rng = random.Random(seed)
    trajectories = [synth_trajectory(policy, turns, "verl-agent", rng) for _ in range(episodes)]
    return [[traj.turns[t].prompt_ids for traj in trajectories] for t in range(turns)]


def play(policy: HFPolicy, prompts_per_turn: list[list[list[int]]], sampling: SamplingParams) -> tuple[float, list, int]:
    """Generate every turn; returns generate wall seconds, the sampled ids and how many
    prompt tokens the prefix cache held (looked up untimed, as generate will)."""
    policy.prefix_cache.clear()
    seconds, answers, reused = 0.0, [], 0
    for prompts in prompts_per_turn:
        reused += sum(policy.prefix_cache.lookup(prompt)[1] for prompt in prompts)
        started = time.perf_counter()
        generations = policy.generate(prompts, sampling)
        seconds += time.perf_counter() - started
        answers.append([g.token_ids for g in generations])
    return seconds, answers, reused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["chat", "verl-agent"], default="chat")
    parser.add_argument("--model", default="tiny", help="tiny, a model folder, or a cached hub id")
    parser.add_argument("--episodes", type=int, default=8, help="episodes played at once (the batch)")
    parser.add_argument("--group-size", type=int, default=4, help="chat mode: episodes per task")
    parser.add_argument("--turns", type=int, default=12, help="turns per episode")
    parser.add_argument("--new-tokens", type=int, default=24, help="max new tokens per turn")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    path = resolve_model(args.model)
    policies = {"transformers-generate": GeneratePolicy(path), "no-reuse": HFPolicy(path, prefix_cache_tokens=0),
                "reuse": HFPolicy(path)}
    sampling = SamplingParams(max_new_tokens=args.new_tokens, greedy=True)

    def workload(seed: int) -> list[list[list[int]]]:
        if args.mode == "chat":
            return rollout_prompts(policies["reuse"], args.episodes, args.group_size, args.turns, seed)
        return verl_agent_prompts(policies["reuse"], args.episodes, args.turns, seed)

    for policy in policies.values():  # warm-up, untimed
        play(policy, workload(-1)[:2], sampling)
    seconds: dict[str, list[float]] = {name: [] for name in policies}
    same_tokens, reused, prompt_lengths = True, 0, []
    for repeat in range(args.repeats):
        prompts = workload(args.seed + repeat)
        prompt_lengths += [len(p) for turn in prompts for p in turn]
        answers = {}
        for name, policy in policies.items():
            elapsed, answers[name], hits = play(policy, prompts, sampling)
            seconds[name].append(elapsed)
            reused += hits if name == "reuse" else 0
        same_tokens &= all(answers[name] == answers["reuse"] for name in policies)

    median = {name: statistics.median(s) for name, s in seconds.items()}
    print(f"tiny model {args.mode} prompts, {args.episodes} episodes x {args.turns} turns, {args.new_tokens} new tokens, "
          f"greedy; prompt tokens mean {statistics.mean(prompt_lengths):.0f} (max {max(prompt_lengths)}); "
          f"median of {args.repeats}, torch threads 1")
    print(f"{'variant':<22}{'generate s':>11}  per repeat")
    for name, runs in seconds.items():
        print(f"{name:<22}{median[name]:>11.2f}  " + "  ".join(f"{s:.2f}" for s in runs))
    share = reused / sum(prompt_lengths)
    print(f"prompt tokens reused: {share:.1%}   same tokens in all variants: {same_tokens}")
    print(f"reuse vs no-reuse: {median['no-reuse'] / median['reuse']:.2f}x   "
          f"reuse vs transformers-generate: {median['transformers-generate'] / median['reuse']:.2f}x")
    print(json.dumps({"mode": args.mode, "episodes": args.episodes, "turns": args.turns, "reused_share": round(share, 3),
                      "same_tokens": same_tokens, **{f"{k}_s": round(v, 3) for k, v in median.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

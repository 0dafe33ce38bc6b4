"""Tokens and CPU-seconds per ALFWorld turn of restricted decoding, by prompt mode.

    OMP_NUM_THREADS=1 .venv/bin/python bench/alfworld_turns.py --model smollm2-135m --games 4 --turns 10
    OMP_NUM_THREADS=1 .venv/bin/python bench/alfworld_turns.py --games 16 --turns 20 --modes append --dtype bfloat16

Plays the first ``--games`` official ID games (``../shared/data`` or wherever ALFWorld's
data is found) for ``--turns`` turns with restricted decoding (every answer an admissible
action), once per ``--modes`` entry, on one torch thread, seeded alike, in this process.
For each mode it prints the prompt tokens a turn asks for, the prompt tokens it runs
(those the prefix cache did not hold), the tokens sampled, the forward passes of an
episode's turn (one for the prompt, then one per choice: restricted decoding appends the
tokens its trie forces without a pass each), and the CPU-seconds of generation per turn (``time.process_time`` around each ``generate`` call: the env's
stepping is not counted), with the ratio to the first mode. The same games, seeds and
model for every mode; the answers differ since the prompts do.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from hp_agent.envs import make
from hp_agent.envs.alfworld.env import prompting
from hp_agent.policies import SamplingParams, load_policy
from hp_agent.rollout import Episode, collect


def play_mode(policy, mode: str, games: int, turns: int, max_new_tokens: int, seed: int) -> dict[str, float]:
    kwargs, chat_history = prompting({"prompt_mode": mode, "split": "id", "source": "official", "num_games": games},
                                     constrain=True, chat_history=None)
    envs = [make("alfworld", **kwargs) for _ in range(games)]
    episodes = [Episode(task_id, group=k) for k, task_id in enumerate(envs[0].task_ids()[:games])]
    cpu, calls = 0.0, 0
    generate = policy.generate

    def timed(*args, **kw):
        nonlocal cpu, calls
        calls += 1
        started = time.process_time()
        out = generate(*args, **kw)
        cpu += time.process_time() - started
        return out

    policy.generate = timed
    policy.prefix_cache.clear()
    before = json.loads(json.dumps(policy.counts.__dict__))
    torch.manual_seed(seed)
    try:
        trajectories = collect(policy, envs, "alfworld", episodes, SamplingParams(max_new_tokens, 1.0), max_turns=turns,
                               seed=seed, chat_history=chat_history, constrain=True)
    finally:
        policy.generate = generate
        for env in envs:
            env.close()
    played = sum(len(t.turns) for t in trajectories)
    after = policy.counts.__dict__
    delta = {key: after[key] - before[key] for key in before}
    return {"turns": played, "won": sum(t.success for t in trajectories),
            "prompt_tokens": delta["prompt_tokens"] / played,
            "computed_prompt_tokens": (delta["prompt_tokens"] - delta["reused_tokens"]) / played,
            "sampled_tokens": delta["sampled_tokens"] / played,
            "passes": (delta["passes"] + calls) / played * len(episodes),
            "cpu_s": cpu / played}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--games", type=int, default=4)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--modes", nargs="+", default=["verl-agent", "append"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", help="float32 (the CPU's default) or bfloat16 (faster where the CPU has bf16 instructions)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    policy = load_policy(args.model, device="cpu", dtype=args.dtype)
    play_mode(policy, args.modes[0], 1, 1, args.max_new_tokens, args.seed)  # warm-up: the first game's translation
    results = {mode: play_mode(policy, mode, args.games, args.turns, args.max_new_tokens, args.seed) for mode in args.modes}
    first = results[args.modes[0]]
    print(f"{args.model} ({args.dtype}), {args.games} official ID games at once x up to {args.turns} turns, restricted, 1 thread")
    print(f"{'mode':<12}{'turns':>6}{'won':>5}{'prompt tok/turn':>17}{'run tok/turn':>14}{'sampled/turn':>14}"
          f"{'passes/turn':>13}{'CPU-s/turn':>12}{'vs ' + args.modes[0]:>16}")
    for mode, r in results.items():
        print(f"{mode:<12}{r['turns']:>6}{r['won']:>5}{r['prompt_tokens']:>17.1f}{r['computed_prompt_tokens']:>14.1f}"
              f"{r['sampled_tokens']:>14.1f}{r['passes']:>13.1f}{r['cpu_s']:>12.3f}{first['cpu_s'] / r['cpu_s']:>15.2f}x")


if __name__ == "__main__":
    main()

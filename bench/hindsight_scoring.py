"""Packed versus per-segment hindsight scoring on ALFWorld-length trajectories (tiny model).

    OMP_NUM_THREADS=1 .venv/bin/python bench/hindsight_scoring.py --turns 20,30,50
    OMP_NUM_THREADS=1 .venv/bin/python bench/hindsight_scoring.py --prompt-mode chat --turns 10,20 --no-generate

Trajectories are synthesized with the tiny model's tokenizer and ALFWorld's own prompt
templates (no game engine): each turn's prompt is the verl-agent template (task, step
count, the last two observation/action pairs, the current observation and ~20
admissible actions; ~500 tokens), or with ``--prompt-mode chat`` the whole conversation
so far (prompts grow every turn). Actions are a short ``<think>`` plus an ``<action>``.
Every row scores the same trajectories with hindsight, in turns, ``--repeats`` times (the
fastest of each is kept, so that load from other processes hits every variant alike):
the per-segment reference (``packed=False``) and the packed scorer, both from an empty
prefix cache. With ``--generate`` (default on) it also times sampling the same actions
with ``policy.generate`` (one batched call per turn index over the trajectories, as a
rollout wave would) and then the packed scorer again, as the trainer runs it: right
after that rollout, reusing the prompts' keys and values it left in the prefix cache
(``--cache-tokens``): ``reuse s``, its speed-up over the reference, and (last column)
that scoring time as a share of generation time.
All results are checked to agree with the reference (max abs difference printed).
Times are CPU seconds of this process (``time.process_time``), not wall time, so that
other processes on a shared machine disturb the ratios less.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import replace

import torch

from hp_agent.config import HindsightConfig
from hp_agent.envs.alfworld.env import CHAT_TURN_TEMPLATE, TEMPLATE, TEMPLATE_NO_HISTORY, format_actions, format_history
from hp_agent.hindsight import ScoringOptions, hindsight_sequences, score_trajectories
from hp_agent.packing import pack_sequences
from hp_agent.policies import Policy, SamplingParams, load_policy
from hp_agent.trajectory import Trajectory, Turn

RECEPTACLES = ["cabinet", "countertop", "drawer", "fridge", "sinkbasin", "shelf", "desk", "diningtable", "garbagecan",
               "microwave", "stoveburner", "coffeemachine", "sidetable", "dresser", "bed", "sofa", "armchair", "safe"]
OBJECTS = ["mug", "apple", "bread", "knife", "spoon", "plate", "bowl", "cup", "egg", "lettuce", "tomato", "potato",
           "book", "pen", "pencil", "cellphone", "keychain", "creditcard", "vase", "statue", "candle", "soapbar"]
TASKS = ["put a clean mug in coffeemachine.", "heat some egg and put it in countertop.", "put two pencil in drawer.",
         "look at book under the desklamp.", "cool some apple and put it in diningtable.", "put a cellphone in bed."]


def _observation(rng: random.Random) -> str:
    place = f"{rng.choice(RECEPTACLES)} {rng.randint(1, 9)}"
    things = ", ".join(f"a {rng.choice(OBJECTS)} {rng.randint(1, 9)}" for _ in range(rng.randint(2, 7)))
    return f"You arrive at {place}. On the {place}, you see {things}."


def _admissible(rng: random.Random, count: int) -> list[str]:
    moves = [f"go to {r} {i}" for r in RECEPTACLES for i in range(1, 4)]
    handling = [f"take {o} {rng.randint(1, 3)} from {r} {rng.randint(1, 3)}" for o, r in zip(OBJECTS, RECEPTACLES)]
    return ["inventory", "look"] + rng.sample(moves + handling, count - 2)


def synth_trajectory(policy: Policy, turns: int, mode: str, rng: random.Random) -> Trajectory:
    """A failed ALFWorld-like episode of ``turns`` turns, prompts rendered as the env would."""
    task = rng.choice(TASKS)
    history: list[tuple[str, str]] = []
    made: list[Turn] = []
    observation = f"You are in the middle of a room. Looking quickly around you, you see a cabinet 1. Your task is to: {task}"
    for t in range(turns):
        actions = _admissible(rng, 20)
        if t == 0:
            text = TEMPLATE_NO_HISTORY.format(current_observation=observation, admissible_actions=format_actions(actions))
        elif mode == "chat":
            text = CHAT_TURN_TEMPLATE.format(current_observation=observation, admissible_actions=format_actions(actions))
        else:
            text = TEMPLATE.format(task_description=task, step_count=t, history_length=min(2, t),
                                   action_history=format_history(history, 2), current_step=t + 1,
                                   current_observation=observation, admissible_actions=format_actions(actions))
        if mode == "chat" and made:
            messages = made[-1].prompt_messages + [{"role": "assistant", "content": made[-1].action_text},
                                                   {"role": "user", "content": text}]
        else:
            messages = [{"role": "user", "content": text}]
        command = rng.choice(actions)
        thought = " ".join(rng.choice(OBJECTS + RECEPTACLES + ["the", "I", "should", "check", "next"]) for _ in range(rng.randint(8, 30)))
        action_text = f"<think>{thought}</think>\n<action>{command}</action>"
        action_ids = policy.tokenizer.encode(action_text, add_special_tokens=False) + [policy.eos_token_id]
        observation = _observation(rng)
        made.append(Turn(messages, policy.render(messages), action_ids, [0.0] * len(action_ids), action_text, command, observation))
        history.append((observation, command))
    made[-1].observation = ""
    feedback = f"failure: the task was not completed within {turns} steps; last observation: {history[-1][0]}"
    return Trajectory("alfworld", f"synth-{rng.randint(0, 10**6)}", "pick", made, 0.0, feedback, False, multi_turn=True)


def time_scoring(policy: Policy, trajectories: list[Trajectory], options: ScoringOptions) -> tuple[float, list]:
    started = time.process_time()
    scores = score_trajectories(policy, trajectories, options, with_hindsight=True)
    return time.process_time() - started, scores


def time_generation(policy: Policy, trajectories: list[Trajectory]) -> float:
    """Sample every turn's action again: one batched call per turn index, as a rollout wave
    would (prefix reuse within this pass only: the cache starts empty)."""
    policy.prefix_cache.clear()
    seconds = 0.0
    for t in range(max(len(traj.turns) for traj in trajectories)):
        live = [traj.turns[t] for traj in trajectories if t < len(traj.turns)]
        sampling = SamplingParams(max_new_tokens=max(len(turn.action_ids) for turn in live))
        started = time.process_time()
        policy.generate([turn.prompt_ids for turn in live], sampling)
        seconds += time.process_time() - started
    return seconds


def forward_tokens(policy: Policy, trajectories: list[Trajectory], options: ScoringOptions) -> tuple[int, int]:
    """Tokens through the model: per-segment (every sequence whole) and packed (row nodes)."""
    sequences = [turn.prompt_ids + turn.action_ids for traj in trajectories for turn in traj.turns]
    sequences += [seq for _, _, seq in hindsight_sequences(policy, trajectories, options)]
    rows, _ = pack_sequences(sequences, options.score_batch_tokens)
    return sum(len(s) for s in sequences), sum(len(row) for row in rows)


def max_difference(a: list, b: list) -> float:
    return max(
        max((x - y).abs().max().item() for x, y in zip(sa.weights + sa.causal_logprobs, sb.weights + sb.causal_logprobs))
        for sa, sb in zip(a, b)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", default="20,30,50", help="comma-separated turns per trajectory, one row each")
    parser.add_argument("--trajectories", type=int, default=2, help="trajectories scored together per row")
    parser.add_argument("--prompt-mode", choices=["verl-agent", "chat"], default="verl-agent")
    parser.add_argument("--batch-tokens", type=int, default=HindsightConfig().score_batch_tokens, help="padded tokens per forward pass")
    parser.add_argument("--repeats", type=int, default=2, help="time each variant this many times, keep the fastest")
    parser.add_argument("--generate", action=argparse.BooleanOptionalAction, default=True,
                        help="also time policy.generate on the same prompts and action lengths")
    parser.add_argument("--cache-tokens", type=int, default=131_072,
                        help="prefix cache budget: room for every prompt of a row's rollout")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(args.seed)
    policy = load_policy("tiny", prefix_cache_tokens=args.cache_tokens)
    reference = replace(ScoringOptions.from_config(), packed=False, score_batch_tokens=args.batch_tokens)
    packed = replace(ScoringOptions.from_config(), packed=True, score_batch_tokens=args.batch_tokens)
    rng = random.Random(args.seed)

    print(f"tiny model, {args.prompt_mode} prompts, {args.trajectories} trajectories per row, "
          f"batch_tokens {args.batch_tokens}, fastest of {args.repeats}, "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'turns':>5} {'prompt':>6} {'per-seg tok':>11} {'packed tok':>10} {'per-seg s':>9} {'packed s':>9} "
          f"{'speedup':>7} {'max diff':>9}"
          + (f" {'gen s':>7} {'reuse s':>8} {'speedup':>7} {'hs/gen':>7}" if args.generate else ""))
    summary = []
    for turns in [int(t) for t in args.turns.split(",")]:
        trajectories = [synth_trajectory(policy, turns, args.prompt_mode, rng) for _ in range(args.trajectories)]
        prompt = sum(len(turn.prompt_ids) for traj in trajectories for turn in traj.turns) / (turns * args.trajectories)
        best = {"reference": float("inf"), "packed": float("inf"), "generate": float("inf"), "reuse": float("inf")}
        for _ in range(args.repeats):
            policy.prefix_cache.clear()
            seconds, ref_scores = time_scoring(policy, trajectories, reference)
            best["reference"] = min(best["reference"], seconds)
            policy.prefix_cache.clear()
            seconds, packed_scores = time_scoring(policy, trajectories, packed)
            best["packed"] = min(best["packed"], seconds)
            if args.generate:
                best["generate"] = min(best["generate"], time_generation(policy, trajectories))
                seconds, reuse_scores = time_scoring(policy, trajectories, packed)
                best["reuse"] = min(best["reuse"], seconds)
        reference_tokens, packed_tokens = forward_tokens(policy, trajectories, packed)
        difference = max(max_difference(ref_scores, packed_scores), max_difference(ref_scores, reuse_scores) if args.generate else 0.0)
        row = {"turns": turns, "prompt_tokens": round(prompt), "reference_tokens": reference_tokens,
               "packed_tokens": packed_tokens, "reference_s": round(best["reference"], 3),
               "packed_s": round(best["packed"], 3), "speedup": round(best["reference"] / best["packed"], 2),
               "max_abs_diff": difference}
        line = (f"{turns:>5} {prompt:>6.0f} {reference_tokens:>11} {packed_tokens:>10} {best['reference']:>9.2f} {best['packed']:>9.2f} "
                f"{row['speedup']:>6.2f}x {row['max_abs_diff']:>9.1e}")
        if args.generate:
            row["generate_s"], row["reuse_s"] = round(best["generate"], 3), round(best["reuse"], 3)
            row["reuse_speedup"] = round(best["reference"] / best["reuse"], 2)
            row["scoring_over_generate"] = round(best["reuse"] / best["generate"], 3)
            line += (f" {best['generate']:>7.2f} {best['reuse']:>8.2f} {row['reuse_speedup']:>6.2f}x"
                     f" {row['scoring_over_generate']:>6.0%}")
        print(line, flush=True)
        summary.append(row)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

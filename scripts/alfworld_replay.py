"""Check AlfworldEnv against the official games: every stored walkthrough must win.

Replays the walkthrough of EVERY official ID (valid_seen, 140) and OOD (valid_unseen,
134) game through :class:`hp_agent.envs.alfworld.AlfworldEnv` (the same parsing, steps
and rewards a model gets), then plays the fixed handcoded expert and a uniformly random
admissible-action policy on a sample of OOD games, and prints success per split and per
task type, plus engine timings. Takes 10-20 minutes on 2 CPU cores (22 min measured
on a shared machine under load).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/alfworld_replay.py --workers 2 --output replay.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="processes playing games in parallel")
    parser.add_argument("--sample", type=int, default=20, help="OOD games for the expert and random policies")
    parser.add_argument("--max-steps", type=int, default=50, help="steps per episode (verl-agent: 50)")
    parser.add_argument("--seed", type=int, default=0, help="episode i is seeded seed + i")
    parser.add_argument("--output", type=Path, help="also write the numbers as JSON here")
    return parser.parse_args(argv)


def summarize(name: str, trajectories: list) -> dict:
    """Print and return wins/total, per task type, mean steps of one batch of episodes."""
    by_type: dict[str, list[bool]] = defaultdict(list)
    for trajectory in trajectories:
        by_type[trajectory.task_type].append(trajectory.success)
    wins = sum(t.success for t in trajectories)
    steps = statistics.mean(len(t.turns) for t in trajectories) if trajectories else 0.0
    invalid = sum(turn.invalid for t in trajectories for turn in t.turns)
    types = {k: f"{sum(v)}/{len(v)}" for k, v in by_type.items()}
    print(f"{name}: {wins}/{len(trajectories)} won ({100 * wins / max(len(trajectories), 1):.1f}%), "
          f"mean steps {steps:.1f}, invalid actions {invalid}; per type: {types}", flush=True)
    failed = [t.task_id for t in trajectories if not t.success]
    return {"wins": wins, "total": len(trajectories), "mean_steps": steps, "per_type": types, "failed": failed}


def time_engine(env, task_ids: list[str]) -> dict:
    """Seconds per first load + reset, per reset of a loaded game, and per step."""
    loads, resets, steps = [], [], []
    for task_id in task_ids:
        start = time.perf_counter()
        _, info = env.reset(seed=0, options={"task_id": task_id})
        loads.append(time.perf_counter() - start)
        start = time.perf_counter()
        _, info = env.reset(seed=0, options={"task_id": task_id})
        resets.append(time.perf_counter() - start)
        for _ in range(10):
            start = time.perf_counter()
            *_, info = env.step(f"<action>{info['admissible_actions'][0]}</action>")
            steps.append(time.perf_counter() - start)
    timing = {"load_and_reset_s": statistics.median(loads), "reset_s": statistics.median(resets),
              "step_s": statistics.median(steps)}
    print("engine timing (median): " + ", ".join(f"{k} {v:.3f}" for k, v in timing.items()), flush=True)
    return timing


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # Imported after argument parsing: the engine is heavy, and parsing should fail fast.
    from hp_agent.envs.alfworld import AlfworldEnv
    from hp_agent.rollout import Episode, play
    from hp_agent.scripted_play import ScriptedActor, scripted_pool

    def played(policy: str, split: str, limit: int | None = None) -> list:
        """``policy`` plays the first ``limit`` games of ``split`` (task ids cycle through the task types: a balanced sample)."""
        actor = ScriptedActor(policy)
        with scripted_pool(actor, "alfworld", {"split": split, "max_steps": args.max_steps}, args.workers) as pool:
            episodes = [Episode(task_id, k) for k, task_id in enumerate(pool.task_ids()[:limit])]
            return play(actor, pool, "alfworld", episodes, seed=args.seed)

    report: dict = {"max_steps": args.max_steps, "workers": args.workers}
    started = time.perf_counter()
    for split in ("id", "ood"):
        trajectories = played("walkthrough", split)
        report[f"walkthrough_{split}"] = summarize(f"walkthrough {split} ({len(trajectories)} games)", trajectories)
    for policy in ("expert", "random"):
        trajectories = played(policy, "ood", args.sample)
        report[f"{policy}_ood_sample"] = summarize(f"{policy} ood sample ({len(trajectories)} games)", trajectories)
    env = AlfworldEnv(split="ood", max_steps=args.max_steps)
    sample = env.task_ids()[: args.sample]
    report["timing"] = time_engine(env, sample[:3])
    env.close()
    report["wall_s"] = time.perf_counter() - started
    print(f"total {report['wall_s']:.0f} s", flush=True)
    if args.output:
        args.output.write_text(json.dumps(report, indent=2))
    all_won = all(report[f"walkthrough_{s}"]["wins"] == report[f"walkthrough_{s}"]["total"] for s in ("id", "ood"))
    return 0 if all_won else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

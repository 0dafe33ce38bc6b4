"""How often a run's training episodes reached each ALFWorld subgoal, by blocks of steps.

    python scripts/alfworld_subgoal_rates.py runs/<run> [--block 8]

Reads the run's trajectories.jsonl and replays each episode's commands through
:class:`hp_agent.envs.alfworld.subgoals.SubgoalTracker` (a well-formed command counts as
accepted: with decoding restricted to admissible actions every one is), so runs trained with
and without ``subgoal_reward`` are measured the same way. Prints, per block, the episodes,
the share that held the task's object, the share of device tasks that applied the device to
it, and the wins, each with a 95% interval.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from hp_agent.envs.alfworld.subgoals import DEVICE_TASKS, LAMP_TASK, SubgoalTracker
from hp_agent.evaluation import wilson_interval


def reached(trajectory: dict) -> set[str]:
    tracker = SubgoalTracker(trajectory["task_id"], trajectory["task_type"])
    for turn in trajectory["turns"]:
        tracker.step(turn["action"], not turn["invalid"])
    return tracker.reached


def rate(hits: int, n: int) -> str:
    low, high = wilson_interval(hits, n) if n else (0.0, 1.0)
    return f"{hits:3d}/{n:<3d} = {hits / max(n, 1):5.1%} [{low:.1%}, {high:.1%}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--block", type=int, default=8, help="training steps per row")
    args = parser.parse_args()
    rows: dict[int, list[tuple[dict, set[str]]]] = defaultdict(list)
    with open(args.run / "trajectories.jsonl") as lines:
        for line in lines:
            trajectory = json.loads(line)
            if not trajectory["errored"]:
                rows[trajectory["step"] // args.block].append((trajectory, reached(trajectory)))
    print(f"{'steps':>8}  {'held the object':<30} {'applied the device':<30} {'won':<30}")
    for block in sorted(rows):
        episodes = rows[block]
        device = [goals for t, goals in episodes if t["task_type"] in DEVICE_TASKS | {LAMP_TASK}]
        first = block * args.block
        print(f"{first:>3}-{first + args.block - 1:<4}  {rate(sum('hold' in g for _, g in episodes), len(episodes)):<30} "
              f"{rate(sum('apply' in g for g in device), len(device)):<30} "
              f"{rate(sum(t['success'] for t, _ in episodes), len(episodes)):<30}")


if __name__ == "__main__":
    main()

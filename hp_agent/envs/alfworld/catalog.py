"""What ALFWorld data is here, and expert demonstrations in the trajectory format.

Backs ``hp-agent data alfworld``: :func:`describe` counts the games of each split by
task type; :func:`write_demonstrations` plays the fixed handcoded expert and writes the
episodes it wins as token-in-token-out trajectories (prompt ids rendered by the target
model's chat template), ready for ``hp-agent sft --data``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hp_agent.envs.alfworld.data import SHORT_TASK_TYPES, list_games
from hp_agent.envs.alfworld.env import AlfworldEnv
from hp_agent.envs.alfworld.scripted import Job, play_episodes
from hp_agent.envs.alfworld.sources import resolve_data_root
from hp_agent.policies import Policy
from hp_agent.trajectory import Trajectory, write_jsonl

SPLIT_NAMES = ("train", "id", "ood")


def describe(root: Path) -> dict[str, dict[str, int]]:
    """Games per split and task type (``{"id": {"pick": 35, ...}, ...}``); absent splits skipped."""
    counts: dict[str, dict[str, int]] = {}
    for split in SPLIT_NAMES:
        try:
            games = list_games(root, split)
        except FileNotFoundError:
            continue
        by_type = Counter(game.task_type for game in games)
        counts[split] = {task_type: by_type.get(task_type, 0) for task_type in SHORT_TASK_TYPES}
    return counts


def tokenize_demonstration(trajectory: Trajectory, policy: Policy) -> Trajectory:
    """Fill prompt and action ids with ``policy``'s chat template and tokenizer.

    Demonstrations were not sampled, so ``sample_logprobs`` stays empty.
    """
    for turn in trajectory.turns:
        turn.prompt_ids = policy.render(turn.prompt_messages)
        turn.action_ids = policy.tokenizer.encode(turn.action_text, add_special_tokens=False) + [policy.tokenizer.eos_token_id]
    return trajectory


def write_demonstrations(out: Path, policy: Policy, split: str = "train", limit: int | None = None, workers: int = 1,
                         source: str = "auto") -> tuple[int, int]:
    """Write the expert's won episodes of ``split`` to ``out``; returns (won, played)."""
    root = resolve_data_root(split, source, num_games=limit)
    env = AlfworldEnv(split=split, data_root=root, num_games=limit)
    jobs = [Job(task_id=task_id, seed=k, group=k) for k, task_id in enumerate(env.task_ids())]
    played = play_episodes(env, {"split": split, "data_root": root, "num_games": limit}, "expert", jobs, workers=workers)
    env.close()
    won = [tokenize_demonstration(t, policy) for t in played if t.success]
    write_jsonl(out, won)
    return len(won), len(played)

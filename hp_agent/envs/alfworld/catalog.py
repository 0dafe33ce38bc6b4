"""What ALFWorld data is here: :func:`describe` counts the games of each split by task type
(``hp-agent data alfworld``; its expert demonstrations: :mod:`hp_agent.scripted_play`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hp_agent.envs.alfworld.data import SHORT_TASK_TYPES, list_games

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

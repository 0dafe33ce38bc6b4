"""What ALFWorld data is here, and expert demonstrations in the trajectory format.

Backs ``hp-agent data alfworld``: :func:`describe` counts the games of each split by
task type; :func:`expert_demonstrations` plays the fixed handcoded expert through the
rollout loop (:func:`hp_agent.rollout.play`, so prompts are rendered as RL's are) and
returns the episodes it wins as text trajectories. Turning them into a model's token ids
is the SFT side's work (:func:`hp_agent.sft.tokenize_demonstration`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hp_agent.envs.alfworld.data import SHORT_TASK_TYPES, list_games
from hp_agent.envs.alfworld.scripted import ScriptedActor, scripted_pool
from hp_agent.envs.alfworld.sources import resolve_data_root
from hp_agent.progress import LoopProgress
from hp_agent.rollout import Episode, play
from hp_agent.trajectory import Trajectory

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


def expert_demonstrations(split: str = "train", limit: int | None = None, workers: int = 1,
                          source: str = "auto", progress: bool = False, chat: bool = False) -> tuple[list[Trajectory], int]:
    """The expert's won episodes of ``split`` as text (no token ids: an env knows no model),
    and how many episodes were played. Episode ``k`` is seeded ``k``.

    ``chat``: prompted as a chat-mode run is (``prompt_mode="chat"`` and ``rollout.chat_history``):
    each turn's prompt is the whole conversation so far."""
    root = resolve_data_root(split, source, num_games=limit)
    kwargs = {"split": split, "data_root": root, "num_games": limit, **({"prompt_mode": "chat"} if chat else {})}
    actor = ScriptedActor("expert")
    won = 0

    def done(wave: list[Trajectory]) -> None:
        nonlocal won
        won += sum(t.success for t in wave)
        bar.advance(len(wave), f"{won} won")

    with scripted_pool(actor, "alfworld", kwargs, workers) as pool:
        episodes = [Episode(task_id, group=k) for k, task_id in enumerate(pool.task_ids())]
        with LoopProgress(f"demonstrations {split}", len(episodes), enabled=progress, every=10) as bar:
            played = play(actor, pool, "alfworld", episodes, chat_history=chat, on_wave=done)
    return [t for t in played if t.success], len(played)

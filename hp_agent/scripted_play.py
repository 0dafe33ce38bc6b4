"""Scripted players through the rollout loop: ALFWorld's walkthrough, expert and random
policies (:mod:`hp_agent.envs.alfworld.scripted`) as :class:`hp_agent.rollout.Actor`\ s.

:func:`hp_agent.rollout.play` plays a :class:`ScriptedActor` as it plays a model, so its
trajectories are recorded, and its prompts rendered (system prompt, ``chat_history``),
exactly as RL's. Its turns are text only, no token ids (no model is involved):
:func:`hp_agent.sft.tokenize_demonstration` renders them for a model.
:func:`expert_demonstrations` backs ``hp-agent data alfworld --demos``.
"""

from __future__ import annotations

from typing import Any

from hp_agent.envs.alfworld.env import CONVERSATION_MODES
from hp_agent.envs.alfworld.scripted import ScriptedPolicy, scripted_policy
from hp_agent.envs.alfworld.sources import resolve_data_root
from hp_agent.envs.pool import EnvPool, make_env_pool
from hp_agent.errors import UserValueError
from hp_agent.progress import LoopProgress
from hp_agent.rollout import Ask, Episode, Reply, play
from hp_agent.trajectory import Trajectory


class ScriptedActor:
    """Plays scripted policy ``name``: a fresh :class:`ScriptedPolicy` per episode."""

    def __init__(self, name: str, action_template: str = "<action>{action}</action>") -> None:
        self.name = name
        self._policy = scripted_policy(name)
        self._episodes: dict[int, ScriptedPolicy] = {}  # episode index -> its script
        self.action_template = action_template  # how a command is written (scripted_pool sets its env's)

    @property
    def env_kwargs(self) -> dict[str, Any]:
        """What the policy needs the env built with (e.g. the walkthrough in the reset's info)."""
        return dict(self._policy.env_kwargs)

    def start(self, episode: int, seed: int, info: dict[str, Any]) -> None:
        self._episodes[episode] = self._policy(info, seed)

    def act(self, asks: list[Ask]) -> list[Reply]:
        return [Reply(self.action_template.format(action=self._episodes[ask.episode].respond(ask.info))) for ask in asks]


def scripted_pool(actor: ScriptedActor, env_name: str, env_kwargs: dict[str, Any], workers: int = 1) -> EnvPool:
    """An env pool for ``actor``: ``workers`` envs built with ``env_kwargs`` and what the
    policy needs, in this process for one worker, else one per worker process (a new
    game's translation is CPU-bound, 0.2-2 s)."""
    if workers < 1:
        raise UserValueError(f"workers must be >= 1, got {workers}")
    pool = make_env_pool(env_name, workers, workers if workers > 1 else 0, {**env_kwargs, **actor.env_kwargs})
    actor.action_template = pool.action_template
    return pool


def expert_demonstrations(split: str = "train", limit: int | None = None, workers: int = 1,
                          source: str = "auto", progress: bool = False,
                          prompt_mode: str = "verl-agent") -> tuple[list[Trajectory], int]:
    """The expert's won episodes of ``split`` as text (no token ids: an env knows no model),
    and how many episodes were played. Episode ``k`` is seeded ``k``.

    ``prompt_mode``: ALFWorld's; in the chat and append modes each turn's prompt is the
    whole conversation so far, as a run's (``rollout.chat_history``)."""
    root = resolve_data_root(split, source, num_games=limit)
    kwargs = {"split": split, "data_root": root, "num_games": limit, "prompt_mode": prompt_mode}
    chat = prompt_mode in CONVERSATION_MODES
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

"""Any hp_agent env as a tool-calling environment for TRL's ``GRPOTrainer(environment_factory=...)``.

TRL (1.16) asks for a class built with no arguments, with ``reset(**row) -> str`` (the
text appended to the prompt's last user message), ``get_reward() -> float`` (read once
per finished rollout) and public methods that it offers the model as tools, described
by their type hints and docstrings. :class:`ToolEnv` has exactly one tool, ``act``: one
action of the env per call, answered with what the env says back. Nothing here imports
TRL, so the adapter is tested without it; ``examples/trl_grpo_keys.py`` runs it in
TRL's trainer (``make test-trl``).

    factory = environment_factory("alfworld", source="official", split="train")
    GRPOTrainer(model=..., environment_factory=factory, train_dataset=Dataset.from_list(
        task_rows("alfworld", source="official", split="train")), args=GRPOConfig(...))

The model writes bare actions ("go to desk 1"); ``act`` puts each in the env's
``action_template`` (ALFWorld's ``<action>`` tags), so the env sees what our own
rollouts send. Since TRL samples freely, each reply lists the admissible actions where
the env has them (our restricted decoding makes that list unnecessary in our rollouts).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from hp_agent.envs import make
from hp_agent.envs.base import TextEnv

ENDED = "The episode has ended: no more actions are taken."


class ToolEnv:
    """One hp_agent env, reset and stepped as TRL's tool-calling loop asks.

    ``reset(**row)`` plays ``row["task_id"]`` where the dataset row has one (else the
    seed's task, ``row["seed"]``, default 0); the reward is the sum of every step's reward
    (the env's outcome and shaping), as our trainer's return is.
    """

    def __init__(self, env: str, env_kwargs: dict[str, Any] | None = None, list_actions: bool = True):
        self._env: TextEnv = make(env, **(env_kwargs or {}))
        self._list_actions = list_actions
        self._return = 0.0
        self._done = True

    def reset(self, **row: Any) -> str:
        task_id = row.get("task_id")
        observation, info = self._env.reset(seed=row.get("seed", 0), options={"task_id": task_id} if task_id else None)
        self._return, self._done = 0.0, False
        return self._reply(observation, info)

    def act(self, action: str) -> str:
        """Take one action in the environment and see what happens.

        Args:
            action: The action, as plain text, e.g. "open" or "go to desk 1".

        Returns:
            What the environment says after the action.
        """
        if self._done:
            return ENDED
        observation, reward, terminated, truncated, info = self._env.step(
            self._env.action_template.format(action=action.strip()))
        self._return += float(reward)
        self._done = terminated or truncated
        return self._reply(observation, info) + (f"\n{ENDED}" if self._done else "")

    def get_reward(self) -> float:
        return self._return

    def _reply(self, observation: str, info: dict[str, Any]) -> str:
        actions = info.get("admissible_actions") if self._list_actions else None
        return f"{observation}\nAdmissible actions: {', '.join(actions)}" if actions else observation


def environment_factory(env: str, list_actions: bool = True, **env_kwargs: Any) -> Callable[[], ToolEnv]:
    """The no-argument constructor TRL's ``environment_factory`` takes, of env ``env`` built with ``env_kwargs``."""
    make(env, **env_kwargs).close()  # a bad name or argument fails here, in one line, not in TRL's probe
    return partial(ToolEnv, env, env_kwargs, list_actions)


def task_rows(env: str, limit: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
    """A dataset for TRL: one row per task of the env's split, its prompt the env's
    instructions (the observation follows from :meth:`ToolEnv.reset`)."""
    built = make(env, **env_kwargs)
    try:
        instructions = " ".join(filter(None, [built.system_prompt, "Call the act tool with one action at a time."]))
        task_ids = built.task_ids()[:limit] if limit else built.task_ids()
    finally:
        built.close()
    return [{"prompt": [{"role": "user", "content": instructions + "\n\n"}], "task_id": task_id} for task_id in task_ids]

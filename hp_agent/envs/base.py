"""The environment contract: Gymnasium envs whose observations and actions are text.

Every environment, single-step (math, code) or multi-turn (ALFWorld), is a
``gymnasium.Env`` with :class:`gymnasium.spaces.Text` spaces:

* ``reset(seed=s, options={"task_id": ...})`` picks a task (by id, else by seed) and
  returns the first observation (the text the policy is prompted with) and an info dict
  with at least ``task_id`` and ``task_type``; multi-turn envs add
  ``admissible_actions``.
* ``step(action_text)`` returns ``(observation, reward, terminated, truncated, info)``.
  When an episode ends, ``info["verdict"]`` holds the :class:`Verdict` (outcome reward R
  and feedback). Per-step shaping (e.g. an invalid-action penalty) is reported as
  ``info["penalty"]`` and is already included in ``reward``; ``info["action"]`` is the
  parsed action and ``info["invalid_action"]`` flags an unparsable one. An env whose
  observation is a whole prompt (history, instructions) puts the new text alone in
  ``info["game_text"]``; trajectories record that as the turn's observation.

Envs know nothing about learners: they never see token ids or log-probs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from functools import cache
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium import spaces


@cache
def _charset() -> frozenset[str]:
    # Every printable character plus layout whitespace: model output and user data may
    # hold any of them, and Gymnasium's default Text charset is alphanumeric only.
    printable = (chr(code) for code in range(sys.maxunicode + 1) if chr(code).isprintable())
    return frozenset(printable) | frozenset("\n\t\r")


@cache
def text_space(max_length: int) -> spaces.Text:
    """A Text space over all printable characters, up to ``max_length`` characters.

    Cached: building one indexes ~144,000 characters (about 0.3 s), and every env
    instance needs two.
    """
    return spaces.Text(max_length=max_length, min_length=0, charset=_charset())


class TextEnv(gym.Env[str, str]):
    """Base class for text environments.

    Subclasses set ``reward_bounds`` (lowest and highest outcome reward R; the credit
    bound |R_max - R_min| and the default baseline derive from it) and ``system_prompt``
    (the system message the rollout puts before each observation, or ``None``).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    reward_bounds: ClassVar[tuple[float, float]] = (0.0, 1.0)
    system_prompt: ClassVar[str | None] = None
    max_turns: int = 1

    def __init__(self, max_observation_chars: int = 200_000, max_action_chars: int = 32_768):
        super().__init__()
        self.observation_space = text_space(max_observation_chars)
        self.action_space = text_space(max_action_chars)

    def task_ids(self) -> list[str]:
        """Ids of every task in this env's split, in a fixed order."""
        raise NotImplementedError

    @classmethod
    def corpus_texts(cls) -> Iterator[str]:
        """Representative texts (prompts, answers) for training the tiny model's tokenizer."""
        return iter(())

    def demonstrations(self) -> Iterator[tuple[str, str]]:
        """(first observation, good response) pairs of this split, for supervised warm-up."""
        raise NotImplementedError(f"{type(self).__name__} has no built-in demonstrations")

    def task_id_for_seed(self, seed: int) -> str:
        """The task a ``reset(seed=seed)`` without a task id plays."""
        ids = self.task_ids()
        return ids[seed % len(ids)]

    def task_id_for_reset(self, seed: int | None, options: dict[str, Any] | None) -> str:
        """The task a ``reset`` plays: ``options["task_id"]``, else the seed's task, else a
        random one (from ``np_random``, so call it after ``super().reset(seed=seed)``)."""
        task_id = (options or {}).get("task_id")
        if task_id is not None:
            return task_id
        if seed is not None:
            return self.task_id_for_seed(seed)
        ids = self.task_ids()
        return ids[int(self.np_random.integers(len(ids)))]

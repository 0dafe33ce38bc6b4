"""The environment contract: Gymnasium envs whose observations and actions are text.

Every environment, single-step (math, code) or multi-turn (ALFWorld), is a
``gymnasium.Env`` with :class:`gymnasium.spaces.Text` spaces:

* ``reset(seed=s, options={"task_id": ...})`` picks a task (by id, else by seed) and
  returns the first observation (the text the policy is prompted with) and an info dict
  with at least ``task_id`` and ``task_type``; multi-turn envs add
  ``admissible_actions``.
* ``step(action_text)`` returns ``(observation, reward, terminated, truncated, info)``.
  When an episode ends, ``info["verdict"]`` holds the :class:`Verdict` (outcome reward R
  and feedback). Per-step shaping is reported as ``info["shaping"]``, a reward that is
  negative for a cost (-0.1 for an invalid action), already included in ``reward``; ``info["action"]`` is the
  parsed action and ``info["invalid_action"]`` flags an unparsable one. An env whose
  observation is a whole prompt (history, instructions) puts the new text alone in
  ``info["game_text"]``; trajectories record that as the turn's observation.

Envs know nothing about learners: they never see token ids or log-probs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from typing import Any, ClassVar, TypeVar

import gymnasium as gym
from gymnasium import spaces

from hp_agent.errors import UserNotImplementedError, UserValueError


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


T = TypeVar("T")


def find_task(table: Mapping[str, T], task_id: str, env: TextEnv, noun: str = "tasks") -> T:
    """``table[task_id]``, or a LookupError naming the env, its split, its size and a valid id."""
    if task_id not in table:
        raise LookupError(f"unknown task id {task_id!r} in {type(env).__name__}(split={getattr(env, 'split', None)!r}) "
                          f"with {len(table)} {noun}, e.g. {next(iter(table), None)!r}")
    return table[task_id]


class TextEnv(gym.Env[str, str]):
    """Base class for text environments.

    Subclasses set ``reward_bounds`` (lowest and highest outcome reward R; the credit
    bound |R_max - R_min| derives from it), ``system_prompt`` (the system message the
    rollout puts before each observation, or ``None``) and ``answer_format`` (a regular
    expression matching the answer's markup, e.g. ``<action>`` tags, so that the trainer
    can log the credit of format tokens apart from content tokens).

    Envs that list ``admissible_actions`` set ``action_template`` too: the response that the
    env reads as an action, ``{action}`` standing for it (ALFWorld's ``<action>{action}</action>``),
    which restricted decoding (``rollout.constrain_to_admissible``) makes each response.

    Evaluation reads five more: ``eval_split`` (the held-out split scored when none is
    named; ``None``: the constructor's default), ``compare_splits`` (the held-out splits
    ``hp-agent compare`` scores; empty: ``eval_split`` alone), ``eval_samples`` (samples per
    task there: Avg@k and Pass@k for k > 1), ``task_type_order`` (the order results per
    task type are reported in; others follow alphabetically) and ``limit_argument`` (the
    constructor argument that builds only the first N tasks, so that an evaluation of N
    tasks prepares no more; ``None`` when building all is cheap).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    reward_bounds: ClassVar[tuple[float, float]] = (0.0, 1.0)
    system_prompt: ClassVar[str | None] = None
    answer_format: ClassVar[str | None] = None
    action_template: ClassVar[str] = "{action}"
    eval_split: ClassVar[str | None] = None
    compare_splits: ClassVar[tuple[str, ...]] = ()
    eval_samples: ClassVar[int] = 1
    task_type_order: ClassVar[tuple[str, ...]] = ()
    limit_argument: ClassVar[str | None] = None
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
        """(observation, response) pairs of this split for supervised warm-up: good
        responses, unless the env was asked for noisy ones (the toy envs' ``demo_mistakes``)."""
        raise UserNotImplementedError(f"{type(self).__name__} has no built-in demonstrations")

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


class SingleStepTaskEnv(TextEnv):
    """One step per episode over a table of tasks, each with ``id``, ``question``,
    ``task_type`` and ``difficulty`` (math, code): the table, ``reset`` and the
    one-step guard. Subclasses check their options (:meth:`_check_options`), then call
    :meth:`_set_tasks`, and grade in ``step`` after :meth:`_take_step`. Their held-out
    split is ``test``."""

    eval_split: ClassVar[str | None] = "test"
    max_turns = 1

    @staticmethod
    def _check_options(split: str, splits: Iterable[str], num_tasks: int | None) -> None:
        if split not in splits:
            raise UserValueError(f"unknown split {split!r}; valid splits: {', '.join(splits)}")
        if num_tasks is not None and num_tasks < 1:
            raise UserValueError(f"num_tasks must be >= 1 (or None for all), got {num_tasks}")

    def _set_tasks(self, split: str, tasks: Iterable[Any]) -> None:
        self.split = split
        self._tasks = {task.id: task for task in tasks}
        self._task = None
        self._done = False

    def task_ids(self) -> list[str]:
        """Task ids in file / generation order."""
        return list(self._tasks)

    def task(self, task_id: str) -> Any:
        """The task ``task_id``, reference included (never shown to the policy)."""
        return find_task(self._tasks, task_id, self)

    @classmethod
    def corpus_texts(cls) -> Iterator[str]:
        """The system prompt, then each built-in train task's question and demonstration."""
        if cls.system_prompt:
            yield cls.system_prompt
        for question, answer in cls(split="train").demonstrations():
            yield question
            yield answer

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on ``options["task_id"]``, else the seed's task, else a random one."""
        super().reset(seed=seed)
        self._task = self.task(self.task_id_for_reset(seed, options))
        self._done = False
        info = {"task_id": self._task.id, "task_type": self._task.task_type, "difficulty": self._task.difficulty}
        return self._task.question, info

    def _take_step(self) -> Any:
        """The episode's task, once: a second step, or one before ``reset``, is an error."""
        name = type(self).__name__
        if self._task is None:
            raise RuntimeError(f"{name}.step() called before reset()")
        if self._done:
            raise RuntimeError(f"{name} episode is over (one step per episode); call reset() first")
        self._done = True
        return self._task

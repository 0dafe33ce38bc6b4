"""The env pool protocol, and what its two implementations share.

:class:`EnvPool` is all that rollout, the trainer and the bench use of a pool. Its two
implementations, :class:`~hp_agent.envs.pool.local.LocalPool` (envs in this process) and
:class:`~hp_agent.envs.pool.workers.WorkerPool` (envs in worker processes), subclass it
to share the code below: slot layout, request checks, the env attributes and their
meaning. :mod:`hp_agent.envs.pool` documents the pools and picks one.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import import_module
from pathlib import Path
from typing import Any, Protocol, Union, runtime_checkable

from hp_agent.envs import make
from hp_agent.envs.base import TextEnv
from hp_agent.errors import UserError


@dataclass(frozen=True)
class EnvError:
    """A failed env call: exception type name, message and traceback text.

    Besides the env's own exceptions the worker pool reports ``WorkerDied``,
    ``EnvTimeout`` and ``EnvStateLost`` (a step on a slot whose env was rebuilt, before
    its next reset).
    """

    type: str
    message: str
    traceback: str = ""
    user_error: bool = False  # a bad name or argument (hp_agent.errors.UserError): one line, not a bug

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"

    @classmethod
    def from_exception(cls, error: BaseException) -> EnvError:
        return cls(type(error).__name__, str(error), "".join(traceback.format_exception(error)), isinstance(error, UserError))


Result = Union[tuple, EnvError]
Request = tuple[int, Any]  # (slot, (seed, options)) for a reset, (slot, action) for a step


def build_env(spec: str, **kwargs: Any) -> TextEnv:
    """Build a registered env by name, or call the factory of a ``"module:factory"`` spec."""
    if ":" not in spec:
        return make(spec, **kwargs)
    module_name, _, attr = spec.partition(":")
    env = getattr(import_module(module_name), attr)(**kwargs)
    if not isinstance(env, TextEnv):
        raise TypeError(f"env factory {spec!r} returned {type(env).__name__}, expected a TextEnv subclass")
    return env


def call_env(env: TextEnv, kind: str, args: Any) -> Result:
    """One reset (``args`` = seed, options) or step (``args`` = action); an exception becomes an EnvError."""
    try:
        if kind == "reset":
            seed, options = args
            return env.reset(seed=seed, options=options)
        return env.step(args)
    except Exception as error:  # one broken env must not stop the others
        return EnvError.from_exception(error)


def require_slots(num_envs: int | None) -> int:
    if not num_envs or num_envs < 1:
        raise ValueError(f"an EnvPool needs at least one env slot, got num_envs={num_envs}")
    return num_envs


@dataclass(frozen=True)
class EnvAttributes:
    """What a pool says of its envs, read once when it starts.

    All but ``max_turns`` come from the first env. ``max_turns`` is the most any env of
    the pool allows: envs of one pool may differ (a list of instances, a factory), and
    rollout plays a wave for ``max_turns`` turns, so a smaller figure would cut off the
    episodes of the longer envs (each env still ends its own episodes when it wants).
    """

    system_prompt: str | None
    answer_format: str | None
    action_template: str
    max_turns: int
    reward_bounds: tuple[float, float]
    task_ids: list[str] | None  # None: the env does not list its tasks

    @classmethod
    def of(cls, envs: Sequence[TextEnv]) -> EnvAttributes:
        first = envs[0]
        try:
            task_ids: list[str] | None = list(first.task_ids())
        except NotImplementedError:
            task_ids = None
        return cls(first.system_prompt, first.answer_format, first.action_template, max(int(env.max_turns) for env in envs),
                   tuple(first.reward_bounds), task_ids)

    @staticmethod
    def combined(parts: Sequence[EnvAttributes]) -> EnvAttributes:
        """The attributes of a pool whose envs are split in ``parts`` (one per worker)."""
        return replace(parts[0], max_turns=max(part.max_turns for part in parts))


@runtime_checkable
class EnvPool(Protocol):
    """``num_envs`` env slots, called in batches: one result per request, in request order.

    Implementations set the attributes below and define ``_calls``, ``worker_pids`` and
    ``close``; the rest is shared.
    """

    env_spec: str
    num_envs: int
    num_workers: int  # worker processes; 0: the envs live in this process
    restarts: int  # worker restarts so far
    attributes: EnvAttributes
    closed: bool

    @property
    def system_prompt(self) -> str | None:
        return self.attributes.system_prompt

    @property
    def answer_format(self) -> str | None:
        return self.attributes.answer_format

    @property
    def action_template(self) -> str:
        return self.attributes.action_template

    @property
    def max_turns(self) -> int:
        return self.attributes.max_turns

    @property
    def reward_bounds(self) -> tuple[float, float]:
        return self.attributes.reward_bounds

    def task_ids(self) -> list[str]:
        if self.attributes.task_ids is None:
            raise NotImplementedError(f"env {self.env_spec!r} does not list its task ids")
        return list(self.attributes.task_ids)

    def worker_slots(self, index: int) -> range:
        """The slots worker ``index`` holds: a contiguous block, sizes differing by at most
        one. An in-process pool is one worker, this process."""
        size, extra = divmod(self.num_envs, max(self.num_workers, 1))
        start = index * size + min(index, extra)
        return range(start, start + size + (index < extra))

    def balanced_slots(self, count: int) -> list[int]:
        """Slots for ``count`` adjacent episodes: the same number (within one) on each worker,
        in order, so neighbours (a prompt's copies) play on one worker."""
        if not 1 <= count <= self.num_envs:
            raise ValueError(f"count must be between 1 and num_envs={self.num_envs}, got {count}")
        workers = max(self.num_workers, 1)
        size, extra = divmod(count, workers)
        return [slot for index in range(workers) for slot in self.worker_slots(index)[: size + (index < extra)]]

    def reset_many(self, requests: Sequence[tuple[int, int | None, dict | None]]) -> list[Result]:
        """Reset each ``(slot, seed, options)``; one ``(observation, info)`` or EnvError each."""
        return self._checked("reset", [(slot, (seed, options)) for slot, seed, options in requests])

    def step_many(self, requests: Sequence[tuple[int, str]]) -> list[Result]:
        """Step each ``(slot, action)``; one ``(obs, reward, terminated, truncated, info)`` or EnvError each."""
        return self._checked("step", list(requests))

    def _checked(self, kind: str, requests: list[Request]) -> list[Result]:
        if self.closed:
            raise RuntimeError("this EnvPool is closed")
        for slot, _ in requests:
            if not 0 <= slot < self.num_envs:
                raise IndexError(f"slot {slot} is out of range for a pool of {self.num_envs} envs")
        return self._calls(kind, requests)

    def _calls(self, kind: str, requests: list[Request]) -> list[Result]:
        """Run checked requests of one kind; never raises for a failing env."""
        ...

    def worker_pids(self) -> list[int]:
        ...

    def worker_cpu_seconds(self) -> float:
        """CPU seconds the live worker processes have used so far (from ``/proc``; 0 where
        it cannot be read, and for an in-process pool, whose envs use the caller's CPU)."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in self.worker_pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
        return total

    def close(self) -> None:
        ...

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env_spec!r}, num_envs={self.num_envs}, num_workers={self.num_workers})"
